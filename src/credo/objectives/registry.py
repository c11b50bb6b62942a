"""Registry of policy losses.

A policy loss is a pure function ``fn(inputs: LossInputs, *, knob=default, ...) ->
(loss, metrics)``: ``loss`` a scalar tensor, ``metrics`` a dict of scalar tensors named
``loss/...`` or ``policy/...``. Both must be *additive over micro-batches*: computed as
``Σ w·x`` with the aggregation weights in ``inputs.weights``, so the trainer can sum
them over the micro-batches of one mini-batch.

A loss that needs something from the sampler (KLPO's auxiliary draws) declares it when it
registers, as ``requires(params, rollout) -> str | None``: given the loss's params and
the run's rollout settings, the message that says what is missing and how to set it, or
``None``. The config check calls it at load time, before any compute.

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

__all__ = [
    "LOSSES",
    "PolicyLoss",
    "Requirement",
    "get_loss",
    "loss_names",
    "loss_requirements",
    "needs_teacher_scores",
    "register_loss",
    "validate_loss",
]

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
#: ``requires(params, rollout) -> message | None`` (see the module docstring).
Requirement = Callable[[Mapping[str, Any], Any], "str | None"]
LOSSES: Registry[PolicyLoss] = Registry("loss")


def _nothing_required(params: Mapping[str, Any], rollout: Any) -> None:
    return None


def needs_teacher_scores(params: Mapping[str, Any], rollout: Any) -> str:
    """The requirement of the distillation losses (``opd``, ``mt_sdpo``, ``renyi_opsd``)
    until the trainer scores rollouts with a teacher: refuse them at config load."""
    return (
        "the distillation losses (opd, mt_sdpo, renyi_opsd) need a teacher's scores in "
        "inputs.extras, which `credo train` does not compute yet; call them directly "
        "(credo.objectives, with credo.teachers for the scores)"
    )


def register_loss(
    name: str, *, requires: Requirement | None = None
) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make ``fn`` available as ``objective.loss: <name>`` in configs.

    The registered (and returned) function is ``fn`` behind
    :func:`~credo.objectives.inputs.check_finite_inputs`: every registered loss, called
    through the registry or directly, raises a ``ValueError`` naming the input that is
    NaN/±inf on an unmasked token instead of returning a NaN loss. The wrapper keeps
    ``fn``'s name, docstring and signature (``__wrapped__``).

    Args:
        name: the config name.
        requires: what the loss needs from the run's settings (see the module
            docstring); ``None``: nothing.
    """

    def deco(fn: PolicyLoss) -> PolicyLoss:
        @functools.wraps(fn)
        def checked(inputs: LossInputs, *args: Any, **kwargs: Any) -> Any:
            check_finite_inputs(inputs, name)
            return fn(inputs, *args, **kwargs)

        return LOSSES.register(name, requires=requires or _nothing_required)(checked)

    return deco


def loss_requirements(name: str) -> Requirement:
    """The ``requires`` check loss ``name`` registered (a no-op if none)."""
    return LOSSES.meta(name)["requires"]


def get_loss(name: str) -> PolicyLoss:
    return LOSSES.get(name)


def loss_names() -> list[str]:
    return LOSSES.names()


def validate_loss(name: str, params: Mapping[str, Any]) -> None:
    check_kwargs("loss", name, get_loss(name), params, reserved=("inputs",))
