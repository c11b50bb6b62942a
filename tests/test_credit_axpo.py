"""AXPO: hand-built forests with resample branches; properties."""

from __future__ import annotations

import math
import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_forests_b import forests, group_rows, reorder, topological_shuffle
from credit_reference_b import axpo_reference
from credo.credit import compute_advantages
from credo.credit.axpo import axpo, resample_branches
from credo.credit.grpo import grpo
from credo.data import RolloutForest

R2 = 1 / math.sqrt(2)  # GRPO in a pair with returns (1, 0): ±0.70711


def close(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=0
    )


def test_ordinary_linear_group_is_grpo() -> None:
    # No resample rows: plain GRPO. R = (1, 0, 0): mean 1/3, std √(1/3) → (1.15470, −0.57735, ·)
    forest = RolloutForest.from_columns(
        group=[0, 0, 0, 0, 0],
        parent=[-1, 0, -1, 2, -1],
        reward=[0, 1, 0, 0, 0],
        success=[0, 1, 0, 0, 0],
    )
    a, b = (2 / 3) / math.sqrt(1 / 3), -(1 / 3) / math.sqrt(1 / 3)
    close(axpo(forest), [a, a, b, b, b])
    close(axpo(forest), grpo(forest).tolist())


# An all-failed group: original episodes (0, 1, 2) and (3), both R = 0. The sampler kept
# rows 0, 1 and resampled the tool call at step 2 twice: row 4 (succeeds, R = 1) and
# rows 5 → 6 (fails). Branch point p = row 1.
ALL_FAILED = dict(
    group=[0] * 7,
    parent=[-1, 0, 1, -1, 1, 1, 5],
    source=[0, 0, 0, 0, 2, 2, 2],
    reward=[0, 0, 0, 0, 1, 0, 0],
    success=[0, 0, 0, 0, 1, 0, 0],
)


def test_all_failed_group_with_a_recovered_set() -> None:
    forest = RolloutForest.from_columns(**ALL_FAILED)
    in_branch, branch_parent = resample_branches(forest)
    assert in_branch.tolist() == [False] * 4 + [True] * 3
    assert branch_parent.tolist() == [-1, -1, -1, -1, 1, 1, 1]
    # originals (0, 1, 2) and (3): R = (0, 0) → GRPO 0, 0 (rows 2 and 3).
    # set {row 4: R = 1, rows 5-6: R = 0}: GRPO ±0.70711.
    # recovery: y = 1 (row 4 succeeded), baseline = success rate of the originals = 0
    #   → prefix rows 0 and 1 (root to p) get 1·(1 − 0) = 1.
    close(axpo(forest), [1, 1, 0, 0, R2, -R2, -R2])
    # recovery_coef 0.5 halves the prefix; Dr.GRPO gives the set ±0.5
    close(axpo(forest, recovery_coef=0.5, norm_by_std=False), [0.5, 0.5, 0, 0, 0.5, -0.5, -0.5])
    # partial credit: the first original fails with R = 0.5. The baseline is the
    # originals' success rate (0), not their mean return (0.25): the prefix still gets 1.
    # originals R = (0.5, 0): ±0.70711 on rows 2 and 3.
    partial = RolloutForest.from_columns(**{**ALL_FAILED, "reward": [0, 0, 0.5, 0, 1, 0, 0]})
    close(axpo(partial), [1, 1, R2, -R2, R2, -R2, -R2])
    # without recovery (all resamples fail too): y = 0 → the prefix gets 0, the set 0
    failed = RolloutForest.from_columns(**{**ALL_FAILED, "reward": [0] * 7, "success": [0] * 7})
    close(axpo(failed), [0] * 7)


def test_states_do_not_matter() -> None:
    # AXPO partitions by branch structure only: the same forest whose resamples merge back
    # into the original episode's states (a graph, not a tree, in state space) gives the
    # same advantages.
    merged = RolloutForest.from_columns(
        **ALL_FAILED, state=[0, 1, 2, 0, 2, 2, 3], next_state=[1, 2, 3, 9, 3, 3, 1]
    )
    close(axpo(merged), [1, 1, 0, 0, R2, -R2, -R2])


def test_two_sets_on_one_episode_in_a_mixed_group() -> None:
    # group 0: originals (0, 1, 2) fails, (3) succeeds → baseline b = 1/2.
    #   set A at p = row 0: row 4 (succeeds), row 5 (fails)      → y_A = 1
    #   set B at p = row 1: row 6 (fails)                         → y_B = 0
    # group 1 (ordinary): row 7 succeeds, row 8 fails.
    forest = RolloutForest.from_columns(
        group=[0, 0, 0, 0, 0, 0, 0, 1, 1],
        parent=[-1, 0, 1, -1, 0, 0, 1, -1, -1],
        source=[0, 0, 0, 0, 2, 2, 2, 0, 0],
        reward=[0, 0, 0, 1, 1, 0, 0, 1, 0],
        success=[0, 0, 0, 1, 1, 0, 0, 1, 0],
    )
    # originals of group 0: R = (0, 1) → row 2: −0.70711, row 3: +0.70711
    # set A: R = (1, 0) → rows 4, 5: ±0.70711; set B: one episode, GRPO's singleton rule
    #   A = R = 0 → row 6: 0
    # prefixes: set A → row 0 gets 1 − 1/2 = 0.5; set B → rows 1, 0 get 0 − 1/2 = −0.5
    #   row 0 (in both prefixes) = mean(0.5, −0.5) = 0; row 1 = −0.5
    # group 1: ±0.70711
    close(axpo(forest), [0, -0.5, -R2, R2, R2, -R2, 0, R2, -R2])


def test_resampled_first_step_has_no_prefix() -> None:
    # p = −1: the whole episode was resampled; rows 1, 2 form a set {R = 1, 0} at the root.
    # The original (row 0) is alone among the originals: GRPO singleton A = R = 0.
    forest = RolloutForest.from_columns(
        group=[0, 0, 0], parent=[-1, -1, -1], source=[0, 2, 2], reward=[0, 1, 0], success=[0, 1, 0]
    )
    close(axpo(forest), [0, R2, -R2])


def test_nested_resample_continues_the_branch() -> None:
    # row 3 resamples under resample row 2: it continues the branch of row 2 (set at p = 0)
    forest = RolloutForest.from_columns(
        group=[0] * 5,
        parent=[-1, 0, 0, 2, 2],
        source=[0, 0, 2, 2, 0],
        reward=[0, 0, 0, 1, 0],
        success=[0, 0, 0, 1, 0],
    )
    in_branch, branch_parent = resample_branches(forest)
    assert in_branch.tolist() == [False, False, True, True, True]
    assert branch_parent.tolist() == [-1, -1, 0, 0, 0]
    # set at p = 0: episodes (0, 2, 3) R = 1 and (0, 2, 4) R = 0 → rows 3, 4: ±0.70711,
    # row 2 (shared) = mean = 0; original (0, 1) alone → row 1: 0; prefix row 0: y = 1, b = 0 → 1
    close(axpo(forest), [1, 0, 0, R2, -R2])


def test_registry() -> None:
    forest = RolloutForest.from_columns(**ALL_FAILED)
    close(compute_advantages("axpo", forest, {"recovery_coef": 2.0}), [2, 2, 0, 0, R2, -R2, -R2])
    assert axpo(RolloutForest.from_columns(group=[], parent=[])).shape == (0,)


# ----------------------------------------------------------------------- properties
KNOBS = st.fixed_dictionaries(
    {"norm_by_std": st.booleans(), "recovery_coef": st.sampled_from([0.0, 1.0, 0.5])}
)


@settings(max_examples=80, deadline=None)
@given(forests(resample=True), KNOBS)
def test_matches_loop_reference(forest: RolloutForest, knobs: dict) -> None:
    adv = axpo(forest, **knobs)
    torch.testing.assert_close(adv, axpo_reference(forest, **knobs), atol=1e-5, rtol=1e-5)
    assert bool(torch.isfinite(adv).all())


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1, resample=True), KNOBS, st.randoms(use_true_random=False))
def test_row_order_independent(forest: RolloutForest, knobs: dict, rnd: random.Random) -> None:
    order = topological_shuffle(forest, rnd)
    adv = axpo(forest, **knobs)
    torch.testing.assert_close(
        axpo(reorder(forest, order), **knobs), adv[order], atol=1e-5, rtol=1e-5
    )


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1, resample=True), KNOBS)
def test_groups_independent(forest: RolloutForest, knobs: dict) -> None:
    adv = axpo(forest, **knobs)
    for gid in forest.group.unique().tolist():
        rows = group_rows(forest, gid)
        torch.testing.assert_close(
            axpo(forest.select(rows), **knobs), adv[rows], atol=1e-5, rtol=1e-5
        )


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1, resample=True), KNOBS, st.booleans())
def test_equal_returns_give_zero(forest: RolloutForest, knobs: dict, solved: bool) -> None:
    # every episode ends the same way: all fail with R = 0, or all succeed with R = 1
    leaf = forest.is_leaf()
    forest.reward.fill_(0.0)
    forest.success.fill_(False)
    if solved:  # everyone succeeds with R = 1: GRPO 0 in groups/sets of ≥ 2, y = b = 1
        forest.reward[leaf] = 1.0
        forest.success[leaf] = True
    adv = axpo(forest, **knobs)
    if not solved:
        assert torch.equal(adv, torch.zeros_like(adv))
    else:  # singleton partitions get A = R = 1 (GRPO's rule); everything else is 0
        ep = forest.episodes()
        in_branch, branch_parent = resample_branches(forest)
        key = torch.stack([ep.group, in_branch[ep.leaf].long(), branch_parent[ep.leaf]], 1)
        size = (key[:, None, :] == key[None, :, :]).all(-1).sum(1)
        assert bool((adv[ep.leaf[size > 1]] == 0).all())


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1, max_groups=6, max_rows=8, resample=True), KNOBS)
def test_singletons_and_single_steps_finite(forest: RolloutForest, knobs: dict) -> None:
    single = RolloutForest.from_columns(
        group=list(range(forest.num_rows)),
        parent=[-1] * forest.num_rows,
        source=forest.source,
        reward=forest.reward,
        success=forest.success,
    )
    for f in (forest, single):
        adv = axpo(f, **knobs)
        assert adv.shape == (f.num_rows,) and bool(torch.isfinite(adv).all())
    # a single-step episode alone in its group or set gets A = R (GRPO's singleton rule)
    close(axpo(single, **knobs), single.reward.tolist())


def test_resample_under_an_oracle_row() -> None:
    # the branch point may be any non-resample row, here an oracle row (p = row 0)
    forest = RolloutForest.from_columns(
        group=[0, 0, 0], parent=[-1, 0, 0], source=[1, 0, 2], reward=[0, 0, 1], success=[0, 0, 1]
    )
    # original (0, 1) alone: 0; set at p = 0 {row 2, R = 1} alone: A = R = 1;
    # prefix row 0: y = 1, b = 0 → 1
    close(axpo(forest), [1, 0, 1])
