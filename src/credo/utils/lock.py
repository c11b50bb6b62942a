"""The run-folder lock: one process at a time works in a run folder.

:class:`RunLock` holds an exclusive ``flock`` on ``<folder>/.lock`` for as long as the run
lives; the file records the holder's pid, host and start time. The kernel drops the lock
when its process dies however it dies (``kill -9`` included), so a lock file left by a
dead process is *stale*: the next run finds the pid it names no longer running, says so
and takes the lock over. A second process that finds the lock held by a live one stops
at once with :class:`RunLocked`, naming that process.

The file is never deleted (deleting a lock file lets two processes lock two different
files of the same name); releasing empties it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

__all__ = ["RunLock", "RunLocked", "pid_alive"]

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


class RunLocked(FileExistsError):
    """The run folder is in use by another live process."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """An exclusive lock on a run folder (see the module docstring).

    Args:
        folder: the run folder (must exist).

    Attributes:
        stale: what the lock file said when a dead process's lock was taken over
            (``None`` when there was none).
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / ".lock"
        self._fd: int | None = None
        self.stale: dict[str, Any] | None = None

    def _holder(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            return {}

    def acquire(self) -> RunLock:
        """Take the lock, or raise :class:`RunLocked` naming the live process holding it.

        A lock file naming a process that no longer runs is taken over (recorded in
        :attr:`stale`)."""
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    holder = self._holder()
                    raise RunLocked(self._message(holder)) from None
            else:  # no flock: trust a live pid in the file
                holder = self._holder()
                if holder.get("pid") and pid_alive(int(holder["pid"])):
                    raise RunLocked(self._message(holder))
        except BaseException:
            os.close(fd)
            raise
        previous = self._holder()
        if previous.get("pid") and previous.get("pid") != os.getpid():
            self.stale = previous
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def _message(self, holder: dict[str, Any]) -> str:
        folder = self.path.parent
        who = f"process {holder.get('pid', '?')}"
        if holder.get("host") and holder.get("host") != socket.gethostname():
            who += f" on {holder['host']}"
        since = holder.get("started")
        when = (
            f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}" if since else ""
        )
        return (
            f"{folder} is in use by {who}{when}: one run at a time per run folder "
            "(wait for it to end, stop it, or pick another train.name)"
        )

    def release(self) -> None:
        """Give the lock up (the file stays, emptied)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
