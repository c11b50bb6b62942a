"""A reusable env fuzzer: random and adversarial action strings with a per-step time bound.

Any env that follows credo's protocol (:mod:`credo.envs.base`) can be fuzzed::

    from fuzz_util import FUZZ_ACTIONS, adversarial_actions, fuzz_batches, fuzz_env

    report = fuzz_env(lambda: make_env("mine"), adversarial_actions(["go", "take"]), seed=0)

    @fuzz_settings()
    @given(fuzz_batches(["go", "take"]))
    def run(batch):
        fuzz_env(lambda: make_env("mine"), batch.actions, seed=batch.seed)

:func:`fuzz_env` plays the actions in episodes of fresh tasks. Before each fuzz action it
may take a *guided* action (``oracle_action()`` or ``sample_action(rng)`` when the env has
them), so that fuzz actions reach every page, not just the first one. After every call
into the env it checks the protocol's promises:

- nothing raises (a bad action is an "invalid action" observation, never an exception);
- ``observation`` is a ``str`` of at most ``max_observation_chars`` characters;
- ``state_key()`` is a ``str`` of at most ``max_state_key_chars`` characters, and a
  snapshot taken before a step restores it (checked on a share of the steps);
- ``reward`` is a finite number, ``done`` a ``bool``, ``info`` a ``dict`` whose ``valid``
  (if any) is a ``bool``; ``progress()`` (if any) is in [0, 1];
- ``extract_action(text)`` (if any) returns ``None`` or a ``str``; ``is_tool_call``
  (if any) a ``bool``;
- each call (``step``, ``extract_action``, ``state_key``, ...) takes at most
  ``step_limit_s`` seconds of *CPU* time of the calling thread (:func:`time.thread_time`:
  other threads of the test process, a server's or a pool's, do not count; the garbage
  collector is paused during the call, since a full collection of the whole test process's
  heap, 0.2 s per 3 million objects here, is not the env's cost: a ``reset()`` that takes
  1 ms was once charged 0.67 s in the full suite), so a loaded machine does not fail the
  test while a super-linear parser still does; a call still running
  at twice the limit is interrupted (``SIGPROF``) and reported, so a hang fails the test
  instead of stalling it. The wall time is reported too.

Hypothesis draws the random actions (:func:`action_strategy`): unicode text (superscript
and other non-ASCII digits, control characters, lone surrogates, bidi marks), the env's
verbs with broken, empty and nested brackets, long runs of spaces and newlines, and at
most one huge (up to 1 MB) string per batch (:func:`fuzz_batches`).
:func:`adversarial_actions` is a fixed list of the same kinds, always played in full.

The number of actions is set by the environment variable ``CREDO_FUZZ_ACTIONS`` (default
10,000 per env and difficulty, :data:`FUZZ_ACTIONS`); :func:`fuzz_settings` turns it into
Hypothesis examples of :data:`BATCH` actions each.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from credo.envs.base import Task, restore_env, snapshot_env

__all__ = [
    "BATCH",
    "FUZZ_ACTIONS",
    "FuzzBatch",
    "FuzzReport",
    "action_strategy",
    "adversarial_actions",
    "fuzz_batches",
    "fuzz_env",
    "fuzz_settings",
    "random_action",
]

#: Fuzz actions per env and difficulty (``CREDO_FUZZ_ACTIONS``, default 10,000).
FUZZ_ACTIONS = int(os.environ.get("CREDO_FUZZ_ACTIONS", "10000"))
#: Actions per Hypothesis example, and how many of them Hypothesis draws itself.
BATCH = 200
DRAWN = 8

MB = 1_000_000

#: Characters that break naive parsers: non-ASCII digits (``"²".isdigit()`` is True but
#: ``int("²")`` raises), whitespace that ``str.split`` sees but ASCII code does not,
#: controls, bidi marks, a BOM, a lone surrogate (cannot be UTF-8 encoded), case-folding
#: oddities (``"İ".lower()`` has two characters, the Kelvin sign lowers to ``k``).
ODD_CHARS = (
    "²³¹⁰⁹",
    "١٢٣",
    "①",
    "𝟙𝟚",
    "Ⅻ",
    "\u00a0",
    "\u2003",
    "\u2028",
    "\u0085",
    "\x0b",
    "\x0c",
    "\r",
    "\t",
    "\n",
    "\x00",
    "\x1b[31m",
    "\x7f",
    "\u202e",
    "\u200b",
    "\ufeff",
    "\ud800",
    "İ",
    "K",
    "ß",
    "ﬀ",
    "🛒",
    "\\",
    '"',
    "'",
    "(",
    ")",
    "{",
    "}",
    "<",
    ">",
    "*",
    "+",
    "?",
    ".*",
    "$",
    "^",
    "|",
)
#: Argument names and values for ``name{json}`` actions: the names envs use, JSON that
#: ``json.loads`` accepts but a careless env may not (NaN, 1e309, huge integers, floats,
#: booleans, nulls, nesting), and almost-JSON.
JSON_KEYS = ("order_id", "customer_id", "amount", "variant_id", "name", "message", "", "x")
JSON_VALUES = (
    "1",
    "-1",
    "0",
    "1.0",
    "1e309",
    "-1e309",
    "NaN",
    "Infinity",
    "9" * 400,
    "true",
    "null",
    '"1"',
    '"²"',
    '"\\ud800"',
    '"\\u0000"',
    "[1]",
    "{}",
    '{"a": 1}',
    "[" * 400 + "]" * 400,
    "'1'",
    "01",
    "0x1",
    "1_000",
    '"' + "x" * 600 + '"',
)
#: Text pieces long runs are made of (regex-hostile runs of spaces, brackets, digits).
RUN_PIECES = (" ", "\n", "\t", " \n", "[", "]", "[]", "][", "a ", "9", "x", "²", "\x00")


def adversarial_actions(verbs: Sequence[str]) -> list[str]:
    """A fixed list of hostile actions for an env whose actions start with ``verbs``
    (bracketed ``verb[arg]`` forms are tried for every verb).

    Includes empty and whitespace-only strings, 1 MB strings (spaces, newlines, brackets,
    digits, letters, a verb with a 1 MB argument), runs of 8,000 spaces after an opening
    bracket (the pattern that made a backtracking regex cubic), nested and broken
    brackets, non-ASCII digits, control characters and lone surrogates.
    """
    fixed = [
        "",
        " ",
        "\n",
        "\x00",
        "[]",
        "[",
        "]",
        "][",
        "[[[]]]",
        "\ud800",
        "\x1b[2J",
        "\u202eyub",
        "action:",
        "Action: \n",
        "x" * MB,
        " " * MB,
        "\n" * MB,
        "[" * MB,
        "]" * MB,
        "[" * (MB // 2) + "]" * (MB // 2),
        "9" * MB,
        " \n" * (MB // 2),
        "a " * (MB // 2),
        "²" * MB,
    ]
    for v in verbs:
        fixed += [
            v,
            v.upper(),
            f" {v} ",
            f"{v}\n",
            f"{v}\x00",
            f"{v} {v}",
            f"{v}[",
            f"{v}]",
            f"{v}[]",
            f"{v}[ ]",
            f"{v}[[]]",
            f"{v}[]]",
            f"{v}[[]",
            f"{v}][",
            f"{v}[{v}[{v}[1]]]",
            f"{v}[" * 1000 + "]" * 1000,
            f"{v}[1][2]",
            f"{v}[1]x",
            f"x{v}[1]",
            f"{v}[\n1]",
            f"{v}[1\n2]",
            f"{v}[²]",
            f"{v}[¹]",
            f"{v}[١]",
            f"{v}[①]",
            f"{v}[𝟙]",
            f"{v}[-1]",
            f"{v}[0]",
            f"{v}[1.5]",
            f"{v}[1e9]",
            f"{v}[0x1]",
            f"{v}[ 1 ]",
            f"{v}[" + "9" * 5000 + "]",
            f"{v}[" + "0" * 900 + "1]",
            f"{v}[\u00a01\u00a0]",
            f"{v}[\ud800]",
            f"{v}[\x00]",
            f"{v}[" + " " * 8000,
            f"{v}[" + " " * 8000 + "x",
            f"{v}[" + " " * MB,
            f"{v}[" + " " * MB + "]",
            f"{v}[" + "\t" * MB + "x]",
            f"{v}" + " " * MB + "[1]",
            f"{v}[" + "a " * (MB // 2) + "]",
            f"{v}[" + "x" * MB + "]",
            f"{v}[" + "[" * 10_000 + "]",
            (f"{v}[" + " " * 1000) * 100,
            f"I will {v}[1] now\n" * 1000,
            f"{v}{{}}",
            f"{v}{{",
            f"{v}}}",
            f"{v}{{{{}}}}",
            f"{v}{{" + " " * MB,
            f"{v}{{" + " " * MB + "}",
            f'{v}{{"message": "' + "x" * MB + '"}',
            f'{v}{{"order_id": ' + "[" * 480 + "]" * 480 + "}",
            f'{v}{{"order_id": ' + "[" * 100_000 + "]" * 100_000 + "}",
            f'{v}{{"order_id": ' + "9" * 900 + "}",
            f'{v}{{"order_id": ' + "9" * 5000 + "}",
            *(f'{v}{{"{JSON_KEYS[i % 6]}": {x}}}' for i, x in enumerate(JSON_VALUES)),
            f'{v} {{ "order_id" : 1 , "order_id" : 2 }}',
            f'{v}{{"order_id": 1}} {v}{{"order_id": 2}}',
            f'{v}{{"order_id": 1}}' + "}" * 1000,
        ]
    return fixed


def action_strategy(verbs: Sequence[str]) -> st.SearchStrategy[str]:
    """One random action (never huge; see :func:`fuzz_batches` for those).

    A mix of arbitrary unicode text, odd characters, and ``verb[arg]`` forms of the
    env's ``verbs`` with random padding, case, missing/doubled/nested brackets and odd
    arguments (non-ASCII digits, numbers, runs of spaces).
    """
    odd = st.sampled_from(ODD_CHARS)
    bit = st.one_of(st.text(max_size=4), odd, st.sampled_from(list(verbs)))
    pad = st.sampled_from(["", " ", "  ", "\n", "\t", "\u00a0", " " * 50, "\n" * 30])
    opens = st.sampled_from(["[", "", "[[", "(", "[ ", "{", "{ "])
    closes = st.sampled_from(["]", "", "]]", ")", " ]", "] x", "}", " }"])
    json_arg = st.builds(
        lambda k, v: f'"{k}": {v}', st.sampled_from(JSON_KEYS), st.sampled_from(JSON_VALUES)
    )
    arg = st.one_of(
        st.text(max_size=12),
        json_arg,
        st.integers(-10, 10**6).map(str),
        st.lists(bit, max_size=6).map(" ".join),
        st.builds(lambda p, n: p * n, st.sampled_from(RUN_PIECES), st.integers(0, 300)),
    )
    verb = st.sampled_from(list(verbs)).flatmap(
        lambda v: st.sampled_from([v, v.upper(), v.title(), v[:-1], v + v[-1]])
    )
    bracketed = st.builds(
        lambda a, v, b, o, x, c, d: f"{a}{v}{b}{o}{x}{c}{d}",
        pad,
        verb,
        pad,
        opens,
        arg,
        closes,
        pad,
    )
    return st.one_of(
        bracketed,
        bracketed,
        st.lists(bit, max_size=8).map("".join),
        st.text(max_size=30),
        st.builds(lambda p, n: p * n, st.sampled_from(RUN_PIECES), st.integers(0, 2000)),
    )


def random_action(rng: random.Random, verbs: Sequence[str], base: Sequence[str] = ()) -> str:
    """One hostile action from ``rng`` alone (fast: no Hypothesis draw).

    Kinds, equally likely: a ``verb[arg]`` form with random padding, case and brackets;
    random code points (surrogates and controls included); a run of a hostile piece (up
    to 1,200 characters); a splice of two ``base`` actions; a ``base`` action with an odd
    character inserted (the last two fall back to the first kinds without ``base``).
    """
    kind = rng.randrange(5 if base else 3)
    if kind == 0:
        v = rng.choice(verbs)
        v = rng.choice([v, v.upper(), v.title(), v[:-1], v + v[-1], f"{v} {v}"])
        pads = ["", "", " ", "\n", "\t", "\u00a0", " " * rng.randrange(200)]
        arg = rng.choice(
            [
                str(rng.randrange(-10, 10 ** rng.randrange(1, 12))),
                "".join(rng.choice(ODD_CHARS) for _ in range(rng.randrange(1, 5))),
                "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(8))),
                rng.choice(RUN_PIECES) * rng.randrange(300),
                " ".join(rng.choice(verbs) for _ in range(rng.randrange(4))),
            ]
        )
        if rng.random() < 0.3:  # name{json}
            key = rng.choice(JSON_KEYS)
            value = rng.choice([*JSON_VALUES, json.dumps(arg), arg])
            arg = rng.choice([f'"{key}": {value}', f'"{key}": {value}, "{key}": 1', value])
            opens, closes = ["{", "{", "", "{{", "{ "], ["}", "}", "", "}}", " }", "} x"]
        else:
            opens, closes = ["[", "[", "", "[[", "(", "[ "], ["]", "]", "", "]]", ")", " ]", "] x"]
        return (
            rng.choice(pads)
            + v
            + rng.choice(pads)
            + rng.choice(opens)
            + arg
            + rng.choice(closes)
            + rng.choice(pads)
        )
    if kind == 1:
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(24)))
    if kind == 2:
        return rng.choice(RUN_PIECES) * rng.randrange(1200)
    a, b = rng.choice(base), rng.choice(base)
    if kind == 3:
        return a[: rng.randrange(len(a) + 1)] + b[rng.randrange(len(b) + 1) :]
    i = rng.randrange(len(a) + 1)
    return a[:i] + rng.choice(ODD_CHARS) + a[i:]


@dataclass(frozen=True)
class FuzzBatch:
    """One Hypothesis example: the drawn actions, expanded to ``size`` ``actions``.

    ``actions`` holds each ``base`` action and ``huge`` (if any) once, and the rest from
    :func:`random_action` (with the env's ``verbs``, splicing and mutating ``base``)
    seeded with ``seed``, which also seeds tasks and guided moves. Hypothesis draws (and
    shrinks) ``base``, ``huge`` and ``seed``; the expansion keeps the cost of a
    Hypothesis draw off most of the actions.
    """

    base: tuple[str, ...]
    huge: str | None
    seed: int
    size: int
    verbs: tuple[str, ...]

    @functools.cached_property
    def actions(self) -> list[str]:
        rng = random.Random(self.seed)
        drawn = [*self.base, *([self.huge] if self.huge is not None else [])]
        out = [random_action(rng, self.verbs, self.base) for _ in range(self.size - len(drawn))]
        for a in drawn:  # each drawn action once, at a random place
            out.insert(rng.randrange(len(out) + 1), a)
        return out


def fuzz_batches(
    verbs: Sequence[str], size: int = BATCH, drawn: int = DRAWN
) -> st.SearchStrategy[FuzzBatch]:
    """Batches of ``size`` actions: up to ``drawn`` from :func:`action_strategy`, in half
    of the batches one huge action (a run of a hostile piece of 10 kB to 1 MB, bare or as
    a verb's argument), the rest from :func:`random_action`."""
    verbs = tuple(verbs)
    huge = st.builds(
        lambda v, p, n, wrap: f"{v}[{p * (n // len(p))}]" if wrap else p * (n // len(p)),
        st.sampled_from(verbs),
        st.sampled_from(RUN_PIECES),
        st.sampled_from([10_000, 100_000, MB]),
        st.booleans(),
    )
    return st.builds(
        lambda base, big, seed: FuzzBatch(tuple(base), big, seed, size, verbs),
        st.lists(action_strategy(verbs), min_size=1, max_size=drawn),
        st.one_of(st.none(), huge),
        st.integers(0, 2**31 - 1),
    )


def fuzz_settings(n_actions: int = FUZZ_ACTIONS, batch: int = BATCH) -> settings:
    """Hypothesis settings for ``n_actions`` actions in batches of ``batch``: no deadline
    (:func:`fuzz_env` bounds each step itself), no too-slow health checks."""
    return settings(
        max_examples=max(1, math.ceil(n_actions / batch)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


@dataclass
class FuzzReport:
    """What :func:`fuzz_env` did: counts, and the worst per-call times (seconds)."""

    actions: int = 0
    steps: int = 0
    episodes: int = 0
    invalid: int = 0
    max_cpu_s: float = 0.0
    max_wall_s: float = 0.0
    slowest: str = ""
    max_observation_chars: int = 0
    max_state_key_chars: int = 0
    restores: int = 0
    seen_states: set[str] = field(default_factory=set, repr=False)

    def merge(self, other: FuzzReport) -> None:
        """Add ``other``'s counts and keep the worst of both."""
        for name in ("actions", "steps", "episodes", "invalid", "restores"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.max_cpu_s > self.max_cpu_s:
            self.max_cpu_s, self.slowest = other.max_cpu_s, other.slowest
        self.max_wall_s = max(self.max_wall_s, other.max_wall_s)
        self.max_observation_chars = max(self.max_observation_chars, other.max_observation_chars)
        self.max_state_key_chars = max(self.max_state_key_chars, other.max_state_key_chars)
        self.seen_states |= other.seen_states


class _Overrun(BaseException):
    """Raised inside a call into the env that ran past its CPU deadline (a
    ``BaseException``, so that an env's ``except Exception`` does not swallow it)."""


@contextlib.contextmanager
def _cpu_alarm() -> Iterator[Callable[[float], None]]:
    """Install a ``SIGPROF`` handler that raises :class:`_Overrun`; yields ``arm(seconds)``,
    which interrupts the running code after ``seconds`` of process CPU time (``arm(0)``
    disarms). Python's regex engine checks for signals while it backtracks, so a
    super-linear parser fails the test instead of hanging it. Off the main thread or
    without ``setitimer`` (Windows), ``arm`` does nothing."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield lambda seconds: None
        return

    def overrun(signum: int, frame: Any) -> None:
        raise _Overrun

    previous = signal.signal(signal.SIGPROF, overrun)
    setitimer, which = signal.setitimer, signal.ITIMER_PROF
    try:
        yield lambda seconds: setitimer(which, seconds)
    finally:
        setitimer(which, 0)
        signal.signal(signal.SIGPROF, previous)


def _show(text: str, n: int = 60) -> str:
    """A short, printable form of an action for messages."""
    return repr(text) if len(text) <= n else f"{text[:n]!r}... ({len(text):,} chars)"


def fuzz_env(
    make_env: Callable[[], Any],
    actions: Sequence[str],
    *,
    seed: int = 0,
    guide: float = 0.5,
    step_limit_s: float = 0.5,
    max_observation_chars: int = 8192,
    max_state_key_chars: int = 8192,
    restore_share: float = 0.1,
    new_task_share: float = 0.05,
    extract: bool = True,
    report: FuzzReport | None = None,
) -> FuzzReport:
    """Play ``actions`` in ``make_env()`` and check the env protocol after every call.

    Args:
        make_env: builds a fresh env.
        actions: the fuzz actions, each played once (through ``extract_action`` too,
            when the env has it).
        seed: seeds the tasks (``Task.make("train", k)``) and the guided moves.
        guide: probability of a guided move (``oracle_action`` 70 %, else
            ``sample_action``) before each fuzz action, to reach deeper pages.
        step_limit_s: CPU-time bound on each call into the env.
        max_observation_chars, max_state_key_chars: size bounds.
        restore_share: share of steps checked to be undone exactly by
            ``restore_env(snapshot_env(...))``.
        new_task_share: share of episodes started with ``reset`` on a new task; the
            others restore the snapshot taken after the last ``reset`` (tasks can be
            costly to generate, and restoring is part of the protocol too).
        extract: also call ``extract_action`` and ``is_tool_call`` (when the env has
            them) on each action; they do not depend on the env's state, so callers that
            play one list on many states may check them once.
        report: a report to add to (default: a new one).

    Returns:
        The :class:`FuzzReport`.

    Raises:
        AssertionError: naming the action, the call and what went wrong.
    """
    rep = report if report is not None else FuzzReport()
    rng = random.Random(seed)
    env = make_env()
    where = f"{type(env).__name__} (seed {seed})"

    def timed(what: str, action: str, fn: Callable[[], Any]) -> Any:
        collecting = gc.isenabled()
        gc.disable()  # a collection of the whole test process's heap is not the env's cost
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            arm(2 * step_limit_s)
            try:
                out = fn()
            finally:
                arm(0)
                if collecting:
                    gc.enable()
        except _Overrun:
            raise AssertionError(
                f"{where}: {what} was stopped after {2 * step_limit_s} s CPU (limit "
                f"{step_limit_s} s) on {_show(action)}"
            ) from None
        except Exception as exc:
            raise AssertionError(
                f"{where}: {what} raised {type(exc).__name__}: {exc} (action {_show(action)})"
            ) from exc
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        if cpu > rep.max_cpu_s:
            rep.max_cpu_s, rep.slowest = cpu, f"{what} on {_show(action, 30)}"
        rep.max_wall_s = max(rep.max_wall_s, wall)
        assert cpu <= step_limit_s, (
            f"{where}: {what} took {cpu:.3f} s CPU (limit {step_limit_s} s) on {_show(action)}"
        )
        return out

    def check_state(action: str) -> str:
        key = timed("state_key()", action, env.state_key)
        assert isinstance(key, str), f"{where}: state_key() returned a {type(key).__name__}"
        assert len(key) <= max_state_key_chars, (
            f"{where}: state_key() has {len(key):,} characters (limit "
            f"{max_state_key_chars:,}) after {_show(action)}"
        )
        rep.max_state_key_chars = max(rep.max_state_key_chars, len(key))
        if len(rep.seen_states) < 10_000:
            rep.seen_states.add(key)
        if hasattr(env, "progress"):
            prog = env.progress()
            assert 0.0 <= float(prog) <= 1.0, f"{where}: progress() = {prog} after {_show(action)}"
        return key

    def check_observation(obs: Any, what: str, action: str) -> None:
        assert isinstance(obs, str), f"{where}: {what} returned a {type(obs).__name__} observation"
        assert len(obs) <= max_observation_chars, (
            f"{where}: {what} returned {len(obs):,} characters (limit "
            f"{max_observation_chars:,}) for {_show(action)}"
        )
        rep.max_observation_chars = max(rep.max_observation_chars, len(obs))

    start: list[Any] = []  # the snapshot taken after the last reset

    def new_episode() -> None:
        rep.episodes += 1
        if start and rng.random() >= new_task_share:
            timed("restore()", "<episode start>", lambda: restore_env(env, start[0]))
            check_state("<episode start>")
            return
        task = Task.make("train", rng.randrange(1_000_000))
        obs = timed("reset()", f"<reset {task.id}>", lambda: env.reset(task, 0))
        check_observation(obs, "reset()", "<reset>")
        check_state("<reset>")
        start[:] = [timed("snapshot()", "<reset>", lambda: snapshot_env(env))]

    def step(action: str) -> bool:
        """One checked step; True if the episode ended (the env is then reset)."""
        check = rng.random() < restore_share
        if check:
            snap, before = snapshot_env(env), env.state_key()
        res = timed("step()", action, lambda: env.step(action))
        rep.steps += 1
        check_observation(res.observation, "step()", action)
        reward = res.reward
        assert isinstance(reward, (int, float)) and not isinstance(reward, bool), (
            f"{where}: reward {reward!r} is not a number after {_show(action)}"
        )
        assert math.isfinite(reward), f"{where}: reward {reward} after {_show(action)}"
        assert isinstance(res.done, bool), f"{where}: done {res.done!r} is not a bool"
        assert isinstance(res.info, dict), f"{where}: info is a {type(res.info).__name__}"
        valid = res.info.get("valid", True)
        assert isinstance(valid, bool), f"{where}: info['valid'] = {valid!r}"
        rep.invalid += not valid
        check_state(action)
        if check:
            rep.restores += 1
            timed("restore()", action, lambda: restore_env(env, snap))
            assert env.state_key() == before, (
                f"{where}: restoring the snapshot taken before {_show(action)} gave state "
                f"{env.state_key()!r}, not {before!r}"
            )
            res2 = timed("step() after restore", action, lambda: env.step(action))
            assert res2.observation == res.observation and res2.done == res.done, (
                f"{where}: replaying {_show(action)} after a restore answered differently"
            )
        if res.done:
            new_episode()
        return bool(res.done)

    def guided() -> str | None:
        if hasattr(env, "oracle_action") and (
            rng.random() < 0.7 or not hasattr(env, "sample_action")
        ):
            return env.oracle_action()
        if hasattr(env, "sample_action"):
            return env.sample_action(rng)
        return None

    def play(action: str) -> None:
        if rng.random() < guide:
            move = timed("guided move", "<oracle/sample>", guided)
            if move is not None:
                step(move)
        rep.actions += 1
        if extract and hasattr(env, "extract_action"):
            found = timed("extract_action()", action, functools.partial(env.extract_action, action))
            assert found is None or isinstance(found, str), (
                f"{where}: extract_action() returned a {type(found).__name__}"
            )
        if extract and hasattr(env, "is_tool_call"):
            tool = timed("is_tool_call()", action, functools.partial(env.is_tool_call, action))
            assert isinstance(tool, bool), f"{where}: is_tool_call() returned {tool!r}"
        step(action)

    with _cpu_alarm() as arm:
        new_episode()
        for action in actions:
            play(action)
    return rep
