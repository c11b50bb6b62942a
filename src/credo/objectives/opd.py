"""On-policy distillation (``opd``): reverse KL to a teacher on the student's own samples.

GKD, Agarwal et al. 2024, https://arxiv.org/abs/2306.13649 (on-policy, reverse KL);
Thinking Machines' "On-policy distillation" (Lu et al. 2025,
https://thinkingmachines.ai/blog/on-policy-distillation/: per-token reverse KL of the
sampled token as a dense, undiscounted advantage). [code]

The student π_θ samples a response ``y``; a teacher π_T scores the same tokens in its own
context (which may hold privileged text, see :mod:`credo.teachers`). Per response token
``t`` the signal is the reverse KL ``KL(π_θ(·|x,y<t) ‖ π_T(·|x',y<t))``, estimated by:

- ``topk`` (default): the teacher's K most likely tokens ("head") plus one tail bucket,
  as KLPO's top-K KL (:func:`credo.objectives.kl.kl_topk`) but with the *student* as the
  first argument: with ``s`` the student's and ``τ`` the teacher's log-probs of the same
  head ids, ``k_K = Σ_head e^s (s − τ) + s_tail log(s_tail/τ_tail)``, ``s_tail = 1 − Σ e^s``,
  ``τ_tail = 1 − Σ e^τ``, both clamped below at ``tail_floor``. A lower bound of the
  exact reverse KL (data processing over K + 1 categories); with ``K = V`` (the full
  distribution, for tiny vocabularies) both tails sit at the floor and it *is* the exact
  KL. Its gradient w.r.t. ``s`` is the exact gradient of that coarsened KL at the prefix.
- ``k1``: ``log π_θ(y_t) − log π_T(y_t)`` of the sampled token (unbiased on π_θ's
  samples, can be negative). As a loss it is used through the score function:
  ``ℓ_t = sg(k1_t) · ρ_t`` with ``ρ_t = π_θ(y_t)/π_old(y_t)``, whose gradient on-policy is
  ``k1_t ∇ log π_θ(y_t)`` — the REINFORCE gradient of the per-token reverse KL with
  discount 0 (Thinking Machines' advantage ``−k1``), importance-weighted off-policy.
- ``k3``: ``r − 1 − log r`` with ``r = π_T(y_t)/π_θ(y_t)`` (≥ 0, unbiased), differentiated
  directly as GRPO's KL loss is (a biased but low-variance gradient).

**Loss route** (``opd`` loss): ``rl_coef · L_PPO + distill_coef · Σ w·ℓ_t`` with the
aggregation weights ``w``; ``rl_coef = 0`` (default) is pure distillation, ``rl_coef > 0``
adds the clipped PPO/GRPO surrogate on the same tokens (the advantages the trainer passed).

**Reward route** (:func:`distill_token_reward`, :func:`distill_row_reward`): the dense
reward ``−coef · (log π_θ(y_t) − log π_T(y_t))`` of the sampled token (the sampler's
log-probs as π_θ), detached, per token or summed per row, to add to the RL reward or
advantages before or after credit assignment.

Extras read from ``inputs.extras`` (``[B, L]`` aligned with ``inputs.logprobs``):

- ``teacher_logprobs`` ``[B, L]``: log π_T of the sampled tokens (``k1``, ``k3``; also a
  metric for ``topk`` when present).
- ``teacher_topk_logprobs`` ``[B, L, K]``: the teacher's head log-probs, and
  ``student_topk_logprobs`` ``[B, L, K]``: the trainer's log-probs of the *same* ids (with
  grad; :meth:`credo.policy.HFPolicy.score` with ``extra_ids`` = the teacher's head ids)
  (``topk``).
- ``teacher_row_mask`` ``[B]`` (or ``[B, L]``) bool (optional): rows (tokens) that have a
  teacher signal (the others get no distillation term; their aggregation weight is not
  redistributed).
"""

from __future__ import annotations

import math

import torch

from credo.objectives.inputs import LossInputs
from credo.objectives.metrics import masked_weights
from credo.objectives.ppo import with_ppo_term
from credo.objectives.ratios import token_log_ratio
from credo.objectives.registry import needs_teacher, register_loss

__all__ = [
    "DISTILL_ESTIMATORS",
    "check_same_support",
    "distill_mask",
    "distill_row_reward",
    "distill_terms",
    "distill_token_reward",
    "opd",
    "reverse_kl_sampled",
    "reverse_kl_topk",
]

DISTILL_ESTIMATORS = ("topk", "k1", "k3")


def check_same_support(student: torch.Tensor, teacher: torch.Tensor, what: str) -> None:
    """Raise a one-line ``ValueError`` unless two ``[..., K]`` distributions line up.

    A different last dimension with full distributions means a teacher with another
    vocabulary size; any other mismatch is a shape error.
    """
    if student.shape == teacher.shape:
        return
    if student.shape[:-1] == teacher.shape[:-1]:
        raise ValueError(
            f"{what}: the teacher gives {teacher.shape[-1]} log-probs per position but the "
            f"student {student.shape[-1]}; a teacher must score the student's own token ids "
            "(same tokenizer and vocabulary size; for top-K, the student's log-probs of the "
            "teacher's head ids)"
        )
    raise ValueError(
        f"{what}: student {list(student.shape)} and teacher {list(teacher.shape)} log-probs "
        "must have the same [B, L, K] shape"
    )


def reverse_kl_topk(
    student_head: torch.Tensor, teacher_head: torch.Tensor, *, tail_floor: float = 1e-6
) -> torch.Tensor:
    """Top-K reverse KL(π_θ ‖ π_T) over the teacher's head plus one tail bucket.

    Args:
        student_head: ``[..., K]`` the student's log-probs of the head ids (differentiable;
            original, not renormalised).
        teacher_head: ``[..., K]`` the teacher's log-probs of the same ids (no grad).
        tail_floor: both tail masses are clamped below at this value, in (0, 1)
            (default 1e-6).

    Returns:
        ``[...]`` ``Σ_head e^s (s − τ) + s_tail (log s_tail − log τ_tail)``; 0·log 0 = 0 for
        a student log-prob of ``−inf``.
    """
    check_same_support(student_head, teacher_head, "reverse_kl_topk")
    if not 0.0 < tail_floor < 1.0:
        raise ValueError(f"reverse_kl_topk: tail_floor must be in (0, 1), got {tail_floor}")
    t = teacher_head.detach().to(student_head.dtype)
    zero_s = torch.isneginf(student_head)
    s_safe = torch.where(zero_s, torch.zeros_like(student_head), student_head)
    t_safe = torch.where(zero_s, torch.zeros_like(t), t)
    head = torch.where(zero_s, torch.zeros_like(s_safe), s_safe.exp() * (s_safe - t_safe)).sum(-1)
    s_tail = (1.0 - student_head.exp().sum(-1)).clamp(min=tail_floor)
    t_tail = (1.0 - t.exp().sum(-1)).clamp(min=tail_floor)
    return head + s_tail * (s_tail.log() - t_tail.log())


def reverse_kl_sampled(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, kind: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_T) from the sampled token's log-probs.

    Args:
        student_logprobs: ``[...]`` log π_θ(y_t) (samples drawn from π_θ).
        teacher_logprobs: ``[...]`` log π_T(y_t), same shape.
        kind: ``k1`` (``log π_θ − log π_T``) or ``k3`` (``r − 1 − log r``,
            ``r = π_T/π_θ``, log r clamped to ±20).
    """
    if student_logprobs.shape != teacher_logprobs.shape:
        raise ValueError(
            f"reverse_kl_sampled: student {list(student_logprobs.shape)} and teacher "
            f"{list(teacher_logprobs.shape)} log-probs must have the same shape"
        )
    diff = student_logprobs - teacher_logprobs.detach().to(student_logprobs.dtype)
    if kind == "k1":
        return diff
    if kind == "k3":
        log_r = (-diff).clamp(-20.0, 20.0)
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"reverse_kl_sampled: unknown kind {kind!r}; valid: k1, k3")


def distill_mask(inputs: LossInputs) -> torch.Tensor:
    """``[B, L]`` bool: loss tokens of rows with a teacher signal (``teacher_row_mask``,
    ``[B]`` per row or ``[B, L]`` per token)."""
    m = inputs.mask
    rows = inputs.extras.get("teacher_row_mask")
    if rows is None:
        return m
    if rows.shape == m.shape:  # given per token (e.g. carried in TokenBatch.token_extras)
        return m & rows.bool()
    if rows.shape != m.shape[:1]:
        raise ValueError(
            f"extras['teacher_row_mask'] must be [B] = [{m.shape[0]}] (or [B, L]), got "
            f"{list(rows.shape)}"
        )
    return m & rows.bool()[:, None]


def _extra(inputs: LossInputs, key: str, dims: int, why: str) -> torch.Tensor:
    x = inputs.extras.get(key)
    if x is None:
        shape = "[B, L]" if dims == 2 else "[B, L, K]"
        raise ValueError(f"{why} needs inputs.extras[{key!r}] ({shape})")
    if x.dim() != dims or x.shape[:2] != inputs.mask.shape:
        raise ValueError(
            f"inputs.extras[{key!r}] must be {'[B, L]' if dims == 2 else '[B, L, K]'} with "
            f"[B, L] = {list(inputs.mask.shape)}, got {list(x.shape)}"
        )
    return x


def distill_terms(
    inputs: LossInputs, *, estimator: str = "topk", tail_floor: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token distillation surrogate, KL estimate and mask.

    Args:
        inputs: the batch with the teacher extras of the estimator (module docstring).
        estimator: ``topk`` (default), ``k1`` or ``k3``.
        tail_floor: floor of the top-K tails (default 1e-6).

    Returns:
        ``(surrogate [B, L], kl [B, L], mask [B, L])``: ``surrogate`` carries the gradient
        (its value is the KL estimate for ``topk``/``k3`` and ``sg(k1)·ρ`` for ``k1``),
        ``kl`` is the detached estimate; both are 0 where ``mask`` (loss tokens of rows with
        a teacher) is false, whatever the extras hold there.
    """
    if estimator not in DISTILL_ESTIMATORS:
        raise ValueError(
            f"opd: unknown estimator {estimator!r}; valid: {', '.join(DISTILL_ESTIMATORS)}"
        )
    m = distill_mask(inputs)
    lp = inputs.logprobs
    dtype = lp.dtype
    zero = torch.zeros((), dtype=dtype, device=lp.device)
    if estimator == "topk":
        s = _extra(inputs, "student_topk_logprobs", 3, "estimator='topk'")
        t = _extra(inputs, "teacher_topk_logprobs", 3, "estimator='topk'")
        check_same_support(s, t, "opd topk")
        keep = m[..., None].expand_as(s)
        fill = torch.full((), -math.log(s.shape[-1]) - 1.0, dtype=dtype, device=lp.device)
        s = torch.where(keep, s.to(dtype), fill)  # masked: a harmless proper head
        t = torch.where(keep, t.detach().to(dtype), fill)
        k = reverse_kl_topk(s, t, tail_floor=tail_floor)
        sur = k
    else:
        t_lp = _extra(inputs, "teacher_logprobs", 2, f"estimator={estimator!r}")
        cur = torch.where(m, lp, torch.full_like(lp, -1.0))
        ref = torch.where(m, t_lp.detach().to(dtype), torch.full_like(lp, -1.0))
        k = reverse_kl_sampled(cur, ref, estimator)
        if estimator == "k1":
            ratio = torch.exp(
                token_log_ratio(inputs.logprobs, inputs.old_logprobs, m).clamp(-20.0, 20.0)
            )
            sur = k.detach() * ratio
        else:
            sur = k
    sur = torch.where(m, sur, zero)
    k = torch.where(m, k.detach(), zero)
    return sur, k, m


@register_loss(
    "opd", teacher=needs_teacher("opd", head=lambda p: p.get("estimator", "topk") == "topk")
)
def opd(
    inputs: LossInputs,
    *,
    estimator: str = "topk",
    distill_coef: float = 1.0,
    rl_coef: float = 0.0,
    tail_floor: float = 1e-6,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """On-policy distillation loss: ``rl_coef·L_PPO + distill_coef·Σ w·ℓ_t``.

    Args:
        inputs: the batch; extras by estimator (module docstring): ``topk`` needs
            ``teacher_topk_logprobs`` and ``student_topk_logprobs`` ``[B, L, K]``; ``k1``
            and ``k3`` need ``teacher_logprobs`` ``[B, L]``; optional ``teacher_row_mask``.
        estimator: ``topk`` (default), ``k1`` or ``k3``.
        distill_coef: weight of the distillation term (default 1.0, ≥ 0).
        rl_coef: weight of the PPO-clip surrogate on the same batch (default 0: pure
            distillation; 1 with ``distill_coef = β`` is GRPO + β·KL).
        tail_floor: floor of the top-K tails (default 1e-6).
        clip_low, clip_high, dual_clip, ratio_level: the PPO knobs (used when
            ``rl_coef > 0``; defaults as ``ppo``).

    Returns:
        ``(loss, metrics)``: ``loss/policy`` (the total), ``loss/distill``
        (``Σ w·ℓ``, before ``distill_coef``), ``distill/reverse_kl`` (``Σ w·k``),
        ``distill/coverage`` (``Σ w`` over tokens with a teacher), ``distill/teacher_logprob``
        when ``teacher_logprobs`` is given; the ``ppo`` metrics when ``rl_coef > 0``, else
        ``policy/approx_kl``, ``policy/ratio_mean``, ``policy/ratio_sq_mean`` (and
        ``policy/entropy``).
    """
    for name, v in (("distill_coef", distill_coef), ("rl_coef", rl_coef)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"opd: {name} must be finite and >= 0, got {v}")
    sur, k, m = distill_terms(inputs, estimator=estimator, tail_floor=tail_floor)
    w = masked_weights(inputs.weights, m).to(sur.dtype)
    distill = (w * sur).sum()
    loss, metrics = with_ppo_term(
        inputs,
        distill_coef * distill,
        rl_coef,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        ratio_level=ratio_level,
    )
    metrics.update(_distill_metrics(inputs, distill, k, w, m))
    return loss, metrics


def _distill_metrics(
    inputs: LossInputs, distill: torch.Tensor, k: torch.Tensor, w: torch.Tensor, m: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``loss/distill``, ``distill/reverse_kl``, ``distill/coverage`` (+ teacher log-prob)."""
    wd = w.detach()
    out = {
        "loss/distill": distill.detach(),
        "distill/reverse_kl": (wd * k).sum(),
        "distill/coverage": wd.sum(),
    }
    t_lp = inputs.extras.get("teacher_logprobs")
    if t_lp is not None and t_lp.shape == m.shape:
        t = torch.where(m, t_lp.detach().to(wd.dtype), torch.zeros_like(wd))
        out["distill/teacher_logprob"] = (wd * t).sum()
    return out


def distill_token_reward(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float = 1.0,
    clip: float | None = None,
) -> torch.Tensor:
    """Dense reward ``−coef·(log π_θ(y_t) − log π_T(y_t))`` per response token.

    Args:
        student_logprobs: ``[B, L]`` the student's (sampler's) log-probs of its tokens.
        teacher_logprobs: ``[B, L]`` the teacher's log-probs of the same tokens.
        mask: ``[B, L]`` bool, tokens that get a reward (e.g. response tokens of rows with
            a teacher); 0 elsewhere, whatever the inputs hold there.
        coef: the reward scale (default 1.0; > 0).
        clip: clamp each token's reward to ``[−clip, clip]`` (default ``None``: no clamp).

    Returns:
        ``[B, L]`` detached rewards.
    """
    if not (math.isfinite(coef) and coef > 0):
        raise ValueError(f"distill reward: coef must be positive and finite, got {coef}")
    if clip is not None and not clip > 0:
        raise ValueError(f"distill reward: clip must be > 0 or None, got {clip}")
    if student_logprobs.shape != mask.shape or teacher_logprobs.shape != mask.shape:
        raise ValueError(
            "distill reward: student and teacher log-probs must be [B, L] like the mask "
            f"{list(mask.shape)}; got {list(student_logprobs.shape)} and "
            f"{list(teacher_logprobs.shape)}"
        )
    zero = torch.zeros((), dtype=student_logprobs.dtype, device=student_logprobs.device)
    s = torch.where(mask, student_logprobs.detach(), zero)
    t = torch.where(mask, teacher_logprobs.detach().to(s.dtype), zero)
    r = -coef * (s - t)
    if clip is not None:
        r = r.clamp(-clip, clip)
    return torch.where(mask, r, zero)


def distill_row_reward(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float = 1.0,
    clip: float | None = None,
    reduce: str = "sum",
) -> torch.Tensor:
    """The dense reward of :func:`distill_token_reward` reduced per row → ``[B]``.

    ``reduce``: ``sum`` (default; the row's total, as a per-step reward) or ``mean`` (over
    the row's masked tokens; 0 for a row without any).
    """
    r = distill_token_reward(student_logprobs, teacher_logprobs, mask, coef=coef, clip=clip)
    if reduce == "sum":
        return r.sum(1)
    if reduce == "mean":
        return r.sum(1) / mask.sum(1).clamp(min=1).to(r.dtype)
    raise ValueError(f"distill reward: unknown reduce {reduce!r}; valid: sum, mean")
