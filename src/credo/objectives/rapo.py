"""RAPO: profile–token mutual-information weights on the PPO surrogate. [recon]

Reconstruction (``docs/algorithms.md#rapo``; paper: Xu et al. 2026,
https://arxiv.org/abs/2606.27025; no public code): a frozen reference
model scores every response token twice, with and without the user/role profile in the
prompt; the difference

    m_t = log π_ref(y_t | profile, x, y<t) − log π_ref(y_t | x, y<t)

(a pointwise mutual information between the profile and the token) says how much the
profile explains the token. Scaled to [0, 1] (min–max, see ``scale``; a constant signal
maps to 0), it reweighs the per-token PPO loss asymmetrically:

    w_t = 1 + γ m_t          if A_t > 0   (amplify profile-specific tokens of good responses)
    w_t = 1 / (1 + γ m_t)    if A_t < 0   (soften the blame on them in bad responses)
    w_t = 1                  if A_t = 0
    ℓ_t = w_t · ppo_token_loss(log ρ_t, A_t)        (= −w_t · surrogate)

so that generic, profile-independent tokens cannot carry the reward on their own.

Inputs: the trainer (:mod:`credo.teachers.profiles`, for envs whose tasks carry a profile)
runs the two reference passes and supplies
``inputs.extras["ref_logprobs_profile"]`` and ``inputs.extras["ref_logprobs_plain"]``
(``[B, L]``, aligned with ``inputs.logprobs``).

``scale``: ``batch`` (default) min–max over the unmasked tokens of the batch. Because the
min and max depend on the batch, for exact micro-batching compute them once on the whole
mini-batch with :func:`rapo_signal_range` and pass them as ``extras["rapo_range"]``
(``[2]`` tensor ``(min, max)``); without it each micro-batch uses its own. ``row``:
min–max within each row (micro-batch exact by construction).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from credo.objectives.extras import register_extras
from credo.objectives.inputs import LossInputs
from credo.objectives.metrics import masked_weights, policy_metrics
from credo.objectives.ppo import ppo_token_loss
from credo.objectives.ratios import RATIO_LEVELS, log_ratio, token_log_ratio
from credo.objectives.registry import register_loss

__all__ = [
    "RAPO_EXTRAS",
    "ppo_rapo",
    "rapo_extras",
    "rapo_signal",
    "rapo_signal_range",
    "rapo_token_weights",
]

SCALES = ("batch", "row")


def _raw_signal(
    ref_profile: torch.Tensor, ref_plain: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    if ref_profile.shape != mask.shape or ref_plain.shape != mask.shape:
        raise ValueError(
            "RAPO: ref_logprobs_profile and ref_logprobs_plain must be [B, L] like the mask "
            f"{list(mask.shape)}; got {list(ref_profile.shape)} and {list(ref_plain.shape)}"
        )
    zero = torch.zeros((), dtype=ref_profile.dtype, device=ref_profile.device)
    diff = torch.where(mask, ref_profile, zero) - torch.where(
        mask, ref_plain.to(ref_profile.dtype), zero
    )
    return diff.detach()


def rapo_signal_range(
    ref_profile: torch.Tensor, ref_plain: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``(min, max)`` of the raw signal ``m`` over the unmasked tokens → ``[2]``.

    Call it on the whole mini-batch and pass the result as ``extras["rapo_range"]``.
    An empty mask gives ``(0, 0)``.
    """
    raw = _raw_signal(ref_profile, ref_plain, mask)
    if not bool(mask.any()):
        return torch.zeros(2, dtype=raw.dtype, device=raw.device)
    vals = raw[mask]
    return torch.stack([vals.min(), vals.max()])


def rapo_signal(
    ref_profile: torch.Tensor,
    ref_plain: torch.Tensor,
    mask: torch.Tensor,
    *,
    scale: str = "batch",
    value_range: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scaled profile signal ``m ∈ [0, 1]`` per token, 0 on masked tokens.

    Args:
        ref_profile: ``[B, L]`` log π_ref(y_t | profile, x, y<t).
        ref_plain: ``[B, L]`` log π_ref(y_t | x, y<t).
        mask: ``[B, L]`` bool.
        scale: ``batch`` (min–max over the batch's unmasked tokens; default) or ``row``
            (within each row).
        value_range: ``[2]`` ``(min, max)`` to use instead of the batch's own (``batch``
            only), e.g. from :func:`rapo_signal_range` on the whole mini-batch.

    Returns:
        ``[B, L]`` detached; ``(m − min)/(max − min)`` clamped to [0, 1]; 0 where
        ``max = min``.
    """
    if scale not in SCALES:
        raise ValueError(f"RAPO: unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    raw = _raw_signal(ref_profile, ref_plain, mask)
    if scale == "row":
        big = torch.finfo(raw.dtype).max
        lo = torch.where(mask, raw, torch.full_like(raw, big)).amin(1, keepdim=True)
        hi = torch.where(mask, raw, torch.full_like(raw, -big)).amax(1, keepdim=True)
    else:
        rng = (
            rapo_signal_range(ref_profile, ref_plain, mask) if value_range is None else value_range
        )
        rng = rng.to(raw.dtype).reshape(2)
        lo, hi = rng[0], rng[1]
    span = hi - lo
    ok = span > 0
    scaled = ((raw - lo) / torch.where(ok, span, torch.ones_like(span))).clamp(0.0, 1.0)
    scaled = torch.where(ok, scaled, torch.zeros_like(scaled))
    return torch.where(mask, scaled, torch.zeros_like(scaled))


def rapo_token_weights(
    signal: torch.Tensor, advantages: torch.Tensor, gamma: float
) -> torch.Tensor:
    """``1 + γm`` where ``A > 0``, ``1/(1 + γm)`` where ``A < 0``, 1 where ``A = 0``.

    Args:
        signal: ``[B, L]`` scaled signal m in [0, 1].
        advantages: ``[B, L]``.
        gamma: γ ≥ 0.
    """
    if gamma < 0:
        raise ValueError(f"RAPO: gamma must be >= 0, got {gamma}")
    up = 1.0 + gamma * signal
    ones = torch.ones_like(up)
    return torch.where(advantages > 0, up, torch.where(advantages < 0, 1.0 / up, ones))


#: The token extras the trainer attaches for RAPO (``[B, L]`` each; the range ``[B, L, 2]``,
#: the same ``(min, max)`` at every position: the whole iteration's).
RAPO_EXTRAS = ("ref_logprobs_profile", "ref_logprobs_plain", "rapo_range")


def rapo_extras(
    token_extras: Mapping[str, torch.Tensor], *, device: torch.device | str | None = None
) -> dict[str, torch.Tensor]:
    """The :class:`LossInputs` extras of one micro-batch from the token batch's extras:
    the two reference log-probs ``[B, L]`` and ``rapo_range`` ``[2]`` (read from the
    first position of the first row of the broadcast ``[B, L, 2]``); ``{}`` when the
    batch carries none (any loss but ``ppo_rapo``)."""
    if "ref_logprobs_profile" not in token_extras:
        return {}
    out = {k: token_extras[k].to(device) for k in RAPO_EXTRAS[:2]}
    rng = token_extras.get("rapo_range")
    if rng is not None and rng.shape[0] > 0:
        out["rapo_range"] = rng[0, 0].to(device)
    return out


#: The update hands the reference's two scorings to the loss, micro-batch by micro-batch.
register_extras(
    "rapo", extras=lambda token_extras, _, device: rapo_extras(token_extras, device=device)
)


@register_loss(
    "ppo_rapo",
    env_features=("profiles",),
    advantage_weighted=True,
    needs={"reference", "profile_reference"},
)
def ppo_rapo(
    inputs: LossInputs,
    *,
    gamma: float = 1.0,
    scale: str = "batch",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip with RAPO's asymmetric token weights [recon]: ``Σ w · w_t^RAPO · ℓ_t^PPO``.

    Args:
        inputs: the batch as for ``ppo`` plus ``extras["ref_logprobs_profile"]`` and
            ``extras["ref_logprobs_plain"]`` ``[B, L]``; optional ``extras["rapo_range"]``
            ``[2]`` (whole-mini-batch min/max for ``scale="batch"``).
        gamma: γ, strength of the reweighting (default 1.0; 0 gives plain PPO).
        scale: ``batch`` (default) or ``row`` min–max scaling of the signal.
        clip_low, clip_high, dual_clip, ratio_level: as for ``ppo`` (defaults 0.2, 0.2,
            3.0, ``token``).

    Returns:
        ``(loss, metrics)``: the ``ppo`` metrics plus ``policy/rapo_weight`` (``Σ w·w_t``)
        and ``policy/rapo_signal`` (``Σ w·m_t``).
    """
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(
            f"ppo_rapo: unknown ratio_level {ratio_level!r}; valid: {', '.join(RATIO_LEVELS)}"
        )
    for key in ("ref_logprobs_profile", "ref_logprobs_plain"):
        if key not in inputs.extras:
            raise ValueError(f"ppo_rapo needs inputs.extras[{key!r}] ([B, L] reference log-probs)")
    m = inputs.mask
    w = masked_weights(inputs.weights, m)
    signal = rapo_signal(
        inputs.extras["ref_logprobs_profile"],
        inputs.extras["ref_logprobs_plain"],
        m,
        scale=scale,
        value_range=inputs.extras.get("rapo_range"),
    )
    lr = log_ratio(ratio_level, inputs.logprobs, inputs.old_logprobs, m, inputs.episode)
    adv = torch.where(m, inputs.advantages, torch.zeros_like(inputs.advantages))
    tok_w = rapo_token_weights(signal, adv, gamma).to(lr.dtype)
    loss_tok, clipped = ppo_token_loss(
        lr, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    loss = (w * tok_w * loss_tok).sum()
    metrics = policy_metrics(
        loss=loss,
        weights=w,
        token_log_ratio=token_log_ratio(inputs.logprobs, inputs.old_logprobs, m),
        ratio=torch.exp(lr.detach().clamp(-20.0, 20.0)),
        clipped=clipped,
        entropy=inputs.entropy,
        mask=m,
    )
    metrics["policy/rapo_weight"] = (w * tok_w.detach()).sum()
    metrics["policy/rapo_signal"] = (w * signal).sum()
    return loss, metrics
