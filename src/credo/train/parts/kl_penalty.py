"""The KL reward penalty (``objective.kl_reward_coef`` = β): each step's reward loses
``β·Σ_tokens k(π_old, π_ref)`` before credit assignment, the rows scored with the policy
that sampled them and with the frozen reference (:func:`credo.objectives.kl_reward_penalty`,
``objective.kl_estimator``'s k)."""

from __future__ import annotations

import torch

from credo.data import RolloutForest
from credo.objectives import kl_estimate, kl_reward_penalty
from credo.policy.hf import HFPolicy
from credo.train.parts.base import IterationData, Part, PartContext, register_part
from credo.train.update import score_batch

__all__ = ["KLRewardPenalty", "kl_reward_penalty_rows"]


@torch.no_grad()
def kl_reward_penalty_rows(
    policy: HFPolicy,
    reference: HFPolicy | None,
    forest: RolloutForest,
    *,
    beta: float,
    estimator: str,
    temperature: float,
    micro_rows: int,
) -> torch.Tensor:
    """``[N]`` per-row reward penalty ``β·Σ_tokens k(π, π_ref)`` of a forest's rows, scored
    with ``policy`` (the sampler) and the frozen ``reference``."""
    if reference is None:
        raise RuntimeError("a KL reward penalty needs the reference policy")
    batch = forest.to_batch(torch.zeros(forest.num_rows), pad_id=policy.pad_id)
    lp = score_batch(policy, batch, temperature=temperature, micro_rows=micro_rows)
    ref = score_batch(reference, batch, temperature=temperature, micro_rows=micro_rows)
    kl = kl_estimate(lp, ref, estimator)
    penalty = kl_reward_penalty(kl, batch.response_mask, beta)
    out = torch.zeros(forest.num_rows)
    out[batch.row] = penalty
    return out


@register_part(
    "kl_reward_penalty", when=lambda cfg: cfg.objective.kl_reward_coef > 0, needs={"reference"}
)
class KLRewardPenalty(Part):
    """Subtract the penalty from the forest's rewards."""

    def __init__(self, ctx: PartContext) -> None:
        cfg = ctx.cfg
        self.policy = ctx.engine.trainer or ctx.policy  # the policy the update trains
        self.reference = ctx.reference
        self.beta, self.estimator = cfg.objective.kl_reward_coef, cfg.objective.kl_estimator
        self.temperature, self.micro_rows = cfg.rollout.temperature, cfg.optim.micro_batch_rows

    def reward(self, data: IterationData) -> None:
        penalty = kl_reward_penalty_rows(
            self.policy,
            self.reference,
            data.forest,
            beta=self.beta,
            estimator=self.estimator,
            temperature=self.temperature,
            micro_rows=self.micro_rows,
        )
        data.forest = data.forest.with_rewards(data.forest.reward - penalty)
