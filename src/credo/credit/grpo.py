"""Group-relative episode advantages: GRPO, Dr.GRPO and RLOO.

- GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300; verl's ``compute_grpo_outcome_advantage``):
  A_i = (R_i − mean_g R) / (std_g R + ε), std unbiased. A group of one episode has
  μ = 0, σ = 1 (so A = R), as in verl.
- Dr.GRPO (Liu et al. 2025, https://arxiv.org/abs/2503.20783): the same without the std
  division, A_i = R_i − mean_g R.
- RLOO (Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740):
  A_i = R_i − mean_{j≠i} R_j = G/(G−1) · (R_i − mean_g R); a group of one gets A = R.

Every row of an episode gets the episode's advantage (a row shared by several episodes,
in a tree, gets their mean). [code]
"""

from __future__ import annotations

import torch

from credo.credit.registry import register_estimator
from credo.data import RolloutForest
from credo.data.ops import compact_ids, segment_count, segment_mean, segment_std

__all__ = ["dr_grpo", "episode_group_advantage", "grpo", "rloo"]


def episode_group_advantage(
    ret: torch.Tensor, group: torch.Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantage per episode.

    Args:
        ret: ``[E]`` episode returns R.
        group: ``[E]`` group id of each episode.
        norm_by_std: divide by the group's unbiased std (GRPO) or not (Dr.GRPO).
        eps: added to the std.

    Returns:
        ``[E]`` float64 advantages; a singleton group gives A = R (μ = 0, σ = 1).
    """
    ret = ret.to(torch.float64)
    gid, num = compact_ids(group)
    if num == 0:
        return ret.clone()
    count = segment_count(gid, num)
    mean = segment_mean(ret, gid, num)
    std = segment_std(ret, gid, num, unbiased=True)
    single = count[gid] < 2
    mean_i = torch.where(single, torch.zeros_like(ret), mean[gid])
    adv = ret - mean_i
    if norm_by_std:
        std_i = torch.where(single, torch.ones_like(ret), std[gid])
        adv = adv / (std_i + eps)
    return adv


@register_estimator("grpo")
def grpo(forest: RolloutForest, *, norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: ``(R − mean_g R)/(std_g R + eps)`` broadcast to each episode's rows → ``[N]``."""
    ep = forest.episodes()
    adv = episode_group_advantage(ep.ret, ep.group, norm_by_std=norm_by_std, eps=eps)
    return forest.episode_values_to_rows(adv).to(torch.float32)


@register_estimator("dr_grpo")
def dr_grpo(forest: RolloutForest) -> torch.Tensor:
    """Dr.GRPO: ``R − mean_g R`` broadcast to rows → ``[N]`` (GRPO without std scaling)."""
    return grpo(forest, norm_by_std=False)


@register_estimator("rloo")
def rloo(forest: RolloutForest) -> torch.Tensor:
    """RLOO: ``R_i − mean_{j≠i} R_j`` per episode, broadcast to rows → ``[N]``."""
    ep = forest.episodes()
    ret = ep.ret.to(torch.float64)
    gid, num = compact_ids(ep.group)
    count = segment_count(gid, num)[gid] if num else ret.new_zeros(0)
    total = torch.zeros(num, dtype=torch.float64).index_add_(0, gid, ret)[gid] if num else ret
    loo_mean = (total - ret) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, ret - loo_mean, ret)
    return forest.episode_values_to_rows(adv).to(torch.float32)
