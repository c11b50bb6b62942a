"""The sampler/trainer mismatch of every update, and its truncated importance-sampling
correction (``objective.tis_cap`` = C; :mod:`credo.objectives.tis`).

The update keeps the sampler's log-probs of the rollouts beside π_old
(:data:`~credo.train.update.ENGINE_LOGPROBS`). Per loss token ``d = log π_trainer −
log π_engine`` is collected before the first step (from the recomputed π_old, or from its
own scoring pass when π_old is the sampler's) or, with one step per batch, from the step's
own forward pass; the update reports the ``engine/...`` statistics of ``d``. With C, each
token's policy-gradient weight is multiplied by ``min(π_trainer_old/π_engine, C)``
(``policy/tis_weight``, ``policy/tis_clip_frac``).
"""

from __future__ import annotations

from typing import Any

import torch

from credo.data import TokenBatch
from credo.objectives.tis import logprob_mismatch, tis_clipped, tis_weights
from credo.train.parts.base import Part, PartContext, register_part
from credo.train.update import ENGINE_LOGPROBS, MicroPass, UpdateContext

__all__ = ["EngineMismatch"]


@register_part("engine_mismatch")
class EngineMismatch(Part):
    """Collect ``d`` and report it; reweigh the policy-gradient term with C."""

    def __init__(self, ctx: PartContext) -> None:
        self.cap: float | None = ctx.cfg.objective.tis_cap
        self.diffs: list[torch.Tensor] = []

    def prepare(self, ctx: UpdateContext, batch: TokenBatch, keep: torch.Tensor) -> None:
        self.diffs = []
        s = ctx.settings
        if s.single_step:  # π_old is the step's own forward pass: collected there
            return
        trainer_lp = batch.old_logprobs
        if not s.recompute_old_logprobs:
            trainer_lp = ctx.score_rows(batch, keep)
        scored = batch.loss_mask & keep[:, None]
        self.diffs.append((trainer_lp - batch.token_extras[ENGINE_LOGPROBS])[scored])

    def weigh(self, mp: MicroPass, pg_weights: torch.Tensor) -> torch.Tensor:
        if self.cap is None or mp.engine is None:
            return pg_weights
        return pg_weights * tis_weights(mp.old, mp.engine, self.cap)

    def micro_metrics(self, mp: MicroPass, metrics: dict[str, Any]) -> None:
        if mp.engine is not None and mp.single_step:  # this pass is π_old: mismatch for free
            self.diffs.append((mp.old - mp.engine)[mp.mask].detach())
        if self.cap is not None and mp.engine is not None:  # Σ w·x: weighted means
            metrics["policy/tis_weight"] = (mp.pg_weights * mp.mask).sum()
            clipped = tis_clipped(mp.old, mp.engine, self.cap)
            metrics["policy/tis_clip_frac"] = (mp.weights * (mp.mask & clipped)).sum()

    def finish(self, ctx: UpdateContext, out: dict[str, float], steps: int) -> None:
        diffs = [d.detach().float().cpu() for d in self.diffs]
        out.update(logprob_mismatch(torch.cat(diffs) if diffs else torch.zeros(0)))
