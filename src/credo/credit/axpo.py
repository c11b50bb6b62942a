"""AXPO: partitioned advantages for resampled tool calls. [page; recon details]

Kang et al. 2026, "Agent Explorative Policy Optimization for Multimodal Agentic
Reasoning", https://arxiv.org/abs/2605.28774 (``docs/algorithms.md#axpo``). For an all-failed
group, the sampler keeps a low-confidence episode's prefix (and its thinking), restores
the env and resamples the tool call and everything after it. In the forest these
branches are rows with ``source == 2`` ("resample") hanging under the *branch parent* p:
the last kept row of the original episode (−1 when step 0 itself was resampled).

- A *resampled set* S = the resample episodes that branch from the same parent row p
  (same group). Each set is its own advantage partition: GRPO within the set on the
  episodes' returns, A_e = (R_e − mean_S R)/(std_S R + ε) (Dr.GRPO without the std;
  a set of one episode gets A = R, as GRPO's singleton rule). The rows of a branch (from
  its first resample row down to its leaves) get their episodes' advantages.
- The *source prefix* of S (the original episode's rows from the root to p, inclusive)
  gets a binary recovery reward y_S = 1 if any episode of S succeeded, else 0, turned
  into an advantage against the original group's baseline [recon]:
  A_prefix = c · (y_S − b_g), b_g = success rate of the group's original (non-resample)
  episodes (0 for an all-failed group, where A_prefix = c·y_S); c = ``recovery_coef``.
  The success rate, not the mean return, is the baseline so that both sides are 0/1; no
  std division, because the std of an all-failed group is 0. The prefix rows get this
  *instead of* any other advantage (they are shared by the original episode and the
  resamples, whose signals would otherwise conflict on them); a row in the prefix of
  several sets gets the mean of their values.
- Every other row (ordinary groups; the original episodes' rows after the branch point)
  gets plain GRPO over the group's *original* episodes (resamples excluded), a row
  shared by several episodes the mean, as :func:`~credo.credit.grpo.grpo`.

A resample row under another resample row continues the same branch (nested resampling
is not distinguished: its episodes join the outer set). Rows of other sources (policy,
oracle) below a resample row also belong to that branch.
"""

from __future__ import annotations

import torch

from credo.credit.grpo import episode_group_advantage
from credo.credit.registry import register_estimator
from credo.data import SOURCES, RolloutForest
from credo.data.ops import compact_ids, segment_max, segment_mean, segment_sum

__all__ = ["axpo", "resample_branches"]

RESAMPLE = SOURCES.index("resample")


def resample_branches(forest: RolloutForest) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows belong to a resample branch, and each branch's parent row.

    Returns:
        ``(in_branch [N] bool, branch_parent [N] int64)``: ``in_branch`` marks resample
        rows and everything below them; ``branch_parent`` is, for those rows, the parent
        of their branch's first resample row (the branch point p, −1 for a resampled
        first step), and −1 elsewhere.
    """
    n = forest.num_rows
    parent = forest.parent
    in_branch = forest.source == RESAMPLE
    start = torch.where(in_branch, torch.arange(n), torch.full((n,), -1, dtype=torch.long))
    has_parent = parent >= 0
    for depth in range(1, int(forest.t.max().item()) + 1 if n else 0):
        rows = torch.nonzero((forest.t == depth) & has_parent, as_tuple=False).flatten()
        inherit = rows[in_branch[parent[rows]]]
        in_branch[inherit] = True
        start[inherit] = start[parent[inherit]]
    branch_parent = torch.where(in_branch, parent[start.clamp(min=0)], torch.full_like(start, -1))
    return in_branch, branch_parent


@register_estimator("axpo")
def axpo(
    forest: RolloutForest,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    recovery_coef: float = 1.0,
) -> torch.Tensor:
    """AXPO advantages → ``[N]`` float32 (see the module docstring).

    Args:
        forest: ``[N]`` rows; resample branches are rows with ``source == 2``.
        norm_by_std: GRPO (True, default) or Dr.GRPO (False) in every partition.
        eps: added to the std.
        recovery_coef: c, the scale of the prefix's recovery advantage. Default 1.0;
            0 gives the prefix rows 0.
    """
    n = forest.num_rows
    if n == 0:
        return torch.zeros(0, dtype=torch.float32)
    ep = forest.episodes()
    e = ep.num_episodes
    in_branch, branch_parent = resample_branches(forest)
    resampled = in_branch[ep.leaf]  # [E] episode is a resample episode
    original = ~resampled

    # Original episodes: GRPO within their group.
    adv = torch.zeros(e, dtype=torch.float64)
    adv[original] = episode_group_advantage(
        ep.ret[original], ep.group[original], norm_by_std=norm_by_std, eps=eps
    )
    # Resample episodes: GRPO within their set (group, branch parent).
    set_id, num_sets = compact_ids(ep.group[resampled], branch_parent[ep.leaf[resampled]])
    adv[resampled] = episode_group_advantage(
        ep.ret[resampled], set_id, norm_by_std=norm_by_std, eps=eps
    )
    out = segment_mean(adv[ep.episode_of], ep.rows, n)

    if num_sets:
        # Recovery reward y_S and the original group's success rate b_g.
        gid, num_groups = compact_ids(ep.group)
        succ = ep.success.to(torch.float64)
        base = segment_sum(succ * original, gid, num_groups) / segment_sum(
            original.to(torch.float64), gid, num_groups
        ).clamp(min=1)
        y = segment_max(succ[resampled], set_id, num_sets)
        set_group = torch.zeros(num_sets, dtype=torch.long)
        set_group[set_id] = gid[resampled]
        set_parent = torch.full((num_sets,), -1, dtype=torch.long)
        set_parent[set_id] = branch_parent[ep.leaf[resampled]]
        value = recovery_coef * (y - base[set_group])
        # Climb from each branch point to its root, summing the set values per row.
        total = torch.zeros(n, dtype=torch.float64)
        count = torch.zeros(n, dtype=torch.float64)
        cur, val = set_parent[set_parent >= 0], value[set_parent >= 0]
        while cur.numel():
            total.index_add_(0, cur, val)
            count.index_add_(0, cur, torch.ones_like(val))
            keep = forest.parent[cur] >= 0
            cur, val = forest.parent[cur][keep], val[keep]
        prefix = count > 0
        out[prefix] = total[prefix] / count[prefix]
    return out.to(torch.float32)
