"""Loss aggregation: how per-token losses become one scalar.

Each mode is expressed as per-token weights ``w [B, L]`` with ``loss = Σ_{b,j} w·ℓ``.
Weights are computed once on the whole mini-batch, so splitting it into micro-batches
(gradient accumulation) gives exactly the same gradient. Masked tokens get weight 0 and
never enter a numerator or a denominator.

Notation: ``n_b`` = unmasked tokens of row ``b``; ``B'`` = rows with at least one
unmasked token ("active" rows); ``N = Σ n_b``; ``n_e`` = unmasked tokens of episode
``e`` (all its rows); ``E'`` = episodes with at least one unmasked token; ``L`` = the
padded width of the mask.

Modes (verl's names where they exist, https://github.com/volcengine/verl
``core_algos.agg_loss``):

- ``token-mean``: every unmasked token weighs the same, ``w = 1/N``. Long rows (and
  episodes with many rows) dominate.
- ``token-sum``: plain sum, ``w = 1``. Scale grows with the batch; for losses that are
  already normalised elsewhere.
- ``seq-mean-token-mean``: mean over each row's tokens, then mean over rows,
  ``w = 1/(n_b · B')``. Every row weighs the same; an episode weighs as many rows as it
  has.
- ``seq-mean-token-sum``: sum over each row's tokens, mean over rows, ``w = 1/B'``.
- ``seq-mean-token-sum-norm``: Dr.GRPO's constant normaliser
  (https://arxiv.org/abs/2503.20783): sum over each row's tokens divided by a constant
  ``C``, mean over rows, ``w = 1/(B' · C)``. ``C`` is the knob ``norm``; by default the
  padded width ``L`` of the mask, as verl's ``loss_scale_factor`` default
  (``loss_mask.shape[-1]``). Set ``norm`` to the maximum response length so that it stays
  constant through training (the point of Dr.GRPO).
- ``turn-sum-active-turns``: TSBPO's aggregation [recon]: sum the token surrogates within
  each response (one row = one turn), divide by the number of *active turns* of the
  batch, i.e. rows with at least one unmasked token: ``w = 1/B'``. In credo this equals
  ``seq-mean-token-sum`` (which also counts only active rows); it is registered under
  its own name so that a TSBPO recipe reads as the paper does.
- ``episode-mean``: token mean within each episode (all tokens of all its rows), then
  mean over episodes, ``w = 1/(n_e · E')``: every episode weighs the same whatever its
  number of rows or tokens. (credo's addition.)
- ``episode-mean-token-sum``: token *sum* within each episode, mean over episodes,
  ``w = 1/E'``: KLPO's ``−mean_responses Σ_tokens`` when a response is a whole multi-turn
  episode. (credo's addition.)

verl's trainer divides all three ``seq-mean-*`` modes by all rows ``B`` of the mini-batch,
including fully masked ones; credo divides by ``B'`` (see
``docs/algorithms.md#differences-from-verl``).

Sequence-level losses (HPO, KLPO's sequence route) produce one value per sequence; they
weigh sequence ``u`` by ``W_u = Σ_{tokens of u} w``, so the "mean over sequences" of
the papers is ``seq-mean-token-mean`` (a sequence = a row) or ``episode-mean`` (a
sequence = an episode).

``docs/aggregation.md`` works one example through every mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from credo.utils.registry import Registry, check_kwargs

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "aggregation_weights",
    "register_aggregation",
    "validate_aggregation",
]

Weights = Callable[..., torch.Tensor]
AGGREGATIONS: Registry[Weights] = Registry("aggregation")


def register_aggregation(name: str) -> Callable[[Weights], Weights]:
    """Decorator: ``fn(mask, episode, turn, *, knob=default) -> w [B, L]`` as a mode."""
    return AGGREGATIONS.register(name)


def _rows_with_tokens(m: torch.Tensor) -> torch.Tensor:
    return (m.sum(1) > 0).sum().clamp(min=1)


def _episode_token_counts(
    m: torch.Tensor, episode: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ep [B] dense episode ids, n_e [E] unmasked tokens per episode)``."""
    _, ep = torch.unique(episode, return_inverse=True)
    num = int(ep.max().item()) + 1 if ep.numel() else 0
    per_ep = torch.zeros(num, dtype=m.dtype).index_add_(0, ep, m.sum(1))
    return ep, per_ep


@register_aggregation("token-mean")
def token_mean(mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """``w = 1/N``."""
    m = mask.to(torch.float32)
    return m / m.sum().clamp(min=1)


@register_aggregation("token-sum")
def token_sum(mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """``w = 1`` on every unmasked token."""
    return mask.to(torch.float32)


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(
    mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    """``w = 1/(n_b · B')``."""
    m = mask.to(torch.float32)
    per_row = m.sum(1, keepdim=True).clamp(min=1)
    return m / per_row / _rows_with_tokens(m)


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(
    mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    """``w = 1/B'``."""
    m = mask.to(torch.float32)
    return m / _rows_with_tokens(m)


@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    mask: torch.Tensor,
    episode: torch.Tensor,
    turn: torch.Tensor,
    *,
    norm: float | None = None,
) -> torch.Tensor:
    """``w = 1/(B' · C)``, ``C = norm`` (default: the padded width ``L`` of ``mask``).

    Args:
        norm: the constant normaliser ``C`` (> 0), e.g. the maximum response length.
            ``None`` (default) uses ``mask.shape[1]`` like verl; computed on the whole
            mini-batch, so micro-batches still add up, but it changes with the batch's
            longest row unless set explicitly.
    """
    if norm is not None and not norm > 0:
        raise ValueError(f"seq-mean-token-sum-norm: norm must be > 0 (or None), got {norm}")
    m = mask.to(torch.float32)
    c = float(norm) if norm is not None else float(max(m.shape[1], 1))
    return m / (_rows_with_tokens(m) * c)


@register_aggregation("turn-sum-active-turns")
def turn_sum_active_turns(
    mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    """TSBPO [recon]: ``w = 1/(active turns)``, a turn = a row with ≥ 1 unmasked token."""
    m = mask.to(torch.float32)
    return m / _rows_with_tokens(m)


@register_aggregation("episode-mean")
def episode_mean(mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """``w = 1/(n_e · E')``."""
    m = mask.to(torch.float32)
    ep, per_ep = _episode_token_counts(m, episode)
    n_eps = (per_ep > 0).sum().clamp(min=1)
    return m / per_ep[ep].clamp(min=1)[:, None] / n_eps


@register_aggregation("episode-mean-token-sum")
def episode_mean_token_sum(
    mask: torch.Tensor, episode: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    """``w = 1/E'``."""
    m = mask.to(torch.float32)
    _, per_ep = _episode_token_counts(m, episode)
    n_eps = (per_ep > 0).sum().clamp(min=1)
    return m / n_eps


def validate_aggregation(name: str, params: Mapping[str, Any] | None = None) -> None:
    """Check the mode name and that every key of ``params`` is one of its knobs."""
    fn = AGGREGATIONS.get(name)
    check_kwargs("aggregation", name, fn, params or {}, reserved=("mask", "episode", "turn"))


def aggregation_weights(
    mask: torch.Tensor, mode: str, *, episode: torch.Tensor, turn: torch.Tensor, **params: Any
) -> torch.Tensor:
    """Per-token weights ``[B, L]`` (float32) of aggregation ``mode`` (see the module docstring).

    Compute them on the *whole* mini-batch and slice them with the micro-batches.

    Args:
        mask: ``[B, L]`` bool tokens in the loss.
        mode: a registered aggregation name.
        episode: ``[B]`` episode id of each row.
        turn: ``[B]`` turn index of each row.
        **params: the mode's knobs (only ``seq-mean-token-sum-norm`` has one: ``norm``).
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, L], got shape {tuple(mask.shape)}")
    if episode.shape != mask.shape[:1]:
        raise ValueError(
            f"episode must be [B] = [{mask.shape[0]}], got shape {tuple(episode.shape)}"
        )
    validate_aggregation(mode, params)
    return AGGREGATIONS.get(mode)(mask.bool(), episode, turn, **params)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    episode: torch.Tensor,
    turn: torch.Tensor,
    **params: Any,
) -> torch.Tensor:
    """``Σ w·values`` with the weights of ``mode``; masked entries never contribute."""
    w = aggregation_weights(mask, mode, episode=episode, turn=turn, **params)
    return (torch.where(mask, values, torch.zeros_like(values)) * w).sum()
