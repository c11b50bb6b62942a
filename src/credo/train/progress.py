"""The terminal display (rich): phases with a bar, the training bar, and Ctrl-C handling."""

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

__all__ = ["Progress", "StopOnInterrupt"]


class StopOnInterrupt:
    """First Ctrl-C: ask the loop to stop after the current iteration (it checkpoints);
    a second Ctrl-C: raise ``KeyboardInterrupt`` at once."""

    def __init__(self) -> None:
        self.requested = False
        self._old: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nCtrl-C: finishing this iteration and saving a checkpoint "
            "(press Ctrl-C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


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
