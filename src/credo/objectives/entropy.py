"""The entropy bonus: ``Σ_tokens w·H(π_θ(·|prefix))`` with the aggregation weights.

The trainer subtracts ``entropy_coef`` times this term from the loss (a bonus for
spreading probability mass). Like every loss term it is additive over micro-batches: the
weights are those of the whole mini-batch, so micro-batch sums add up to the mini-batch
value.
"""

from __future__ import annotations

import torch

__all__ = ["entropy_bonus"]


def entropy_bonus(entropy: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Σ w·H`` over the loss tokens.

    Args:
        entropy: ``[B, L]`` the policy's entropy at each position (differentiable when
            the bonus should train).
        weights: ``[B, L]`` aggregation weights of the whole mini-batch.
        mask: ``[B, L]`` bool, tokens in the loss (masked positions never count, whatever
            their entropy value).
    """
    return (torch.where(mask, entropy, torch.zeros_like(entropy)) * (weights * mask)).sum()
