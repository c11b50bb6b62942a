"""Teachers backed by a policy: any loaded model, or the student itself (self-teacher)."""

from __future__ import annotations

from typing import Any

from credo.policy import HFPolicy
from credo.teachers.base import TeacherCost, TeacherRows, TeacherScores
from credo.teachers.scoring import score_with_policy

__all__ = ["PolicyTeacher", "SelfTeacher"]


class PolicyTeacher:
    """A teacher that scores with an :class:`~credo.policy.HFPolicy`.

    Args:
        policy: the teacher model (loaded from a run, a checkpoint or an HF folder by
            :func:`credo.teachers.load_teacher_policy`, or any policy already in memory).
        name: a short description for logs (default ``"policy"``).
        micro_batch: rows per forward pass (default 16).
        temperature: divides the teacher's logits (default 1.0: its own distribution).
    """

    def __init__(
        self,
        policy: HFPolicy,
        *,
        name: str = "policy",
        micro_batch: int = 16,
        temperature: float = 1.0,
    ) -> None:
        if micro_batch < 1:
            raise ValueError(f"teacher micro_batch must be >= 1, got {micro_batch}")
        self.policy = policy
        self.name = name
        self.micro_batch = int(micro_batch)
        self.temperature = float(temperature)
        self.cost_total = TeacherCost()

    @property
    def vocab_size(self) -> int:
        return int(self.policy.vocab_size)

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    def score(self, rows: TeacherRows, *, topk: int = 0, full: bool = False) -> TeacherScores:
        """Score ``rows`` in the teacher's context (see :class:`~credo.teachers.Teacher`)."""
        out = score_with_policy(
            self.policy,
            rows,
            topk=topk,
            full=full,
            micro_batch=self.micro_batch,
            temperature=self.temperature,
        )
        self.cost_total.add(out.cost)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class SelfTeacher(PolicyTeacher):
    """The student itself as its own teacher, reading privileged context.

    It shares the student's weights (no copy): the teacher signal comes from the context
    alone (``TeacherRows.prompts``: the same state rendered with privileged text), and it
    moves with the student. Scoring never builds a graph, so the teacher's log-probs are
    constants of the student's loss (``sg``).

    Args:
        student: the student policy.
        micro_batch, temperature: as :class:`PolicyTeacher`.
    """

    def __init__(self, student: HFPolicy, *, micro_batch: int = 16, temperature: float = 1.0):
        super().__init__(student, name="self", micro_batch=micro_batch, temperature=temperature)
