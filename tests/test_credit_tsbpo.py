"""TSBPO: hand-worked examples on a linear group, a tree and a merge; properties."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_forests_b import forests, group_rows, reorder, topological_shuffle
from credit_reference_b import tsbpo_reference
from credo.credit import compute_advantages
from credo.credit.grpo import dr_grpo
from credo.credit.tsbpo import leaf_values, tsbpo
from credo.data import RolloutForest


def close(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=0
    )


# Linear group: E0 = rows 0, 1 (R = 1), E1 = rows 2, 3, 4 (R = 0), E2 = row 5 (R = 1).
# Every root starts in state 0; later states are all different.
LINEAR = RolloutForest.from_columns(
    group=[0] * 6,
    parent=[-1, 0, -1, 2, 3, -1],
    state=[0, 1, 0, 2, 3, 0],
    reward=[0, 1, 0, 0, 0, 1],
)


def test_linear_group() -> None:
    # V per row = its episode's R: (1, 1, 0, 0, 0, 1).
    # Roots are siblings under the virtual root: mean V = 2/3 → A_sib = (1/3, −2/3, 1/3),
    # inherited down each chain (only children): (1/3, 1/3, −2/3, −2/3, −2/3, 1/3)
    # = Dr.GRPO's R − mean R on every row.
    close(tsbpo(LINEAR, omega=0.0), [1 / 3, 1 / 3, -2 / 3, -2 / 3, -2 / 3, 1 / 3])
    close(tsbpo(LINEAR, omega=0.0), dr_grpo(LINEAR).tolist())
    # Same-state: the three roots share state 0 → A_state = A_sib at the roots, 0 elsewhere
    # (states 1, 2, 3 are alone). ω = 1 doubles the roots: (2/3, 1/3, −4/3, −2/3, −2/3, 2/3)
    close(tsbpo(LINEAR), [2 / 3, 1 / 3, -4 / 3, -2 / 3, -2 / 3, 2 / 3])
    # only_child="zero": the formula applied literally, only the roots are compared
    close(tsbpo(LINEAR, omega=0.0, only_child="zero"), [1 / 3, 0, -2 / 3, 0, 0, 1 / 3])


# Tree: one root (row 0) branches into rows 1 and 4; row 1 branches into leaves 2 (R = 1)
# and 3 (R = 0); row 4 continues to leaf 5 (R = 0). All states different.
TREE = dict(group=[0] * 6, parent=[-1, 0, 1, 1, 0, 4], reward=[0, 0, 1, 0, 0, 0])


def test_tree() -> None:
    forest = RolloutForest.from_columns(**TREE, state=[10, 11, 12, 13, 14, 15])
    # V: leaves 2, 3, 5 → 1, 0, 0; row 1 = mean(1, 0) = 0.5; row 4 = 0; row 0 = 1/3.
    assert leaf_values(forest).tolist() == pytest.approx([1 / 3, 0.5, 1, 0, 0, 0])
    # row 0: alone under the virtual root → 0.
    # rows 1, 4 are siblings: mean(0.5, 0) = 0.25 → +0.25, −0.25.
    # rows 2, 3 are siblings: mean(1, 0) = 0.5 → +0.5, −0.5.
    # row 5 is an only child: inherits row 4's −0.25.
    close(tsbpo(forest), [0, 0.25, 0.5, -0.5, -0.25, -0.25])
    close(tsbpo(forest, only_child="zero"), [0, 0.25, 0.5, -0.5, -0.25, 0])
    # norm_by_std: a pair {x, y} has unbiased std |x − y|/√2, so each member is ±1/√2:
    #   {0.5, 0}: ±0.25/0.35355 = ±0.70711;  {1, 0}: ±0.5/0.70711 = ±0.70711
    r = 1 / math.sqrt(2)
    close(tsbpo(forest, norm_by_std=True), [0, r, r, -r, -r, -r])


def test_merge_same_state() -> None:
    # The tree above, but the two branches meet: rows 2 and 5 are in the same env state 12.
    forest = RolloutForest.from_columns(**TREE, state=[10, 11, 12, 13, 14, 12])
    # Same-state set {2, 5}: V = (1, 0), mean 0.5 → A_state = +0.5, −0.5; others alone → 0.
    # ω = 0.5: row 2 = 0.5 + 0.5·0.5 = 0.75; row 5 = −0.25 + 0.5·(−0.5) = −0.5
    close(tsbpo(forest, omega=0.5), [0, 0.25, 0.75, -0.5, -0.25, -0.5])
    # The same states in another group do not mix: a copy as group 1 changes nothing.
    two = RolloutForest.concat(
        [
            forest,
            RolloutForest.from_columns(
                **{**TREE, "group": [1] * 6}, state=[10, 11, 12, 13, 14, 12]
            ),
        ]
    )
    close(tsbpo(two, omega=0.5), [0, 0.25, 0.75, -0.5, -0.25, -0.5] * 2)


def test_registry_and_errors() -> None:
    close(
        compute_advantages("tsbpo", LINEAR, {"omega": 0.0}),
        [1 / 3, 1 / 3, -2 / 3, -2 / 3, -2 / 3, 1 / 3],
    )
    with pytest.raises(ValueError, match="only_child"):
        tsbpo(LINEAR, only_child="mean")
    assert tsbpo(RolloutForest.from_columns(group=[], parent=[])).shape == (0,)


# ----------------------------------------------------------------------- properties
KNOBS = st.fixed_dictionaries(
    {
        "omega": st.sampled_from([0.0, 0.5, 1.0]),
        "norm_by_std": st.booleans(),
        "only_child": st.sampled_from(["inherit", "zero"]),
    }
)


@settings(max_examples=80, deadline=None)
@given(forests(), KNOBS)
def test_matches_loop_reference(forest: RolloutForest, knobs: dict) -> None:
    adv = tsbpo(forest, **knobs)
    torch.testing.assert_close(adv, tsbpo_reference(forest, **knobs), atol=1e-5, rtol=1e-5)
    assert bool(torch.isfinite(adv).all())


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1), KNOBS, st.randoms(use_true_random=False))
def test_row_order_independent(forest: RolloutForest, knobs: dict, rnd: random.Random) -> None:
    order = topological_shuffle(forest, rnd)
    adv = tsbpo(forest, **knobs)
    torch.testing.assert_close(
        tsbpo(reorder(forest, order), **knobs), adv[order], atol=1e-5, rtol=1e-5
    )


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1), KNOBS)
def test_groups_independent(forest: RolloutForest, knobs: dict) -> None:
    adv = tsbpo(forest, **knobs)
    for gid in forest.group.unique().tolist():
        rows = group_rows(forest, gid)
        torch.testing.assert_close(
            tsbpo(forest.select(rows), **knobs), adv[rows], atol=1e-5, rtol=1e-5
        )


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1), KNOBS, st.sampled_from([0.0, 1.0, 0.3]))
def test_equal_returns_give_zero(forest: RolloutForest, knobs: dict, r: float) -> None:
    forest.reward.fill_(0.0)
    forest.reward[forest.is_leaf()] = r
    adv = tsbpo(forest, **knobs)
    assert torch.equal(adv, torch.zeros_like(adv))


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1, max_groups=6, max_rows=8), KNOBS)
def test_singletons_and_single_steps_finite(forest: RolloutForest, knobs: dict) -> None:
    single = RolloutForest.from_columns(
        group=list(range(forest.num_rows)),
        parent=[-1] * forest.num_rows,
        state=forest.state,
        reward=forest.reward,
    )
    for f in (forest, single):
        adv = tsbpo(f, **knobs)
        assert adv.shape == (f.num_rows,) and bool(torch.isfinite(adv).all())
    # a group of one single-step episode has nothing to compare against: 0
    assert torch.equal(tsbpo(single, **knobs), torch.zeros(forest.num_rows))
