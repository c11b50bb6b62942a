"""The terminal display (rich): phases with a bar, the training bar, and Ctrl-C/SIGTERM
handling."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

__all__ = ["STOP_SIGNALS", "Progress", "StopOnInterrupt", "interrupt_on_term"]


#: The signals a run treats as "stop": Ctrl-C, and what schedulers and containers send.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnInterrupt:
    """First Ctrl-C (or SIGTERM): ask the loop to stop after the current iteration (it
    checkpoints); a second one: raise ``KeyboardInterrupt`` at once.

    Args:
        say: prints the one-line notice (default: standard error).
    """

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.requested = False
        self._say = say or (lambda m: print(m, file=sys.stderr, flush=True))
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        self._say(
            f"\n{name}: finishing this iteration and saving a checkpoint "
            "(press Ctrl-C again to stop at once)"
        )

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


@contextmanager
def interrupt_on_term() -> Iterator[None]:
    """Within this block SIGTERM raises ``KeyboardInterrupt`` like Ctrl-C does (set-up,
    warm start, final evaluation: there is no iteration to finish)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class _Bar:
    def __init__(self, progress: RichProgress | None, task: Any) -> None:
        self._p, self._t = progress, task

    def update(self, completed: int, record: dict[str, Any]) -> None:
        if self._p is None:
            return
        loss = record.get("loss/total", float("nan"))
        stats = (
            f"success {record['rollout/success_rate']:.2f}  loss {loss:+.4f}  "
            f"{record['perf/env_steps_per_s']:.0f} env steps/s  "
            f"{record['perf/gen_tokens_per_s']:.0f} tok/s"
        )
        self._p.update(self._t, completed=completed, stats=stats)


class Progress:
    """Live display for a run; ``enabled=False`` prints nothing (tests)."""

    def __init__(self, *, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)

    def say(self, message: str) -> None:
        if self.enabled:
            self.console.print(message)

    def warn(self, message: str) -> None:
        """Print ``message`` even when the display is off (``--quiet``): errors, the
        resume hint. Plain text (no markup), one line."""
        if self.enabled:
            self.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=sys.stderr, flush=True)

    def _progress(self) -> RichProgress:
        return RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )

    @contextmanager
    def phase(self, description: str) -> Iterator[Callable[[int, int, str], None]]:
        """A setup phase; yields ``tick(done, total, stats)`` to move its bar."""
        if not self.enabled:
            yield lambda done, total, stats="": None
            return
        with self._progress() as p:
            task = p.add_task(description, total=None, stats="")

            def tick(done: int, total: int, stats: str = "") -> None:
                p.update(task, completed=done, total=total, stats=stats)

            yield tick

    @contextmanager
    def training(self, total: int, start: int) -> Iterator[_Bar]:
        if not self.enabled:
            yield _Bar(None, None)
            return
        with self._progress() as p:
            task = p.add_task("RL", total=total, completed=start, stats="")
            yield _Bar(p, task)
