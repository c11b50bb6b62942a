"""Refuse an optimizer step on a non-finite loss or gradient.

One AdamW (or Adam) step on a NaN gradient turns every weight it touches into NaN, and
nothing downstream says why: the model then samples from NaN probabilities, or is saved
and cached as if it had trained. The supervised loops (the warm start's SFT, the CAST
critic, a fitted judge) call :func:`check_step` between ``backward()`` and ``step()``.
(The RL update checks its gradient norm itself, ``credo.train.update``.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["check_step"]


def check_step(
    loss: torch.Tensor,
    parameters: Iterable[torch.nn.Parameter],
    max_norm: float,
    where: str,
    fix: str,
) -> float:
    """Clip the gradients to ``max_norm`` (``inf``: no clipping) and return their norm
    before clipping; raise before the step if the loss or that norm is not finite.

    Args:
        loss: the step's loss (after ``backward()``).
        parameters: the parameters the optimizer steps.
        max_norm: the clipping bound.
        where: what is training, for the message (``"SFT step 3 of 175"``).
        fix: what to change, for the message.

    Raises:
        FloatingPointError: one line naming ``where``, the loss, the norm and ``fix``;
            the step was not taken.
    """
    norm = float(torch.nn.utils.clip_grad_norm_(list(parameters), max_norm))
    value = float(loss.detach())
    if not (math.isfinite(value) and math.isfinite(norm)):
        raise FloatingPointError(
            f"{where}: the loss is {value:.4g} and the gradient norm {norm:.4g}; the "
            f"step was not taken. {fix}"
        )
    return norm
