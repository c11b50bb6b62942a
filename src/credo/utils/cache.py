"""credo's cache folder (warm starts, converted models): one place, importable from anywhere."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """``$CREDO_CACHE``, else ``~/.cache/credo``."""
    return Path(os.environ.get("CREDO_CACHE", Path.home() / ".cache" / "credo"))
