"""SERO's oracle rows in the iteration and the update (``rollout.oracle_horizon`` ≥ 1,
``objective.oracle_coef`` = λ_O; :mod:`credo.objectives.sero`, :mod:`credo.rollout.oracle`).

The oracle continuations the sampler added come as a separate
:class:`~credo.rollout.OracleBatch`, never mixed into the RL batch (the iteration's forest
has them split off). Their reachability weights are computed once, before the first
optimizer step, from the frozen policy (the policy as it is now, or the reference:
``objective.oracle_frozen``); the continuations are split into as many parts as there are
mini-batches (in order, no RNG), and each optimizer step adds λ_O · L_O of its part to the
RL loss before the gradient is clipped. With λ_O = 0 the term is computed for its metrics
only (no gradient, in eval mode), so the parameters follow the base method's exactly.
"""

from __future__ import annotations

import torch

from credo.objectives import action_logprobs, reachability_log_weights, sero_loss
from credo.rollout import OracleBatch, oracle_batch
from credo.train.parts.base import IterationData, Part, PartContext, Unsharded, register_part
from credo.train.update import UpdateContext, micro_chunks, score_batch

__all__ = ["OracleRows"]


def _needs(cfg: object) -> set[str]:
    """The frozen policy of the weights may be the reference."""
    return {"reference"} if cfg.objective.oracle_frozen == "reference" else set()  # type: ignore[attr-defined]


@register_part(
    "oracle_rows",
    when=lambda cfg: cfg.rollout.oracle_horizon > 0,
    needs=_needs,
    unsharded=Unsharded(
        "rollout.oracle_horizon",
        "0",
        "SERO's oracle micro-batches are not padded to equal passes",
        refuse=True,
    ),
)
class OracleRows(Part):
    """SERO's oracle rows: their batch, weights and loss term (module docstring)."""

    def __init__(self, ctx: PartContext) -> None:
        obj = ctx.cfg.objective
        self.coef = obj.oracle_coef
        self.frozen_reference = obj.oracle_frozen == "reference"
        self.mode, self.inclusive, self.min_weight = (
            obj.oracle_weight,
            obj.oracle_weight_inclusive,
            obj.oracle_weight_min,
        )
        self.pad_id = ctx.policy.pad_id
        self.oracle: OracleBatch | None = None
        self.log_w: torch.Tensor | None = None

    def transform(self, data: IterationData) -> None:
        self.oracle = oracle_batch(data.rollout.forest, pad_id=self.pad_id)

    def prepare(self, ctx: UpdateContext, batch: object, keep: torch.Tensor) -> None:
        self.log_w = self.log_weights(ctx, self.oracle) if self.oracle is not None else None

    def step_term(
        self, ctx: UpdateContext, index: int, parts: int, metrics: dict[str, float]
    ) -> None:
        oracle = self.oracle
        if oracle is None or self.log_w is None:
            return
        part = oracle.chain * parts // max(1, oracle.num_chains)  # this step's share, in order
        self._step(ctx, oracle, self.log_w, torch.nonzero(part == index).flatten(), metrics)

    def log_weights(self, ctx: UpdateContext, oracle: OracleBatch) -> torch.Tensor:
        """``[M]`` SERO log-weights of the oracle rows under the frozen policy (no grad)."""
        frozen = ctx.ref_policy if self.frozen_reference else ctx.policy
        if frozen is None:
            raise ValueError("objective.oracle_frozen=reference needs the reference policy")
        was_training = frozen.model.training
        frozen.model.eval()  # a frozen copy: no dropout, no RNG
        try:
            lp = score_batch(
                frozen,
                oracle.tokens,
                temperature=ctx.settings.temperature,
                micro_rows=ctx.settings.micro_batch_rows,
            )
        finally:
            frozen.model.train(was_training)
        ell = action_logprobs(lp, oracle.tokens.response_mask, geomean=self.mode == "geomean")
        return reachability_log_weights(
            ell,
            oracle.chain,
            oracle.position,
            mode=self.mode,
            inclusive=self.inclusive,
            min_weight=self.min_weight,
        )

    def _step(
        self,
        ctx: UpdateContext,
        oracle: OracleBatch,
        log_w: torch.Tensor,
        rows: torch.Tensor,
        metrics: dict[str, float],
    ) -> None:
        """Add λ_O · L_O of the oracle ``rows`` to the gradients (metrics only when λ_O = 0)."""
        policy, coef, s = ctx.policy, self.coef, ctx.settings
        if rows.numel() == 0:
            return
        num_chains = int(torch.unique(oracle.chain[rows]).numel())
        was_training = policy.model.training
        if coef == 0:
            policy.model.eval()  # metrics only: no dropout, no RNG, no gradient
        try:
            for idx in ctx.engine.my_share(micro_chunks(oracle.chain, rows, s.micro_batch_rows)):
                sub = oracle.tokens.index(idx).trim()
                with torch.set_grad_enabled(coef > 0):
                    sc = policy.score(sub.input_ids, sub.attention_mask, temperature=s.temperature)
                    loss, m = sero_loss(
                        sc.logprobs,
                        sub.response_mask.to(sc.logprobs.device),
                        log_w[idx],
                        num_chains=num_chains,
                        num_rows=rows.numel(),
                    )
                if coef > 0:
                    (coef * loss).backward()
                for k, v in m.items():
                    metrics[k] += float(v)
                metrics["loss/total"] += coef * float(loss.detach())
        finally:
            policy.model.train(was_training)
