"""What a policy loss receives: :class:`LossInputs`, and the check that it is finite."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["LossInputs", "check_finite_inputs"]


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


#: The tensors :func:`check_finite_inputs` checks on unmasked tokens (``ref_logprobs``
#: when given).
CHECKED_FIELDS = ("advantages", "logprobs", "old_logprobs", "ref_logprobs", "weights")


def check_finite_inputs(inputs: LossInputs, loss: str) -> None:
    """Raise ``ValueError`` if an input a loss reads is NaN or ±inf on an unmasked token.

    Checks :data:`CHECKED_FIELDS` (``[B, L]`` each) where ``inputs.mask`` is true; masked
    positions may hold anything (padding is never read). One NaN advantage or log-prob
    would otherwise make the loss and every gradient NaN without a word. The registry
    runs this before every registered loss (:func:`credo.objectives.registry.register_loss`);
    it costs one device synchronisation per call.

    Args:
        inputs: the batch.
        loss: the loss's registry name, for the message.

    Raises:
        ValueError: e.g. ``loss 'ppo': inputs.advantages has 2 non-finite value(s) on
        unmasked tokens (first: nan at row 0, position 3); losses need finite advantages,
        log-probs and weights (check the rewards, the estimator and the model's
        log-probs)``.
    """
    mask = inputs.mask
    tensors = [(name, getattr(inputs, name)) for name in CHECKED_FIELDS]
    tensors = [(name, t) for name, t in tensors if t is not None and t.shape == mask.shape]
    if not tensors:
        return
    bad = torch.stack([(~torch.isfinite(t.detach()) & mask).sum() for _, t in tensors])
    counts = bad.tolist()  # the one synchronisation
    for (name, t), n in zip(tensors, counts):
        if n:
            row, pos = (~torch.isfinite(t.detach()) & mask).nonzero()[0].tolist()
            raise ValueError(
                f"loss {loss!r}: inputs.{name} has {n} non-finite value(s) on unmasked tokens "
                f"(first: {t[row, pos].item()} at row {row}, position {pos}); losses need "
                "finite advantages, log-probs and weights (check the rewards, the estimator "
                "and the model's log-probs)"
            )
