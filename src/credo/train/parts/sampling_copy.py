"""Under FSDP, the full sampling copy of the policy gets the trainer's new weights after
every update (:meth:`credo.engines.Engine.after_update`, a collective), before anything
else follows the weights (an EMA teacher reads the sampling copy)."""

from __future__ import annotations

from credo.train.parts.base import IterationData, Part, PartContext, register_part

__all__ = ["SamplingCopy"]


class SamplingCopy(Part):
    """Refresh the sampling copy after each update."""

    def __init__(self, ctx: PartContext) -> None:
        self.engine, self.policy = ctx.engine, ctx.policy

    def after_update(self, data: IterationData) -> None:
        self.engine.after_update(self.policy)


@register_part("sampling_copy")
def _build(ctx: PartContext) -> Part | None:
    """Only a sharded trainer has a separate sampling copy."""
    return SamplingCopy(ctx) if ctx.engine.trainer is not None else None
