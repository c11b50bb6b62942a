"""GiGPO: hand-worked examples, invariants and equality with the loop reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_forests import forests, permute_forest, random_topological_order, relabel_groups
from credit_reference import gigpo_reference
from credo.credit import compute_advantages, validate_estimator
from credo.credit.gigpo import gigpo
from credo.data import RolloutForest

SETTINGS = settings(max_examples=50, deadline=None)


def close(a: torch.Tensor, expected: list[float], tol: float = 1e-5) -> None:
    assert torch.allclose(a.double(), torch.tensor(expected, dtype=torch.float64), atol=tol), (
        a.tolist(),
        expected,
    )


# ----------------------------------------------------------------- hand-worked examples
def linear_group() -> RolloutForest:
    # episode A: s1 -> s2 -> end, rewards 0, 1 (rows 0, 1)
    # episode B: s1 -> s3 -> s2 -> end, rewards 0, 0, 0 (rows 2, 3, 4)
    return RolloutForest.from_columns(
        group=[0, 0, 0, 0, 0],
        parent=[-1, 0, -1, 2, 3],
        state=[1, 2, 1, 3, 2],
        next_state=[2, 9, 3, 2, 9],
        reward=[0, 1, 0, 0, 0],
    )


def test_linear_group_mean_norm() -> None:
    # A^E (rows carry R: 1,1,0,0,0; μ over the group's 5 rows = 0.4): 0.6,0.6,-0.4,-0.4,-0.4
    # step returns (γ=0.95): row0 0.95, row1 1, rows 2-4 0
    # anchor s1 = rows {0, 2}: mean 0.475 -> A^S +0.475, -0.475
    # anchor s2 = rows {1, 4}: mean 0.5 -> +0.5, -0.5 ; anchor s3 = row 3 alone -> 0
    # A = A^E + A^S: 1.075, 1.1, -0.875, -0.4, -0.9
    close(gigpo(linear_group()), [1.075, 1.1, -0.875, -0.4, -0.9])


def test_linear_group_mean_std_norm() -> None:
    # A^E: row values 1,1,0,0,0: μ 0.4, unbiased var (2·0.36 + 3·0.16)/4 = 0.3, σ 0.5477226
    #   0.6/σ = 1.0954451, -0.4/σ = -0.7302967
    # A^S: anchor s1 (0.95, 0): ±0.475/(0.95/√2) = ±0.7071068; anchor s2 (1, 0): ±0.7071068
    a = gigpo(linear_group(), mode="mean_std_norm")
    close(a, [1.8025519, 1.8025519, -1.4374035, -0.7302967, -1.4374035])


def test_linear_group_episode_stats() -> None:
    # over episodes: R = 1, 0 -> μ 0.5 -> A^E ±0.5 (instead of 0.6 / -0.4); A^S as above
    a = gigpo(linear_group(), episode_stats="episodes")
    close(a, [0.975, 1.0, -0.975, -0.5, -1.0])
    # ω = 0: episode advantage alone
    close(gigpo(linear_group(), episode_stats="episodes", omega=0.0), [0.5, 0.5, -0.5, -0.5, -0.5])


def tree_group(valid: list[bool] | None = None) -> RolloutForest:
    # row 0: s1 -> s2, r 0; its children (both in s2): row 1 r 1 (R=1), row 2 r 0 (R=0)
    return RolloutForest.from_columns(
        group=[0, 0, 0],
        parent=[-1, 0, 0],
        state=[1, 2, 2],
        next_state=[2, 3, 4],
        reward=[0, 1, 0],
        valid=valid,
    )


def test_tree() -> None:
    # row scores: row0 is on both episodes -> mean(1, 0) = 0.5; row1 1; row2 0; μ = 0.5
    # A^E = 0, 0.5, -0.5
    # step returns: row1 1, row2 0, row0 0 + 0.95·mean(1, 0) = 0.475
    # anchors: s1 = row 0 alone -> 0 ; s2 = rows {1, 2} -> ±0.5
    close(gigpo(tree_group()), [0.0, 1.0, -1.0])


def test_invalid_penalty() -> None:
    # row 2 invalid, c = 0.1 (verl-agent: subtract c from that row's score and step return)
    # scores 0.5, 1, -0.1 -> μ 1.4/3 = 0.4666667 -> A^E 0.0333333, 0.5333333, -0.5666667
    # step returns 0.475 (unchanged: the penalty does not propagate), 1, -0.1
    # anchor s2 = (1, -0.1): mean 0.45 -> ±0.55 ; s1 alone -> 0
    a = gigpo(tree_group(valid=[True, True, False]), invalid_penalty=0.1)
    close(a, [0.0333333, 1.0833333, -1.1166667])


def test_cycle_and_singleton_group() -> None:
    # group 0, episode A: s1 -> s2 -> s1 -> end (rewards 0, 0, 1; it comes back to s1)
    #          episode B: s1 -> end (reward 0)
    # group 5: one single-step episode, reward 1
    f = RolloutForest.from_columns(
        group=[0, 0, 0, 0, 5],
        parent=[-1, 0, 1, -1, -1],
        state=[1, 2, 1, 1, 1],
        next_state=[2, 1, 9, 9, 9],
        reward=[0, 0, 1, 0, 1],
    )
    # A^E group 0: rows carry 1,1,1,0 -> μ 0.75 -> 0.25, 0.25, 0.25, -0.75
    #     group 5: one row -> μ = 0 (verl-agent) -> A^E = R = 1
    # step returns: row0 0.9025, row1 0.95, row2 1, row3 0, row4 1
    # anchor (0, s1) = rows {0, 2, 3}: mean 1.9025/3 = 0.6341667
    #   -> 0.2683333, 0.3658333, -0.6341667 ; (0, s2) = row 1 alone -> 0
    # anchor (5, s1) = row 4 alone (groups never share anchors) -> 0
    close(gigpo(f), [0.5183333, 0.25, 0.6158333, -1.3841667, 1.0])


def test_similarity_threshold() -> None:
    # two one-step episodes whose states differ but whose texts are near-identical:
    # ratio = 2·16 / (16 + 17) = 0.9697
    f = RolloutForest.from_columns(
        group=[0, 0],
        parent=[-1, -1],
        state=[10, 11],
        next_state=[9, 9],
        reward=[1, 0],
        observations=["the door is open", "the door is open."],
    )
    # exact: two singleton anchors -> A^S = 0, A^E = ±0.5
    close(gigpo(f), [0.5, -0.5])
    # τ = 0.9 merges them: A^S = ±0.5 as well
    close(gigpo(f, similarity_threshold=0.9), [1.0, -1.0])
    # τ = 0.99 does not
    close(gigpo(f, similarity_threshold=0.99), [0.5, -0.5])


# -------------------------------------------------------------------------- errors
def test_bad_arguments() -> None:
    f = linear_group()
    with pytest.raises(ValueError, match="mode must be one of"):
        gigpo(f, mode="std")
    with pytest.raises(ValueError, match="episode_stats"):
        gigpo(f, episode_stats="rows")
    with pytest.raises(ValueError, match=r"needs forest.observations"):
        gigpo(f, similarity_threshold=0.9)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        gigpo(f, similarity_threshold=1.5)
    with pytest.raises(ValueError, match="no parameter"):
        validate_estimator("gigpo", {"gama": 0.9})
    assert gigpo(RolloutForest.from_columns(group=[], parent=[])).shape == (0,)


# ------------------------------------------------------------------------ properties
KNOBS = [
    {},
    {"mode": "mean_std_norm"},
    {"episode_stats": "episodes", "invalid_penalty": 0.3, "gamma": 0.8},
    {"similarity_threshold": 0.9, "mode": "mean_std_norm", "omega": 0.5},
]


@SETTINGS
@given(forests(), st.sampled_from(KNOBS))
def test_matches_loop_reference(forest: RolloutForest, knobs: dict) -> None:
    a = compute_advantages("gigpo", forest, knobs)
    ref = torch.tensor(gigpo_reference(forest, **knobs), dtype=torch.float64)
    assert torch.isfinite(a).all()
    assert torch.allclose(a.double(), ref, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(forests(), st.integers(0, 10_000), st.sampled_from(KNOBS))
def test_row_order_does_not_matter(forest: RolloutForest, seed: int, knobs: dict) -> None:
    # row j of the shuffled forest is row order[j] of the original (groups interleaved)
    order = random_topological_order(forest, seed)
    a = gigpo(forest, **knobs)
    assert torch.allclose(gigpo(permute_forest(forest, order), **knobs), a[order], atol=1e-5)


@SETTINGS
@given(forests(max_groups=2), forests(max_groups=2), st.sampled_from(KNOBS))
def test_groups_do_not_interact(f1: RolloutForest, f2: RolloutForest, knobs: dict) -> None:
    f2 = relabel_groups(f2, 1000)  # disjoint group ids
    both = RolloutForest.concat([f1, f2])
    expected = torch.cat([gigpo(f1, **knobs), gigpo(f2, **knobs)])
    assert torch.allclose(gigpo(both, **knobs), expected, atol=1e-5)


@SETTINGS
@given(forests(rewards=(0.0,)), st.sampled_from(KNOBS))
def test_equal_rewards_give_zero(forest: RolloutForest, knobs: dict) -> None:
    knobs = {k: v for k, v in knobs.items() if k != "invalid_penalty"}
    assert torch.equal(gigpo(forest, **knobs), torch.zeros(forest.num_rows))


@SETTINGS
@given(forests(max_episodes=1, max_len=1), st.sampled_from(KNOBS))
def test_singleton_groups_single_steps(forest: RolloutForest, knobs: dict) -> None:
    # every group is one single-step episode: A^E = R (μ = 0, σ = 1), A^S = 0
    a = gigpo(forest, **knobs)
    assert torch.isfinite(a).all()
    pen = knobs.get("invalid_penalty", 0.0) * (~forest.valid).float()
    expected = forest.reward - pen
    if knobs.get("mode") == "mean_std_norm":
        expected = expected / (1 + 1e-6)
    assert torch.allclose(a, expected, atol=1e-6)
