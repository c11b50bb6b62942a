"""Registry of policy losses.

A policy loss is a pure function ``fn(inputs: LossInputs, *, knob=default, ...) ->
(loss, metrics)``: ``loss`` a scalar tensor, ``metrics`` a dict of scalar tensors named
``loss/...`` or ``policy/...``. Both must be *additive over micro-batches*: computed as
``Σ w·x`` with the aggregation weights in ``inputs.weights``, so the trainer can sum
them over the micro-batches of one mini-batch.

Every registered loss first checks that its inputs are finite on unmasked tokens
(:func:`~credo.objectives.inputs.check_finite_inputs`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from credo.objectives.inputs import LossInputs, check_finite_inputs
from credo.utils.registry import Registry, check_kwargs

__all__ = ["LOSSES", "PolicyLoss", "get_loss", "loss_names", "register_loss", "validate_loss"]

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
LOSSES: Registry[PolicyLoss] = Registry("loss")


def register_loss(name: str, **meta: Any) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make ``fn`` available as ``objective.loss: <name>`` in configs.

    The registered (and returned) function is ``fn`` behind
    :func:`~credo.objectives.inputs.check_finite_inputs`: every registered loss, called
    through the registry or directly, raises a ``ValueError`` naming the input that is
    NaN/±inf on an unmasked token instead of returning a NaN loss. The wrapper keeps
    ``fn``'s name, docstring and signature (``__wrapped__``).
    """

    def deco(fn: PolicyLoss) -> PolicyLoss:
        @functools.wraps(fn)
        def checked(inputs: LossInputs, *args: Any, **kwargs: Any) -> Any:
            check_finite_inputs(inputs, name)
            return fn(inputs, *args, **kwargs)

        return LOSSES.register(name, **meta)(checked)

    return deco


def get_loss(name: str) -> PolicyLoss:
    return LOSSES.get(name)


def loss_names() -> list[str]:
    return LOSSES.names()


def validate_loss(name: str, params: Mapping[str, Any]) -> None:
    check_kwargs("loss", name, get_loss(name), params, reserved=("inputs",))
