"""Loss aggregation: how per-token losses become one scalar.

Each mode is expressed as per-token weights ``w [B, L]`` with ``loss = Σ_{b,j} w·ℓ``.
Weights are computed once on the whole mini-batch, so splitting it into micro-batches
(gradient accumulation) gives exactly the same gradient. Masked tokens get weight 0 and
never enter a numerator or a denominator.

Modes (verl's names where they exist):

- ``token-mean``: every unmasked token weighs the same, ``w = 1/ΣM``. Long rows (and
  episodes with many rows) dominate.
- ``seq-mean-token-mean``: mean over each row's tokens, then mean over rows,
  ``w = 1/(n_b · B')`` with ``n_b`` the row's token count and ``B'`` the rows with at least
  one token. Every row weighs the same; an episode weighs as many rows as it has.
- ``seq-mean-token-sum``: sum over each row's tokens, mean over rows, ``w = 1/B'``.
- ``episode-mean``: token mean within each episode (all tokens of all its rows), then
  mean over episodes, ``w = 1/(n_e · E')``: every episode weighs the same whatever its
  number of rows or tokens. (credo's addition.)

``docs/aggregation.md`` works one example through every mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from credo.utils.registry import Registry

__all__ = ["AGGREGATIONS", "aggregate", "aggregation_weights", "register_aggregation"]

Weights = Callable[..., torch.Tensor]
AGGREGATIONS: Registry[Weights] = Registry("aggregation")


def register_aggregation(name: str) -> Callable[[Weights], Weights]:
    return AGGREGATIONS.register(name)


def _rows_with_tokens(m: torch.Tensor) -> torch.Tensor:
    return (m.sum(1) > 0).sum().clamp(min=1)


@register_aggregation("token-mean")
def token_mean(mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    m = mask.to(torch.float32)
    return m / m.sum().clamp(min=1)


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(
    mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    m = mask.to(torch.float32)
    per_row = m.sum(1, keepdim=True).clamp(min=1)
    return m / per_row / _rows_with_tokens(m)


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(
    mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    m = mask.to(torch.float32)
    return m / _rows_with_tokens(m)


@register_aggregation("episode-mean")
def episode_mean(mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    m = mask.to(torch.float32)
    _, ep = torch.unique(episode, return_inverse=True)
    num = int(ep.max().item()) + 1 if ep.numel() else 0
    per_ep = torch.zeros(num).index_add_(0, ep, m.sum(1))
    n_eps = (per_ep > 0).sum().clamp(min=1)
    return m / per_ep[ep].clamp(min=1)[:, None] / n_eps


def aggregation_weights(
    mask: torch.Tensor, mode: str, *, episode: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    """Per-token weights ``[B, L]`` of aggregation ``mode`` (see the module docstring).

    Args:
        mask: ``[B, L]`` bool tokens in the loss.
        mode: a registered aggregation name.
        episode: ``[B]`` episode id of each row.
        turn: ``[B]`` turn index of each row.
    """
    return AGGREGATIONS.get(mode)(mask, episode, turn)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    episode: torch.Tensor,
    turn: torch.Tensor,
) -> torch.Tensor:
    """``Σ w·values`` with the weights of ``mode``; masked entries never contribute."""
    w = aggregation_weights(mask, mode, episode=episode, turn=turn)
    return (torch.where(mask, values, torch.zeros_like(values)) * w).sum()
