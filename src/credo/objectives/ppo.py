"""PPO-clip surrogate with token-, turn- or sequence-level importance ratios.

Schulman et al. 2017, https://arxiv.org/abs/1707.06347; dual clip from Ye et al. 2020,
https://arxiv.org/abs/1912.09729 (verl's ``compute_policy_loss``). Per token, with
ρ = π_θ/π_old at the chosen level (see :mod:`credo.objectives.ratios`):

    ℓ = max(−Aρ, −A·clip(ρ, 1−ε_low, 1+ε_high))
    for A < 0 (dual clip, c > 1):  ℓ = min(ℓ, −A·c)

aggregated with the weights in ``inputs.weights`` (see
:mod:`credo.objectives.aggregation`). ``ratio_level="sequence"`` with
``dual_clip=None`` and ``seq-mean-token-mean`` weights is verl's ``gspo`` loss (GSPO,
https://arxiv.org/abs/2507.18071, one row per sequence); ``ratio_level="turn"`` is ROLL's
``segment`` ratio. [code]
"""

from __future__ import annotations

import torch

from credo.objectives.inputs import LossInputs
from credo.objectives.metrics import masked_weights, policy_metrics
from credo.objectives.ratios import RATIO_LEVELS, log_ratio, token_log_ratio
from credo.objectives.registry import register_loss

__all__ = [
    "ppo_clip",
    "ppo_token_loss",
    "with_ppo_term",
]


def ppo_token_loss(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element clipped surrogate.

    Args:
        log_ratio: ``[...]`` log π_θ − log π_old (any shape: tokens, turns, sequences).
        advantages: ``[...]`` same shape.
        clip_low, clip_high: ε_low, ε_high.
        dual_clip: c (> 1) or ``None`` to disable.

    Returns:
        ``(loss [...], clipped [...] bool)``: ``clipped`` marks elements where the clip
        (either bound or the dual clip) set the value.
    """
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    surr = -advantages * ratio
    surr_clip = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(surr, surr_clip)
    clipped = surr_clip > surr
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or null to disable), got {dual_clip}")
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        clipped = clipped | dual
    return loss, clipped


@register_loss("ppo", advantage_weighted=True)
def ppo_clip(
    inputs: LossInputs,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip with token-, turn- or sequence-level ratios.

    Args:
        inputs: the batch (``logprobs``, ``old_logprobs``, ``advantages``, ``mask``,
            ``weights`` all ``[B, L]``; ``episode`` ``[B]`` for the sequence level;
            ``entropy`` optional).
        clip_low: ε_low, lower clip 1−ε_low (default 0.2).
        clip_high: ε_high, upper clip 1+ε_high (default 0.2; DAPO uses 0.28).
        dual_clip: c for negative advantages (default 3.0; ``None`` disables; GSPO and
            verl's ``gspo`` use none).
        ratio_level: ``token`` (default, PPO/GRPO), ``turn`` (geometric mean over each
            row's tokens, ROLL's ``segment``) or ``sequence`` (GSPO over each episode; its
            rows must be in the same micro-batch). See :mod:`credo.objectives.ratios`.

    Returns:
        ``(loss, metrics)`` with ``loss/policy``, ``policy/clip_frac``,
        ``policy/approx_kl`` (k3 between π_old and π_θ, per token),
        ``policy/ratio_mean`` and ``policy/ratio_sq_mean`` (of the level's ratio) and
        ``policy/entropy`` when ``inputs.entropy`` is given; all ``Σ w·x``.
    """
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(
            f"ppo: unknown ratio_level {ratio_level!r}; valid: {', '.join(RATIO_LEVELS)}"
        )
    m = inputs.mask
    w = masked_weights(inputs.weights, m)
    lr = log_ratio(ratio_level, inputs.logprobs, inputs.old_logprobs, m, inputs.episode)
    adv = torch.where(m, inputs.advantages, torch.zeros_like(inputs.advantages))
    loss_tok, clipped = ppo_token_loss(
        lr, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    loss = (loss_tok * w).sum()
    metrics = policy_metrics(
        loss=loss,
        weights=w,
        token_log_ratio=token_log_ratio(inputs.logprobs, inputs.old_logprobs, m),
        ratio=torch.exp(lr.detach().clamp(-20.0, 20.0)),
        clipped=clipped,
        entropy=inputs.entropy,
        mask=m,
    )
    return loss, metrics


def with_ppo_term(
    inputs: LossInputs,
    loss: torch.Tensor,
    rl_coef: float,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``loss + rl_coef·L_PPO`` for a loss that may carry a PPO-clip term beside it (the
    distillation losses), with the metrics: :func:`ppo_clip`'s own (``loss/policy`` the
    combined loss) when ``rl_coef`` > 0, else the common ``policy/`` metrics of ``loss``
    alone (no PPO pass)."""
    if rl_coef > 0:
        rl_loss, metrics = ppo_clip(
            inputs,
            clip_low=clip_low,
            clip_high=clip_high,
            dual_clip=dual_clip,
            ratio_level=ratio_level,
        )
        loss = loss + rl_coef * rl_loss
        metrics["loss/policy"] = loss.detach()
        return loss, metrics
    metrics = policy_metrics(
        loss=loss,
        weights=masked_weights(inputs.weights, inputs.mask),
        token_log_ratio=token_log_ratio(inputs.logprobs, inputs.old_logprobs, inputs.mask),
        entropy=inputs.entropy,
        mask=inputs.mask,
    )
    return loss, metrics
