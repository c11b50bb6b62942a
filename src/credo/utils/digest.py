"""Content digests of a run's or a stage's outputs, recorded when they are made and checked
before they are trusted again.

A file that is the right type but not the right content (weights truncated and padded,
another run's weights copied over, a file edited by hand) loads without complaint and
silently changes what a resumed pipeline computes (a tampered stage policy took a
held-out success from 12.5 % to 0 %). :func:`digests` records each file's size and
SHA-256 under an output (a file or a whole folder); :func:`digest_problem` names the
first file that is missing, has another size or another content.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

__all__ = ["digest_problem", "digests", "file_sha256"]

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def digests(root: Path, outputs: list[str]) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes": n, "sha256": hex}}`` of every file under each of
    ``outputs`` (paths relative to ``root``: a file, or a folder taken recursively),
    sorted by path. Hidden files (temporary leftovers) are left out."""
    root = Path(root)
    out: dict[str, dict[str, Any]] = {}
    for name in outputs:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            rel = f.relative_to(root)
            if any(part.startswith(".") for part in rel.parts):
                continue
            out[rel.as_posix()] = {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
    return dict(sorted(out.items()))


def digest_problem(root: Path, recorded: dict[str, dict[str, Any]]) -> str | None:
    """The first way the files under ``root`` differ from ``recorded`` (:func:`digests`),
    as a phrase naming the file (``"policy/model.safetensors has 10 bytes, 4,096 were
    written"``), or ``None`` when every recorded file is there with its size and content."""
    root = Path(root)
    for rel, want in sorted(recorded.items()):
        path = root / rel
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{path} has {size:,} bytes, {want['bytes']:,} were written"
        if file_sha256(path) != want["sha256"]:
            return f"{path} was changed after it was written (its SHA-256 differs)"
    return None
