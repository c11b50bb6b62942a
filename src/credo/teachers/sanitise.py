"""Sanitisers: strip the answer from a verified trajectory before a teacher reads it.

MT-SDPO's teacher context ``c*`` is a trajectory of the same task that the verifier
accepted; shown verbatim it would let the teacher copy the answer rather than teach the
approach. A sanitiser maps the trajectory's actions to the text the teacher reads
(``fn(actions, **knobs) -> str``), registered by name (``teacher.sanitiser``):

- ``none``: every action, joined by ``" ; "``.
- ``drop_final``: all but the last ``n`` actions (default 1: the final answer).
- ``shop``: the ``shop`` env's answer is which item to open, which size to choose and
  the purchase; this keeps only its searches (the query words: the approach) and drops
  every ``click[...]``, ``choose[...]``, ``buy`` and ``back``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from credo.utils.registry import Registry, check_kwargs

__all__ = ["SANITISERS", "register_sanitiser", "sanitise"]

Sanitiser = Callable[..., str]
SANITISERS: Registry[Sanitiser] = Registry("sanitiser")
SEPARATOR = " ; "


def register_sanitiser(name: str) -> Callable[[Sanitiser], Sanitiser]:
    """Decorator: ``fn(actions: Sequence[str], **knobs) -> str`` as ``teacher.sanitiser``."""
    return SANITISERS.register(name)


def sanitise(name: str, actions: Sequence[str], **params: Any) -> str:
    """Apply sanitiser ``name`` to a trajectory's ``actions``."""
    fn = SANITISERS.get(name)
    check_kwargs("sanitiser", name, fn, params, reserved=("actions",))
    return fn(list(actions), **params)


def _join(actions: Sequence[str]) -> str:
    return SEPARATOR.join(a.strip() for a in actions if a.strip())


@register_sanitiser("none")
def keep_all(actions: Sequence[str]) -> str:
    """Every action, joined by ``" ; "``."""
    return _join(actions)


@register_sanitiser("drop_final")
def drop_final(actions: Sequence[str], *, n: int = 1) -> str:
    """All but the last ``n`` actions (``n ≥ 0``; default 1)."""
    if n < 0:
        raise ValueError(f"sanitiser drop_final: n must be >= 0, got {n}")
    return _join(actions[: len(actions) - n] if n else actions)


_SHOP_SEARCH = re.compile(r"^\s*search\s*\[.*\]\s*$", re.IGNORECASE | re.DOTALL)


@register_sanitiser("shop")
def shop_searches(actions: Sequence[str]) -> str:
    """Only the ``search[...]`` actions (the approach), never the item, size or purchase."""
    return _join([a for a in actions if _SHOP_SEARCH.match(a)])


def validate_sanitiser(name: str, params: Mapping[str, Any]) -> None:
    """Raise for an unknown sanitiser or a knob it does not take."""
    check_kwargs("sanitiser", name, SANITISERS.get(name), params, reserved=("actions",))
