"""The update's health statistics (:mod:`credo.objectives.health`, ``docs/metrics.md``):
the importance ratio's extremes at the loss's ratio level (``policy/ratio_min``,
``policy/ratio_max``, merged by min/max), its spread (``policy/ratio_std``) and the KL to
the sampler at the first and the last optimizer step (``policy/kl_sampler_first``,
``policy/kl_sampler_last``)."""

from __future__ import annotations

from typing import Any

import torch

from credo.data import TokenBatch
from credo.objectives import loss_ratio_level
from credo.objectives.health import EXTREMES, ratio_extremes, sampler_kl
from credo.train.parts.base import Part, PartContext, register_part
from credo.train.update import MicroPass, UpdateContext

__all__ = ["UpdateHealth"]


@register_part("update_health")
class UpdateHealth(Part):
    """Read every micro-batch's forward pass; report per update."""

    merge = EXTREMES

    def __init__(self, ctx: PartContext) -> None:
        obj = ctx.cfg.objective
        self.level = loss_ratio_level(obj.loss, obj.params)  # the loss's declared level
        self.kl_steps: list[float] = []

    def prepare(self, ctx: UpdateContext, batch: TokenBatch, keep: torch.Tensor) -> None:
        self.kl_steps = []

    def micro_metrics(self, mp: MicroPass, metrics: dict[str, Any]) -> None:
        if mp.sampler is not None:
            metrics["policy/kl_sampler"] = sampler_kl(mp.logprobs, mp.sampler, mp.weights, mp.mask)
        metrics.update(ratio_extremes(mp.logprobs, mp.old, mp.mask, mp.batch.episode, self.level))

    def step_metrics(self, metrics: dict[str, float]) -> None:
        self.kl_steps.append(metrics.pop("policy/kl_sampler", 0.0))

    def finish(self, ctx: UpdateContext, out: dict[str, float], steps: int) -> None:
        if self.kl_steps:  # KL to the sampler at the first optimizer step and at the last one
            out["policy/kl_sampler_first"] = self.kl_steps[0]
            out["policy/kl_sampler_last"] = self.kl_steps[-1]
        if "policy/ratio_mean" in out:  # pooled over the steps' loss tokens
            var = out.get("policy/ratio_sq_mean", 0.0) - out["policy/ratio_mean"] ** 2
            out["policy/ratio_std"] = max(0.0, var) ** 0.5
