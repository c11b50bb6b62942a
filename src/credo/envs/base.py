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
demonstrations, SERO), ``progress() -> float`` in [0, 1], ``abstract_state_key() -> str``
(a coarse progress stage, for ProAS), ``vocabulary() -> list[str]`` (every word the env
can print or accept, for the built-in word-level tokenizer), ``is_tool_call(action) ->
bool`` and ``action_format() -> str`` (rules shown to chat models).

Rules every env follows: a bad action never raises — it returns an "invalid action"
observation with ``info["valid"] = False`` and still counts toward the turn limit; the
final step's ``info["success"]`` says whether the task was solved.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from credo.utils.registry import Registry

__all__ = [
    "ENVS",
    "Env",
    "StepResult",
    "Task",
    "Transition",
    "env_names",
    "make_env",
    "register_env",
    "resolve_env",
    "snapshot_env",
    "step_env",
]

#: Seeds of held-out tasks start here; training tasks use seeds below it.
HELDOUT_SEED_OFFSET = 1_000_000_000


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


def step_env(env: Any, action: str) -> Transition:
    """Step ``env`` and record the state keys and optional progress signals."""
    state = env.state_key()
    abstract = _optional(env, "abstract_state_key")
    result = env.step(action)
    info = dict(result.info)
    if abstract is not None:
        info["abstract_state"] = abstract
        info["abstract_next_state"] = _optional(env, "abstract_state_key")
    progress = _optional(env, "progress")
    if progress is not None:
        info["progress"] = float(progress)
    return Transition(state, env.state_key(), result, info)


def snapshot_env(env: Any) -> Any:
    """``env.snapshot()`` if the env has it, else a deep copy of its ``__dict__``."""
    if hasattr(env, "snapshot"):
        return env.snapshot()
    return copy.deepcopy(env.__dict__)


EnvFactory = Callable[..., Any]
ENVS: Registry[EnvFactory] = Registry("env")


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Decorator: make an env class (or factory) available as ``--env <name>``."""
    return ENVS.register(name)


def env_names() -> list[str]:
    import credo.envs  # noqa: F401  (registers the built-in envs)

    return ENVS.names()


def resolve_env(name: str) -> EnvFactory:
    """Find an env factory by registry name or by ``module:Class`` import path."""
    import credo.envs  # noqa: F401

    if ":" in name:
        module_name, _, attr = name.partition(":")
        if os.getcwd() not in sys.path:  # `--env mymodule:MyEnv` from the project folder
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(
                f"--env {name!r}: cannot import module {module_name!r}: {exc}"
            ) from exc
        if name in ENVS:
            return ENVS.get(name)
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ValueError(f"--env {name!r}: module {module_name!r} has no {attr!r}") from None
    if name in ENVS:
        return ENVS.get(name)
    raise ValueError(_unknown_env(name))


def _unknown_env(name: str) -> str:
    from credo.utils.registry import unknown_name_message

    return (
        unknown_name_message("env", name, ENVS.names()) + " (or give an import path 'module:Class')"
    )


def make_env(name: str, **kwargs: Any) -> Any:
    """Instantiate env ``name`` (registry name or ``module:Class``) with ``kwargs``."""
    factory = resolve_env(name)
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise ValueError(f"env {name!r} rejected its options {sorted(kwargs)}: {exc}") from exc
