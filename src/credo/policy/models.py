"""Resolving ``--model``: a local folder, a hub name, or a credo alias."""

from __future__ import annotations

from pathlib import Path

__all__ = ["MODEL_ALIASES", "resolve_model"]

#: Aliases that credo knows how to materialise offline (see issue: real LMs).
MODEL_ALIASES: dict[str, str] = {}


def resolve_model(name: str) -> str:
    """A local folder as is; an alias via its provider; anything else as a hub name
    (``from_pretrained`` then needs the weights in the HF cache or a reachable hub)."""
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if name in MODEL_ALIASES:
        return MODEL_ALIASES[name]
    return name
