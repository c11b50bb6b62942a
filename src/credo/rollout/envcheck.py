"""Check an env against the protocol before any compute (``credo check-env --env X``,
:mod:`credo.commands.check_env`).

Training runs a brief version of the same checks (:func:`preflight`, from
:func:`~credo.train.run.build_run`) and stops with the message of the first failure, so a
broken env costs seconds, not a run. The checks, each a small function:

- **types**: ``reset`` returns a ``str``; ``step`` a :class:`~credo.envs.base.StepResult`
  (``observation`` str, ``reward`` number, ``done`` bool, ``info`` dict with a bool
  ``info["valid"]``, and ``info["success"]`` on the last step); ``state_key`` a ``str``;
  an episode ends (``done``) within the env's turn limit;
- **determinism per task**: two fresh envs reset on the same task and given the same
  actions print the same observations and state keys (the episode comes from
  ``task.seed``; the ``seed`` argument of ``reset`` is always 0);
- **snapshot/restore**: restoring a snapshot and replaying the next action reproduces
  the recorded observation and state key (the branching samplers rely on it);
- **tokenizer round trip**: each oracle action, encoded and decoded by the policy's
  tokenizer (what ``step()`` receives from the model: the built-in tokenizer writes
  ``add [ moss ]`` for ``add[moss]`` and drops unknown words), is still accepted
  (``info["valid"]``) when the raw action is;
- **vocabulary coverage**: the words of the oracle's actions are in the tokenizer's
  vocabulary (a word outside it can never be written by the built-in model).

Episodes are driven by ``oracle_action()`` when the env has it, else ``sample_action(rng)``,
else a random walk over the words the env prints (:func:`action_candidates`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from credo.envs.base import StepResult, Task, restore_env, snapshot_env
from credo.policy.tokenizer import split_words

__all__ = [
    "EnvCheck",
    "EnvCheckError",
    "action_candidates",
    "check_env",
    "check_round_trip",
    "collect_words",
    "preflight",
    "round_trip",
]

#: Turn cap of an episode during the checks when the env has no ``max_turns``.
DEFAULT_TURN_CAP = 64


class EnvCheckError(ValueError):
    """An env fails a protocol check; the message says which method to fix and how."""


@dataclass
class EnvCheck:
    """What :func:`check_env` found.

    Attributes:
        env: the env's class name.
        passed: names of the checks that passed.
        problems: one line per failed check (what is wrong and what to change).
        errors: exceptions the env raised during a check (with the check's name).
        notes: observations that are not failures (e.g. checks skipped and why).
    """

    env: str
    passed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No check failed and the env raised nothing."""
        return not self.problems and not self.errors


# ------------------------------------------------------------------ driving episodes
def _text(env: Any, name: str) -> str:
    fn = getattr(env, name, None)
    if fn is None:
        return ""
    value = fn()
    return value if isinstance(value, str) else ""


def action_candidates(env: Any, observation: str) -> list[str]:
    """Words a random walk may try as actions when the env offers neither
    ``oracle_action`` nor ``sample_action``: the words of the observation, the
    instruction and ``action_format()`` (punctuation left out)."""
    text = " ".join([observation, _text(env, "instruction"), _text(env, "action_format")])
    return sorted({w for w in split_words(text) if any(c.isalnum() for c in w)})


def _next_action(env: Any, obs: str, rng: random.Random, oracle_share: float) -> str | None:
    """The action an exploring episode takes: the oracle's (with probability
    ``oracle_share`` when the env can also sample), a sampled one, or a random word the
    env printed; ``None`` when there is nothing to try."""
    has_oracle = callable(getattr(env, "oracle_action", None))
    has_sample = callable(getattr(env, "sample_action", None))
    if has_oracle and (not has_sample or rng.random() < oracle_share):
        return env.oracle_action()
    if has_sample:
        return env.sample_action(rng)
    words = action_candidates(env, obs)
    return rng.choice(words) if words else None


def _turn_cap(env: Any) -> int:
    cap = getattr(env, "max_turns", None)
    return int(cap) if isinstance(cap, int) and cap > 0 else DEFAULT_TURN_CAP


@dataclass
class _Walk:
    """The words and validity seen while exploring an env."""

    words: set[str] = field(default_factory=set)
    steps: int = 0
    valid_steps: int = 0
    guided: bool = False


def _explore(make: Callable[[], Any], episodes: int, *, oracle_share: float = 0.7) -> _Walk:
    env = make()
    walk = _Walk(
        guided=callable(getattr(env, "oracle_action", None))
        or callable(getattr(env, "sample_action", None))
    )
    rng = random.Random(0)
    for i in range(episodes):
        try:
            _explore_episode(env, Task.make("train", i), rng, oracle_share, walk)
        except EnvCheckError:
            raise
        except Exception:  # an env that raises on a task: training contains it, skip it here
            env = make()
    return walk


def _explore_episode(
    env: Any, task: Task, rng: random.Random, oracle_share: float, walk: _Walk
) -> None:
    obs = env.reset(task, 0)
    if not isinstance(obs, str):
        raise EnvCheckError(
            f"{type(env).__name__}.reset() must return the first observation as a str, got "
            f"{type(obs).__name__}"
        )
    walk.words.update(split_words(obs))
    walk.words.update(split_words(_text(env, "instruction")))
    if not walk.guided:
        walk.words.update(split_words(_text(env, "action_format")))
    for _ in range(DEFAULT_TURN_CAP):
        action = _next_action(env, obs, rng, oracle_share)
        if action is None:
            break
        res = env.step(action)
        _check_step_result(env, res)
        walk.steps += 1
        valid = bool(res.info.get("valid", True))
        walk.valid_steps += valid
        if valid or walk.guided:
            walk.words.update(split_words(action))
        obs = res.observation
        walk.words.update(split_words(obs))
        if res.done:
            break


def collect_words(make: Callable[[], Any], episodes: int = 200) -> list[str]:
    """Words for the built-in tokenizer of an env without ``vocabulary()``: those of the
    instructions, observations, ``action_format()`` and valid actions of ``episodes``
    episodes (oracle/sampled actions, else a random walk over the words the env prints).

    Raises:
        EnvCheckError: the env has neither ``oracle_action`` nor ``sample_action`` and no
            word it prints is an action it accepts: the built-in model could never write
            a valid action, so training would learn nothing.
    """
    walk = _explore(make, episodes)
    if not walk.guided and walk.steps and walk.valid_steps == 0:
        env = make()
        # an adapter (gym, ...) reads these methods from the user's own env, not from
        # itself: it says where they go (``actions_advice``)
        advice = getattr(env, "actions_advice", None) or (
            "Add vocabulary() (every word it prints or accepts) or sample_action(rng) (a "
            "random valid action), or list the actions in action_format(); add "
            "oracle_action() too for a warm start"
        )
        raise EnvCheckError(
            f"{type(env).__name__}: none of the words it prints is an action it accepts "
            f"({walk.steps} random single-word actions taken from its observations were all "
            "invalid), so the built-in model's tokenizer cannot write its actions and training "
            f"would learn nothing. {advice}"
        )
    return sorted(walk.words)


# ------------------------------------------------------------------ the checks
def _check_step_result(env: Any, res: Any) -> None:
    name = type(env).__name__
    if not isinstance(res, StepResult):
        got = type(res).__name__
        raise EnvCheckError(
            f"{name}.step() returned a {got}; return credo.envs.StepResult(observation, "
            "reward, done, info)"
        )
    if not isinstance(res.observation, str):
        raise EnvCheckError(
            f"{name}.step() observation must be a str, got {type(res.observation).__name__}"
        )
    if isinstance(res.reward, bool) or not isinstance(res.reward, (int, float)):
        raise EnvCheckError(f"{name}.step() reward must be a number, got {res.reward!r}")
    if not isinstance(res.done, bool):
        raise EnvCheckError(f"{name}.step() done must be True or False, got {res.done!r}")
    if not isinstance(res.info, dict):
        raise EnvCheckError(f"{name}.step() info must be a dict, got {type(res.info).__name__}")
    if "valid" in res.info and not isinstance(res.info["valid"], bool):
        raise EnvCheckError(
            f"{name}.step() info['valid'] must be True or False, got {res.info['valid']!r}"
        )
    if res.done and "success" not in res.info:
        raise EnvCheckError(
            f"{name}.step() ended the episode without info['success'] (True or False): "
            "the last step says whether the task was solved"
        )


def _episode(
    env: Any, task: Task, rng: random.Random, *, actions: list[str] | None = None
) -> tuple[list[str], list[str], list[str]]:
    """Play one episode; returns (actions, observations, state keys). With ``actions``
    replay those instead of choosing."""
    name = type(env).__name__
    obs = env.reset(task, 0)
    if not isinstance(obs, str):
        raise EnvCheckError(
            f"{name}.reset() must return the first observation as a str, got {type(obs).__name__}"
        )
    key = env.state_key()
    if not isinstance(key, str):
        raise EnvCheckError(f"{name}.state_key() must return a str, got {type(key).__name__}")
    taken, observations, keys = [], [obs], [key]
    cap = _turn_cap(env)
    for t in range(len(actions) if actions is not None else cap):
        action = actions[t] if actions is not None else _next_action(env, obs, rng, 1.0)
        if action is None:
            break
        res = env.step(action)
        _check_step_result(env, res)
        taken.append(action)
        obs = res.observation
        observations.append(obs)
        keys.append(env.state_key())
        if res.done:
            break
    else:
        if actions is None and getattr(env, "max_turns", None) is not None:
            raise EnvCheckError(
                f"{name}: an episode did not end within max_turns={cap} steps: step() must "
                "return done=True at the turn limit"
            )
    return taken, observations, keys


def _check_types_and_determinism(make: Callable[[], Any], tasks: list[Task]) -> None:
    for task in tasks:
        first = _episode(make(), task, random.Random(task.seed))
        again = _episode(make(), task, random.Random(task.seed), actions=first[0])
        if first[1] != again[1] or first[2] != again[2]:
            shorter = min(len(first[1]), len(again[1]))
            t = next(
                (
                    i
                    for i in range(shorter)
                    if (first[1][i], first[2][i]) != (again[1][i], again[2][i])
                ),
                shorter - 1,
            )
            raise EnvCheckError(
                f"{type(make()).__name__} is not deterministic on task {task.id}: two fresh "
                f"envs given the same actions differ at turn {t} ({first[1][t]!r} vs "
                f"{again[1][t]!r}); derive everything random from task.seed in reset() (the "
                "seed argument is always 0)"
            )


def _check_snapshot(make: Callable[[], Any], tasks: list[Task]) -> None:
    """On the first task whose episode has at least two actions: for every turn k, a
    snapshot taken there, restored into a fresh env after the episode went on, and the
    recorded action k replayed, gives the recorded observation and state key."""
    for task in tasks:
        actions, observations, keys = _episode(make(), task, random.Random(task.seed))
        if len(actions) >= 2:
            break
    else:
        return
    for k in range(len(actions)):
        env = make()
        env.reset(task, 0)
        for a in actions[:k]:
            env.step(a)
        snap = snapshot_env(env)
        for a in actions[k:]:  # move on, so that a restore that does nothing shows
            if env.step(a).done:
                break
        fresh = make()
        fresh.reset(task, 0)
        restore_env(fresh, snap)
        res = fresh.step(actions[k])
        if res.observation != observations[k + 1] or fresh.state_key() != keys[k + 1]:
            raise EnvCheckError(
                f"{type(env).__name__}: restoring a snapshot taken at turn {k} of task "
                f"{task.id} and replaying {actions[k]!r} gives {res.observation!r}, not the "
                f"recorded {observations[k + 1]!r}: snapshot() must capture everything step() "
                "depends on and restore() put it back"
            )


def round_trip(action: str, tokenizer: Any, renderer: Any = None, env: Any = None) -> str:
    """The text ``step()`` receives when the model writes ``action``: its tokens decoded
    as the sampler decodes them (special and unknown tokens dropped), then parsed by the
    renderer (the chat renderer pulls the action out of a reply)."""
    ids = tokenizer.encode(action, add_special_tokens=False)
    text = tokenizer.decode(ids, skip_special_tokens=True).strip()
    return renderer.extract_action(text, env) if renderer is not None else text


def check_round_trip(
    make: Callable[[], Any], tasks: list[Task], tokenizer: Any, renderer: Any
) -> None:
    """Play the oracle on ``tasks``; every oracle action must be written with words of
    the tokenizer's vocabulary (word-level tokenizers) and, sent as the model would send
    it (:func:`round_trip`), be accepted whenever the raw action is.

    An exception the env raises ends the check of that task only: exceptions are
    training's to contain, episode by episode.

    Raises:
        EnvCheckError: the first action that fails, with the fix.
    """
    env = make()
    if not callable(getattr(env, "oracle_action", None)):
        return
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else None
    word_level = vocab is not None and "<unk>" in vocab and len(vocab) < 5000
    for task in tasks:
        try:
            _round_trip_task(make, task, tokenizer, renderer, vocab if word_level else None)
        except EnvCheckError:
            raise
        except Exception:  # the env raised: not a protocol problem, training contains it
            continue


def _round_trip_task(
    make: Callable[[], Any], task: Task, tokenizer: Any, renderer: Any, vocab: Any
) -> None:
    """:func:`check_round_trip` on one task (``vocab``: a word-level vocabulary to check
    the oracle's words against, or ``None``)."""
    word_level = vocab is not None
    env = make()
    env.reset(task, 0)
    for _ in range(_turn_cap(env)):
        action = env.oracle_action()
        if word_level:
            missing = [w for w in split_words(action) if w not in vocab]
            if missing:
                raise EnvCheckError(
                    f"{type(env).__name__}: the oracle's action {action!r} has words the "
                    f"built-in tokenizer lacks ({', '.join(missing[:5])}), so the model can "
                    "never write it: list every word the env accepts in vocabulary()"
                )
        sent = round_trip(action, tokenizer, renderer, env)
        snap = snapshot_env(env)
        raw = env.step(action)
        if sent != action and bool(raw.info.get("valid", True)):
            probe = make()
            probe.reset(task, 0)
            restore_env(probe, snap)
            res = probe.step(sent)
            if not bool(res.info.get("valid", True)):
                raise EnvCheckError(
                    f"{type(env).__name__}.step() accepts the oracle's {action!r} but "
                    f"rejects {sent!r}, which is what it receives when the model writes "
                    "that action (the tokenizer splits words and punctuation and joins "
                    "them with spaces): parse actions with the spaces, e.g. "
                    "action.replace('[', ' ').replace(']', ' ').split()"
                )
        if raw.done:
            break


def check_env(
    make: Callable[[], Any],
    *,
    tasks: int = 8,
    tokenizer: Any = None,
    renderer: Any = None,
    snapshots: bool = True,
) -> EnvCheck:
    """Run every check on the env ``make()`` builds; see the module docstring.

    Args:
        make: a zero-argument env factory.
        tasks: training tasks to play (each check uses some of them).
        tokenizer: the policy's tokenizer, for the round-trip and coverage checks
            (skipped without it).
        renderer: the run's renderer (its ``extract_action``), for the round trip.
        snapshots: also check the snapshot/restore round trip.

    Returns:
        The checks passed, the problems found (one line each) and the exceptions the
        env raised while being checked.
    """
    env = make()
    report = EnvCheck(type(env).__name__)
    missing = [m for m in ("reset", "step", "state_key") if not callable(getattr(env, m, None))]
    if missing:
        report.problems.append(
            f"{report.env} has no {', '.join(m + '()' for m in missing)}: an env needs "
            "reset(task, seed), step(action), state_key(), snapshot() and restore(snap)"
        )
        return report
    sample = [Task.make("train", i) for i in range(max(1, tasks))]
    checks: list[tuple[str, Callable[[], None]]] = [
        (
            "types, turn limit, determinism per task",
            lambda: _check_types_and_determinism(make, sample),
        ),
    ]
    if snapshots:
        checks.append(("snapshot/restore round trip", lambda: _check_snapshot(make, sample)))
    if tokenizer is not None:
        checks.append(
            (
                "oracle actions survive the tokenizer round trip; vocabulary coverage",
                lambda: check_round_trip(make, sample, tokenizer, renderer),
            )
        )
    else:
        report.notes.append("tokenizer round trip skipped: no tokenizer given")
    if not callable(getattr(env, "oracle_action", None)):
        report.notes.append(
            "no oracle_action(): no warm start (train with sft.enabled=false) and no oracle "
            "round trip"
        )
    for name, check in checks:
        try:
            check()
        except EnvCheckError as exc:
            report.problems.append(str(exc))
        except Exception as exc:  # the env itself raised: say where
            report.errors.append(f"{name}: {report.env} raised {type(exc).__name__}: {exc}")
        else:
            report.passed.append(name)
    return report


def preflight(
    make: Callable[[], Any],
    *,
    needs_oracle: bool,
    snapshots: bool,
    tokenizer: Any = None,
    renderer: Any = None,
    tasks: int = 2,
) -> None:
    """The brief check training runs before it starts: :func:`check_env` on ``tasks``
    tasks, and ``oracle_action()`` when the warm start needs it. Exceptions the env
    raises are left to training (which contains them episode by episode); protocol
    violations stop it.

    Args:
        make: the env factory.
        needs_oracle: the warm start is on, so the env needs ``oracle_action()``.
        snapshots: the sampler branches from snapshots (tree, resample, oracle
            continuations), so the snapshot round trip must hold.
        tokenizer: the policy's tokenizer (round trip and coverage).
        renderer: the run's renderer.
        tasks: training tasks to play.

    Raises:
        EnvCheckError: the first problem found.
    """
    env = make()
    if needs_oracle and not callable(getattr(env, "oracle_action", None)):
        raise EnvCheckError(
            f"{type(env).__name__} has no oracle_action(): the warm start (sft.enabled, on by "
            "default) learns from the oracle's demonstrations. Add oracle_action() (a correct "
            "next action) or set sft.enabled=false (RL from the untrained model)"
        )
    report = check_env(
        make, tasks=tasks, tokenizer=tokenizer, renderer=renderer, snapshots=snapshots
    )
    if report.problems:
        raise EnvCheckError(report.problems[0])
