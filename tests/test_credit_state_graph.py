"""Shared state-graph helpers: nodes, similarity clustering, Bellman values, path sums."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_forests import forests, permute_forest, random_topological_order, relabel_groups
from credo.credit.state_graph import (
    bellman_values,
    path_prefix_sum,
    state_nodes,
    suffix_discounted_sum,
    text_similarity,
)
from credo.data import RolloutForest
from credo.data.ops import compact_ids

SETTINGS = settings(max_examples=50, deadline=None)
INT64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 3))


@SETTINGS
@given(st.integers(1, 3).flatmap(lambda k: st.lists(st.tuples(*[INT64] * k), min_size=1)))
def test_compact_ids_follow_sorted_tuples(rows: list[tuple[int, ...]]) -> None:
    keys = [torch.tensor(col, dtype=torch.long) for col in zip(*rows)]
    ids, num = compact_ids(*keys)
    distinct = sorted(set(rows))
    assert num == len(distinct)
    assert ids.tolist() == [distinct.index(r) for r in rows]


@SETTINGS
@given(forests(), st.floats(0.0, 1.0))
def test_suffix_sum_of_rewards_is_discounted_return(forest: RolloutForest, gamma: float) -> None:
    got = suffix_discounted_sum(forest.reward, forest, gamma)
    assert torch.allclose(got, forest.discounted_returns(gamma), atol=1e-9)


@SETTINGS
@given(forests())
def test_prefix_sum_of_ones_is_depth_plus_one(forest: RolloutForest) -> None:
    ones = torch.ones(forest.num_rows)
    assert torch.equal(path_prefix_sum(ones, forest), (forest.t + 1).double())


def test_prefix_and_suffix_on_a_tree() -> None:
    # row 0 -> rows 1, 2 ; row 1 -> row 3.  x = 1, 2, 3, 4
    f = RolloutForest.from_columns(group=[0] * 4, parent=[-1, 0, 0, 1])
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # prefix: 1, 1+2, 1+3, 1+2+4
    assert path_prefix_sum(x, f).tolist() == [1.0, 3.0, 4.0, 7.0]
    # suffix with factor 0.5: row3 4 ; row1 2 + 0.5·4 = 4 ; row2 3 ; row0 1 + 0.5·mean(4, 3)
    assert suffix_discounted_sum(x, f, 0.5).tolist() == [2.75, 4.0, 3.0, 4.0]


def test_text_similarity() -> None:
    # SequenceMatcher ratio = 2·matches / total length = 2·16 / 33
    assert text_similarity("the door is open", "the door is open.") == pytest.approx(32 / 33)
    assert text_similarity("abc", "abc") == 1.0


def test_greedy_clustering_compares_with_the_first_member() -> None:
    # sorted texts: a10 = "aaaaaaaaaa" < b1 = "aaaaaaaaab" < b2 = "aaaaaaaabb"
    # ratio(b1, a10) = 2·9/20 = 0.9 -> joins a10's cluster ; ratio(b2, a10) = 0.8 < 0.9
    # -> new cluster, although ratio(b2, b1) = 0.9: members are compared with the
    # representative only. Group 1 has the same texts but its own nodes.
    texts = ["aaaaaaaabb", "aaaaaaaaaa", "aaaaaaaaab"]
    f = RolloutForest.from_columns(
        group=[0, 0, 0, 1, 1, 1],
        parent=[-1] * 6,
        state=[3, 1, 2, 3, 1, 2],
        next_state=[7] * 6,
        observations=texts + texts,
    )
    src = state_nodes(f, similarity_threshold=0.9).src.tolist()
    assert src[1] == src[2] != src[0]
    assert src[4] == src[5] != src[3]
    assert len(set(src[:3]) & set(src[3:])) == 0


@SETTINGS
@given(forests(), st.randoms(use_true_random=False))
def test_similarity_nodes_do_not_depend_on_row_order(forest: RolloutForest, rnd) -> None:
    order = random_topological_order(forest, rnd.randint(0, 10_000))
    a = state_nodes(forest, similarity_threshold=0.9)
    b = state_nodes(permute_forest(forest, order), similarity_threshold=0.9)
    # node ids follow sorted keys, so they are equal, not just the same partition
    assert torch.equal(b.src, a.src[order]) and torch.equal(b.dst, a.dst[order])


@SETTINGS
@given(forests(max_groups=4), st.integers(1, 8), st.sampled_from(["mean", "max"]))
def test_bellman_blocks_give_the_same_values(
    forest: RolloutForest, block_edges: int, backup: str
) -> None:
    # cutting the graph into blocks of a few edges (never through a group) changes nothing
    nodes = state_nodes(forest)
    args = (nodes.src, nodes.dst, forest.reward, forest.terminal, nodes.num_nodes)
    kw = {"gamma": 0.9, "backup": backup, "tol": 1e-3}
    whole = bellman_values(*args, **kw)
    blocks = bellman_values(*args, block_edges=block_edges, **kw)
    assert torch.equal(blocks, whole)


@SETTINGS
@given(
    forests(max_groups=2),
    forests(max_groups=2),
    st.sampled_from(["mean", "max"]),
    st.sampled_from([1e-2, 1e-6]),
)
def test_bellman_values_of_a_group_do_not_depend_on_the_batch(
    f1: RolloutForest, f2: RolloutForest, backup: str, tol: float
) -> None:
    # each connected part of the graph is iterated to its own tolerance, so a group's
    # values are the same, to the bit, alone or beside others, whatever the tolerance
    both = RolloutForest.concat([f1, relabel_groups(f2, 1000)])

    def values(f: RolloutForest) -> torch.Tensor:
        nodes = state_nodes(f)
        v = bellman_values(
            nodes.src,
            nodes.dst,
            f.reward,
            f.terminal,
            nodes.num_nodes,
            gamma=0.9,
            backup=backup,
            tol=tol,
        )
        return v[nodes.src]

    assert torch.equal(values(both)[: f1.num_rows], values(f1))


def test_bellman_warns_when_not_converged() -> None:
    # a rewarded self-loop with γ = 1 grows forever
    one = torch.tensor([0])
    with pytest.warns(RuntimeWarning, match="did not converge|stopped after"):
        v = bellman_values(
            one, one, torch.tensor([1.0]), torch.tensor([False]), 1, gamma=1.0, max_iters=50
        )
    assert v.tolist() == [50.0]
    # γ = 0.5: V = 1 + 0.5 V -> 2
    v = bellman_values(
        one, one, torch.tensor([1.0]), torch.tensor([False]), 1, gamma=0.5, tol=1e-12
    )
    assert v.item() == pytest.approx(2.0, abs=1e-10)


def test_embedding_merge_by_cosine_with_the_first_member() -> None:
    # group 0: keys 1, 2, 3 with mean vectors e1 = (1, 0), e2 = (0.8, 0.6) (two rows,
    # (1, 0) and (0.6, 1.2)), e3 = (0.6, 0.8). Visited in key order: 1 starts a cluster;
    # cos(e2, e1) = 0.8 >= 0.75 joins it; cos(e3, e1) = 0.6 < 0.75 starts another,
    # although cos(e3, e2) = 0.96. Group 1 has key 1 with e1 too: its own node.
    f = RolloutForest.from_columns(
        group=[0, 0, 0, 0, 1],
        parent=[-1] * 5,
        state=[3, 1, 2, 2, 1],
        next_state=[9] * 5,
        extras={"state_embedding": [[0.6, 0.8], [1, 0], [1, 0], [0.6, 1.2], [1, 0]]},
    )
    src = state_nodes(f, similarity_threshold=0.75, similarity="embedding").src.tolist()
    assert src[1] == src[2] == src[3] != src[0]
    assert src[4] not in src[:4]
    # tau 0.97: nothing merges (0.96 < 0.97); tau 0.5: all of group 0 merges
    exact = state_nodes(f).src.tolist()
    tight = state_nodes(f, similarity_threshold=0.97, similarity="embedding").src.tolist()
    loose = state_nodes(f, similarity_threshold=0.5, similarity="embedding").src.tolist()
    assert tight == exact and len(set(loose[:4])) == 1
    with pytest.raises(ValueError, match="needs a similarity_threshold"):
        state_nodes(f, similarity="embedding")
    with pytest.raises(ValueError, match="similarity must be one of"):
        state_nodes(f, similarity_threshold=0.5, similarity="cosine")
    bare = RolloutForest.from_columns(group=[0], parent=[-1], state=[1], next_state=[2])
    with pytest.raises(ValueError, match="this forest has none"):
        state_nodes(bare, similarity_threshold=0.5, similarity="embedding")


@SETTINGS
@given(forests(), st.randoms(use_true_random=False))
def test_embedding_nodes_do_not_depend_on_row_order(forest: RolloutForest, rnd) -> None:
    # one vector per key (its hash spread over 3 coordinates): equal keys, equal vectors
    keys = forest.state
    emb = torch.stack([(keys % 5).double(), (keys % 7).double(), torch.ones_like(keys).double()], 1)
    forest.extras["state_embedding"] = emb
    order = random_topological_order(forest, rnd.randint(0, 10_000))
    a = state_nodes(forest, similarity_threshold=0.9, similarity="embedding")
    b = state_nodes(permute_forest(forest, order), similarity_threshold=0.9, similarity="embedding")
    assert torch.equal(b.src, a.src[order]) and torch.equal(b.dst, a.dst[order])
