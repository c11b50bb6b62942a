"""Trajectory-graph advantage: hand-worked examples, invariants, loop reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_forests import forests, permute_forest, random_topological_order, relabel_groups
from credit_reference import graph_reference
from credo.credit import compute_advantages
from credo.credit.graph import graph
from credo.credit.state_graph import bellman_values, state_nodes
from credo.data import RolloutForest

SETTINGS = settings(max_examples=50, deadline=None)
RAW = {"state_norm": "none", "episode_norm": "none"}  # the graph advantage alone
S = 0.7071068  # 1/√2: z-score of ±x over two rows


def close(a: torch.Tensor, expected: list[float], tol: float = 1e-5) -> None:
    assert torch.allclose(a.double(), torch.tensor(expected, dtype=torch.float64), atol=tol), (
        a.tolist(),
        expected,
    )


# ----------------------------------------------------------------- hand-worked examples
def linear_group() -> RolloutForest:
    # episode A: s0 -> s1 (r 0), s1 -> end (r 1)        rows 0, 1
    # episode B: s0 -> s3 (r 0), s3 -> end (r 0)        rows 2, 3
    return RolloutForest.from_columns(
        group=[0, 0, 0, 0],
        parent=[-1, 0, -1, 2],
        state=[0, 1, 0, 3],
        next_state=[1, 9, 3, 9],
        reward=[0, 1, 0, 0],
    )


def test_linear_group() -> None:
    # γ = 0.9, λ = 0.5. Values: V(s1) = 1, V(s3) = 0, V(s0) = mean(0.9·1, 0.9·0) = 0.45
    # δ: row0 0 + 0.9·1 − 0.45 = 0.45 ; row1 1 − 1 = 0 ; row2 0.9·0 − 0.45 = −0.45 ; row3 0
    # GAE (γλ = 0.45): row0 0.45 + 0.45·0 = 0.45 ; row2 −0.45 ; rows 1, 3: 0
    close(graph(linear_group(), gamma=0.9, lam=0.5, **RAW), [0.45, 0.0, -0.45, 0.0])
    # on-state norm: s0 is left by rows 0, 2 -> ±1/√2; s1, s3 by one row each -> 0
    # episode term (GRPO): R = 1, 0 -> ±1/√2 on every row of the episode
    close(graph(linear_group(), gamma=0.9, lam=0.5), [2 * S, S, -2 * S, -S])
    # ω = 0.5 halves the graph part; episode_norm="mean_norm": R − μ = ±0.5
    a = graph(linear_group(), gamma=0.9, lam=0.5, omega=0.5, episode_norm="mean_norm")
    close(a, [0.5 + 0.5 * S, 0.5, -0.5 - 0.5 * S, -0.5])


def tree_group() -> RolloutForest:
    # row 0: s0 -> s1 (r 0); children in s1: row 1 s1 -> s2 (r 0), row 2 s1 -> end (r 0)
    # row 3 (child of row 1): s2 -> end (r 1).  Episodes: [0, 1, 3] R = 1 ; [0, 2] R = 0
    return RolloutForest.from_columns(
        group=[0, 0, 0, 0],
        parent=[-1, 0, 0, 1],
        state=[0, 1, 1, 2],
        next_state=[1, 2, 9, 9],
        reward=[0, 0, 0, 1],
    )


def test_tree() -> None:
    # γ = 0.9: V(s2) = 1, V(s1) = mean(0 + 0.9·1, 0) = 0.45, V(s0) = 0.9·0.45 = 0.405
    # δ: row0 0.9·0.45 − 0.405 = 0 ; row1 0.9·1 − 0.45 = 0.45 ; row2 0 − 0.45 ; row3 1 − 1 = 0
    # GAE (γλ = 0.45): row3 0 ; row1 0.45 ; row2 −0.45 ; row0 0 + 0.45·mean(0.45, −0.45) = 0
    close(graph(tree_group(), gamma=0.9, lam=0.5, **RAW), [0.0, 0.45, -0.45, 0.0])
    # normalised: s1 = rows {1, 2} -> ±1/√2 ; episode term ±1/√2, row 0 (both) -> 0
    close(graph(tree_group(), gamma=0.9, lam=0.5), [0.0, 2 * S, -2 * S, S])


def cycle_group() -> RolloutForest:
    # episode A: a -> b (r 0), b -> a (r 0), a -> end (r 1)   rows 0, 1, 2 (visits a twice)
    # episode B: a -> end (r 0)                                row 3
    return RolloutForest.from_columns(
        group=[0, 0, 0, 0],
        parent=[-1, 0, 1, -1],
        state=[1, 2, 1, 1],
        next_state=[2, 1, 9, 9],
        reward=[0, 0, 1, 0],
    )


def test_cycle_mean_backup() -> None:
    # γ = 0.5: V(a) = mean(0 + 0.5 V(b), 1, 0), V(b) = 0.5 V(a)
    #   -> 3 V(a) = 0.25 V(a) + 1 -> V(a) = 4/11, V(b) = 2/11
    f = cycle_group()
    nodes = state_nodes(f)
    v = bellman_values(
        nodes.src, nodes.dst, f.reward, f.terminal, nodes.num_nodes, gamma=0.5, tol=1e-12
    )
    close(v[nodes.src[:2]], [4 / 11, 2 / 11], tol=1e-9)
    # δ: row0 0.5·2/11 − 4/11 = −3/11 ; row1 0.5·4/11 − 2/11 = 0 ; row2 1 − 4/11 = 7/11 ;
    #    row3 −4/11.  λ = 1 (γλ = 0.5): row2 7/11 ; row1 0 + 0.5·7/11 = 3.5/11 ;
    #    row0 −3/11 + 0.5·3.5/11 = −1.25/11 (= return 0.25 − V(a)) ; row3 −4/11
    a = graph(f, gamma=0.5, lam=1.0, tol=1e-12, **RAW)
    close(a, [-1.25 / 11, 3.5 / 11, 7 / 11, -4 / 11])
    # singleton handling: b is left by row 1 only -> "zero" gives 0, "raw" keeps 3.5/11;
    # a is left by rows 0, 2, 3: centred by their mean (1.75/11)/3 with state_norm="mean"
    m = 1.75 / 33
    kw = {"gamma": 0.5, "lam": 1.0, "tol": 1e-12, "episode_norm": "none", "state_norm": "mean"}
    close(graph(f, **kw), [-1.25 / 11 - m, 0.0, 7 / 11 - m, -4 / 11 - m])
    close(graph(f, singleton="raw", **kw), [-1.25 / 11 - m, 3.5 / 11, 7 / 11 - m, -4 / 11 - m])


def test_cycle_max_backup() -> None:
    # γ = 0.5, max: V(a) = max(0.5 V(b), 1, 0) = 1, V(b) = 0.5 V(a) = 0.5
    # δ: row0 0.5·0.5 − 1 = −0.75 ; row1 0.5·1 − 0.5 = 0 ; row2 1 − 1 = 0 ; row3 0 − 1 = −1
    # λ = 1: row2 0, row1 0, row0 −0.75, row3 −1
    a = graph(cycle_group(), gamma=0.5, lam=1.0, backup="max", tol=1e-12, **RAW)
    close(a, [-0.75, 0.0, 0.0, -1.0])


def test_solver_error_is_not_normalised_into_advantages() -> None:
    # one episode: s0 -> s1, then three self-loops on s1 with reward 0.5, truncated.
    # V(s1) = 0.5 + 0.95 V(s1) = 10, so every δ leaving s1 is 0.5 + 9.5 − 10 = 0 and the
    # three rows at s1 have A^graph = 0 exactly; s0 is left once (singleton -> 0). Without
    # the episode term (episode_norm="none") every advantage is 0. With the iteration
    # stopped at 1e-6 (the default until 2026-12-06) V(s1) fell ~2e-5 short, the δ were
    # ~1e-6 and the on-state z-score (÷ σ + 1e-6) made them graph terms of order 1
    # (advantages 1.05 … 1.94 with the episode term, where 1.50 is exact).
    f = RolloutForest.from_columns(
        group=[0, 0, 0, 0],
        parent=[-1, 0, 1, 2],
        state=[0, 1, 1, 1],
        next_state=[1, 1, 1, 1],
        reward=[0.0, 0.5, 0.5, 0.5],
        terminal=[False, False, False, False],
    )
    close(graph(f, episode_norm="none"), [0.0, 0.0, 0.0, 0.0], tol=1e-7)
    with pytest.raises(AssertionError):  # the earlier tolerance
        close(graph(f, episode_norm="none", tol=1e-6), [0.0, 0.0, 0.0, 0.0], tol=0.1)
    # two loops (found by hypothesis): at tol 1e-10 the graph terms were still ±5e-4
    two = RolloutForest.from_columns(
        group=[0, 0], parent=[-1, 0], reward=[0.5, 0.5], terminal=[False, False]
    )
    close(graph(two, episode_norm="none"), [0.0, 0.0], tol=1e-7)
    with pytest.raises(AssertionError):
        close(graph(two, episode_norm="none", tol=1e-10), [0.0, 0.0], tol=1e-5)


def test_similarity_merges_nodes() -> None:
    # two episodes from s0 reach s1 / s2, whose texts are near-identical; from there one
    # ends with reward 1, the other with 0.  Exact keys: V(s1) = 1, V(s2) = 0, so the
    # second steps have δ = 0.  Merged (τ = 0.9): V(s12) = 0.5 -> δ = ±0.5 there.
    f = RolloutForest.from_columns(
        group=[0, 0, 0, 0],
        parent=[-1, 0, -1, 2],
        state=[0, 1, 0, 2],
        next_state=[1, 9, 2, 9],
        reward=[0, 1, 0, 0],
        observations=["start", "the door is open", "start", "the door is open."],
    )
    # γ = 0.5, λ = 0 (δ only). Exact: V(s0) = mean(0.5, 0) = 0.25 -> δ row0 0.25, row2 −0.25
    close(graph(f, gamma=0.5, lam=0.0, **RAW), [0.25, 0.0, -0.25, 0.0])
    # merged: V(s12) = 0.5, V(s0) = 0.25 -> δ row0 0 + 0.25 − 0.25 = 0 ; row1 0.5 ; row2 0 ;
    # row3 −0.5
    a = graph(f, gamma=0.5, lam=0.0, similarity_threshold=0.9, **RAW)
    close(a, [0.0, 0.5, 0.0, -0.5])


def test_bad_arguments() -> None:
    f = linear_group()
    for kw, msg in [
        ({"backup": "min"}, "backup must be one of"),
        ({"state_norm": "std"}, "state_norm must be one of"),
        ({"singleton": "one"}, "singleton must be one of"),
        ({"episode_norm": "grpo"}, "episode_norm must be one of"),
        ({"gamma": 1.5}, r"gamma must be in \[0, 1\]"),
        ({"lam": -0.1}, r"lam must be in \[0, 1\]"),
        ({"tol": 0.0}, "tol > 0"),
    ]:
        with pytest.raises(ValueError, match=msg):
            graph(f, **kw)
    assert graph(RolloutForest.from_columns(group=[], parent=[])).shape == (0,)


# ------------------------------------------------------------------------ properties
KNOBS = [
    {},
    {"backup": "max", "lam": 0.5, "gamma": 0.8},
    {"state_norm": "mean", "singleton": "raw", "episode_norm": "mean_norm", "omega": 0.5},
    {"similarity_threshold": 0.9, "lam": 1.0},
    {"state_norm": "none", "episode_norm": "none", "lam": 0.0},
]


@SETTINGS
@given(forests(), st.sampled_from(KNOBS))
def test_matches_loop_reference(forest: RolloutForest, knobs: dict) -> None:
    # credo at its default tol (float64's resolution); the loop reference to 1e-13
    a = compute_advantages("graph", forest, knobs)
    ref = torch.tensor(graph_reference(forest, **knobs, tol=1e-13), dtype=torch.float64)
    assert torch.isfinite(a).all()
    assert torch.allclose(a.double(), ref, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(forests(), st.integers(0, 10_000), st.sampled_from(KNOBS))
def test_row_order_does_not_matter(forest: RolloutForest, seed: int, knobs: dict) -> None:
    order = random_topological_order(forest, seed)
    a = graph(forest, **knobs)
    b = graph(permute_forest(forest, order), **knobs)
    assert torch.allclose(b, a[order], atol=1e-5)


@SETTINGS
@given(forests(max_groups=2), forests(max_groups=2), st.sampled_from(KNOBS))
def test_groups_do_not_interact(f1: RolloutForest, f2: RolloutForest, knobs: dict) -> None:
    f2 = relabel_groups(f2, 1000)
    both = RolloutForest.concat([f1, f2])
    expected = torch.cat([graph(f1, **knobs), graph(f2, **knobs)])
    assert torch.allclose(graph(both, **knobs), expected, atol=1e-5)


@SETTINGS
@given(forests(rewards=(0.0,)), st.sampled_from(KNOBS))
def test_equal_rewards_give_zero(forest: RolloutForest, knobs: dict) -> None:
    assert torch.equal(graph(forest, **knobs), torch.zeros(forest.num_rows))


@SETTINGS
@given(forests(max_episodes=1, max_len=1), st.sampled_from(KNOBS))
def test_singleton_groups_single_steps(forest: RolloutForest, knobs: dict) -> None:
    a = graph(forest, **knobs)
    assert torch.isfinite(a).all()
    # one row per group: V(s) = r (terminal) or 0 (truncated), so δ = 0 ; A^E = R (GRPO
    # singleton: μ = 0, σ = 1), or R for mean_norm, 0 for none
    norm = knobs.get("episode_norm", "mean_std_norm")
    expected = {"none": 0 * forest.reward, "mean_norm": forest.reward}.get(
        norm, forest.reward / (1 + 1e-6)
    )
    # (a self-loop s -> s converges only to within tol; δ is then ~1e-6, not 0)
    assert torch.allclose(a, expected, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(forests(), st.integers(2, 4))
def test_embedding_merge_is_the_exact_graph_of_the_merged_keys(
    forest: RolloutForest, classes: int
) -> None:
    # every key's vector is the unit vector of (key mod classes): keys of one class have
    # cosine 1, of two classes 0, so tau = 0.5 merges exactly the keys of a class, and
    # the advantages are those of the exact graph whose keys are the classes
    k = forest.state % classes
    forest.extras["state_embedding"] = torch.nn.functional.one_hot(k, classes).double()
    merged = graph(forest, similarity_threshold=0.5, similarity="embedding")
    # a next_state that is never a state of its group stays its own node: keep it apart
    seen = {(int(g), int(s)) for g, s in zip(forest.group, forest.state)}
    nxt = torch.tensor(
        [
            int(s) % classes if (int(g), int(s)) in seen else 1000 + int(s) % 10**6
            for g, s in zip(forest.group, forest.next_state)
        ],
        dtype=torch.long,
    )
    relabelled = RolloutForest.from_columns(
        group=forest.group,
        parent=forest.parent,
        state=k,
        next_state=nxt,
        reward=forest.reward,
        terminal=forest.terminal,
        success=forest.success,
    )
    torch.testing.assert_close(merged, graph(relabelled), atol=1e-6, rtol=0)


def test_embedding_merge_needs_the_run_to_embed() -> None:
    from credo.credit import estimator_needs

    assert estimator_needs("graph", {"similarity": "embedding"}) == {"state_embeddings"}
    assert estimator_needs("graph", {}) == set() and estimator_needs("grpo", {}) == set()
    with pytest.raises(ValueError, match="needs a similarity_threshold"):
        graph(RolloutForest.from_columns(group=[], parent=[]), similarity="embedding")
