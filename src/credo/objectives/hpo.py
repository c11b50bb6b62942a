"""Hölder policy optimisation (HölderPO): sequence ratios as Hölder (power) means.

Chen, Liang, Chen et al. 2026, https://arxiv.org/abs/2605.12058; code
https://github.com/YihangChen9/HolderPO (``alfworld/verl/trainer/ppo/core_algos.py``:
``masked_log_holder_mean``, ``resolve_holder_p``, ``compute_policy_loss_holder_seq`` /
``_holder_token``). [code]

For a sequence ``i`` (a row by default; a whole episode with ``unit="episode"``) with
token log-ratios ``log r_t = log π_θ − log π_old`` over its ``|y_i|`` unmasked tokens,
the Hölder mean with exponent ``p``, in log space:

    log ρ_{i,p} = (logsumexp_t(p · log r_t) − log|y_i|) / p,       |p| < 1e-6: mean_t log r_t

(p = 1: arithmetic mean of the ratios; p → 0: geometric mean (GSPO); p = −1: harmonic.)
Clipped in log space to ``[log(1−ε_low), log(1+ε_high)]`` and selected by the sign of
the sequence advantage ``Ā_i`` (the masked mean of its token advantages): ``min(log ρ,
clip)`` for ``Ā > 0``, ``max(log ρ, clip)`` for ``Ā < 0``, unclipped for ``Ā = 0`` —
PPO's pessimistic bound. The loss is

    loss = Σ_i W_i · (−Ā_i · exp(log ρ_i^sel)),

the authors' ``mean_i`` when the sequence weights ``W_i`` are ``1/#sequences``.
``holder_token`` clips each token's log-ratio first (same sign rule, with the sequence's
``Ā``) and then takes the Hölder mean of the clipped values.

**Sequence weights and micro-batches.** ``W_i = Σ_{tokens of i} w`` with ``w =
inputs.weights``, the aggregation weights the trainer computed on the whole mini-batch.
With ``seq-mean-token-mean`` weights (``unit="row"``) or ``episode-mean`` weights
(``unit="episode"``) every sequence gets ``1/#sequences of the mini-batch``: exactly the
authors' mean, and the sum over micro-batches equals the mini-batch loss because no
denominator depends on the micro-batch. Other modes give other (documented) sequence
weights, e.g. ``token-mean`` weighs a sequence by its token share. With ``unit="episode"``
all rows of an episode must be in the same micro-batch.

**Schedules** for ``p`` (the authors' ``resolve_holder_p``), with ``x = min(1,
step/S)``, ``mid = (p_max + p_min)/2``, ``amp = (p_max − p_min)/2``:

=============  ====================================  ==========================
schedule       p(step)                               direction over S steps
=============  ====================================  ==========================
``constant``   ``p``                                 —
``linear``     ``p_min + (p_max − p_min)·x``         p_min → p_max
``linear_dec`` ``p_max − (p_max − p_min)·x``         p_max → p_min (default)
``sin``        ``mid − amp·cos(πx)``                 p_min → p_max (S-curve)
``cos``        ``mid + amp·cos(πx)``                 p_max → p_min (S-curve)
``quad``       ``p_min + (p_max − p_min)·x^n``        p_min → p_max
``quad_dec``   ``p_max − (p_max − p_min)·x^n``        p_max → p_min
``cubic``      ``mid + amp·(2x − 1)³``               p_min → p_max
``cubic_dec``  ``mid − amp·(2x − 1)³``               p_max → p_min
=============  ====================================  ==========================

**Extreme ratios.** ``exp`` is taken of ``min(log ρ^sel, 20)`` (:data:`LOG_RATIO_CAP`, the
cap of credo's PPO surrogate), for the loss and for the ratio metrics. Without it a
sequence with ``log ρ > 88.7`` overflows float32: +inf for ``Ā < 0`` (where the sign rule
keeps the unclipped ratio) and NaN for ``Ā = 0``. Above the cap the loss is constant in θ
(zero gradient, as in PPO); only a policy that has already moved e^20-fold from the
sampler gets there, and the exact formula would give it an infinite step.

(``n`` = ``power``, default 2.) The names and directions are the authors': ``sin``,
``quad`` and ``cubic`` *increase*; their decreasing twins are ``cos``, ``quad_dec`` and
``cubic_dec``. Every schedule is monotone and stays at its end value after S steps.
Defaults are the paper's agent setting: ``linear_dec`` from 1 to −1 over 500 steps,
ε = 0.2 (math used 2 → −2).
"""

from __future__ import annotations

import math

import torch

from credo.data.ops import compact_ids, segment_max, segment_sum
from credo.objectives.inputs import LossInputs
from credo.objectives.metrics import masked_weights, policy_metrics
from credo.objectives.ratios import token_log_ratio
from credo.objectives.registry import register_loss

__all__ = [
    "HOLDER_SCHEDULES",
    "LOG_RATIO_CAP",
    "holder",
    "holder_p",
    "holder_token",
    "log_holder_mean",
    "sequence_ids",
]

HOLDER_SCHEDULES = (
    "constant",
    "linear",
    "linear_dec",
    "sin",
    "cos",
    "quad",
    "quad_dec",
    "cubic",
    "cubic_dec",
)
UNITS = ("row", "episode")
_P_ZERO = 1e-6
#: Cap on the (selected) Hölder log-ratio before ``exp``, as the PPO surrogate caps its
#: log-ratio (:func:`credo.objectives.ppo.ppo_token_loss`): ratios are at most e^20 ≈ 4.9e8.
LOG_RATIO_CAP = 20.0


def holder_p(
    step: int,
    *,
    schedule: str = "linear_dec",
    p: float = 1.0,
    p_max: float = 1.0,
    p_min: float = -1.0,
    schedule_steps: int = 500,
    power: float = 2.0,
) -> float:
    """The Hölder exponent at training ``step`` (see the schedule table above).

    Args:
        step: training iteration (negative values count as 0).
        schedule: one of :data:`HOLDER_SCHEDULES` (default ``linear_dec``).
        p: the exponent of ``constant`` (default 1.0); ignored by the others.
        p_max, p_min: the schedule's bounds (defaults 1.0 and −1.0).
        schedule_steps: S, the steps the schedule spans (default 500; values < 1 act
            as 1).
        power: exponent n of ``quad`` / ``quad_dec`` (default 2.0).
    """
    if schedule not in HOLDER_SCHEDULES:
        raise ValueError(
            f"unknown Hölder p schedule {schedule!r}; valid: {', '.join(HOLDER_SCHEDULES)}"
        )
    if schedule == "constant":
        return float(p)
    lo, hi = float(p_min), float(p_max)
    if lo == hi:
        return lo
    x = min(1.0, max(0, int(step)) / max(1, int(schedule_steps)))
    mid, amp = (lo + hi) / 2.0, (hi - lo) / 2.0
    if schedule == "linear":
        return lo + (hi - lo) * x
    if schedule == "linear_dec":
        return hi - (hi - lo) * x
    if schedule == "sin":
        return mid - amp * math.cos(math.pi * x)
    if schedule == "cos":
        return mid + amp * math.cos(math.pi * x)
    if schedule == "quad":
        return lo + (hi - lo) * x ** float(power)
    if schedule == "quad_dec":
        return hi - (hi - lo) * x ** float(power)
    if schedule == "cubic":
        return mid + amp * (2.0 * x - 1.0) ** 3
    return mid - amp * (2.0 * x - 1.0) ** 3  # cubic_dec


def sequence_ids(unit: str, episode: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense sequence id of each row: the row itself (``row``) or its episode (``episode``).

    Returns:
        ``(ids [B] int64, number of sequences)``.
    """
    if unit == "row":
        n = int(episode.shape[0])
        return torch.arange(n, device=episode.device), n
    if unit == "episode":
        return compact_ids(episode)
    raise ValueError(f"unknown sequence unit {unit!r}; valid: {', '.join(UNITS)}")


def log_holder_mean(
    log_x: torch.Tensor, mask: torch.Tensor, p: float, seq: torch.Tensor, num: int
) -> torch.Tensor:
    """Log of the Hölder p-mean of ``exp(log_x)`` over the unmasked tokens of each sequence.

    Args:
        log_x: ``[B, L]`` values in log space (e.g. log-ratios), 0 on masked tokens.
        mask: ``[B, L]`` bool.
        p: the exponent; ``|p| < 1e-6`` gives the geometric mean (mean of ``log_x``).
        seq: ``[B]`` dense sequence id of each row, in ``[0, num)``.
        num: number of sequences.

    Returns:
        ``[num]``: ``(log Σ exp(p·log_x) − log n)/p`` per sequence (0 for a sequence
        without tokens), differentiable and NaN-free. As in the authors' code the exact
        formula runs down to ``|p| = 1e-6``; its *value* then carries a rounding error of
        about ``eps/|p|`` (float32: ~1e-4 at ``|p| = 1e-3``), its gradient (the softmax
        weights ``r_t^p/Σ r^p``) does not.
    """
    dtype = log_x.dtype
    count = segment_sum(mask.sum(1).to(dtype), seq, num)
    has = count > 0
    if abs(p) < _P_ZERO:
        total = segment_sum(torch.where(mask, log_x, torch.zeros_like(log_x)).sum(1), seq, num)
        return torch.where(has, total / count.clamp(min=1), torch.zeros_like(total))
    scaled = torch.where(mask, p * log_x, torch.full_like(log_x, float("-inf")))
    row_has = mask.any(1)
    # rows without tokens: a finite dummy row (then dropped) keeps logsumexp's gradient finite
    scaled = torch.where(row_has[:, None], scaled, torch.zeros_like(scaled))
    row_lse = torch.logsumexp(scaled, dim=1)
    row_lse = torch.where(row_has, row_lse, torch.full_like(row_lse, float("-inf")))
    shift = segment_max(row_lse.detach(), seq, num)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    summed = segment_sum(torch.exp(row_lse - shift[seq]), seq, num)
    lse = torch.log(torch.where(has, summed, torch.ones_like(summed))) + shift
    out = (lse - torch.log(count.clamp(min=1))) / p
    return torch.where(has, out, torch.zeros_like(out))


def _clip_bounds(clip_low: float, clip_high: float) -> tuple[float, float]:
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(
            f"HPO clip bounds need 0 <= clip_low < 1 and clip_high >= 0, got "
            f"clip_low={clip_low}, clip_high={clip_high}"
        )
    return math.log1p(-clip_low), math.log1p(clip_high)


def _select_by_sign(
    log_r: torch.Tensor, lo: float, hi: float, adv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``min(log_r, clip)`` where ``adv > 0``, ``max`` where ``adv < 0``, ``log_r`` where 0.

    Returns ``(selected, outside)`` with ``outside`` marking values outside ``[lo, hi]``.
    """
    clipped = log_r.clamp(lo, hi)
    sel = torch.where(
        adv > 0,
        torch.minimum(log_r, clipped),
        torch.where(adv < 0, torch.maximum(log_r, clipped), log_r),
    )
    return sel, (log_r < lo) | (log_r > hi)


def _capped_exp(log_x: torch.Tensor) -> torch.Tensor:
    """``exp(min(log_x, LOG_RATIO_CAP))``: finite in every float dtype (see the module
    docstring, *Extreme ratios*)."""
    return torch.exp(log_x.clamp(max=LOG_RATIO_CAP))


def _holder_loss(
    inputs: LossInputs,
    *,
    token_clip: bool,
    schedule: str,
    p: float,
    p_max: float,
    p_min: float,
    schedule_steps: int,
    power: float,
    clip_low: float,
    clip_high: float,
    unit: str,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    m = inputs.mask
    w = masked_weights(inputs.weights, m)
    lo, hi = _clip_bounds(clip_low, clip_high)
    p_now = holder_p(
        inputs.step,
        schedule=schedule,
        p=p,
        p_max=p_max,
        p_min=p_min,
        schedule_steps=schedule_steps,
        power=power,
    )
    seq, num = sequence_ids(unit, inputs.episode)
    lr = token_log_ratio(inputs.logprobs, inputs.old_logprobs, m)
    dtype = lr.dtype
    count = segment_sum(m.sum(1).to(dtype), seq, num)
    adv_tok = torch.where(m, inputs.advantages.to(dtype), torch.zeros_like(lr))
    adv = segment_sum(adv_tok.sum(1), seq, num) / count.clamp(min=1)  # Ā_i, [num]
    weight = segment_sum(w.sum(1).to(dtype), seq, num)  # W_i, [num]
    if token_clip:
        sel_tok, outside_tok = _select_by_sign(lr, lo, hi, adv[seq][:, None])
        log_rho_sel = log_holder_mean(sel_tok, m, p_now, seq, num)
        log_rho = log_holder_mean(lr.detach(), m, p_now, seq, num)
        clipped = outside_tok & m
    else:
        log_rho = log_holder_mean(lr, m, p_now, seq, num)
        log_rho_sel, outside = _select_by_sign(log_rho, lo, hi, adv)
        clipped = outside[seq][:, None] & m
    loss_seq = -adv * _capped_exp(log_rho_sel)
    loss = (weight * loss_seq).sum()
    rho = _capped_exp(log_rho.detach())
    metrics = policy_metrics(
        loss=loss,
        weights=w,
        token_log_ratio=lr,
        ratio=torch.where(m, rho[seq][:, None].expand_as(lr), torch.ones_like(lr)),
        clipped=clipped,
        entropy=inputs.entropy,
        mask=m,
    )
    metrics["policy/holder_p"] = (weight.detach() * p_now).sum()
    return loss, metrics


@register_loss("holder", advantage_weighted=True)
def holder(
    inputs: LossInputs,
    *,
    schedule: str = "linear_dec",
    p: float = 1.0,
    p_max: float = 1.0,
    p_min: float = -1.0,
    schedule_steps: int = 500,
    power: float = 2.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    unit: str = "row",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """HölderPO with sequence-level clipping: ``Σ_i W_i·(−Ā_i·exp(sel(log ρ_{i,p})))``.

    Args:
        inputs: the batch (``logprobs``, ``old_logprobs``, ``advantages``, ``mask``,
            ``weights`` ``[B, L]``; ``episode`` ``[B]``; ``step`` drives the schedule;
            ``entropy`` optional).
        schedule: p schedule, one of :data:`HOLDER_SCHEDULES` (default ``linear_dec``).
        p: the exponent of the ``constant`` schedule (default 1.0).
        p_max, p_min: schedule bounds (defaults 1.0 → −1.0, the paper's agent setting).
        schedule_steps: S, steps the schedule spans (default 500).
        power: exponent n of ``quad`` / ``quad_dec`` (default 2.0).
        clip_low, clip_high: ε_low, ε_high of the log-space clip (defaults 0.2).
        unit: ``row`` (default; a sequence = one row, the paper's per-response ratio) or
            ``episode`` (a sequence = all rows of an episode; keep episodes whole in
            micro-batches).

    Returns:
        ``(loss, metrics)``: ``loss/policy``, ``policy/clip_frac`` (weighted share of
        sequences whose Hölder ratio left the clip range),
        ``policy/approx_kl`` (token k3), ``policy/ratio_mean`` and
        ``policy/ratio_sq_mean`` (of the unclipped Hölder ratio), ``policy/holder_p``
        (``p·Σ W``: p itself under normalised modes) and ``policy/entropy`` when
        ``inputs.entropy`` is given; all ``Σ w·x`` over the micro-batch.
    """
    return _holder_loss(
        inputs,
        token_clip=False,
        schedule=schedule,
        p=p,
        p_max=p_max,
        p_min=p_min,
        schedule_steps=schedule_steps,
        power=power,
        clip_low=clip_low,
        clip_high=clip_high,
        unit=unit,
    )


@register_loss("holder_token", advantage_weighted=True)
def holder_token(
    inputs: LossInputs,
    *,
    schedule: str = "linear_dec",
    p: float = 1.0,
    p_max: float = 1.0,
    p_min: float = -1.0,
    schedule_steps: int = 500,
    power: float = 2.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    unit: str = "row",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """HölderPO with token-level clipping before the Hölder mean (the authors' ``holder_token``).

    Args:
        inputs: the batch (``logprobs``, ``old_logprobs``, ``advantages``, ``mask``,
            ``weights`` ``[B, L]``; ``episode`` ``[B]``; ``step`` drives the schedule;
            ``entropy`` optional).
        schedule: p schedule, one of :data:`HOLDER_SCHEDULES` (default ``linear_dec``).
        p: the exponent of the ``constant`` schedule (default 1.0).
        p_max, p_min: schedule bounds (defaults 1.0 → −1.0, the paper's agent setting).
        schedule_steps: S, steps the schedule spans (default 500).
        power: exponent n of ``quad`` / ``quad_dec`` (default 2.0).
        clip_low, clip_high: ε_low, ε_high of the log-space clip (defaults 0.2).
        unit: ``row`` (default; a sequence = one row, the paper's per-response ratio) or
            ``episode`` (a sequence = all rows of an episode; keep episodes whole in
            micro-batches).

    Returns:
        ``(loss, metrics)``: ``loss/policy``, ``policy/clip_frac`` (weighted share of
        tokens outside the clip range),
        ``policy/approx_kl`` (token k3), ``policy/ratio_mean`` and
        ``policy/ratio_sq_mean`` (of the unclipped Hölder ratio), ``policy/holder_p``
        (``p·Σ W``: p itself under normalised modes) and ``policy/entropy`` when
        ``inputs.entropy`` is given; all ``Σ w·x`` over the micro-batch.
    """
    return _holder_loss(
        inputs,
        token_clip=True,
        schedule=schedule,
        p=p,
        p_max=p_max,
        p_min=p_min,
        schedule_steps=schedule_steps,
        power=power,
        clip_low=clip_low,
        clip_high=clip_high,
        unit=unit,
    )
