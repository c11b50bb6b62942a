"""GraphPO: hand-worked examples, invariants, loop reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_forests import forests, permute_forest, random_topological_order, relabel_groups
from credit_reference import graphpo_reference
from credo.credit import compute_advantages
from credo.credit.graphpo import graphpo, graphpo_in_edge_advantage, revisits
from credo.credit.state_graph import state_nodes
from credo.data import RolloutForest

SETTINGS = settings(max_examples=50, deadline=None)
S = 0.7071068  # 1/√2
EDGE_ONLY = {"episode_norm": "none", "out_norm": "none"}


def close(a: torch.Tensor, expected: list[float], tol: float = 1e-5) -> None:
    assert torch.allclose(a.double(), torch.tensor(expected, dtype=torch.float64), atol=tol), (
        a.tolist(),
        expected,
    )


# ----------------------------------------------------------------- hand-worked examples
def merge_group() -> RolloutForest:
    # A: s0 -> s1 -> s2 -> end(9), rewards 0, 0, 1     rows 0, 1, 2   R = 1
    # B: s0 -> s2 -> end(9), rewards 0, 1              rows 3, 4      R = 1  (shortcut to s2)
    # C: s0 -> s3 -> end(8), rewards 0, 0              rows 5, 6      R = 0
    return RolloutForest.from_columns(
        group=[0] * 7,
        parent=[-1, 0, 1, -1, 3, -1, 5],
        state=[0, 1, 2, 0, 2, 0, 3],
        next_state=[1, 2, 9, 2, 9, 3, 8],
        reward=[0, 0, 1, 0, 1, 0, 0],
    )


def test_merge_dag() -> None:
    f = merge_group()
    # V (mean R of the episodes through the node): s0 {A,B,C} 2/3 ; s1 {A} 1 ; s2 {A,B} 1 ;
    # s3 {C} 0.  Q = V(n'), or the episode's R on a terminal row:
    #   Q = 1, 1, 1, 1, 1, 0, 0 -> A_out = Q − V(n) = 1/3, 0, 0, 1/3, 0, −2/3, 0
    close(graphpo(f, lam=0.0, **EDGE_ONLY), [1 / 3, 0, 0, 1 / 3, 0, -2 / 3, 0])
    # normalised over s0's out-edges (rows 0, 3, 5): mean 0, σ² = (1/9+1/9+4/9)/2 = 1/3
    #   -> 0.5773503, 0.5773503, −1.1547005 ; s2's rows 2, 4 are equal -> 0 ; others alone
    # A_in: rows arriving at s2 are row1 (path length 2) and row3 (length 1):
    #   z of (−2, −1) -> −1/√2, +1/√2 ; at end(9): row2 (3), row4 (2) -> −1/√2, +1/√2 ;
    #   s1, s3, end(8) are reached once -> 0
    # A^E (GRPO): R = 1, 1, 0 -> μ 2/3, σ 0.5773503 -> 0.5773503 (A, B), −1.1547005 (C)
    # A = A^E + A_out + 0.5·A_in
    close(
        graphpo(f),
        [1.1547005, 0.2237969, 0.2237969, 1.5082540, 0.9309037, -2.3094011, -1.1547005],
    )


def merge_group_success(winner: int | None) -> RolloutForest:
    """:func:`merge_group` with the episode ending at leaf row ``winner`` a success."""
    success = torch.tensor([i == winner for i in range(7)])
    return dataclasses.replace(merge_group(), success=success)


def test_efficiency_only_at_success_nodes() -> None:
    # A_in of merge_group: rows 1, 3 arrive at s2 (lengths 2, 1) → −S, +S; rows 2, 4 at
    # end(9) (lengths 3, 2) → −S, +S; the rest 0. The term alone: A(λ=0.5) − A(λ=0).
    def efficiency_term(f: RolloutForest, **kw: str) -> torch.Tensor:
        return graphpo(f, **EDGE_ONLY, **kw) - graphpo(f, lam=0.0, **EDGE_ONLY, **kw)

    all_nodes = [0, -0.5 * S, -0.5 * S, 0.5 * S, 0.5 * S, 0, 0]
    close(efficiency_term(merge_group_success(None)), all_nodes)
    # A succeeds (leaf row 2): it passes s0, s1, s2, end(9) → every A_in is kept
    close(efficiency_term(merge_group_success(2), efficiency="success"), all_nodes)
    # only C succeeds (leaf row 6): success nodes s0, s3, end(8) → s2 and end(9) give 0
    close(efficiency_term(merge_group_success(6), efficiency="success"), [0.0] * 7)
    # no success in the group: no efficiency term at all
    close(efficiency_term(merge_group_success(None), efficiency="success"), [0.0] * 7)


def test_revisits_skip_back_tracks() -> None:
    # E0: s0→s1 (row 0), s1→s2 (1), s2→s1 (2: back to s1, which row 1 left), s1→end(9) (3)
    # E1: s0→s1 (4), s1→end(8) (5)
    f = RolloutForest.from_columns(
        group=[0] * 6,
        parent=[-1, 0, 1, 2, -1, 4],
        state=[0, 1, 2, 1, 0, 1],
        next_state=[1, 2, 1, 9, 1, 8],
        reward=[0, 0, 0, 1, 0, 0],
    )
    nodes = state_nodes(f)
    assert revisits(f, nodes).tolist() == [False, False, True, False, False, False]
    # into s1: rows 0, 2, 4 with path lengths 1, 3, 1 → z of (−1, −3, −1): mean −5/3,
    # unbiased σ = √(4/3) → (+0.57735, −1.1547, +0.57735); every other node is reached once
    close(graphpo_in_edge_advantage(f, nodes), [0.5773503, 0, -1.1547005, 0, 0.5773503, 0])
    # skipping the back-track: rows 0 and 4 have equal lengths → 0; row 2 → 0
    close(graphpo_in_edge_advantage(f, nodes, skip_revisits=True), [0.0] * 6)
    # a self-loop is a revisit too
    loop = RolloutForest.from_columns(group=[0], parent=[-1], state=[3], next_state=[3])
    assert revisits(loop, state_nodes(loop)).tolist() == [True]


def tree_group() -> RolloutForest:
    # row 0: s0 -> s1 ; in s1: row 1 -> end(9) r 1 ; row 2 -> s2 r 0 ; row 3: s2 -> end(8) r 0
    # episodes [0, 1] R = 1 ; [0, 2, 3] R = 0
    return RolloutForest.from_columns(
        group=[0] * 4,
        parent=[-1, 0, 0, 2],
        state=[0, 1, 1, 2],
        next_state=[1, 9, 2, 8],
        reward=[0, 1, 0, 0],
    )


def test_tree() -> None:
    f = tree_group()
    # mc: V(s0) = V(s1) = mean(1, 0) = 0.5, V(s2) = 0 ; Q = 0.5, 1, 0, 0
    # A_out = 0, 0.5, −0.5, 0
    close(graphpo(f, lam=0.0, **EDGE_ONLY), [0.0, 0.5, -0.5, 0.0])
    # bellman, γ = 0.9: V(s2) = 0, V(s1) = mean(1, 0.9·0) = 0.5, V(s0) = 0.9·0.5 = 0.45
    # Q = r + γV(n') = 0.45, 1, 0, 0 -> A_out = 0, 0.5, −0.5, 0 (the same here)
    a = graphpo(f, value="bellman", gamma=0.9, lam=0.0, tol=1e-12, **EDGE_ONLY)
    close(a, [0.0, 0.5, -0.5, 0.0])
    # defaults: s1's rows 1, 2 -> ±1/√2 ; every node reached once -> A_in = 0 ;
    # A^E ±1/√2 (row 0 is on both episodes -> 0)
    close(graphpo(f), [0.0, 2 * S, -2 * S, -S])


def cycle_group(tokens: list[int]) -> RolloutForest:
    # episode A: a -> b (r 0), b -> a (r 0), a -> end (r 1)   rows 0, 1, 2
    # episode B: a -> end (r 0)                                row 3 ; both end in state 9
    return RolloutForest.from_columns(
        group=[0] * 4,
        parent=[-1, 0, 1, -1],
        state=[1, 2, 1, 1],
        next_state=[2, 1, 9, 9],
        reward=[0, 0, 1, 0],
        prompt_ids=[torch.zeros(1, dtype=torch.long)] * 4,
        response_ids=[torch.zeros(k, dtype=torch.long) for k in tokens],
        old_logprobs=[torch.zeros(k) for k in tokens],
    )


def test_cycle_values_and_singleton() -> None:
    f = cycle_group([3, 2, 4, 12])
    # mc: V(a) = mean over {A, B} = 0.5, V(b) = 1 (A only)
    # Q: row0 V(b) = 1, row1 V(a) = 0.5, row2 R_A = 1, row3 R_B = 0
    # A_out = 0.5, −0.5, 0.5, −0.5
    close(graphpo(f, lam=0.0, **EDGE_ONLY), [0.5, -0.5, 0.5, -0.5])
    # out_norm="mean": a's rows 0, 2, 3 have mean 1/6 -> 1/3, ·, 1/3, −2/3 ; b's row 1 alone
    # -> 0 ("zero") or −0.5 ("raw")
    kw = {"lam": 0.0, "episode_norm": "none", "out_norm": "mean"}
    close(graphpo(f, **kw), [1 / 3, 0.0, 1 / 3, -2 / 3])
    close(graphpo(f, singleton="raw", **kw), [1 / 3, -0.5, 1 / 3, -2 / 3])
    # bellman, γ = 0.5: V(a) = 4/11, V(b) = 2/11 (see test_credit_graph) ;
    # Q = 0.5·2/11, 0.5·4/11, 1, 0 -> A_out = −3/11, 0, 7/11, −4/11
    a = graphpo(f, value="bellman", gamma=0.5, lam=0.0, tol=1e-12, **EDGE_ONLY)
    close(a, [-3 / 11, 0.0, 7 / 11, -4 / 11])


def test_cycle_in_edge_lengths() -> None:
    f = cycle_group([3, 2, 4, 12])
    # rows 2 and 3 both arrive at state 9; rows 0 (-> b) and 1 (-> a) arrive alone.
    # steps: lengths 3 (row 2) and 1 (row 3) -> z of (−3, −1) = −1/√2, +1/√2
    # tokens: row 2's path has 3 + 2 + 4 = 9 tokens, row 3's has 12 -> +1/√2, −1/√2
    # with λ = 1 on top of the raw A_out 0.5, −0.5, 0.5, −0.5:
    close(graphpo(f, lam=1.0, **EDGE_ONLY), [0.5, -0.5, 0.5 - S, -0.5 + S])
    close(graphpo(f, lam=1.0, length="tokens", **EDGE_ONLY), [0.5, -0.5, 0.5 + S, -0.5 - S])


def test_similarity_merges_nodes() -> None:
    # two one-step episodes from different keys with near-identical texts; A reaches end 9
    # with r 1, B end 8 with r 0.  Exact: each node left once -> A_out 0.  Merged (τ = 0.9):
    # V = 0.5, Q = 1, 0 -> raw ±0.5 -> z ±1/√2
    f = RolloutForest.from_columns(
        group=[0, 0],
        parent=[-1, -1],
        state=[10, 11],
        next_state=[9, 8],
        reward=[1, 0],
        observations=["the door is open", "the door is open."],
    )
    kw = {"episode_norm": "none"}
    close(graphpo(f, **kw), [0.0, 0.0])
    close(graphpo(f, similarity_threshold=0.9, **kw), [S, -S])
    merged = state_nodes(f, similarity_threshold=0.9)
    assert merged.src[0] == merged.src[1]


def test_bad_arguments() -> None:
    f = tree_group()
    for kw, msg in [
        ({"value": "td"}, "value must be one of"),
        ({"length": "chars"}, "length must be one of"),
        ({"efficiency": "short"}, "efficiency must be one of"),
        ({"revisit": "drop"}, "revisit must be one of"),
        ({"out_norm": "z"}, "out_norm must be one of"),
        ({"singleton": "one"}, "singleton must be one of"),
        ({"lam": -1.0}, "lam must be >= 0"),
        ({"length": "tokens"}, "needs token data"),
        ({"value": "bellman", "backup": "min"}, "backup must be one of"),
    ]:
        with pytest.raises(ValueError, match=msg):
            graphpo(f, **kw)
    assert graphpo(RolloutForest.from_columns(group=[], parent=[])).shape == (0,)


# ------------------------------------------------------------------------ properties
KNOBS = [
    {},
    {"value": "bellman", "lam": 1.0, "gamma": 0.8},
    {"value": "bellman", "backup": "max", "out_norm": "mean", "singleton": "raw"},
    {"length": "tokens", "episode_norm": "mean_norm", "lam": 0.3},
    {"similarity_threshold": 0.9, "out_norm": "none", "episode_norm": "none"},
    {"efficiency": "success", "out_norm": "mean"},
    {"efficiency": "success", "out_norm": "mean", "revisit": "skip"},
    {"revisit": "skip", "lam": 1.0, "value": "bellman"},
]


@SETTINGS
@given(forests(tokens=True), st.sampled_from(KNOBS))
def test_matches_loop_reference(forest: RolloutForest, knobs: dict) -> None:
    # credo at its default tol (float64's resolution); the loop reference to 1e-13
    # leaves with a positive return count as successes (``efficiency="success"``)
    leaf = torch.ones(forest.num_rows, dtype=torch.bool)
    leaf[forest.parent[forest.parent >= 0]] = False
    forest = dataclasses.replace(forest, success=leaf & (forest.reward > 0))
    a = compute_advantages("graphpo", forest, knobs)
    ref = torch.tensor(graphpo_reference(forest, **knobs, tol=1e-13), dtype=torch.float64)
    assert torch.isfinite(a).all()
    assert torch.allclose(a.double(), ref, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(forests(tokens=True), st.integers(0, 10_000), st.sampled_from(KNOBS))
def test_row_order_does_not_matter(forest: RolloutForest, seed: int, knobs: dict) -> None:
    order = random_topological_order(forest, seed)
    a = graphpo(forest, **knobs)
    b = graphpo(permute_forest(forest, order), **knobs)
    assert torch.allclose(b, a[order], atol=1e-5)


@SETTINGS
@given(
    forests(max_groups=2, tokens=True), forests(max_groups=2, tokens=True), st.sampled_from(KNOBS)
)
def test_groups_do_not_interact(f1: RolloutForest, f2: RolloutForest, knobs: dict) -> None:
    f2 = relabel_groups(f2, 1000)
    both = RolloutForest.concat([f1, f2])
    expected = torch.cat([graphpo(f1, **knobs), graphpo(f2, **knobs)])
    assert torch.allclose(graphpo(both, **knobs), expected, atol=1e-5)


def test_groups_do_not_interact_on_a_cycle() -> None:
    # found by hypothesis (2026-12-06): a Bellman group with a self-loop beside others.
    # The values were iterated until the largest change over the whole batch fell below
    # tol, so a group kept the residual of the batch it came in (~1e-10 here), and the
    # per-node normalisation (÷ σ + 1e-6) made it a difference of 5e-5 in A_out.
    f1 = RolloutForest.from_columns(group=[0], parent=[-1], reward=[0.5], terminal=[False])
    f2 = RolloutForest.from_columns(
        group=[1000] * 8 + [1001] * 6,
        parent=[-1, 0, 1, 2, -1, -1, 5, 6, -1, -1, 9, 10, 11, 12],
        state=[0] * 10 + [3, 3, 3, 3],
        next_state=[0] * 9 + [3, 3, 3, 3, 0],
        reward=[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1],
        terminal=[False] * 8 + [True] + [False] * 4 + [True],
    )
    knobs = {"value": "bellman", "lam": 1.0, "gamma": 0.8, "tol": 1e-10}
    both = RolloutForest.concat([f1, f2])
    expected = torch.cat([graphpo(f1, **knobs), graphpo(f2, **knobs)])
    assert torch.allclose(graphpo(both, **knobs), expected, atol=1e-6)


@SETTINGS
@given(forests(rewards=(0.0,), tokens=True), st.sampled_from(KNOBS))
def test_equal_rewards(forest: RolloutForest, knobs: dict) -> None:
    # correctness terms vanish; the efficiency term does not look at rewards, so what is
    # left is exactly λ·A_in (and 0 with λ = 0)
    zero = graphpo(forest, **{**knobs, "lam": 0.0})
    assert torch.equal(zero, torch.zeros(forest.num_rows))
    lam = knobs.get("lam", 0.5)
    only_in = graphpo(forest, **knobs)
    nodes = state_nodes(forest, similarity_threshold=knobs.get("similarity_threshold"))
    a_in = graphpo_in_edge_advantage(
        forest,
        nodes,
        length=knobs.get("length", "steps"),
        skip_revisits=knobs.get("revisit") == "skip",
    )
    if knobs.get("efficiency") == "success":  # no episode succeeds here: no term at all
        a_in = torch.zeros_like(a_in)
    assert torch.allclose(only_in, (lam * a_in).float(), atol=1e-6)


@SETTINGS
@given(forests(max_episodes=1, max_len=1), st.sampled_from(KNOBS[:3] + KNOBS[4:]))
def test_singleton_groups_single_steps(forest: RolloutForest, knobs: dict) -> None:
    a = graphpo(forest, **knobs)
    assert torch.isfinite(a).all()
    # one row per group: every node is left and reached once -> A_in = 0 ; A_out is 0
    # (normalised singleton) or raw Q − V(n) = 0 (mc: V(n) = R = Q; bellman: V(n) = Q)
    norm = knobs.get("episode_norm", "mean_std_norm")
    expected = {"none": 0 * forest.reward, "mean_norm": forest.reward}.get(
        norm, forest.reward / (1 + 1e-6)
    )
    assert torch.allclose(a, expected, atol=1e-5)


def test_bad_recipe_value_stops_before_any_compute() -> None:
    # a wrong value of a known knob fails config validation, one line naming the key
    from credo.train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"credit\.params: revisit must be one of"):
        load_config("graphpo", ["credit.params.revisit=drop"])
