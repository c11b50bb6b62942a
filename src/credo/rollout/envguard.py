"""The env-call guard: a user env that raises, hangs or returns nonsense fails its own
episode, is written down, and is shown.

Every call credo makes into an env (``reset``, ``step`` with its ``state_key`` and
optional progress signals, ``instruction``, ``snapshot``/``restore``, ``oracle_action``,
``sample_action``) goes through :func:`env_call`, which

- runs it under a per-call time limit (``rollout.step_timeout`` seconds; a ``SIGALRM``
  interval timer, so it only applies on the main thread; 0 disables it). An env that
  times out is in an unknown state: its episode fails and whoever reuses envs (the
  warm-start demonstrations) builds a fresh one;
- checks what came back (:func:`check_observation`, :func:`check_step_result`): an
  observation that is not a ``str`` fails the episode with a message that says so;
- turns any exception into :class:`EnvCallError`, after recording an
  :class:`EnvErrorRecord` (task, turn, phase, the env's own message and the source line
  that raised) in the active :class:`EnvErrorLog`, if any.

A non-finite reward is not the episode's problem but the run's: advantages would be NaN.
:func:`check_step_result` raises :class:`EnvFailure` for it, which the guard does *not*
contain, naming the env, the task and the turn.

The settings and the log are context variables (:func:`env_guard`), so the samplers,
the evaluator and the demonstrations need no extra arguments: ``credo train`` opens one
guard for the whole run (its log is ``env_errors.jsonl`` in the run folder), and library
code outside any guard gets the default timeout and no log (errors stay in
``Episode.error``). The phase of a call (``warm start``, ``rollout``, ``restore``,
``oracle``, ``eval``) is a context variable too (:func:`env_phase`).
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from credo.utils.atomic import write_text_atomic

__all__ = [
    "DEFAULT_STEP_TIMEOUT",
    "EnvCallError",
    "EnvErrorLog",
    "EnvErrorRecord",
    "EnvFailure",
    "StepTimeout",
    "check_observation",
    "check_step_result",
    "current_phase",
    "env_call",
    "env_guard",
    "env_phase",
    "guard_settings",
    "record_env_error",
]

#: Seconds one env call may take before its episode fails (``rollout.step_timeout``).
DEFAULT_STEP_TIMEOUT = 60.0

T = TypeVar("T")


class EnvFailure(ValueError):
    """The env broke the run, not just one episode (a non-finite reward; every episode of
    an iteration failed). The message names the env and what it did."""


class StepTimeout(TimeoutError):
    """An env call took longer than ``rollout.step_timeout`` seconds."""


class EnvCallError(Exception):
    """An env call raised, timed out or returned a value of the wrong type; the episode
    it belongs to fails. ``record`` is what was logged, ``cause`` the original error."""

    def __init__(self, record: EnvErrorRecord, cause: BaseException) -> None:
        super().__init__(record.message)
        self.record = record
        self.cause = cause


@dataclass
class EnvErrorRecord:
    """One env error, as written to ``env_errors.jsonl``.

    Attributes:
        task: the task id (``train-12``), or ``""`` when unknown.
        turn: the turn (0 = ``reset``), or −1 when unknown.
        phase: ``warm start``, ``rollout``, ``restore``, ``oracle`` or ``eval``.
        call: the env method (``reset``, ``step``, ...).
        message: ``<ExceptionType>: <the env's own message>``.
        location: ``file:line in function`` of the innermost frame that raised (for a
            timeout: where the env was when the time ran out).
    """

    task: str
    turn: int
    phase: str
    call: str
    message: str
    location: str

    def line(self) -> str:
        """One line for the terminal."""
        where = f"task {self.task}, turn {self.turn}" if self.task else "no task"
        return f"env error ({self.phase}, {where}, {self.call}): {self.message}  [{self.location}]"


class EnvErrorLog:
    """The env errors of a run: kept in memory, written to ``path`` (JSON lines, the whole
    file rewritten atomically by :meth:`flush`), the first ``show`` of them passed to
    ``say`` as one line each.

    Args:
        path: ``env_errors.jsonl`` in the run folder (``None``: keep in memory only).
        say: prints one line (default: standard error).
        show: how many errors are shown (default 5; the rest are only written).
        keep: most records kept in the file (default 10 000; later ones are counted).
    """

    def __init__(
        self,
        path: Path | None,
        *,
        say: Callable[[str], None] | None = None,
        show: int = 5,
        keep: int = 10_000,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.show, self.keep = show, keep
        self.records: list[EnvErrorRecord] = []
        self.count = 0
        self._dirty = False
        if self.path is not None and self.path.exists():  # a resumed run keeps its history
            for line in self.path.read_text().splitlines():
                try:
                    self.records.append(EnvErrorRecord(**json.loads(line)))
                except (json.JSONDecodeError, TypeError):
                    continue
        self._shown = 0

    def add(self, record: EnvErrorRecord) -> None:
        self.count += 1
        if len(self.records) < self.keep:
            self.records.append(record)
            self._dirty = True
        if self._shown < self.show:
            self._shown += 1
            more = (
                f" (further env errors are only written to {self.path})"
                if self._shown == self.show and self.path is not None
                else ""
            )
            self.say(record.line() + more)

    def flush(self) -> None:
        """Rewrite the file (atomically) if anything was added since the last flush."""
        if self.path is None or not self._dirty:
            return
        write_text_atomic(self.path, "".join(json.dumps(asdict(r)) + "\n" for r in self.records))
        self._dirty = False


@dataclass(frozen=True)
class _Guard:
    timeout: float
    log: EnvErrorLog | None


_GUARD: ContextVar[_Guard | None] = ContextVar("credo_env_guard", default=None)
_DEFAULT = _Guard(DEFAULT_STEP_TIMEOUT, None)


def _guard() -> _Guard:
    return _GUARD.get() or _DEFAULT


def guard_settings() -> tuple[float, EnvErrorLog | None]:
    """The current :func:`env_guard`'s step timeout and log (the defaults outside one):
    what a process sampling on the run's behalf guards its own env calls with."""
    g = _guard()
    return g.timeout, g.log


def env_error_count() -> int:
    """How many env errors the current :func:`env_guard`'s log has counted (0 outside one
    or without a log): compared before and after a rollout, whether envs failed in it."""
    log = _guard().log
    return log.count if log is not None else 0


_PHASE: ContextVar[str] = ContextVar("credo_env_phase", default="rollout")


@contextmanager
def env_guard(
    *, step_timeout: float | None = DEFAULT_STEP_TIMEOUT, log: EnvErrorLog | None = None
) -> Iterator[EnvErrorLog | None]:
    """Within this block env calls time out after ``step_timeout`` seconds (``None`` or 0:
    never) and env errors are recorded in ``log``; the log is flushed on the way out."""
    token = _GUARD.set(_Guard(float(step_timeout or 0.0), log))
    try:
        yield log
    finally:
        _GUARD.reset(token)
        if log is not None:
            log.flush()


@contextmanager
def env_phase(phase: str) -> Iterator[None]:
    """Env errors inside this block are recorded with ``phase``."""
    token = _PHASE.set(phase)
    try:
        yield
    finally:
        _PHASE.reset(token)


def current_phase() -> str:
    return _PHASE.get()


def _location(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``exc`` outside this module
    (a timeout is raised by this module's alarm handler inside the env's frame)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def record_env_error(
    exc: BaseException, *, task: str = "", turn: int = -1, call: str = "step"
) -> EnvErrorRecord:
    """Record ``exc`` (raised by an env) in the active log and return the record."""
    if isinstance(exc, EnvCallError):
        return exc.record
    record = EnvErrorRecord(
        task=task,
        turn=turn,
        phase=_PHASE.get(),
        call=call,
        message=f"{type(exc).__name__}: {exc}",
        location=_location(exc),
    )
    log = _guard().log
    if log is not None:
        log.add(record)
    return record


def _alarm(signum: int, frame: Any) -> None:
    raise StepTimeout("the env call did not return in time")


def env_call(fn: Callable[[], T], *, task: str = "", turn: int = -1, call: str = "step") -> T:
    """``fn()`` (a call into an env) under the guard: the value, or :class:`EnvCallError`
    after the error was recorded. :class:`EnvFailure` (a non-finite reward) is recorded
    and raised as it is: it stops the run."""
    timeout = _guard().timeout
    timed = (
        timeout > 0
        and threading.current_thread() is threading.main_thread()
        and hasattr(signal, "setitimer")
    )
    try:
        if not timed:
            return fn()
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    except EnvFailure as exc:  # recorded too, then it stops the run
        record_env_error(exc, task=task, turn=turn, call=call)
        raise
    except StepTimeout as exc:
        exc.args = (f"{call}() did not return within rollout.step_timeout={timeout:g} s",)
        raise EnvCallError(record_env_error(exc, task=task, turn=turn, call=call), exc) from exc
    except Exception as exc:
        raise EnvCallError(record_env_error(exc, task=task, turn=turn, call=call), exc) from exc


def check_observation(env: Any, obs: Any, call: str) -> str:
    """``obs`` if it is a ``str``; else :class:`TypeError` naming the env and the call."""
    if not isinstance(obs, str):
        raise TypeError(
            f"{type(env).__name__}.{call}() returned an observation of type "
            f"{type(obs).__name__} ({str(obs)[:60]!r}); observations must be str"
        )
    return obs


def check_step_result(env: Any, result: Any, *, task: str, turn: int) -> None:
    """Check what ``env.step`` returned: an observation ``str``, a finite number as the
    reward (:class:`EnvFailure` otherwise: it stops the run), a dict as ``info``."""
    name = type(env).__name__
    for attr in ("observation", "reward", "done", "info"):
        if not hasattr(result, attr):
            raise TypeError(f"{name}.step() returned a {type(result).__name__}, not a StepResult")
    check_observation(env, result.observation, "step")
    reward = result.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        try:
            reward = float(reward)
        except (TypeError, ValueError):
            raise TypeError(
                f"{name}.step() returned a reward of type {type(result.reward).__name__}; "
                "rewards must be numbers"
            ) from None
    if not math.isfinite(float(reward)):
        raise EnvFailure(
            f"the env {name} returned the reward {float(reward)} for task {task} at turn "
            f"{turn}; rewards must be finite numbers (this is the env's doing, not the "
            "estimator's)"
        )
    if not isinstance(result.info, dict):
        raise TypeError(
            f"{name}.step() returned info of type {type(result.info).__name__}; info must be a dict"
        )
