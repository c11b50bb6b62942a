"""SERPO's judge in the iteration (:class:`credo.teachers.judging.Judging`, the ``judge``
section): the free text of the iteration's episodes is judged against the rubric and the
rubric reward combined with the env's before credit assignment; the rubric and the
response pools are checkpointed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from credo.teachers.judging import Judging
from credo.train.parts.base import IterationData, Part, PartContext, register_part

__all__ = ["JudgePart"]


@register_part("judge", when=lambda cfg: cfg.judge.enabled)
class JudgePart(Part):
    """The rubric reward of each episode's free text (module docstring)."""

    checkpoint_key = "judge_state"

    def __init__(self, ctx: PartContext) -> None:
        judging = Judging.from_run(ctx.cfg, ctx.run.make_env, ctx.run_dir, ctx.policy.device)
        assert judging is not None  # `when` asked for a judge
        self.judging = judging

    def reward(self, data: IterationData) -> None:
        judged = self.judging.reward(data.forest, data.tasks, data.it)
        data.forest = judged.forest
        data.metrics.update(judged.metrics)

    def state_dict(self) -> dict[str, Any]:
        return self.judging.state_dict()

    def load(self, folder: Path, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.judging.load_state_dict(state)
