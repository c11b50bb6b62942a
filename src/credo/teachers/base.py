"""The teacher protocol and what it receives and returns.

A **teacher** scores the student's own rollout rows: given the student's token rows
(prompt + response ids, response mask) it returns, for every response token, the
teacher's log-prob of the sampled token and, when asked, its top-K ids and log-probs (or
the full distribution for tiny vocabularies) — in the **teacher's own context**: each row's
prompt may be replaced by another rendering of the same state that holds privileged text
the student never sees (the env's feedback, the oracle's next action, a verified
trajectory of the same task; :mod:`credo.teachers.privileged`). The response ids are
scored unchanged, and the results come back aligned with the student's ``[B, L]`` layout,
ready for ``LossInputs.extras`` (:meth:`TeacherScores.extras`).

Teachers never build a graph (scoring runs under ``torch.no_grad``) and report their cost
(:class:`TeacherCost`: wall seconds, teacher tokens processed, response tokens scored).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from credo.data import TokenBatch

__all__ = ["Teacher", "TeacherCost", "TeacherRows", "TeacherScores"]


@dataclass
class TeacherRows:
    """The student's rows to score, optionally with the teacher's own prompts.

    Shapes: ``B`` rows × ``L`` positions, right-padded as in :class:`~credo.data.TokenBatch`
    (prompt, then response, then padding).

    Attributes:
        input_ids: ``[B, L]`` int64 student prompt + response ids.
        attention_mask: ``[B, L]`` bool, real tokens.
        response_mask: ``[B, L]`` bool, the response tokens to score (one contiguous run
            per row, after at least one prompt token).
        prompts: per row, the prompt ids the teacher reads instead of the student's (its
            privileged context), or ``None`` (default) for the student's own prompt. An
            entry may be ``None`` to keep that row's student prompt.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    prompts: Sequence[Sequence[int] | None] | None = None

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2:
            raise ValueError(
                f"teacher rows: input_ids must be [B, L], got {list(self.input_ids.shape)}"
            )
        for name in ("attention_mask", "response_mask"):
            if getattr(self, name).shape != self.input_ids.shape:
                raise ValueError(
                    f"teacher rows: {name} must be [B, L] = {list(self.input_ids.shape)}, got "
                    f"{list(getattr(self, name).shape)}"
                )
        if self.prompts is not None and len(self.prompts) != self.input_ids.shape[0]:
            raise ValueError(
                f"teacher rows: {len(self.prompts)} teacher prompts for "
                f"{self.input_ids.shape[0]} rows; give one per row (None keeps the student's)"
            )

    @classmethod
    def from_batch(
        cls, batch: TokenBatch, prompts: Sequence[Sequence[int] | None] | None = None
    ) -> TeacherRows:
        """The rows of a :class:`~credo.data.TokenBatch` (its response mask, all rows)."""
        return cls(batch.input_ids, batch.attention_mask, batch.response_mask, prompts)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class TeacherCost:
    """What scoring cost.

    Attributes:
        seconds: wall-clock seconds spent in the teacher's forward passes and gathers.
        tokens: teacher tokens processed (teacher prompt + response of every row).
        scored: response tokens scored.
        rows: rows scored.
        calls: ``score`` calls.
    """

    seconds: float = 0.0
    tokens: int = 0
    scored: int = 0
    rows: int = 0
    calls: int = 0

    def add(self, other: TeacherCost) -> None:
        """Accumulate ``other`` into this cost."""
        self.seconds += other.seconds
        self.tokens += other.tokens
        self.scored += other.scored
        self.rows += other.rows
        self.calls += other.calls

    def metrics(self, prefix: str = "teacher/") -> dict[str, float]:
        """``{prefix}seconds``, ``tokens``, ``scored_tokens``, ``rows`` for the metrics log."""
        return {
            f"{prefix}seconds": float(self.seconds),
            f"{prefix}tokens": float(self.tokens),
            f"{prefix}scored_tokens": float(self.scored),
            f"{prefix}rows": float(self.rows),
        }


@dataclass
class TeacherScores:
    """A teacher's scores of the student's rows, aligned with the student's ``[B, L]``.

    Attributes:
        logprobs: ``[B, L]`` float32 log π_T of each sampled response token in the
            teacher's context; 0 outside the response.
        topk_ids: ``[B, L, K]`` int64 the teacher's K most likely token ids at each
            response position (all ``V`` ids, in order, for a full distribution), or
            ``None``; 0 outside the response.
        topk_logprobs: ``[B, L, K]`` float32 their log-probs, or ``None``; 0 outside.
        cost: what this call cost.
    """

    logprobs: torch.Tensor
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    cost: TeacherCost = field(default_factory=TeacherCost)

    def extras(self, prefix: str = "teacher") -> dict[str, torch.Tensor]:
        """``{prefix}_logprobs`` and ``{prefix}_topk_logprobs`` for ``LossInputs.extras``
        (the losses read ``teacher_*``; use ``prefix="ref"`` for a Rényi reference)."""
        out = {f"{prefix}_logprobs": self.logprobs}
        if self.topk_logprobs is not None:
            out[f"{prefix}_topk_logprobs"] = self.topk_logprobs
        return out


@runtime_checkable
class Teacher(Protocol):
    """Anything that scores the student's rows in its own context (module docstring).

    Attributes:
        name: a short description for logs (``run:/path``, ``self``, ``ema(0.99)``).
        vocab_size: size of the distribution it scores (must equal the student's).
        tokenizer: its tokenizer (the student's, or one with the same vocabulary).
        cost_total: the accumulated cost of every call so far.
    """

    name: str
    vocab_size: int
    tokenizer: Any
    cost_total: TeacherCost

    def score(self, rows: TeacherRows, *, topk: int = 0, full: bool = False) -> TeacherScores:
        """Score ``rows`` (no graph): sampled-token log-probs, plus the top-``topk`` head
        (``topk > 0``) or the full distribution (``full``; tiny vocabularies)."""
        ...
