"""The periodic held-out evaluation (``eval.every`` = N > 0): every N iterations the
policy is evaluated on ``eval.periodic_episodes`` held-out tasks (``eval/success_rate``),
after the iteration is timed, by rank 0 alone."""

from __future__ import annotations

from credo.engines import distributed as dp
from credo.train.parts.base import IterationData, Part, PartContext, register_part

__all__ = ["PeriodicEval"]


@register_part("periodic_eval", when=lambda cfg: cfg.eval.every > 0)
class PeriodicEval(Part):
    """Evaluate every ``eval.every`` iterations."""

    def __init__(self, ctx: PartContext) -> None:
        self.run, self.policy = ctx.run, ctx.policy
        self.every, self.episodes = ctx.cfg.eval.every, ctx.cfg.eval.periodic_episodes

    def report(self, data: IterationData) -> None:
        if (data.it + 1) % self.every == 0 and dp.is_main():
            ev = self.run.evaluate(self.policy, episodes=self.episodes)
            data.metrics["eval/success_rate"] = ev.success_rate
