"""RAPO's reference in the iteration (:mod:`credo.teachers.profiles`): for a loss that
registered the need ``profile_reference`` (``ppo_rapo``), the frozen reference scores the
iteration's rows with and without the task's profile, and both ride in the token batch to
the loss. The sampler records each step's goal and profile for it."""

from __future__ import annotations

from credo.objectives import loss_needs
from credo.teachers.profiles import PROFILE_TEXTS, attach_profile_reference
from credo.train.parts.base import IterationData, Part, PartContext, register_part

__all__ = ["ProfileReference"]


@register_part(
    "profile_reference",
    when=lambda cfg: "profile_reference" in loss_needs(cfg.objective.loss),
    needs={"reference"},
    texts=lambda cfg: PROFILE_TEXTS,
)
class ProfileReference(Part):
    """Attach the reference's two scorings to the token batch."""

    def __init__(self, ctx: PartContext) -> None:
        self.reference, self.renderer = ctx.reference, ctx.run.renderer

    def transform(self, data: IterationData) -> None:
        if self.reference is not None and data.batch is not None:
            rapo = attach_profile_reference(self.reference, self.renderer, data.forest, data.batch)
            data.metrics.update(rapo)
