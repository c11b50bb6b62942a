"""The run's teachers in the iteration (:class:`credo.teachers.teaching.Teaching`, the
``teacher`` section): the teacher scores the policy rows once, after the rollouts; its
route (:mod:`credo.teachers.routes`) adds a reward before credit or changes the token
batch after it; an EMA teacher follows the student after each update; its weights and the
context cache are checkpointed. The teacher folders are checked against the student
before any run folder exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from credo.objectives import loss_needs
from credo.teachers.pool import greedy_play
from credo.teachers.registry import teacher_uses_reference
from credo.teachers.teaching import Lesson, Teaching, check_teacher_inputs
from credo.train.parts.base import IterationData, Part, PartContext, register_part

__all__ = ["TeacherPart"]


@register_part(
    "teacher",
    when=lambda cfg: cfg.teacher.enabled,
    needs=lambda cfg: {"reference"} if teacher_uses_reference(cfg.teacher.kind) else set(),
    texts=lambda cfg: cfg.teacher.rollout_texts(),
    check=lambda cfg, run: check_teacher_inputs(cfg.teacher, run.policy),
)
class TeacherPart(Part):
    """One lesson per iteration, routed (module docstring)."""

    checkpoint_key = "teacher_state"

    def __init__(self, ctx: PartContext) -> None:
        head = "reference_head" in loss_needs(ctx.cfg.objective.loss)  # Rényi OPSD's z_ref
        run = ctx.run
        play = (  # MT-SDPO's pool members play tasks as the held-out evaluation does
            None
            if run is None
            else greedy_play(run.renderer, run.make_env, run.sampling, run.max_turns)
        )
        teaching = Teaching.build(
            ctx.cfg.teacher, ctx.policy, ctx.reference, reference_head=head, play=play
        )
        assert teaching is not None  # `when` asked for a teacher
        self.teaching, self.renderer, self.policy = teaching, ctx.run.renderer, ctx.policy
        self.lesson: Lesson | None = None

    def reward(self, data: IterationData) -> None:
        self.lesson = self.teaching.lesson(
            self.renderer, data.forest, data.rollout.episodes, self.policy.pad_id, data.tasks
        )
        data.forest = self.lesson.reward(data.forest)  # reward routes

    def transform(self, data: IterationData) -> None:
        assert self.lesson is not None and data.batch is not None
        self.lesson.attach(data.batch)  # token routes: advantages, or scores for the loss
        data.metrics.update(self.lesson.metrics)

    def after_update(self, data: IterationData) -> None:
        self.teaching.after_update(self.policy)

    def state_dict(self) -> dict[str, Any]:
        return self.teaching.state_dict()

    def write(self, folder: Path) -> None:
        self.teaching.write(folder)

    def load(self, folder: Path, state: dict[str, Any] | None) -> None:
        self.teaching.load(folder, state)
