"""Atomic file writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["temp_path", "write_text_atomic"]


def temp_path(path: Path) -> Path:
    """A fresh sibling of ``path`` to write into before renaming it into place (unique per
    process and call, so concurrent writers never share one)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


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
