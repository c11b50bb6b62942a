"""What a policy loss receives: :class:`LossInputs`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["LossInputs"]


@dataclass
class LossInputs:
    """Token tensors of one (micro-)batch, aligned as in :class:`~credo.data.TokenBatch`.

    Shapes: ``B`` sequences (forest rows) × ``L`` positions. Position ``j`` of a log-prob
    tensor scores token ``j`` given tokens ``< j``.

    Attributes:
        logprobs: ``[B, L]`` log π_θ of the taken tokens (requires grad).
        old_logprobs: ``[B, L]`` log π_old (the sampler's log-probs).
        advantages: ``[B, L]`` advantage of each token (the row's advantage, broadcast).
        mask: ``[B, L]`` bool, tokens that take part in the loss.
        weights: ``[B, L]`` aggregation weights from
            :func:`credo.objectives.aggregation.aggregation_weights`, computed on the
            *whole* mini-batch so that micro-batches add up exactly; ``loss = Σ w·ℓ``.
        episode: ``[B]`` episode id of each row (for episode-level aggregation).
        turn: ``[B]`` turn index of each row.
        ref_logprobs: ``[B, L]`` log π_ref of a frozen reference, or ``None``.
        entropy: ``[B, L]`` policy entropy per position (no grad needed), or ``None``.
        step: the training iteration (for schedules such as HPO's p).
        extras: other per-token or per-row tensors a loss may need. Keys read by the
            built-in losses (a row-level tensor has ``B`` as its first dimension):

            - ``aux_logprobs`` ``[B, L, M]``: trainer log-probs of M auxiliary tokens drawn
              from the sampler at each position (``klpo``, ``klpo_seq`` with ``kl="mc"``);
              ``aux_old_logprobs`` ``[B, L, M]``: the sampler's log-probs of the same
              draws; ``aux_mask`` ``[B, L, M]`` bool: valid draws (optional).
            - ``topk_logprobs`` / ``topk_old_logprobs`` ``[B, L, K]``: trainer / sampler
              log-probs of the sampler's K most likely tokens (``kl="topk"``).
            - ``ref_logprobs_profile`` / ``ref_logprobs_plain`` ``[B, L]``: reference
              log-probs with / without the profile in the prompt (``ppo_rapo``);
              ``rapo_range`` ``[2]``: the whole mini-batch's (min, max) of their difference.
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor
    episode: torch.Tensor
    turn: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    step: int = 0
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
