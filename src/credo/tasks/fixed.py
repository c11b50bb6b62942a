"""``fixed``: the fixed task distribution — each iteration draws ``tasks_per_iter``
distinct training seeds uniformly from ``0..train_tasks-1`` and learns nothing from the
results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from credo.data.episode import Episode
from credo.envs.base import Task
from credo.tasks.registry import TaskSourceContext, register_task_source

__all__ = ["FixedSource"]


@register_task_source("fixed")
class FixedSource:
    """Uniform draws without replacement from the training seeds (stateless).

    Args:
        ctx: the pool size and the tasks per iteration.
        params: unused (``fixed`` has no knobs).
    """

    def __init__(self, ctx: TaskSourceContext, params: Any = None) -> None:
        self.train_tasks = ctx.train_tasks
        self.tasks_per_iter = ctx.tasks_per_iter

    def draw(self, iteration: int, seed: int) -> list[Task]:
        """``tasks_per_iter`` distinct training tasks drawn with ``seed``."""
        rng = np.random.default_rng(seed)
        ids = rng.choice(self.train_tasks, size=self.tasks_per_iter, replace=False)
        return [Task.make("train", int(i)) for i in ids]

    def observe(
        self, tasks: Sequence[Task], episodes: Sequence[Episode], seed: int
    ) -> dict[str, float]:
        """Nothing to learn; no metrics (the metrics log of a fixed run is unchanged)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"task source 'fixed' keeps no state; got keys {sorted(state)}")
