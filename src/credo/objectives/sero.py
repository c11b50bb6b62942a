"""SERO: the auxiliary loss on executable oracle continuations. [recon]

SERO, "learning long-horizon agentic RL from executable oracle continuations" (Shanghai
AI Laboratory, SJTU, Tongji; known to credo only from a summary of the paper;
``docs/algorithms.md#sero``). From states s the policy reached, the
env's oracle acts for K steps o_0 … o_{K−1} (:mod:`credo.rollout.oracle`). The loss is

    L = L_RL + λ_O · L_O,     L_O = −(1/S) Σ_s Σ_k w_k(s) · log π_θ(o_k | s, o_<k),

with S the number of continuations in the mini-batch, log π_θ(o_k | …) the sum of the
log-probs of action o_k's response tokens, and the *policy-reachability* weight

    log w_k(s) = clip( Σ_{j<k} ℓ_j , log w_min, 0 ),   ℓ_j = log π_frozen(o_j | s, o_<j)

from a frozen copy of the policy (no gradient): deep oracle steps, which the policy
would be unlikely to reach by following the oracle, are supervised less, and the
effective horizon grows as the policy comes to agree with the oracle. Options
(``mode``): ``"product"`` (ℓ_j = Σ_tokens log π_frozen, the action's probability),
``"geomean"`` (ℓ_j = mean_tokens log π_frozen, the per-token geometric mean, which does
not penalise long actions) or ``"none"`` (w = 1); ``inclusive=True`` also counts the
step's own action (Σ_{j≤k}); ``min_weight`` = w_min clips the weights from below
(0 = no floor). All in log space, so long products never underflow.

The RL reward, advantages and ratios are untouched: L_O only adds a term, and λ_O = 0
gives the base method exactly. The trainer adds λ_O · L_O in every optimizer step
(``objective.oracle_coef`` and the other ``objective.oracle_*`` knobs).
"""

from __future__ import annotations

import math

import torch

__all__ = ["WEIGHT_MODES", "action_logprobs", "reachability_log_weights", "sero_loss"]

#: Accepted ``mode`` values of the reachability weight.
WEIGHT_MODES = ("product", "geomean", "none")


def action_logprobs(
    token_logprobs: torch.Tensor, mask: torch.Tensor, *, geomean: bool = False
) -> torch.Tensor:
    """Per-row action log-probability → ``[B]``.

    Args:
        token_logprobs: ``[B, L]`` log-prob of each token.
        mask: ``[B, L]`` bool, the action's (response) tokens.
        geomean: mean over the tokens instead of the sum (default False). A row without
            tokens gives 0.
    """
    lp = torch.where(mask, token_logprobs, torch.zeros_like(token_logprobs)).sum(1)
    if geomean:
        lp = lp / mask.sum(1).clamp(min=1).to(lp.dtype)
    return lp


def reachability_log_weights(
    action_lp: torch.Tensor,
    chain: torch.Tensor,
    position: torch.Tensor,
    *,
    mode: str = "product",
    inclusive: bool = False,
    min_weight: float = 0.0,
) -> torch.Tensor:
    """log w_k of each oracle row → ``[B]`` (see the module docstring).

    Args:
        action_lp: ``[B]`` ℓ of each row under the frozen policy: the action's summed
            token log-probs (``mode="product"``) or their mean (``"geomean"``); see
            :func:`action_logprobs`.
        chain: ``[B]`` continuation id of each row.
        position: ``[B]`` k, its step within the continuation (distinct within a chain;
            every chain's rows 0..k must be present for the prefix to be complete).
        mode: ``"product"`` (default), ``"geomean"`` or ``"none"`` (all 0).
        inclusive: include the row's own ℓ_k in its prefix (default False).
        min_weight: w_min ∈ [0, 1]; log w is clipped to [log w_min, 0] (default 0: no
            lower clip).
    """
    if mode not in WEIGHT_MODES:
        raise ValueError(f"SERO weight mode must be one of {WEIGHT_MODES}, got {mode!r}")
    if not 0 <= min_weight <= 1:
        raise ValueError(f"SERO min_weight must be in [0, 1], got {min_weight}")
    b = action_lp.numel()
    if mode == "none" or b == 0:
        return torch.zeros(b, dtype=torch.float64)
    x = action_lp.to(torch.float64)
    order = torch.argsort(chain * (int(position.max()) + 1) + position)
    xs, cs = x[order], chain[order]
    run = torch.cumsum(xs, 0)
    is_start = torch.ones(b, dtype=torch.bool)
    is_start[1:] = cs[1:] != cs[:-1]
    idx = torch.arange(b)
    first = torch.cummax(torch.where(is_start, idx, torch.zeros_like(idx)), 0).values
    before_chain = run[first] - xs[first]  # running sum before the chain's first row
    prefix = run - before_chain - (0 if inclusive else xs)
    out = torch.empty(b, dtype=torch.float64)
    out[order] = prefix
    low = math.log(min_weight) if min_weight > 0 else -math.inf
    return out.clamp(min=low, max=0.0)


def sero_loss(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    log_weights: torch.Tensor,
    *,
    num_chains: int,
    num_rows: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L_O on (a micro-batch of) oracle rows → ``(loss, metrics)``.

    loss = −(1/S) Σ_b w_b Σ_j mask·log π_θ. Normalised by the mini-batch's totals
    (``num_chains``, ``num_rows``), so loss and metrics add up over micro-batches.

    Args:
        logprobs: ``[B, L]`` log π_θ of every token (with grad).
        mask: ``[B, L]`` bool, the oracle action tokens.
        log_weights: ``[B]`` log w of each row (no grad; see
            :func:`reachability_log_weights`).
        num_chains: S, continuations in the whole mini-batch (≥ 1).
        num_rows: oracle rows in the whole mini-batch (≥ 1).

    Metrics: ``loss/oracle`` (L_O), ``oracle/nll`` (mean over rows of −log π_θ(o_k)),
    ``oracle/weight`` (mean w over rows).
    """
    lp = action_logprobs(logprobs, mask)
    w = log_weights.detach().to(lp.device, lp.dtype).exp()
    s, r = max(1, num_chains), max(1, num_rows)
    loss = -(w * lp).sum() / s
    metrics = {
        "loss/oracle": loss.detach(),
        "oracle/nll": -lp.detach().sum() / r,
        "oracle/weight": w.sum() / r,
    }
    return loss, metrics
