"""Writes the machine refuses: a full disk, a quota, a read-only or unwritable folder.

These are not credo's faults nor the user's input, and nothing is lost by them (every
file is written by temp-and-rename, so a refused write leaves the last complete
checkpoint as it was). What the user needs is one line saying which file could not be
written, why, and what to do, not a traceback: :func:`storage_problem` recognises such an
error (an ``OSError`` with one of :data:`STORAGE_ERRNOS`, or a safetensors or other
library error that wraps one) and :class:`StorageError` carries the line.
"""

from __future__ import annotations

import errno
import os
import re

__all__ = ["STORAGE_ERRNOS", "StorageError", "storage_fix", "storage_problem"]

#: errno → what it means for the user.
STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is larger than this process may write",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}

#: ``(os error 28)``: how Rust libraries (safetensors, tokenizers) report an OS error.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class StorageError(OSError):
    """A write the machine refused; ``str()`` is the one line for the user."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _code(exc: BaseException) -> tuple[int, str | None] | None:
    """``(errno, file name or None)`` when ``exc`` is a refused write."""
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        name = exc.filename if isinstance(exc.filename, (str, bytes, os.PathLike)) else None
        return exc.errno, os.fsdecode(name) if name is not None else None
    m = _RUST_OS_ERROR.search(str(exc))
    if m and int(m.group(1)) in STORAGE_ERRNOS:
        return int(m.group(1)), None
    return None


def storage_problem(exc: BaseException) -> tuple[int, str] | None:
    """``(errno, "FILE: why")`` (``"why"`` when the file is not known) when ``exc`` (or an
    exception it was raised from) is a write the machine refused, else ``None``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, StorageError) and cur.__cause__ is not None:
            cur = cur.__cause__  # the error it was made from names the file
            continue
        found = _code(cur)
        if found is not None:
            code, name = found
            why = f"{STORAGE_ERRNOS[code]} ({os.strerror(code)})"
            return code, f"{name}: {why}" if name else why
        cur = cur.__cause__ or cur.__context__
    return None


def storage_fix(code: int, folder: str | os.PathLike[str]) -> str:
    """What to do about refused write ``code`` in ``folder``, as an imperative phrase."""
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "free some space"
    if code == errno.EFBIG:
        return "raise the file-size limit (ulimit -f)"
    return f"make {os.fspath(folder)} writable"
