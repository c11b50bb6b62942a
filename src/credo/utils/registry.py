"""A tiny name → function registry with helpful errors (used by credit, objectives, envs)."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "check_kwargs", "unknown_name_message"]

T = TypeVar("T")


def unknown_name_message(kind: str, name: str, valid: Iterable[str]) -> str:
    """``unknown estimator 'gipo'. Did you mean 'gigpo'? Valid: grpo, gigpo, ...``"""
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}.{hint} Valid {kind} names: {', '.join(valid)}"


class Registry(Generic[T]):
    """Maps names to objects; ``get`` raises a ``KeyError`` that lists the valid names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            self._meta[name] = meta
            return obj

        return deco

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and notebooks that register a part of their own)."""
        self.get(name)
        del self._items[name], self._meta[name]

    def get(self, name: str) -> T:
        if name not in self._items:
            raise KeyError(unknown_name_message(self.kind, name, self._items))
        return self._items[name]

    def meta(self, name: str) -> dict[str, Any]:
        self.get(name)
        return self._meta[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def registered(self) -> list[str]:
        """The names in the order they registered (for registries whose order matters)."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


def check_kwargs(
    kind: str,
    name: str,
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    *,
    reserved: Iterable[str] = (),
) -> None:
    """Raise ``ValueError`` if ``kwargs`` has a key that ``fn`` does not accept.

    ``reserved`` lists parameters the caller supplies itself (e.g. ``forest``): a user
    may not set them, and they are not shown as settable.
    """
    sig = inspect.signature(fn)
    reserved = set(reserved)
    settable = [
        p.name
        for p in sig.parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in reserved
    ]
    bad = [k for k in kwargs if k not in settable]
    if bad:
        raise ValueError(
            f"{kind} {name!r} has no parameter(s) {', '.join(map(repr, bad))}. "
            f"Accepted: {', '.join(settable) or '(none)'}"
        )
