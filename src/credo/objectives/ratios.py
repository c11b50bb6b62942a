"""Importance log-ratios at three levels: token, turn, sequence.

Every function returns a per-token tensor ``[B, L]`` (0 on masked tokens), so that the
PPO surrogate (:func:`credo.objectives.ppo.ppo_token_loss`) and the aggregation weights
apply unchanged. With ``log r_{b,k} = log π_θ − log π_old`` of token ``k`` of row ``b``:

- ``token``: ``log ρ_{b,k} = log r_{b,k}`` (PPO, GRPO).
- ``turn``: one row is one turn (step); every token of the row gets the row's mean
  log-ratio, ``log ρ_{b,k} = (1/n_b) Σ_k' log r_{b,k'}``, i.e. the geometric mean of the
  token ratios, ``exp(mean_k log r)``, clipped per step. The gradient is the true
  gradient of the mean (each token's log-prob gets ``1/n_b``). "GRPO-C" of the
  trajectory-graph paper; ROLL's ``ratio_type: segment`` (``compute_segment_masked_mean``
  over the row's response span). [code]
- ``sequence``: GSPO (Zheng et al. 2025, https://arxiv.org/abs/2507.18071): the mean
  log-ratio over *all* response tokens of the episode (all rows with the same ``episode``
  id), in GSPO's token form ("GSPO-token", verl's ``compute_policy_loss_gspo``):

      log ρ_{b,k} = sg( (1/n_e) Σ_{rows b' of e} Σ_k' log r_{b',k'} )
                    + log π_θ(y_{b,k}) − sg(log π_θ(y_{b,k}))

  Its value is the episode's mean log-ratio on every token; its gradient w.r.t. a token's
  log-prob is 1 (scaled by ρ in the surrogate). With the advantage constant over the
  episode and ``episode-mean`` weights (or ``seq-mean-token-mean`` when each episode is
  one row, as in verl's GSPO) this is exactly GSPO's sequence objective
  ``s_e·A_e`` with gradient ``s_e A_e (1/n_e) Σ ∇log π``. (verl clamps this log-ratio at
  10 before ``exp``; credo's PPO surrogate clamps every log-ratio to ±20.) [code]

Turn and sequence give the same gradient whenever ``w·A`` is constant over the row
(episode); they differ under per-token weights or advantages, where the sequence form
keeps per-token credit (as GSPO-token intends) and the turn form spreads it evenly.

Micro-batches: ``token`` and ``turn`` only look at one row, so any split of the rows is
exact. ``sequence`` needs every row of an episode in the same micro-batch (split the
mini-batch along episode boundaries); otherwise the episode mean is taken over the part
that is present.

Masked positions may hold any value (even NaN/inf): they are replaced before any
arithmetic, and their gradient is exactly 0.
"""

from __future__ import annotations

import torch

from credo.data.ops import compact_ids, segment_sum

__all__ = [
    "RATIO_LEVELS",
    "log_ratio",
    "sequence_log_ratio",
    "token_log_ratio",
    "turn_log_ratio",
]

RATIO_LEVELS = ("token", "turn", "sequence")


def _check(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> None:
    if logprobs.dim() != 2 or logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            "logprobs, old_logprobs and mask must all be [B, L]; got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")


def token_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``log π_θ − log π_old`` per token, 0 on masked tokens.

    Args:
        logprobs: ``[B, L]`` log π_θ of the taken tokens (with grad).
        old_logprobs: ``[B, L]`` log π_old (the sampler's), no grad needed.
        mask: ``[B, L]`` bool, tokens in the loss.

    Returns:
        ``[B, L]`` log-ratios.
    """
    _check(logprobs, old_logprobs, mask)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp = torch.where(mask, logprobs, zero)
    old = torch.where(mask, old_logprobs.detach().to(logprobs.dtype), zero)
    return lp - old


def turn_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The row's mean log-ratio on each of its tokens (geometric-mean ratio per turn).

    Args:
        logprobs: ``[B, L]`` log π_θ (with grad).
        old_logprobs: ``[B, L]`` log π_old.
        mask: ``[B, L]`` bool.

    Returns:
        ``[B, L]``: ``(1/n_b) Σ_k log r_{b,k}`` on row ``b``'s unmasked tokens, 0
        elsewhere (rows without tokens are all 0). Differentiable through the mean.
    """
    lr = token_log_ratio(logprobs, old_logprobs, mask)
    n = mask.sum(1).clamp(min=1).to(lr.dtype)
    row = lr.sum(1) / n
    return torch.where(mask, row[:, None].expand_as(lr), torch.zeros_like(lr))


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, episode: torch.Tensor
) -> torch.Tensor:
    """GSPO's sequence log-ratio over each episode, in the stop-gradient token form.

    Args:
        logprobs: ``[B, L]`` log π_θ (with grad).
        old_logprobs: ``[B, L]`` log π_old.
        mask: ``[B, L]`` bool.
        episode: ``[B]`` episode id of each row; the mean runs over all unmasked tokens
            of all rows sharing the id.

    Returns:
        ``[B, L]``: value ``(1/n_e) Σ log r`` over the episode on each unmasked token
        (0 elsewhere); gradient ``∂/∂ log π_θ(y_{b,k}) = 1`` on unmasked tokens.
    """
    lr = token_log_ratio(logprobs, old_logprobs, mask)
    if episode.shape != mask.shape[:1]:
        raise ValueError(f"episode must be [B] = [{mask.shape[0]}], got {tuple(episode.shape)}")
    eid, num = compact_ids(episode)
    total = segment_sum(lr.detach().sum(1), eid, num)
    count = segment_sum(mask.sum(1).to(lr.dtype), eid, num)
    seq = (total / count.clamp(min=1))[eid]
    lp = torch.where(mask, logprobs, torch.zeros((), dtype=logprobs.dtype, device=logprobs.device))
    out = seq[:, None] + (lp - lp.detach())
    return torch.where(mask, out, torch.zeros_like(out))


def log_ratio(
    level: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    episode: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token log-ratio ``[B, L]`` at ``level`` (``token``, ``turn`` or ``sequence``).

    Args:
        level: one of :data:`RATIO_LEVELS`.
        logprobs, old_logprobs, mask: ``[B, L]`` as in :func:`token_log_ratio`.
        episode: ``[B]`` episode ids; required for ``sequence``.
    """
    if level == "token":
        return token_log_ratio(logprobs, old_logprobs, mask)
    if level == "turn":
        return turn_log_ratio(logprobs, old_logprobs, mask)
    if level == "sequence":
        if episode is None:
            raise ValueError("ratio level 'sequence' needs the [B] episode ids")
        return sequence_log_ratio(logprobs, old_logprobs, mask, episode)
    raise ValueError(f"unknown ratio level {level!r}; valid: {', '.join(RATIO_LEVELS)}")
