"""Registry of advantage estimators.

An estimator is a pure function ``fn(forest, *, knob=default, ...) -> Tensor[N]`` (one
advantage per row of the :class:`~credo.data.RolloutForest`). Register it with
:func:`register_estimator`. An estimator that keeps state across iterations (ProAS's
evolving reference graph) declares ``state=Factory``: the trainer builds one object with
``Factory(**state_kwargs)``, passes it as ``state=`` on every call and saves its
``state_dict()`` in checkpoints (``load_state_dict`` on resume).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from credo.data import RolloutForest
from credo.utils.registry import Registry, check_kwargs

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "compute_advantages",
    "estimator_names",
    "estimator_needs",
    "get_estimator",
    "register_estimator",
    "validate_estimator",
]

Estimator = Callable[..., torch.Tensor]
ESTIMATORS: Registry[Estimator] = Registry("estimator")


def register_estimator(
    name: str,
    *,
    state: type | None = None,
    needs: Callable[[Mapping[str, Any]], Iterable[str]] | None = None,
) -> Callable[[Estimator], Estimator]:
    """Decorator: make ``fn`` available as ``credit.estimator: <name>`` in configs.

    ``needs(params)``: what the run must compute for the estimator with ``params`` (e.g.
    ``{"state_embeddings"}``: the policy's state embeddings in the forest); the trainer
    asks :func:`estimator_needs`."""
    return ESTIMATORS.register(name, state=state, needs=needs)


def estimator_needs(name: str, params: Mapping[str, Any]) -> set[str]:
    """What estimator ``name`` with ``params`` declared it needs (empty by default)."""
    fn = ESTIMATORS.meta(name).get("needs")
    return set(fn(params)) if fn is not None else set()


def get_estimator(name: str) -> Estimator:
    """The estimator called ``name``; ``KeyError`` listing the valid names otherwise."""
    return ESTIMATORS.get(name)


def estimator_names() -> list[str]:
    return ESTIMATORS.names()


def estimator_state_factory(name: str) -> type | None:
    """The state class an estimator keeps across iterations, or ``None``."""
    return ESTIMATORS.meta(name).get("state")


def validate_estimator(name: str, params: Mapping[str, Any]) -> None:
    """Check the name, that every key in ``params`` is a parameter of the estimator, and
    that the estimator accepts their values: it runs once on an empty forest (every
    estimator checks its choices first), so a wrong value fails before any compute."""
    fn = get_estimator(name)
    check_kwargs("estimator", name, fn, params, reserved=("forest", "state"))
    fn(RolloutForest.from_columns(group=[], parent=[]), **params)


def compute_advantages(
    name: str, forest: RolloutForest, params: Mapping[str, Any] | None = None, state: Any = None
) -> torch.Tensor:
    """Run estimator ``name`` on ``forest`` → ``[N]`` float32 advantages (finite)."""
    fn = get_estimator(name)
    kwargs = dict(params or {})
    if state is not None:
        kwargs["state"] = state
    adv = fn(forest, **kwargs)
    if adv.shape != (forest.num_rows,):
        raise RuntimeError(
            f"estimator {name!r} returned shape {tuple(adv.shape)}, expected ({forest.num_rows},)"
        )
    if not bool(torch.isfinite(adv).all()):
        raise RuntimeError(f"estimator {name!r} returned non-finite advantages")
    return adv.to(torch.float32)
