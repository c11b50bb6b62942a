"""KL estimators, per token, and how to use them as a reward penalty or a loss term.

**Sampled-token estimators of KL(π ‖ π_ref)** (Schulman,
http://joschu.net/blog/kl-approx.html; verl's ``kl_penalty``), with
``log r = log π_ref − log π`` evaluated on tokens sampled from π:

- ``k1 = log π − log π_ref``  (unbiased, high variance, can be negative)
- ``k2 = ½ (log π − log π_ref)²``  (biased; ≈ KL to second order when π ≈ π_ref)
- ``k3 = r − 1 − log r``, ``r = π_ref/π``  (unbiased, always ≥ 0); ``log r`` is clamped
  to [−20, 20] and the value is not clamped (verl also clamps the value to [−10, 10];
  ``docs/algorithms.md#differences-from-verl``)

**KLPO's estimators of KL(q ‖ p)** at one prefix (sampler q, trainer p; KLPO,
https://github.com/yifanzhang-pro/KLPO, ``klpo/loss.py``) [code]:

- top-K (:func:`kl_topk`, K = 16, tail floor 1e-6): from the sampler's K most likely
  token ids ("head") with their sampler log-probs ``q`` and the trainer's log-probs ``p``
  of the *same* ids, all other tokens merged into one tail category:
  ``k_K = Σ_head q log(q/p) + q_tail log(q_tail/p_tail)``,
  ``q_tail = 1 − Σ_head q``, ``p_tail = 1 − Σ_head p``, both clamped below at the floor.
- binary (:func:`kl_binary`): from the sampled token's ``q = q(a)``, ``p = p(a)`` only:
  ``k_bin = q log(q/p) + (1−q) log((1−q)/(1−p))``.

Both are lower bounds of the exact KL (data processing on a coarsened vocabulary); the
chain rule gives the exact gaps (:func:`kl_diagnostics` computes them from the
conditional distributions):

    KL − k_K   = q_tail · KL(q(·|tail) ‖ p(·|tail))        (tails above the floor)
    KL − k_bin = (1 − q_a) · KL(q(·|¬a) ‖ p(·|¬a))

**Use** any per-token estimate ``k [B, L]`` as a reward penalty
(:func:`kl_reward_penalty`: ``β Σ_tokens k`` per row, to subtract from the row's reward)
or as a loss term (:func:`kl_loss`: ``β Σ w·k`` with the aggregation weights). [code]
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "KL_ESTIMATORS",
    "kl_binary",
    "kl_diagnostics",
    "kl_estimate",
    "kl_loss",
    "kl_reward_penalty",
    "kl_topk",
]

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
) -> torch.Tensor:
    """Per-token KL estimate ``[B, L]`` of KL(π ‖ π_ref) from log-probs of sampled tokens.

    Args:
        logprobs: ``[B, L]`` log π of the sampled tokens.
        ref_logprobs: ``[B, L]`` log π_ref of the same tokens.
        kind: ``k1``, ``k2`` or ``k3`` (default).
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


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 − exp(x))`` for ``x < 0``, accurate at both ends."""
    return torch.where(x < -math.log(2.0), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def _xlogx_ratio(q_log: torch.Tensor, p_log: torch.Tensor) -> torch.Tensor:
    """``q (log q − log p)`` with ``0 log 0 = 0`` for ``q_log = −inf``."""
    zero_q = torch.isneginf(q_log)
    safe_q = torch.where(zero_q, torch.zeros_like(q_log), q_log)
    safe_p = torch.where(zero_q, torch.zeros_like(p_log), p_log)
    return torch.where(zero_q, torch.zeros_like(q_log), safe_q.exp() * (safe_q - safe_p))


def kl_topk(
    q_logprobs: torch.Tensor, p_logprobs: torch.Tensor, *, tail_floor: float = 1e-6
) -> torch.Tensor:
    """Top-K aggregated KL(q ‖ p): ``Σ_head q log(q/p) + q_tail log(q_tail/p_tail)``.

    Args:
        q_logprobs: ``[..., K]`` the sampler's log-probs of its K head tokens (original,
            not renormalised; ``−inf`` allowed for zero probability). No grad.
        p_logprobs: ``[..., K]`` the trainer's log-probs of the same K token ids
            (differentiable).
        tail_floor: both tail masses are clamped below at this value (default 1e-6),
            in (0, 1).

    Returns:
        ``[...]`` the estimate; differentiable w.r.t. ``p_logprobs`` (through the head
        terms and the trainer tail while it is above the floor).
    """
    if q_logprobs.shape != p_logprobs.shape:
        raise ValueError(
            f"kl_topk: q and p must have the same [..., K] shape, got "
            f"{tuple(q_logprobs.shape)} and {tuple(p_logprobs.shape)}"
        )
    if not 0.0 < tail_floor < 1.0:
        raise ValueError(f"kl_topk: tail_floor must be in (0, 1), got {tail_floor}")
    q_log = q_logprobs.detach().to(p_logprobs.dtype)
    head = _xlogx_ratio(q_log, p_logprobs).sum(-1)
    q_tail = (1.0 - q_log.exp().sum(-1)).clamp(min=tail_floor)
    p_tail = (1.0 - p_logprobs.exp().sum(-1)).clamp(min=tail_floor)
    return head + q_tail * (q_tail.log() - p_tail.log())


def kl_binary(q_logprob: torch.Tensor, p_logprob: torch.Tensor) -> torch.Tensor:
    """Binary KL of the sampled token: ``q log(q/p) + (1−q) log((1−q)/(1−p))``.

    Args:
        q_logprob: ``[...]`` the sampler's log-prob of the sampled token (< 0). No grad.
        p_logprob: ``[...]`` the trainer's log-prob of the same token (< 0),
            differentiable.

    Returns:
        ``[...]`` the estimate (≥ 0). Complements use a stable ``log(1 − e^x)``.
    """
    q_log = q_logprob.detach().to(p_logprob.dtype)
    q = q_log.exp()
    return q * (q_log - p_logprob) + (1.0 - q) * (_log1mexp(q_log) - _log1mexp(p_logprob))


def _conditional_kl(q_log: torch.Tensor, p_log: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """KL(q(·|S) ‖ p(·|S)) over the subset ``keep [..., V]`` of the vocabulary (0 if empty)."""
    neg = torch.full_like(q_log, float("-inf"))
    qc = torch.log_softmax(torch.where(keep, q_log, neg), dim=-1)
    pc = torch.log_softmax(torch.where(keep, p_log, neg), dim=-1)
    terms = torch.where(keep, _xlogx_ratio(qc, pc), torch.zeros_like(q_log))
    empty = ~keep.any(-1)
    return torch.where(empty, torch.zeros_like(terms[..., 0]), terms.nan_to_num(0.0).sum(-1))


@torch.no_grad()
def kl_diagnostics(
    q_logits: torch.Tensor,
    p_logits: torch.Tensor,
    action: torch.Tensor,
    *,
    k: int = 16,
    tail_floor: float = 1e-6,
) -> dict[str, torch.Tensor]:
    """Exact KL(q ‖ p), its top-K and binary approximations, and their exact gaps.

    Args:
        q_logits: ``[..., V]`` the sampler's logits (any normalisation).
        p_logits: ``[..., V]`` the trainer's logits.
        action: ``[...]`` int64, the sampled token id at each position (for ``k_bin``).
        k: head size K (default 16); the head is the K most likely tokens under q
            (all of them when K ≥ V, leaving an empty tail).
        tail_floor: as in :func:`kl_topk` (default 1e-6).

    Returns:
        dict of ``[...]`` tensors: ``kl`` (exact), ``k_topk``, ``k_bin``, ``gap_topk`` =
        ``q_tail · KL(q(·|tail) ‖ p(·|tail))``, ``gap_bin`` =
        ``(1 − q_a) · KL(q(·|¬a) ‖ p(·|¬a))`` (both from the conditional distributions, not
        by subtraction), ``q_tail``. ``kl − k_topk == gap_topk`` holds while both tails
        exceed the floor; ``kl − k_bin == gap_bin`` always.
    """
    if q_logits.shape != p_logits.shape or q_logits.shape[:-1] != action.shape:
        raise ValueError(
            "kl_diagnostics: q_logits and p_logits must be [..., V] and action [...]; got "
            f"{tuple(q_logits.shape)}, {tuple(p_logits.shape)}, {tuple(action.shape)}"
        )
    q_log = torch.log_softmax(q_logits, dim=-1)
    p_log = torch.log_softmax(p_logits.to(q_log.dtype), dim=-1)
    kl = _xlogx_ratio(q_log, p_log).sum(-1)
    vocab = q_log.shape[-1]
    kk = min(int(k), vocab)
    head_idx = q_log.topk(kk, dim=-1).indices
    k_topk = kl_topk(q_log.gather(-1, head_idx), p_log.gather(-1, head_idx), tail_floor=tail_floor)
    tail = torch.ones_like(q_log, dtype=torch.bool).scatter(-1, head_idx, False)
    q_tail = torch.where(tail, q_log.exp(), torch.zeros_like(q_log)).sum(-1)
    gap_topk = q_tail * _conditional_kl(q_log, p_log, tail)
    a = action.long().unsqueeze(-1)
    qa, pa = q_log.gather(-1, a).squeeze(-1), p_log.gather(-1, a).squeeze(-1)
    k_bin = kl_binary(qa, pa)
    not_a = torch.ones_like(q_log, dtype=torch.bool).scatter(-1, a, False)
    gap_bin = (1.0 - qa.exp()) * _conditional_kl(q_log, p_log, not_a)
    return {
        "kl": kl,
        "k_topk": k_topk,
        "k_bin": k_bin,
        "gap_topk": gap_topk,
        "gap_bin": gap_bin,
        "q_tail": q_tail,
    }


def kl_reward_penalty(kl: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """``β Σ_tokens k`` per row: the penalty to subtract from each row's reward.

    Args:
        kl: ``[B, L]`` any per-token estimate (k1/k2/k3/k_K/k_bin/MC).
        mask: ``[B, L]`` bool, the tokens the penalty counts (garbage elsewhere is ignored).
        beta: the coefficient β (≥ 0).

    Returns:
        ``[B]`` detached penalties (rewards carry no gradient).
    """
    if beta < 0:
        raise ValueError(f"kl_reward_penalty: beta must be >= 0, got {beta}")
    k = torch.where(mask, kl.detach(), torch.zeros_like(kl))
    return beta * k.sum(1)


def kl_loss(
    kl: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """``β Σ w·k``: a KL loss term with the aggregation weights (additive over micro-batches).

    Args:
        kl: ``[B, L]`` a differentiable per-token estimate (e.g. ``kl_estimate(...,
            "k3")`` of the policy against a reference).
        weights: ``[B, L]`` aggregation weights of the whole mini-batch.
        mask: ``[B, L]`` bool.
        beta: the coefficient β (≥ 0).
    """
    if beta < 0:
        raise ValueError(f"kl_loss: beta must be >= 0, got {beta}")
    k = torch.where(mask, kl, torch.zeros_like(kl))
    w = torch.where(mask, weights, torch.zeros_like(weights))
    return beta * (k * w).sum()
