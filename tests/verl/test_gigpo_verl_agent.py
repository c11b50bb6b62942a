"""credo's GiGPO through the plugin equals verl-agent's ``compute_gigpo_outcome_advantage``.

verl-agent is not on PyPI and nothing is fetched at test time, so the reference is
``tests/credit_reference.gigpo_reference``: the hand-written loop version of verl-agent's
GiGPO that the credit tests already check credo against (episode statistics over the
group's step rows, unbiased std + ε, singleton groups μ = 0 / σ = 1, anchor groups by
exact observation, step returns Σ γ^k r). Here the batch is laid out as verl-agent lays
it out — one row per env step, ``uid`` groups, ``traj_uid`` trajectories with their steps
in batch order, ``anchor_obs`` texts, every step row carrying its episode return in
``token_level_rewards`` — and goes through verl's registry.

Where both apply: exact anchors (verl-agent's similarity clustering visits rows in batch
order, credo's in sorted order, so they agree only when the clusters do not depend on the
order) and linear episodes (verl-agent has no trees).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from credit_forests import TEXTS, forests
from credit_reference import gigpo_reference
from credo.data import RolloutForest


def _outcome_only(forest: RolloutForest) -> RolloutForest:
    """Rewards moved to each episode's last step (verl-agent's outcome rewards)."""
    ep = forest.episodes()
    reward = torch.zeros_like(forest.reward)
    reward[ep.leaf] = ep.ret.to(torch.float32)
    return RolloutForest.from_columns(
        group=forest.group,
        parent=forest.parent,
        state=forest.state,
        next_state=forest.next_state,
        reward=reward,
        terminal=forest.terminal,
        valid=forest.valid,
        observations=list(forest.observations),
    )


def agent_batch(forest: RolloutForest, seed: int, *, step_rewards: bool) -> tuple[dict, list[int]]:
    """verl-agent's layout of a linear forest: steps interleaved step-major across a
    shuffled list of trajectories (as its rollout loop appends them), returns on tokens."""
    ep = forest.episodes()
    rng = random.Random(seed)
    episodes = list(range(ep.num_episodes))
    rng.shuffle(episodes)
    rows: list[int] = []  # batch position -> forest row
    traj: list[int] = []
    for t in range(int(ep.length.max())):
        for e in episodes:
            path = ep.path(e).tolist()
            if t < len(path):
                rows.append(path[t])
                traj.append(e)
    width = 4
    mask = torch.zeros(len(rows), width)
    tlr = torch.zeros(len(rows), width)
    for b, e in enumerate(traj):
        n = rng.randint(1, width)
        mask[b, :n] = 1.0
        tlr[b, n - 1] = float(ep.ret[e])  # the episode return on every step row
    kw = {
        "token_level_rewards": tlr,
        "response_mask": mask,
        "index": np.array([f"uid{int(forest.group[r])}" for r in rows], dtype=object),
        "traj_index": np.array([f"traj{e}" for e in traj], dtype=object),
        "anchor_obs": np.array([forest.observations[r] for r in rows], dtype=object),
    }
    if step_rewards:
        kw["rewards"] = np.array([float(forest.reward[r]) for r in rows], dtype=np.float32)
    return kw, rows


SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("gamma", [0.95, 0.5])
@SETTINGS
@given(forest=forests(tree=False), seed=st.integers(0, 10**6))
def test_plugin_gigpo_equals_the_verl_agent_reference(
    mode: str, gamma: float, forest: RolloutForest, seed: int
) -> None:
    kw, rows = agent_batch(forest, seed, step_rewards=True)
    adv, _ = get_adv_estimator_fn("credo_gigpo")(
        **kw, config={"credo": {"mode": mode, "gamma": gamma}}
    )
    ref = gigpo_reference(forest, gamma=gamma, mode=mode)
    want = torch.tensor([ref[r] for r in rows], dtype=torch.float32)[:, None] * kw["response_mask"]
    assert torch.allclose(adv, want, atol=1e-5), (adv - want).abs().max()


@SETTINGS
@given(forest=forests(tree=False), seed=st.integers(0, 10**6))
def test_outcome_rewards_read_from_token_level_rewards(forest: RolloutForest, seed: int) -> None:
    # no per-step rewards: the plugin reads the episode return off token_level_rewards
    forest = _outcome_only(forest)
    kw, rows = agent_batch(forest, seed, step_rewards=False)
    adv, _ = get_adv_estimator_fn("credo_gigpo")(**kw, config=None)
    ref = gigpo_reference(forest)
    want = torch.tensor([ref[r] for r in rows], dtype=torch.float32)[:, None] * kw["response_mask"]
    assert torch.allclose(adv, want, atol=1e-5), (adv - want).abs().max()


def test_hand_worked_verl_agent_batch() -> None:
    # group u1: A = (s0, r 0) → (s1, r 1), B = (s0, 0) → (s2, 0); group u2: C = (s0, r 1).
    # γ = 0.5, mean_std_norm. Episode term over u1's step rows [1, 1, 0, 0]: μ = 0.5,
    # σ = √(1/3); C alone: μ = 0, σ = 1. Step returns A0 = 0.5, A1 = 1, B0 = B1 = 0;
    # anchor s0 in u1 = {A0, B0}: μ = 0.25, σ = √0.125; other anchors alone → 0.
    kw = {
        "token_level_rewards": torch.tensor([[0, 1.0], [0, 0], [1, 0], [0, 1], [0, 0]]),
        "response_mask": torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1], [1, 1]]),
        "index": np.array(["u1", "u1", "u2", "u1", "u1"], dtype=object),
        "traj_index": np.array(["A", "B", "C", "A", "B"], dtype=object),
        "anchor_obs": np.array([TEXTS[0], TEXTS[0], TEXTS[0], TEXTS[2], TEXTS[4]], dtype=object),
        "rewards": np.array([0.0, 0.0, 1.0, 1.0, 0.0]),
    }
    adv, _ = get_adv_estimator_fn("credo_gigpo")(
        **kw, config={"credo": {"gamma": 0.5, "mode": "mean_std_norm"}}
    )
    e = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    s = 0.25 / (math.sqrt(0.125) + 1e-6)
    c = 1.0 / (1.0 + 1e-6)
    want = torch.tensor([e + s, -e - s, c, e, -e])[:, None] * kw["response_mask"]
    assert torch.allclose(adv, want, atol=1e-6)
