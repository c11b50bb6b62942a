"""Rényi OPSD: reference-anchored on-policy self-distillation with a Rényi divergence. [recon]

Reconstruction from the summary (docs/algorithms.md#rényi-opsd; no public code). The self-teacher is
the student (or its EMA) reading privileged feedback ``f`` the student does not see
(:class:`credo.teachers.SelfTeacher`); its logits are anchored to a frozen reference that
reads the plain prompt, by a geometric mixture:

    log q_α(·) = log_softmax(α · z_self(·|x, f, y<t) + (1 − α) · z_ref(·|x, y<t))

(``α = 1``: the self-teacher alone; ``α = 0``: the reference; logits or log-probs give the
same ``q_α`` since softmax ignores a per-position constant). The loss is the Rényi
divergence of order ρ of the student from that target, per response token (van Erven &
Harremoës 2014, https://arxiv.org/abs/1206.2459):

    D_ρ(π_θ ‖ q_α) = (ρ − 1)^{-1} log Σ_v π_θ(v)^ρ q_α(v)^{1−ρ}

computed in log space as ``logsumexp(ρ log π_θ + (1−ρ) log q_α) / (ρ − 1)``; for
``|ρ − 1| < kl_eps`` (default 1e-6) the limit ``KL(π_θ ‖ q_α)`` is used instead (continuous
there: the Rényi divergence is continuous and nondecreasing in ρ, ≥ 0, and 0 iff the two
distributions are equal). ρ < 1 is mass-covering, ρ > 1 mode-seeking.

Distributions: full (``K = V``, tiny vocabularies) or the self-teacher's top-K head, on
which the student, teacher and reference are all *renormalised* (the divergence between
the distributions conditioned on the head: a geometric mixture has no computable tail).

Extras (``[B, L, K]``, the same K ids at every position for all three): ``student_topk_logprobs``
(the trainer's log-probs, with grad), ``teacher_topk_logprobs`` (self-teacher with
feedback), ``ref_topk_logprobs`` (reference without feedback); optional
``teacher_row_mask`` ``[B]`` (rows with feedback).
"""

from __future__ import annotations

import math

import torch

from credo.objectives.inputs import LossInputs
from credo.objectives.metrics import masked_weights
from credo.objectives.opd import check_same_support, distill_mask
from credo.objectives.ppo import with_ppo_term
from credo.objectives.registry import needs_teacher, register_loss

__all__ = ["mixed_target", "renyi_divergence", "renyi_opsd"]


def mixed_target(self_logits: torch.Tensor, ref_logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """``log q_α = log_softmax(α·z_self + (1−α)·z_ref)`` over the last dimension.

    Args:
        self_logits: ``[..., K]`` the self-teacher's logits or log-probs (no grad).
        ref_logits: ``[..., K]`` the reference's logits or log-probs of the same ids.
        alpha: α (finite; [0, 1] interpolates, 0 gives the reference, 1 the self-teacher;
            outside extrapolates). At exactly 0 or 1 the other input is ignored (so a
            ``−inf`` there cannot turn into ``0·∞``).

    Returns:
        ``[..., K]`` normalised log-probs.
    """
    check_same_support(ref_logits, self_logits, "renyi target")
    if not math.isfinite(alpha):
        raise ValueError(f"renyi target: alpha must be finite, got {alpha}")
    if alpha == 0.0:
        z = ref_logits
    elif alpha == 1.0:
        z = self_logits
    else:
        z = alpha * self_logits + (1.0 - alpha) * ref_logits.to(self_logits.dtype)
    return torch.log_softmax(z, dim=-1)


#: ``|ρ − 1|`` below which :func:`renyi_divergence` uses its ``log1p``/``expm1`` form
NEAR_ONE = 0.1


def renyi_divergence(
    p_log: torch.Tensor, q_log: torch.Tensor, rho: float, *, kl_eps: float = 1e-6
) -> torch.Tensor:
    """``D_ρ(p ‖ q)`` over the last dimension, in log space.

    Three forms of one formula, each where it is accurate:

    * ``|ρ − 1| < kl_eps``: the limit, ``KL(p ‖ q) = Σ e^p (p − q)`` (``0·log 0 = 0``);
    * ``|ρ − 1| <`` :data:`NEAR_ONE`: with δ = 1 − ρ,
      ``−log1p(Σ e^p expm1(δ (q − p))) / δ``. The sum is about δ·KL, so its rounding
      is relative; the log-space form below would divide the rounding of a logsumexp
      near 0 (float32: about 1e-7) by ρ − 1;
    * otherwise ``logsumexp(ρ p + (1−ρ) q) / (ρ − 1)``.

    ``p_log`` is taken as normalised: its computed normalisation (0 up to rounding) is
    removed as a constant, so that ``D(p ‖ p)`` is exactly 0 and the gradients are those
    of the formula.

    Args:
        p_log: ``[..., K]`` normalised log-probs of p (differentiable; ``−inf`` allowed).
        q_log: ``[..., K]`` normalised log-probs of q.
        rho: the order ρ > 0.
        kl_eps: for ``|ρ − 1| < kl_eps`` return ``KL(p ‖ q)`` (default 1e-6).

    Returns:
        ``[...]``: ``D_ρ(p ‖ q)``.
    """
    check_same_support(p_log, q_log, "renyi_divergence")
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"renyi_divergence: rho must be positive and finite, got {rho}")
    q = q_log.to(p_log.dtype)
    zero_p = torch.isneginf(p_log)
    ps = torch.where(zero_p, torch.zeros_like(p_log), p_log)
    qs = torch.where(zero_p, torch.zeros_like(q), q)
    if abs(rho - 1.0) < kl_eps:
        return torch.where(zero_p, torch.zeros_like(ps), ps.exp() * (ps - qs)).sum(-1)
    norm = torch.logsumexp(p_log, dim=-1, keepdim=True).detach()
    delta = 1.0 - rho
    if abs(delta) < NEAR_ONE:
        # δ(q − p) > 30 needs p < q − 300: e^p·e^30 and the true e^((1−δ)p + δq) are
        # both 0 in floating point, so the cap changes nothing but an overflow to inf
        grown = torch.expm1((delta * (qs - ps)).clamp(max=30.0))
        weight = torch.where(zero_p, torch.zeros_like(ps), (ps - norm).exp())
        return -torch.log1p((weight * grown).sum(-1)) / delta
    # ρ p + (1−ρ) q written as p + (1−ρ)(q − p), so that q = p gives p's own terms
    terms = torch.where(zero_p, torch.full_like(ps, float("-inf")), ps + delta * (qs - ps))
    return (torch.logsumexp(terms, dim=-1) - norm.squeeze(-1)) / (rho - 1.0)


@register_loss(
    "renyi_opsd", teacher=needs_teacher("renyi_opsd"), needs={"reference", "reference_head"}
)
def renyi_opsd(
    inputs: LossInputs,
    *,
    alpha: float = 0.5,
    rho: float = 1.0,
    coef: float = 1.0,
    rl_coef: float = 0.0,
    kl_eps: float = 1e-6,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``coef·Σ w·D_ρ(π_θ ‖ q_α) + rl_coef·L_PPO`` per response token [recon].

    Args:
        inputs: the batch with ``student_topk_logprobs``, ``teacher_topk_logprobs`` and
            ``ref_topk_logprobs`` ``[B, L, K]`` (module docstring); optional
            ``teacher_row_mask`` ``[B]``.
        alpha: α of the target mixture (default 0.5).
        rho: ρ, the Rényi order (default 1.0: the KL).
        coef: weight of the divergence term (default 1.0; ≥ 0).
        rl_coef: weight of a PPO-clip term on the same batch (default 0: pure
            self-distillation).
        kl_eps: switch to the KL formula for ``|ρ − 1| < kl_eps`` (default 1e-6).
        clip_low, clip_high, dual_clip, ratio_level: PPO knobs (``rl_coef > 0``).

    Returns:
        ``(loss, metrics)``: ``loss/policy``, ``loss/distill`` (``Σ w·D_ρ``),
        ``distill/renyi`` (same, detached), ``distill/reverse_kl`` (``Σ w·KL(π_θ ‖ q_α)``),
        ``distill/ref_kl`` (``Σ w·KL(π_θ ‖ ref)`` on the head), ``distill/coverage``, and
        the ``ppo`` metrics (``rl_coef > 0``) or ``policy/approx_kl`` & co.
    """
    for name, v in (("coef", coef), ("rl_coef", rl_coef)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"renyi_opsd: {name} must be finite and >= 0, got {v}")
    m = distill_mask(inputs)
    lp = inputs.logprobs
    dtype = lp.dtype
    heads = []
    for key in ("student_topk_logprobs", "teacher_topk_logprobs", "ref_topk_logprobs"):
        x = inputs.extras.get(key)
        if x is None:
            raise ValueError(f"renyi_opsd needs inputs.extras[{key!r}] ([B, L, K])")
        if x.dim() != 3 or x.shape[:2] != m.shape:
            raise ValueError(
                f"inputs.extras[{key!r}] must be [B, L, K] with [B, L] = {list(m.shape)}, "
                f"got {list(x.shape)}"
            )
        heads.append(x)
    s, t, r = heads
    check_same_support(s, t, "renyi_opsd (student vs self-teacher)")
    check_same_support(s, r, "renyi_opsd (student vs reference)")
    keep = m[..., None].expand_as(s)
    zero3 = torch.zeros((), dtype=dtype, device=lp.device)
    s = torch.where(keep, s.to(dtype), zero3)  # masked: uniform after renormalising
    t = torch.where(keep, t.detach().to(dtype), zero3)
    r = torch.where(keep, r.detach().to(dtype), zero3)
    p_log = torch.log_softmax(s, dim=-1)
    q_log = mixed_target(t, r, alpha)
    d = renyi_divergence(p_log, q_log, rho, kl_eps=kl_eps)
    zero = torch.zeros((), dtype=dtype, device=lp.device)
    d = torch.where(m, d, zero)
    w = masked_weights(inputs.weights, m).to(dtype)
    distill = (w * d).sum()
    loss, metrics = with_ppo_term(
        inputs,
        coef * distill,
        rl_coef,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        ratio_level=ratio_level,
    )
    with torch.no_grad():
        pd = p_log.detach()
        kl = torch.where(m, renyi_divergence(pd, q_log, 1.0), zero)
        ref_kl = torch.where(m, renyi_divergence(pd, torch.log_softmax(r, -1), 1.0), zero)
        wd = w.detach()
        metrics.update(
            {
                "loss/distill": distill.detach(),
                "distill/renyi": (wd * d.detach()).sum(),
                "distill/reverse_kl": (wd * kl).sum(),
                "distill/ref_kl": (wd * ref_kl).sum(),
                "distill/coverage": wd.sum(),
            }
        )
    return loss, metrics
