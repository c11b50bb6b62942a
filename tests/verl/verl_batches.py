"""A credo forest written out as a verl batch (the reverse of the plugin's mapping).

The tests build a forest, lay it out the way verl / verl-agent would (rows shuffled, one
response per row), send the batch through verl's registry and compare with credo's own
estimator on the forest.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch

from credo.data import RolloutForest


def forest_to_verl(
    forest: RolloutForest,
    anchor_of: Callable[[int], str],
    *,
    seed: int,
    route: str = "parent",
    width: int = 5,
) -> tuple[dict, torch.Tensor]:
    """The batch of ``forest`` with its rows in a random order.

    Args:
        forest: the rollouts.
        anchor_of: observation text of a state key (equal keys ↔ equal texts).
        seed: shuffling and response-length seed.
        route: ``"parent"`` (batch positions of parents) or ``"traj"`` (linear forests
            only: ``traj_index`` + ``step_index``).
        width: response width L.

    Returns:
        ``(estimator kwargs, pos)`` with ``pos[i]`` = batch position of forest row ``i``.
    """
    n = forest.num_rows
    rng = random.Random(seed)
    perm = list(range(n))
    rng.shuffle(perm)  # batch position b holds forest row perm[b]
    pos = torch.empty(n, dtype=torch.long)
    pos[torch.tensor(perm, dtype=torch.long)] = torch.arange(n)
    lengths = [rng.randint(1, width) for _ in range(n)]
    mask = torch.zeros(n, width)
    tlr = torch.zeros(n, width)
    for b, row in enumerate(perm):
        mask[b, : lengths[b]] = 1.0
        tlr[b, lengths[b] - 1] = float(forest.reward[row])

    def col(values: list) -> np.ndarray:
        return np.array([values[row] for row in perm], dtype=object)

    kw: dict = {
        "token_level_rewards": tlr,
        "response_mask": mask,
        "index": col([f"uid-{g}" for g in forest.group.tolist()]),
        "anchor_obs": col([anchor_of(k) for k in forest.state.tolist()]),
        "next_anchor_obs": col([anchor_of(k) for k in forest.next_state.tolist()]),
        "rewards": col(forest.reward.tolist()),
        "dones": col(forest.terminal.tolist()),
        "success": col(forest.success.tolist()),
        "is_action_valid": col(forest.valid.tolist()),
        "source": col(forest.source.tolist()),
    }
    if forest.actions:
        kw["actions"] = col(list(forest.actions))
    if route == "parent":
        par = forest.parent.tolist()
        kw["parent"] = np.array([int(pos[par[row]]) if par[row] >= 0 else -1 for row in perm])
    else:
        if not forest.is_linear():
            raise ValueError("route='traj' needs a linear forest")
        kw["traj_index"] = col([f"traj-{e}" for e in forest.row_episode().tolist()])
        kw["step_index"] = col(forest.t.tolist())
    return kw, pos


def token_view(row_values: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-forest-row values ``[N]`` on the batch's tokens ``[B, L]``."""
    per_batch = torch.zeros(mask.shape[0], dtype=torch.float32)
    per_batch[pos] = row_values.to(torch.float32)
    return per_batch[:, None] * mask
