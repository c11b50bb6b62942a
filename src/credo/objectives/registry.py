"""Registry of policy losses.

A policy loss is a pure function ``fn(inputs: LossInputs, *, knob=default, ...) ->
(loss, metrics)``: ``loss`` a scalar tensor, ``metrics`` a dict of scalar tensors named
``loss/...`` or ``policy/...``. Both must be *additive over micro-batches*: computed as
``Σ w·x`` with the aggregation weights in ``inputs.weights``, so the trainer can sum
them over the micro-batches of one mini-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from credo.utils.registry import Registry, check_kwargs

__all__ = ["LOSSES", "PolicyLoss", "get_loss", "loss_names", "register_loss", "validate_loss"]

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
LOSSES: Registry[PolicyLoss] = Registry("loss")


def register_loss(name: str, **meta: Any) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make ``fn`` available as ``objective.loss: <name>`` in configs."""
    return LOSSES.register(name, **meta)


def get_loss(name: str) -> PolicyLoss:
    return LOSSES.get(name)


def loss_names() -> list[str]:
    return LOSSES.names()


def validate_loss(name: str, params: Mapping[str, Any]) -> None:
    check_kwargs("loss", name, get_loss(name), params, reserved=("inputs",))
