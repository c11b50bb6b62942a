"""GRPO, Dr.GRPO and RLOO episode advantages, by hand, on linear and tree forests."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.credit import compute_advantages
from credo.credit.grpo import dr_grpo, episode_group_advantage, grpo, rloo
from credo.data import RolloutForest

# Four groups, rows in order (reward per row; R = the episode's return):
#   group 0, three episodes: A rows 0 → 1 (0, 3: R = 3), B row 2 (R = 0), C rows 3 → 4
#            (0.5, −0.5: R = 0)
#   group 1, two episodes:   D row 5 (R = 1), E row 6 (R = 0)
#   group 2, one episode:    F row 7 (R = 0.5)
#   group 3, a tree:         root row 8 (0) with children 9 (1) and 10 (0): episodes
#            8 → 9 (R = 1) and 8 → 10 (R = 0); row 8 is shared by both
MIXED = RolloutForest.from_columns(
    group=[0, 0, 0, 0, 0, 1, 1, 2, 3, 3, 3],
    parent=[-1, 0, -1, -1, 3, -1, -1, -1, -1, 8, 8],
    reward=[0.0, 3.0, 0.0, 0.5, -0.5, 1.0, 0.0, 0.5, 0.0, 1.0, 0.0],
)


def close(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


def test_forest_returns_are_what_the_comments_say() -> None:
    ep = MIXED.episodes()
    assert ep.group.tolist() == [0, 0, 0, 1, 1, 2, 3, 3]
    assert ep.ret.tolist() == [3.0, 0.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0.0]


def test_rloo_by_hand() -> None:
    # group 0 (G = 3): A = 3 − (0 + 0)/2 = 3; B = 0 − (3 + 0)/2 = −1.5; C likewise −1.5
    #   (= G/(G−1)·(R − mean) = 1.5·(3 − 1), 1.5·(0 − 1))
    # group 1 (G = 2): D = 1 − 0 = 1; E = 0 − 1 = −1
    # group 2 (G = 1): A = R = 0.5
    # group 3 (tree, G = 2): leaves +1 and −1; the shared root gets their mean 0
    adv = rloo(MIXED)
    assert adv.dtype == torch.float32
    close(adv, [3.0, 3.0, -1.5, -1.5, -1.5, 1.0, -1.0, 0.5, 0.0, 1.0, -1.0])
    close(compute_advantages("rloo", MIXED), adv.tolist())


def test_rloo_group_of_two_is_the_difference_of_returns() -> None:
    f = RolloutForest.from_columns(group=[7, 7], parent=[-1, -1], reward=[0.25, 2.0])
    close(rloo(f), [0.25 - 2.0, 2.0 - 0.25])


def test_rloo_group_of_one_is_the_return() -> None:
    f = RolloutForest.from_columns(group=[4, 5], parent=[-1, -1], reward=[-0.75, 2.0])
    close(rloo(f), [-0.75, 2.0])


def test_rloo_of_an_empty_forest_is_empty() -> None:
    f = RolloutForest.from_columns(group=[], parent=[])
    assert rloo(f).shape == (0,)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(-8, 8)),  # (group, return in quarters)
        min_size=1,
        max_size=12,
    )
)
def test_rloo_is_the_leave_one_out_mean_by_loop(episodes: list[tuple[int, int]]) -> None:
    groups = [g for g, _ in episodes]
    rets = [r / 4 for _, r in episodes]
    f = RolloutForest.from_columns(group=groups, parent=[-1] * len(groups), reward=rets)
    expected = []
    for i, (g, r) in enumerate(zip(groups, rets)):
        others = [rets[j] for j in range(len(rets)) if j != i and groups[j] == g]
        expected.append(r - sum(others) / len(others) if others else r)
    torch.testing.assert_close(rloo(f), torch.tensor(expected, dtype=torch.float32))


def test_grpo_by_hand() -> None:
    # group 0: mean 1, unbiased std √((4 + 1 + 1)/2) = √3 → 2/√3, −1/√3, −1/√3
    # group 1: mean ½, std √((¼ + ¼)/1) = √½ → ±½/√½ = ±√½
    # group 2 (one episode): μ = 0, σ = 1 → 0.5/(1 + ε)
    # group 3: as group 1 on the leaves, the shared root gets the mean 0
    eps = 1e-6
    s3, h = math.sqrt(3) + eps, math.sqrt(0.5) + eps
    expected = [2 / s3, 2 / s3, -1 / s3, -1 / s3, -1 / s3, 0.5 / h, -0.5 / h]
    expected += [0.5 / (1 + eps), 0.0, 0.5 / h, -0.5 / h]
    close(grpo(MIXED), expected)
    close(compute_advantages("grpo", MIXED), expected)
    # a larger eps shows in the value
    close(grpo(MIXED, eps=1.0)[:1], [2 / (math.sqrt(3) + 1.0)])


def test_dr_grpo_by_hand() -> None:
    # R − mean_g R: group 0 → 2, −1, −1; group 1 → ±½; group 2 → R = 0.5; group 3 → ±½
    close(dr_grpo(MIXED), [2.0, 2.0, -1.0, -1.0, -1.0, 0.5, -0.5, 0.5, 0.0, 0.5, -0.5])
    close(grpo(MIXED, norm_by_std=False), dr_grpo(MIXED).tolist())


def test_episode_group_advantage_singletons_and_equal_returns() -> None:
    ret = torch.tensor([2.0, 1.0, 1.0, -3.0])
    group = torch.tensor([5, 9, 9, 11])
    # groups {2}, {1, 1}, {−3}: singletons keep R (/(1 + ε)); equal returns give 0
    adv = episode_group_advantage(ret, group, eps=0.5)
    assert adv.dtype == torch.float64
    close(adv, [2.0 / 1.5, 0.0, 0.0, -3.0 / 1.5])
    close(episode_group_advantage(ret, group, norm_by_std=False), [2.0, 0.0, 0.0, -3.0])
    empty = episode_group_advantage(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_advantages_sum_to_zero_in_groups_of_two_or_more(name: str) -> None:
    adv = compute_advantages(name, MIXED)
    ep = MIXED.episodes()
    leaf_adv = adv[ep.leaf]
    for g in (0, 1, 3):
        assert float(leaf_adv[ep.group == g].sum()) == pytest.approx(0.0, abs=1e-6)


def test_one_group_and_the_default_eps() -> None:
    # a single group of two (num = 1 group): mean ½, std √½; default ε = 1e-6
    adv = episode_group_advantage(torch.tensor([1.0, 0.0]), torch.tensor([3, 3]))
    h = math.sqrt(0.5) + 1e-6
    close(adv, [0.5 / h, -0.5 / h])
    # ε only matters next to a small std: with std √½ an ε of 1 would give ±0.293
    assert abs(float(adv[0]) - 0.5 / (math.sqrt(0.5) + 1.0)) > 0.4


@pytest.mark.parametrize("fn", [grpo, dr_grpo, rloo], ids=["grpo", "dr_grpo", "rloo"])
def test_the_estimators_themselves_return_float32_rows(fn) -> None:  # type: ignore[no-untyped-def]
    # (compute_advantages casts anyway; called directly they keep the same contract)
    adv = fn(MIXED)
    assert adv.dtype == torch.float32 and adv.shape == (MIXED.num_rows,)
