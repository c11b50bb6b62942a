"""KL estimators between the policy π and a reference π_ref, per token.

Schulman's estimators (http://joschu.net/blog/kl-approx.html), as in verl's ``kl_penalty``,
with ``log r = log π_ref − log π`` evaluated on tokens sampled from π:

- ``k1 = log π − log π_ref``  (unbiased, high variance, can be negative)
- ``k2 = ½ (log π − log π_ref)²``
- ``k3 = r − 1 − log r``, ``r = π_ref/π``  (unbiased, always ≥ 0)

Usable as a reward penalty (subtract ``β·Σ_tokens k`` from a step's reward) or as a loss
term (``β · aggregate(k)``). [code]
"""

from __future__ import annotations

import torch

__all__ = ["KL_ESTIMATORS", "kl_estimate"]

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
) -> torch.Tensor:
    """Per-token KL estimate ``[B, L]`` of KL(π ‖ π_ref) from log-probs of sampled tokens.

    Args:
        logprobs: ``[B, L]`` log π of the sampled tokens.
        ref_logprobs: ``[B, L]`` log π_ref of the same tokens.
        kind: ``k1``, ``k2`` or ``k3``.
    """
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.pow(2)
    if kind == "k3":
        log_r = (-diff).clamp(-20.0, 20.0)
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}")
