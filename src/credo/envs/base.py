"""The environment protocol, tasks, and the env registry.

An environment is anything with these methods (a :class:`typing.Protocol`, so no base
class is needed)::

    reset(task, seed) -> str          first observation
    step(action) -> StepResult        observation, reward, done, info
    state_key() -> str                canonical state, for graphs and anchor groups
    snapshot() -> Any                 an exact copy of the current state ...
    restore(snap) -> None             ... to branch from any step

Optional: ``instruction() -> str`` (the goal, kept at the top of every prompt; default:
the first observation), ``oracle_action() -> str`` (a correct next action: warm-start
demonstrations, SERO oracle continuations), ``progress() -> float`` in [0, 1],
``abstract_state_key() -> str`` (a coarse progress stage, for ProAS), ``vocabulary() ->
list[str]`` (every word the env can print or accept, for the built-in word-level
tokenizer), ``is_tool_call(action) -> bool`` and ``action_format() -> str`` (rules shown
to chat models), ``privileged_context(kind) -> str | None`` (below), ``similar_task(task,
rng) -> Task`` (below), ``task_difficulty() -> str`` (the current task's difficulty
label, for the per-difficulty breakdown of ``credo eval``; ``tools``: its number of calls).
An adapter that plays another library's envs may set ``actions_advice`` (a str): where
*its* users add those methods (``check-env`` shows it when no printed word is an action).

``similar_task(task: Task, rng: random.Random) -> Task`` returns "a task like this one":
a new training task with the same structure as ``task`` (the same task graph or API
topology) and new entities, names, amounts and wording, its seed drawn with ``rng``
(:func:`find_variant_seed` draws from a range that no pool, demonstration or held-out
seed uses). The RODS task source (:mod:`credo.tasks.rods`) spawns such variants of the
tasks on the policy's capability boundary. It must not change the env's state. (``shop``:
the first goal's category is kept; ``tools``: the task family is kept.)

``privileged_context(kind: str) -> str | None`` offers text about the *current* state
that a teacher may read but the student never sees (on-policy distillation from a
privileged teacher, :mod:`credo.teachers`): the sampler asks for it before the action is
taken (so it describes the state the action was taken in) and the teacher's prompt is the
student's, re-rendered with that text (:func:`credo.teachers.privileged_prompt_ids`).
``kind`` names what is asked: ``"oracle"`` (a correct next action), ``"feedback"`` (what
the env can say about the previous action beyond the observation), ``"solution"`` (a
description of what solves the task, e.g. the target item); an env returns ``None`` for
kinds it does not offer. It must not change the env's state (no RNG draws, no step
count). Call it through :func:`privileged_context`, which returns ``None`` for envs
without the method. (``shop`` offers ``"oracle"``.)

``abstract_state_key()`` is what ProAS's progress graph is built over
(:mod:`credo.credit.proas`): the graph's edges are the key changes seen in successful
episodes, and a step along such an edge is spared ProAS's penalty. So the key must tell
progress toward *this task's goal* from progress toward a wrong one: a coarse stage that
is the same whether the agent looks at the right item or a wrong one makes every
wandering step look like progress. Give the stage relative to the goal (the right entity
found, the right option chosen, k of n sub-goals done) and map every state from which the
agent is not on its way to *this* goal (a wrong entity viewed, a wrong option chosen, a
wrong irreversible action taken) to one shared ``off`` key; keep the number of distinct
keys small (tens), so that successful episodes cover the graph. (``shop``:
``results``/``item``/``chosen`` only with a fitting item and size, ``off`` otherwise,
``|k`` items bought; ``tools``: ``"1/2|policy"``, ``off`` for other orders.)

``is_tool_call(action)`` marks the actions that call a tool (a search, an API, a code
run) as opposed to answering or navigating; the AXPO resample sampler
(:mod:`credo.rollout.resample`) re-samples an all-failed group's tool calls. An env
without it has no tool calls (``shop``: ``search[...]`` is the tool call).

Snapshots: the branching samplers (tree, resample, oracle continuations) restart an
episode in the middle. They take :func:`snapshot_env` before every step and, to branch,
``reset`` a fresh env on the same task, :func:`restore_env` the snapshot and replay the
recorded action, checking that the env answers with the recorded observation and state
key (:func:`check_replay`; a mismatch is a :class:`RestoreDivergence`). An env with
``snapshot``/``restore`` is restored by them; an env without them (both are needed) is
restored from a deep copy of its ``__dict__``, which works for any env whose state is
plain Python data.

Rules every env follows: a bad action never raises — it returns an "invalid action"
observation with ``info["valid"] = False`` and still counts toward the turn limit; the
final step's ``info["success"]`` says whether the task was solved.
"""

from __future__ import annotations

import copy
import importlib
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from credo.utils.imports import add_cwd_to_path, import_user_module
from credo.utils.registry import Registry

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENVS",
    "ENV_MODULES_VAR",
    "ENV_SCHEMES",
    "REQUIRED_METHODS",
    "Env",
    "RestoreDivergence",
    "StepResult",
    "Task",
    "Transition",
    "check_env_instance",
    "check_observation",
    "check_replay",
    "env_names",
    "env_sources",
    "find_variant_seed",
    "make_env",
    "privileged_context",
    "register_env",
    "register_env_scheme",
    "reset_env",
    "resolve_env",
    "restore_env",
    "snapshot_env",
    "step_env",
]

#: Seeds of held-out tasks start here; training tasks use seeds below it.
HELDOUT_SEED_OFFSET = 1_000_000_000
#: Seeds of spawned variants (``similar_task``) lie in [this, HELDOUT_SEED_OFFSET).
VARIANT_SEED_OFFSET = 500_000_000


@dataclass(frozen=True)
class Task:
    """One task instance. Built-in envs generate the whole task from ``seed``.

    Attributes:
        split: ``"train"`` or ``"test"`` (held-out).
        seed: the generator seed; train and test seeds never overlap.
        data: free-form task data for envs that read tasks from a list (JSON-able).
    """

    split: str
    seed: int
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def id(self) -> str:
        return f"{self.split}/{self.seed}"

    @staticmethod
    def make(split: str, index: int) -> Task:
        """Task ``index`` of a split: train seeds are ``index``, test seeds are offset."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; valid: train, test")
        return Task(split, index if split == "train" else HELDOUT_SEED_OFFSET + index)


def find_variant_seed(
    rng: random.Random, accept: Callable[[int], bool], tries: int = 10_000
) -> int:
    """The first seed drawn with ``rng`` from [:data:`VARIANT_SEED_OFFSET`,
    :data:`HELDOUT_SEED_OFFSET`) that ``accept`` takes: the helper of ``similar_task``
    (``accept`` checks that the seed generates a task of the wanted structure). Raises
    ``ValueError`` after ``tries`` refused seeds."""
    for _ in range(tries):
        seed = rng.randrange(VARIANT_SEED_OFFSET, HELDOUT_SEED_OFFSET)
        if accept(seed):
            return seed
    raise ValueError(f"no variant seed accepted in {tries} draws")


@dataclass
class StepResult:
    """What ``Env.step`` returns.

    Attributes:
        observation: the next observation text.
        reward: immediate reward.
        done: the episode is over (task ended or turn limit reached).
        info: ``valid`` (bool, the action was understood and executed), ``success``
            (bool, on the last step) and anything else JSON-able.
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """The environment protocol (see the module docstring)."""

    def reset(self, task: Task, seed: int) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def state_key(self) -> str: ...

    def snapshot(self) -> Any: ...

    def restore(self, snap: Any) -> None: ...


@dataclass
class Transition:
    """One env step with what credo records around it (see :func:`step_env`).

    Attributes:
        state: ``state_key()`` before the action.
        next_state: ``state_key()`` after it.
        result: what ``step`` returned.
        info: ``result.info`` plus ``abstract_state``/``abstract_next_state`` and
            ``progress`` when the env provides ``abstract_state_key()``/``progress()``.
    """

    state: str
    next_state: str
    result: StepResult
    info: dict[str, Any]


def _optional(env: Any, name: str) -> Any:
    fn = getattr(env, name, None)
    return fn() if fn is not None else None


def privileged_context(env: Any, kind: str) -> str | None:
    """``env.privileged_context(kind)``, or ``None`` for an env without it (or with no
    text of that kind); an empty string counts as none."""
    fn = getattr(env, "privileged_context", None)
    if fn is None:
        return None
    text = fn(kind)
    if text is not None and not isinstance(text, str):
        raise TypeError(
            f"{type(env).__name__}.privileged_context({kind!r}) must return a str or None, "
            f"got {type(text).__name__}"
        )
    return text or None


def check_observation(observation: Any, env: Any, method: str) -> str:
    """Return ``observation`` if it is a ``str``; else raise a ``TypeError`` naming the
    env's method and the type it returned (credo never converts an observation: ``str()``
    of a tuple or of bytes would reach the prompt without a word)."""
    if isinstance(observation, str):
        return observation
    shown = repr(observation)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise TypeError(
        f"{type(env).__name__}.{method}() returned an observation of type "
        f"{type(observation).__name__} ({shown}); observations must be str"
    )


def reset_env(env: Any, task: Task, seed: int) -> str:
    """``env.reset(task, seed)``, checked to be a ``str`` (see :func:`check_observation`)."""
    return check_observation(env.reset(task, seed), env, "reset")


def step_env(env: Any, action: str) -> Transition:
    """Step ``env`` and record the state keys and optional progress signals.

    Raises ``TypeError`` if ``step`` returns no :class:`StepResult`-like object or a
    non-string observation (see :func:`check_observation`).
    """
    state = env.state_key()
    abstract = _optional(env, "abstract_state_key")
    result = env.step(action)
    if not all(hasattr(result, a) for a in ("observation", "reward", "done", "info")):
        raise TypeError(
            f"{type(env).__name__}.step() returned a {type(result).__name__}; expected a "
            "StepResult(observation, reward, done, info)"
        )
    check_observation(result.observation, env, "step")
    info = dict(result.info)
    if abstract is not None:
        info["abstract_state"] = abstract
        info["abstract_next_state"] = _optional(env, "abstract_state_key")
    progress = _optional(env, "progress")
    if progress is not None:
        info["progress"] = float(progress)
    return Transition(state, env.state_key(), result, info)


def _has_own_snapshot(env: Any) -> bool:
    return callable(getattr(env, "snapshot", None)) and callable(getattr(env, "restore", None))


def snapshot_env(env: Any) -> Any:
    """``env.snapshot()`` if the env has both ``snapshot`` and ``restore``, else a deep
    copy of its ``__dict__`` (the fallback :func:`restore_env` undoes)."""
    if _has_own_snapshot(env):
        return env.snapshot()
    return copy.deepcopy(env.__dict__)


def restore_env(env: Any, snap: Any) -> None:
    """Put ``env`` back into the state :func:`snapshot_env` recorded in ``snap``.

    Uses ``env.restore(snap)`` when the env has its own ``snapshot``/``restore``;
    otherwise replaces the env's ``__dict__`` with a deep copy of ``snap`` (so one
    snapshot can be restored any number of times). ``env`` should be an instance of the
    same class that was reset on the same task (an env's own snapshot may hold only the
    part of its state that changes during an episode, as ``shop``'s does).
    """
    if _has_own_snapshot(env):
        env.restore(snap)
        return
    if not isinstance(snap, dict):
        raise TypeError(
            f"restore_env: {type(env).__name__} has no snapshot()/restore(), so its snapshots "
            f"are deep copies of its __dict__; got a {type(snap).__name__}"
        )
    env.__dict__.clear()
    env.__dict__.update(copy.deepcopy(snap))


class RestoreDivergence(RuntimeError):
    """A restored env does not reproduce the recorded episode (see :func:`check_replay`)."""


def check_replay(
    env: Any,
    *,
    observation: str,
    expected_observation: str,
    expected_state: str | int,
    where: str = "",
) -> None:
    """Raise :class:`RestoreDivergence` unless a restored-and-replayed env matches the
    recording.

    Args:
        env: the env after the restore and the replayed step (or after ``reset``).
        observation: the observation the replay returned.
        expected_observation: the observation recorded at that point of the episode.
        expected_state: the recorded ``state_key()`` there (string, or its int64 hash).
        where: what was being restored (task and depth), for the message.
    """
    from credo.data.ops import hash_key

    state = env.state_key()
    same_state = (
        hash_key(state) == expected_state
        if isinstance(expected_state, int)
        else state == expected_state
    )
    if observation == expected_observation and same_state:
        return
    what = []
    if observation != expected_observation:
        what.append(f"observation {observation!r} != recorded {expected_observation!r}")
    if not same_state:
        what.append(f"state_key {state!r} != recorded {expected_state!r}")
    own = _has_own_snapshot(env)
    hint = (
        "its snapshot() must capture everything step() depends on, and step() must be "
        "deterministic given that state"
        if own
        else "it has no snapshot()/restore(), so credo deep-copies its __dict__: state kept "
        "outside the instance (globals, processes, files) is not restored; implement "
        "snapshot()/restore()"
    )
    raise RestoreDivergence(
        f"restoring {type(env).__name__}{' ' + where if where else ''} diverged from the "
        f"recorded episode: {'; '.join(what)}. {hint}. Set rollout.on_restore_divergence=skip "
        "to drop such branches (counted in rollout/restore_divergences) instead of stopping."
    )


EnvFactory = Callable[..., Any]
ENVS: Registry[EnvFactory] = Registry("env")

#: The entry-point group a package declares to offer envs by name, e.g. in its
#: ``pyproject.toml``: ``[project.entry-points."credo.envs"] maze = "mypkg.maze:MazeEnv"``.
ENTRY_POINT_GROUP = "credo.envs"

#: Environment variable naming modules to import before looking an env name up
#: (comma-separated), so that their ``@register_env`` names work on the command line:
#: ``CREDO_ENV_MODULES=examples.custom_env credo train --env guess``.
ENV_MODULES_VAR = "CREDO_ENV_MODULES"

#: Methods every env has (``snapshot``/``restore`` may fall back to a deep copy).
REQUIRED_METHODS = ("reset", "step", "state_key")


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Decorator: make an env class (or factory) available as ``--env <name>`` once its
    module is imported (by ``--env module:name``, by ``$CREDO_ENV_MODULES``, or by a
    package's ``credo.envs`` entry point)."""
    return ENVS.register(name)


#: Name schemes: ``scheme:rest`` names an env built by ``ENV_SCHEMES[scheme](rest)``
#: (``gym:credo/TextLights-v0``, ``textarena:GuessTheNumber-v0``); a scheme wins over a
#: module of the same name.
ENV_SCHEMES: dict[str, Callable[[str], EnvFactory]] = {}


def register_env_scheme(scheme: str, factory: Callable[[str], EnvFactory]) -> None:
    """Make ``--env scheme:rest`` build envs with ``factory(rest)`` (an env factory),
    e.g. an adapter that takes a third-party env id."""
    ENV_SCHEMES[scheme] = factory


def _entry_points() -> dict[str, Any]:
    """The ``credo.envs`` entry points of the installed packages, by name."""
    from importlib.metadata import entry_points

    try:
        return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken distribution's metadata must not stop credo
        return {}


def _import_env_modules() -> None:
    """Import the modules named in ``$CREDO_ENV_MODULES`` (their envs register)."""
    for module in filter(None, (m.strip() for m in os.environ.get(ENV_MODULES_VAR, "").split(","))):
        add_cwd_to_path()
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(
                f"${ENV_MODULES_VAR}: cannot import module {module!r}: {exc}"
            ) from None


def env_names() -> list[str]:
    """Every env name ``--env`` accepts: registered ones (built-ins and imported
    modules', ``$CREDO_ENV_MODULES`` included) and installed packages' entry points."""
    import credo.envs  # noqa: F401  (registers the built-in envs)

    _import_env_modules()
    return sorted({*ENVS.names(), *_entry_points()})


def env_sources() -> dict[str, str]:
    """Where each env name comes from: ``credo`` (built in), a module, or an installed
    package's entry point (``package (entry point)``)."""
    env_names()
    out = {}
    for name in ENVS.names():
        module = getattr(ENVS.get(name), "__module__", "") or ""
        out[name] = "credo" if module.startswith("credo.") else module
    for name, ep in _entry_points().items():
        if name not in out:
            dist = getattr(getattr(ep, "dist", None), "name", None)
            out[name] = f"{dist or ep.value} (entry point)"
    return out


def _import_module(name: str, module_name: str) -> Any:
    """Import ``module_name`` of ``--env name``: a dotted module (the working folder is on
    the path) or a ``.py`` file path (:func:`credo.utils.imports.import_user_module`)."""
    return import_user_module(name, module_name, flag="--env", prefix="credo_env_")


def _check_env_class(name: str, factory: Any) -> EnvFactory:
    """``factory`` is an env class (with the protocol's methods) or another callable;
    anything else is refused with the methods an env needs."""
    if isinstance(factory, type):
        missing = [m for m in REQUIRED_METHODS if not callable(getattr(factory, m, None))]
        if missing:
            raise ValueError(
                f"--env {name!r}: {factory.__module__}.{factory.__qualname__} is not an env: it "
                f"has no {', '.join(m + '()' for m in missing)} (an env class has reset(task, "
                "seed), step(action) -> StepResult, state_key(), snapshot(), restore(snap))"
            )
        return factory
    if not callable(factory):
        raise ValueError(
            f"--env {name!r} names a {type(factory).__name__}, not an env class or factory"
        )
    return factory


def check_env_instance(name: str, env: Any) -> Any:
    """``env`` (made by a factory) has the protocol's methods; a clear error if not."""
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(env, m, None))]
    if missing:
        raise ValueError(
            f"env {name!r} made a {type(env).__name__}, which is not an env: it has no "
            f"{', '.join(m + '()' for m in missing)}"
        )
    return env


def resolve_env(name: str) -> EnvFactory:
    """Find an env factory: a registered name, an installed package's ``credo.envs``
    entry point, a scheme name ``scheme:id`` (:data:`ENV_SCHEMES`: ``gym:ENV_ID``,
    ``textarena:GAME_ID``), or an import path ``module:Class`` (also
    ``module:registered_name`` and ``path/to/file.py:Class``).

    Raises:
        ValueError: the name is unknown, the module cannot be imported, or what it names
            is not an env (the message says what an env needs).
    """
    import credo.envs  # noqa: F401

    scheme, _, rest = name.partition(":")
    if rest and scheme in ENV_SCHEMES:
        # a scheme's id may name the user's own module (``gym:my_env:MyEnv-v0``) or an id
        # that a ``$CREDO_ENV_MODULES`` module registers: both as for ``--env module:Class``
        add_cwd_to_path()
        _import_env_modules()
        return ENV_SCHEMES[scheme](rest)
    if ":" in name:
        module_name, _, attr = name.rpartition(":")
        module = _import_module(name, module_name)
        if attr in ENVS and not hasattr(module, attr):
            return ENVS.get(attr)
        if name in ENVS:
            return ENVS.get(name)
        try:
            factory = getattr(module, attr)
        except AttributeError:
            found = sorted(
                k for k, v in vars(module).items() if isinstance(v, type) and hasattr(v, "step")
            )
            hint = f"; env classes there: {', '.join(found)}" if found else ""
            raise ValueError(
                f"--env {name!r}: module {module_name!r} has no {attr!r}{hint}"
            ) from None
        return _check_env_class(name, factory)
    _import_env_modules()
    if name in ENVS:
        return ENVS.get(name)
    eps = _entry_points()
    if name in eps:
        try:
            factory = eps[name].load()
        except Exception as exc:
            raise ValueError(
                f"--env {name!r}: the entry point {eps[name].value!r} failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return _check_env_class(name, factory)
    raise ValueError(_unknown_env(name))


def _unknown_env(name: str) -> str:
    from credo.utils.registry import unknown_name_message

    return (
        unknown_name_message("env", name, env_names())
        + " (or an import path 'module:Class'; a module's @register_env names work with "
        f"--env module:name or ${ENV_MODULES_VAR}=module)"
    )


def make_env(name: str, **kwargs: Any) -> Any:
    """Instantiate env ``name`` (registry name or ``module:Class``) with ``kwargs``."""
    factory = resolve_env(name)
    try:
        env = factory(**kwargs)
    except TypeError as exc:
        raise ValueError(f"env {name!r} rejected its options {sorted(kwargs)}: {exc}") from exc
    return check_env_instance(name, env)
