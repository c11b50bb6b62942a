"""A trust region on each update (``optim.max_kl``): after every optimizer step the policy
is scored on the mini-batch it stepped on, and a step whose KL to the sampler (k3, token
mean) exceeds ``max_kl`` is undone (weights and optimizer state) and the update's
remaining steps skipped. Metrics ``policy/kl_after_step``, ``policy/steps_kept``,
``policy/steps_undone``. On by default (0.2); left off, with one printed line, under FSDP
and ZeRO, which shard the optimizer's state (registered :class:`Unsharded`)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from credo.data import TokenBatch
from credo.objectives.health import sampler_kl
from credo.policy.lora import trainable_parameters
from credo.train.parts.base import Part, PartContext, Unsharded, register_part
from credo.train.update import UpdateContext, score_batch

__all__ = ["TrustRegion"]

Snapshot = tuple[list[torch.Tensor], dict[str, Any]]


def _snapshot(ctx: UpdateContext) -> Snapshot:
    """The trainable weights and the optimizer's state, copied (to undo one step)."""
    weights = [p.detach().clone() for p in trainable_parameters(ctx.policy.model)]
    return weights, copy.deepcopy(ctx.optimizer.state_dict())


@torch.no_grad()
def _restore(ctx: UpdateContext, snapshot: Snapshot) -> None:
    weights, state = snapshot
    for p, w in zip(trainable_parameters(ctx.policy.model), weights):
        p.copy_(w)
    ctx.optimizer.load_state_dict(state)


def _kl_after_step(
    ctx: UpdateContext, mb: TokenBatch, sampler_lp: torch.Tensor, keep: torch.Tensor
) -> float:
    """The KL between the sampler and π_θ per loss token (k3 as ``policy/kl_sampler_*``
    reads it, :func:`~credo.objectives.health.sampler_kl`; token mean) on the ``keep``
    rows of the mini-batch just stepped on, with the weights after the step (no grad).
    Every process holds the whole batch and the same weights, so every rank finds the
    same value and takes the same decision."""
    rows = torch.nonzero(keep).flatten()
    if rows.numel() == 0:
        return 0.0
    sub = mb.index(rows)
    s = ctx.settings
    lp = score_batch(
        ctx.policy,
        sub,
        temperature=s.temperature,
        micro_rows=s.micro_batch_rows,
        micro_tokens=s.micro_batch_tokens,
    )
    mask = sub.loss_mask
    kl = sampler_kl(lp, sampler_lp[rows], mask.float(), mask)
    return float(kl) / max(1.0, float(mask.sum()))


@register_part(
    "trust_region",
    when=lambda cfg: cfg.optim.max_kl is not None,
    unsharded=Unsharded(
        "optim.max_kl",
        "null",
        "undoing a step copies the optimizer's state, which the engine shards",
    ),
)
class TrustRegion(Part):
    """Undo the step that crossed ``max_kl`` and stop the update (module docstring)."""

    def __init__(self, ctx: PartContext) -> None:
        self.max_kl: float = ctx.cfg.optim.max_kl
        self.before: Snapshot | None = None
        self.guard: dict[str, float] = {}

    def prepare(self, ctx: UpdateContext, batch: TokenBatch, keep: torch.Tensor) -> None:
        self.guard = {}

    def before_step(self, ctx: UpdateContext) -> None:
        self.before = _snapshot(ctx)

    def after_step(
        self, ctx: UpdateContext, mb: TokenBatch, sampler_lp: torch.Tensor, keep: torch.Tensor
    ) -> bool:
        self.guard["policy/kl_after_step"] = kl = _kl_after_step(ctx, mb, sampler_lp, keep)
        if kl <= self.max_kl:
            return False
        assert self.before is not None
        _restore(ctx, self.before)
        self.guard["policy/steps_undone"] = 1.0
        return True

    def finish(self, ctx: UpdateContext, out: dict[str, float], steps: int) -> None:
        kept = steps - int(self.guard.get("policy/steps_undone", 0.0))
        out.update({"policy/steps_undone": 0.0, **self.guard, "policy/steps_kept": float(kept)})
