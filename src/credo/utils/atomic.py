"""Atomic writes: a reader (or a crash) never sees a half-written file or folder.

Everything is written under a hidden temporary sibling name (:func:`temp_path`:
``.NAME.PID.RANDOM.tmp``) and renamed into place, which is atomic on one file system. A
kill leaves at most such a hidden sibling; :func:`remove_leftovers` deletes the ones whose
writer is no longer running.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "remove_leftovers",
    "replace_dir",
    "temp_path",
    "write_file_atomic",
    "write_text_atomic",
]

#: ``.NAME.PID.RANDOM.tmp`` (:func:`temp_path`) and ``.NAME.PID.RANDOM.old`` (the folder
#: :func:`replace_dir` renamed aside), capturing NAME and PID.
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.(?:tmp|old)")


def temp_path(path: Path, suffix: str = "tmp") -> Path:
    """A fresh sibling of ``path`` to write into before renaming it into place (unique per
    process and call, so concurrent writers never share one)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.{suffix}")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` by writing a temporary sibling, flushing it to disk and
    renaming it over ``path``."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with tmp.open("w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_file_atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """Make the file ``path`` by ``write(tmp)`` into a temporary sibling, then renaming it
    over ``path`` (for writers that take a path, e.g. ``fig.savefig``; the temporary name
    does not end in ``path``'s suffix, so pass the format explicitly)."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def replace_dir(final: Path, write: Callable[[Path], None]) -> Path:
    """Make the folder ``final`` by ``write(tmp)`` into a hidden temporary sibling (``write``
    creates it, as ``policy.save`` does), then renaming it into place. An existing
    ``final`` is renamed aside first and deleted once the new one is in place, so a kill
    at any point leaves either the old complete folder, the new complete folder, or no
    folder and hidden leftovers (:func:`remove_leftovers`) — never a half-written one."""
    final = Path(final)
    tmp = temp_path(final)
    aside: Path | None = None
    try:
        write(tmp)
        if final.exists():
            aside = temp_path(final, "old")
            os.replace(final, aside)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return final


def remove_leftovers(folder: Path, names: tuple[str, ...] | None = None) -> list[str]:
    """Delete the hidden temporary siblings (:func:`temp_path`) in ``folder`` whose
    writer is no longer running, for the given ``names`` (default: every name).
    Returns the names deleted. A live writer's (another process, or another thread of
    this one, still writing into a shared folder such as the warm-start cache) are kept."""
    from credo.utils.lock import pid_alive

    removed = []
    for p in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        m = _LEFTOVER.fullmatch(p.name)
        if m is None or (names is not None and m.group("name") not in names):
            continue
        if pid_alive(int(m.group("pid"))):  # this process too: another thread may be writing
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p.name)
    return removed
