"""TSBPO: sibling-relative and same-state advantages over a rollout tree. [recon]

Paper: "TSBPO: tree-structured branch policy optimisation for training interactive
language agents" (University of Electronic Science and Technology of China; known to
credo only from a summary of the paper, no public text found). The formulas are credo's
reconstruction (``docs/algorithms.md#tsbpo``).

Rollouts form a tree: branches restart from env snapshots at chosen rows, so a row with
several children is a branch point. With V(row) = mean return R of the episodes (leaves)
below the row:

- sibling-relative advantage: A_sib(i) = V(i) − mean_{j ∈ sib(i)} V(j), where sib(i)
  is the set of rows with the same parent (rows whose parent is −1 in the same group are
  siblings of one virtual root, so a linear GRPO group compares its episodes there).
  A row that is an *only child* continues the segment its parent started, so it inherits
  its parent's A_sib (``only_child="inherit"``, default): every row of a segment between
  two branch points gets the segment's credit, and a linear group gives every row its
  episode's R − mean_g R (Dr.GRPO). ``only_child="zero"`` applies the formula literally
  (an only child gets 0). A root alone in its group gets 0 (nothing to compare).
- same-state advantage: rows of one group whose ``state`` is equal form a group;
  A_state(i) = V(i) − mean_{same group, same state} V (0 for a row alone in its state).
- combined: A = A_sib + ω · A_state (``omega``; 0 gives the sibling term only).

With ``norm_by_std=True`` both terms are divided by their set's unbiased std + ε (a set
of one row gives 0 either way). For a 0/1 terminal reward, V is the success rate below a
row. The roots of a group with a common initial state are in one same-state set, so at
the roots both terms coincide (as GiGPO's episode and step terms do at t = 0).
"""

from __future__ import annotations

from typing import Literal

import torch

from credo.credit.registry import register_estimator
from credo.data import RolloutForest
from credo.data.ops import compact_ids, segment_count, segment_zscore

__all__ = ["leaf_values", "tsbpo"]

_ONLY_CHILD = ("inherit", "zero")


def leaf_values(forest: RolloutForest) -> torch.Tensor:
    """``[N]`` float64 V(row): mean return R of the episodes whose path contains the row."""
    return forest.episode_values_to_rows(forest.episodes().ret)


@register_estimator("tsbpo")
def tsbpo(
    forest: RolloutForest,
    *,
    omega: float = 1.0,
    norm_by_std: bool = False,
    eps: float = 1e-6,
    only_child: Literal["inherit", "zero"] = "inherit",
) -> torch.Tensor:
    """TSBPO advantages A = A_sib + ω·A_state → ``[N]`` float32 (see the module docstring).

    Args:
        forest: the rollout tree(s): ``[N]`` rows with ``group``, ``parent``, ``state``.
        omega: weight ω of the same-state term. Default 1.0.
        norm_by_std: divide each term by its set's unbiased std + ``eps``. Default False.
        eps: added to the std.
        only_child: ``"inherit"`` (default): a row without siblings takes its parent's
            sibling advantage; ``"zero"``: it gets 0 from the sibling term.
    """
    if only_child not in _ONLY_CHILD:
        raise ValueError(f"only_child must be one of {_ONLY_CHILD}, got {only_child!r}")
    n = forest.num_rows
    if n == 0:
        return torch.zeros(0, dtype=torch.float32)
    v = leaf_values(forest)

    sib, num_sib = compact_ids(forest.group, forest.parent)
    a_sib = segment_zscore(v, sib, num_sib, norm_by_std=norm_by_std, eps=eps)
    if only_child == "inherit":
        alone = (segment_count(sib, num_sib)[sib] < 2) & (forest.parent >= 0)
        # parents are final before their children: one pass per depth, top down
        for depth in range(1, int(forest.t.max().item()) + 1):
            rows = torch.nonzero(alone & (forest.t == depth), as_tuple=False).flatten()
            if rows.numel():
                a_sib[rows] = a_sib[forest.parent[rows]]

    same, num_same = compact_ids(forest.group, forest.state)
    a_state = segment_zscore(v, same, num_same, norm_by_std=norm_by_std, eps=eps)
    return (a_sib + omega * a_state).to(torch.float32)
