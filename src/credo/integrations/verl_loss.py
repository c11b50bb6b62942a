"""credo's policy losses on verl's loss tensors (no verl import).

verl calls a policy loss with ``old_log_prob``, ``log_prob``, ``advantages`` and
``response_mask`` (all ``[B, L]``, one row per response), a ``loss_agg_mode`` and its
``global_batch_info`` (``dp_size``, ``batch_num_tokens``, ``global_batch_size``,
``loss_scale_factor``) so that micro-batches and data-parallel ranks add up to the global
batch's loss (``verl.trainer.ppo.core_algos.agg_loss``). credo's losses are ``Σ w·x`` with
per-token weights ``w`` (:mod:`credo.objectives.aggregation`), so the adapter turns verl's
aggregation into weights (:func:`verl_aggregation_weights`, the same sum as ``agg_loss``
for every mode) and calls the credo loss on :class:`~credo.objectives.LossInputs`.

Turns. In verl's multi-turn agent loop one row holds a whole conversation: the assistant's
turns are the runs of ``response_mask = 1`` and the env's / tools' tokens between them are
masked out. :func:`split_turns` finds those runs, and with ``turns=True``
:func:`credo_policy_loss` packs each run into its own credo row (``episode`` = the verl
row), so credo's turn-level ratio (``ratio_level="turn"``, the geometric mean of each
turn's token ratios) applies per assistant turn. In verl-agent's layout (one row per env
step) every row is one run, i.e. one turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from credo.objectives import LossInputs, get_loss

__all__ = [
    "VERL_AGG_MODES",
    "TurnSplit",
    "credo_policy_loss",
    "pack_turns",
    "split_turns",
    "verl_aggregation_weights",
]

VERL_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "seq-mean-token-mean",
)


def verl_aggregation_weights(
    mask: torch.Tensor,
    mode: str,
    *,
    dp_size: int = 1,
    batch_num_tokens: float | torch.Tensor | None = None,
    global_batch_size: float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Per-token weights ``w [B, L]`` with ``Σ w·ℓ`` = verl's ``agg_loss(ℓ, mask, mode, ...)``.

    Args:
        mask: ``[B, L]`` bool, tokens in the loss.
        mode: one of :data:`VERL_AGG_MODES`.
        dp_size: data-parallel ranks (verl scales each rank's loss by it).
        batch_num_tokens: tokens of the global batch (``token-mean``); default: this
            batch's (only with ``dp_size == 1``).
        global_batch_size: sequences of the global batch (``seq-mean-*``); default: this
            batch's rows with at least one token (only with ``dp_size == 1``).
        loss_scale_factor: the constant of ``seq-mean-token-sum-norm``; default ``L``.

    Returns:
        ``[B, L]`` float32, 0 on masked tokens.
    """
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, L], got shape {tuple(mask.shape)}")
    if mode not in VERL_AGG_MODES:
        raise ValueError(f"unknown verl loss_agg_mode {mode!r}; valid: {', '.join(VERL_AGG_MODES)}")
    m = mask.to(torch.float32)
    dp = float(dp_size)
    if mode == "token-sum":
        return m * dp
    if mode == "token-mean":
        if batch_num_tokens is None:
            _need_global(dp_size, "batch_num_tokens", mode)
            batch_num_tokens = m.sum()
        return m / _as_float(batch_num_tokens, m) * dp
    seq_tokens = m.sum(-1, keepdim=True)
    if global_batch_size is None:
        _need_global(dp_size, "global_batch_size", mode)
        global_batch_size = (seq_tokens > 0).float().sum()
    g = _as_float(global_batch_size, m)
    if mode == "seq-mean-token-mean":
        return m / (seq_tokens + 1e-8) / g * dp
    w = m / g * dp
    if mode == "seq-mean-token-sum-norm":
        w = w / float(loss_scale_factor if loss_scale_factor is not None else m.shape[-1])
    return w


def _need_global(dp_size: int, name: str, mode: str) -> None:
    if dp_size > 1:
        raise ValueError(f"loss_agg_mode {mode!r} with dp_size > 1 needs the global {name}")


def _as_float(x: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float32, device=like.device)


@dataclass(frozen=True)
class TurnSplit:
    """The runs of ``mask = 1`` in each row, packed.

    Attributes:
        row: ``[T]`` verl row of each turn.
        turn: ``[T]`` index of the turn within its row (0, 1, ...).
        index: ``[T, S]`` token positions of each turn, padded with the turn's last one.
        valid: ``[T, S]`` bool, real (not padding) positions.
    """

    row: torch.Tensor
    turn: torch.Tensor
    index: torch.Tensor
    valid: torch.Tensor


def split_turns(mask: torch.Tensor) -> TurnSplit:
    """Maximal runs of unmasked tokens of each row of ``mask [B, L]`` → :class:`TurnSplit`.

    Rows without tokens have no turn. ``S`` is the longest run (1 when there is none).
    """
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, L], got shape {tuple(mask.shape)}")
    m = mask.bool()
    prev = torch.zeros_like(m)
    prev[:, 1:] = m[:, :-1]
    start = m & ~prev
    rows, cols = torch.nonzero(start, as_tuple=True)
    nxt = torch.zeros_like(m)
    nxt[:, :-1] = m[:, 1:]
    _, end_cols = torch.nonzero(m & ~nxt, as_tuple=True)  # same order as the starts
    length = end_cols - cols + 1
    s = int(length.max()) if length.numel() else 1
    offs = torch.arange(s, device=m.device)
    valid = offs[None, :] < length[:, None]
    index = torch.minimum(cols[:, None] + offs[None, :], end_cols[:, None])
    turn_no = torch.cumsum(start.long(), dim=1)[rows, cols] - 1
    return TurnSplit(row=rows, turn=turn_no, index=index, valid=valid)


def pack_turns(x: torch.Tensor, split: TurnSplit, fill: float = 0.0) -> torch.Tensor:
    """``x [B, L, ...]`` → ``[T, S, ...]`` turn by turn (``fill`` on padding); keeps gradients."""
    out = x[split.row[:, None], split.index]
    valid = split.valid.reshape(*split.valid.shape, *([1] * (x.dim() - 2)))
    return torch.where(valid, out, torch.full((), fill, dtype=x.dtype, device=x.device))


def credo_policy_loss(
    loss: str,
    params: Mapping[str, Any],
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    weights: torch.Tensor,
    turns: bool = False,
    step: int = 0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run credo loss ``loss`` on verl's tensors.

    Args:
        loss: a credo loss name (:func:`credo.objectives.get_loss`).
        params: its knobs.
        old_log_prob, log_prob, advantages: ``[B, L]`` as verl passes them.
        response_mask: ``[B, L]``.
        weights: ``[B, L]`` aggregation weights (:func:`verl_aggregation_weights`, times
            verl's ``rollout_is_weights`` when it has them).
        turns: split rows into their assistant turns first (:func:`split_turns`); each turn
            becomes a credo row whose ``episode`` is its verl row.
        step: training step (HölderPO's p schedule).

    Returns:
        credo's ``(loss, metrics)``.
    """
    shapes = {tuple(t.shape) for t in (old_log_prob, log_prob, advantages, response_mask, weights)}
    if len(shapes) != 1 or log_prob.dim() != 2:
        raise ValueError(
            "old_log_prob, log_prob, advantages, response_mask and weights must all be "
            f"[B, L]; got shapes {sorted(shapes)}"
        )
    mask = response_mask.bool()
    b = mask.shape[0]
    if turns:
        split = split_turns(mask)
        inputs = LossInputs(
            logprobs=pack_turns(log_prob, split),
            old_logprobs=pack_turns(old_log_prob, split),
            advantages=pack_turns(advantages, split),
            mask=split.valid,
            weights=pack_turns(weights, split),
            episode=split.row,
            turn=split.turn,
            step=step,
        )
    else:
        inputs = LossInputs(
            logprobs=log_prob,
            old_logprobs=old_log_prob,
            advantages=advantages,
            mask=mask,
            weights=weights,
            episode=torch.arange(b, device=mask.device),
            turn=torch.zeros(b, dtype=torch.long, device=mask.device),
            step=step,
        )
    return get_loss(loss)(inputs, **dict(params))
