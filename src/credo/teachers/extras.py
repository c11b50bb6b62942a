"""Carrying teacher scores from the rollout phase to the loss.

Teachers score the whole token batch once per iteration (after the rollouts); the trainer
then splits the batch into mini- and micro-batches. :func:`attach_teacher_scores` stores
the scores in ``TokenBatch.token_extras`` (``[B, L, ...]`` tensors that follow every
``index``/``trim``), and, in the update, :func:`teacher_extra_ids` gives the ids whose
log-probs the *student* must gather in its own forward pass (``HFPolicy.score(...,
extra_ids=...)``, with grad) and :func:`teacher_loss_extras` turns a micro-batch's token
extras plus those student log-probs into the ``LossInputs.extras`` the distillation losses
read (``teacher_logprobs``, ``teacher_topk_logprobs``, ``student_topk_logprobs``,
``ref_topk_logprobs``, ``teacher_row_mask``).

Token-extra keys (``prefix`` = ``teacher``; a Rényi reference uses ``ref`` on the same ids):

- ``teacher_logprobs`` ``[B, L]``: log π_T of the sampled tokens.
- ``teacher_topk_ids`` / ``teacher_topk_logprobs`` ``[B, L, K]``: the teacher's head.
- ``teacher_mask`` ``[B, L]`` bool: tokens of rows that have a teacher signal.
- ``ref_topk_logprobs`` ``[B, L, K]``: a reference's log-probs of the teacher's head ids.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from credo.data import TokenBatch
from credo.objectives.extras import register_extras
from credo.teachers.base import TeacherScores

__all__ = ["attach_teacher_scores", "teacher_extra_ids", "teacher_loss_extras"]


def attach_teacher_scores(
    batch: TokenBatch,
    scores: TeacherScores,
    *,
    prefix: str = "teacher",
    row_mask: torch.Tensor | None = None,
    head_only: bool = False,
) -> None:
    """Store ``scores`` in ``batch.token_extras`` (in place).

    Args:
        batch: the iteration's token batch (the rows the teacher scored, same layout).
        scores: the teacher's scores of ``batch``.
        prefix: key prefix (``teacher``; ``ref`` for a reference scored on the teacher's
            head ids, whose ids are then not stored again).
        row_mask: ``[B]`` bool rows with a teacher signal (stored per token as
            ``{prefix}_mask``), or ``None``.
        head_only: store only ``{prefix}_topk_logprobs`` (for ``ref``).
    """
    shape = tuple(batch.input_ids.shape)
    if tuple(scores.logprobs.shape) != shape:
        raise ValueError(
            f"teacher scores {list(scores.logprobs.shape)} do not match the batch {list(shape)}"
        )
    ex = batch.token_extras
    if not head_only:
        ex[f"{prefix}_logprobs"] = scores.logprobs
        if scores.topk_ids is not None:
            ex[f"{prefix}_topk_ids"] = scores.topk_ids
    if scores.topk_logprobs is not None:
        ex[f"{prefix}_topk_logprobs"] = scores.topk_logprobs
    if row_mask is not None:
        if row_mask.shape != shape[:1]:
            raise ValueError(f"row_mask must be [B] = [{shape[0]}], got {list(row_mask.shape)}")
        ex[f"{prefix}_mask"] = row_mask.bool()[:, None].expand(shape).clone()


def teacher_extra_ids(token_extras: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """``[B, L, K]`` the teacher's head ids, for the student to gather, or ``None``."""
    return token_extras.get("teacher_topk_ids")


def teacher_loss_extras(
    token_extras: Mapping[str, torch.Tensor],
    student_head_logprobs: torch.Tensor | None,
    *,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """``LossInputs.extras`` for the distillation losses from a micro-batch.

    Args:
        token_extras: the micro-batch's ``TokenBatch.token_extras``.
        student_head_logprobs: ``[B, L, K]`` the student's log-probs (with grad) of
            :func:`teacher_extra_ids`, or ``None`` when there is no head.
        device: where the loss runs (default: that of ``student_head_logprobs``).
    """
    dev = (
        device
        if device is not None
        else (student_head_logprobs.device if student_head_logprobs is not None else None)
    )
    out: dict[str, torch.Tensor] = {}
    for key in ("teacher_logprobs", "teacher_topk_logprobs", "ref_topk_logprobs"):
        if key in token_extras:
            out[key] = token_extras[key].to(dev) if dev is not None else token_extras[key]
    if "teacher_mask" in token_extras:
        m = token_extras["teacher_mask"]
        out["teacher_row_mask"] = m.to(dev) if dev is not None else m
    if student_head_logprobs is not None:
        head = token_extras.get("teacher_topk_logprobs")
        if head is not None and head.shape != student_head_logprobs.shape:
            raise ValueError(
                f"student head log-probs {list(student_head_logprobs.shape)} do not match the "
                f"teacher's head {list(head.shape)}"
            )
        out["student_topk_logprobs"] = student_head_logprobs
    return out


#: The update gathers the student's log-probs of the teacher's head in its own forward pass.
register_extras(
    "teacher",
    ids=teacher_extra_ids,
    extras=lambda token_extras, logprobs, device: teacher_loss_extras(
        token_extras, logprobs, device=device
    ),
)
