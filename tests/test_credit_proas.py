"""ProAS: hand-worked examples, ablation switches, the progress graph, properties."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_forests_b import forests, group_rows, reorder, topological_shuffle
from credit_reference_b import proas_reference
from credo.credit import compute_advantages, estimator_state_factory, validate_estimator
from credo.credit.grpo import episode_group_advantage, grpo
from credo.credit.proas import (
    ProgressGraph,
    action_type,
    generic_states,
    proas,
    progress_labels,
)
from credo.data import RolloutForest
from credo.data.ops import hash_key

R2 = 1 / math.sqrt(2)  # GRPO advantage of a two-episode group with one success: ±0.70711


def close(actual: torch.Tensor, expected: list[float], atol: float = 1e-5) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0
    )


def chain(group: int, steps: list[tuple[int, int]], *, reward: float, success: bool) -> dict:
    """Columns of one linear episode with transitions ``steps`` (reward on the last row)."""
    n = len(steps)
    return dict(
        group=[group] * n,
        parent=[-1, *range(n - 1)],
        state=[a for a, _ in steps],
        next_state=[b for _, b in steps],
        reward=[0.0] * (n - 1) + [reward],
        success=[False] * (n - 1) + [success],
    )


def build(*episodes: dict, **extra: list) -> RolloutForest:
    """Concatenate chains (parents shifted) into one forest."""
    cols: dict[str, list] = {k: [] for k in episodes[0]}
    for e in episodes:
        offset = len(cols["group"])
        for k, v in e.items():
            cols[k] += [p + offset if p >= 0 else p for p in v] if k == "parent" else v
    cols.update(extra)
    return RolloutForest.from_columns(**cols)


def shop_graph(**kwargs: float) -> ProgressGraph:
    """G from one demonstration 1 → 2 → 3 → 4 (goal): d(1)=3, d(2)=2, d(3)=1, d(4)=0."""
    g = ProgressGraph(**kwargs)
    g.add_episodes(build(chain(0, [(1, 2), (2, 3), (3, 4)], reward=1.0, success=True)))
    return g


# Example 1: a linear group. E0 succeeds with a self-loop detour, E1 fails off-track.
#   E0: 1→2, 2→2, 2→3, 3→4 (R = 1)     E1: 1→2, 2→5, 5→5, 5→2 (R = 0)
LINEAR = build(
    chain(0, [(1, 2), (2, 2), (2, 3), (3, 4)], reward=1.0, success=True),
    chain(0, [(1, 2), (2, 5), (5, 5), (5, 2)], reward=0.0, success=False),
)


def test_linear_group_future_drift() -> None:
    # GRPO on R = (1, 0): A = ±0.5/std, std = 0.70711 → ±0.70711.
    # E0 (A > 0): 2→2 is not an edge of G → masked: (a, 0, a, a).
    # E1 (A < 0): 1→2 is reasonable → masked; the other three are unmasked (N_u = 3).
    #   progress: 1→2 yes (3 → 2), 2→5 no (2 → ∞), 5→5 no (∞ → ∞), 5→2 yes (∞ → 2)
    #   drift (non-progress steps in the suffix): (2, 2, 1, 0); unmasked Σ = 2+1+0 = 3
    #   A_t = A·3·drift/3 = A·drift: (0, 2A, A, 0) = (0, −1.41421, −0.70711, 0)
    adv = proas(LINEAR, state=shop_graph())
    close(adv, [R2, 0, R2, R2, 0, -2 * R2, -R2, 0])
    # total penalty kept: Σ over E1 = A·N_u = −0.70711·3
    assert float(adv[4:].sum()) == pytest.approx(-3 * R2, abs=1e-5)


def test_linear_group_ablations() -> None:
    # suffix_length: drift = T − t = (4, 3, 2, 1); unmasked Σ = 3+2+1 = 6
    #   A_t = A·3·d/6: (0, 1.5A, A, 0.5A)
    close(
        proas(LINEAR, state=shop_graph(), redistribute="suffix_length"),
        [R2, 0, R2, R2, 0, -1.5 * R2, -R2, -0.5 * R2],
    )
    # none (mask only): every unmasked step keeps A
    close(proas(LINEAR, state=shop_graph(), redistribute="none"), [R2, 0, R2, R2, 0, -R2, -R2, -R2])
    # mask_negative off: N_u = 4, drift (2, 2, 1, 0), Σ = 5 → A·4·d/5 = (1.6A, 1.6A, 0.8A, 0)
    close(
        proas(LINEAR, state=shop_graph(), mask_negative=False),
        [R2, 0, R2, R2, -1.6 * R2, -1.6 * R2, -0.8 * R2, 0],
    )
    # mask_positive off: E0 is not masked
    close(
        proas(LINEAR, state=shop_graph(), mask_positive=False),
        [R2, R2, R2, R2, 0, -2 * R2, -R2, 0],
    )
    # both masks off, no redistribution: plain GRPO
    close(
        proas(
            LINEAR,
            state=shop_graph(),
            mask_positive=False,
            mask_negative=False,
            redistribute="none",
        ),
        grpo(LINEAR).tolist(),
    )


def test_spare_progress_penalises_wandering() -> None:
    # G: 1→2→3→4 (goal), d = (3, 2, 1, 0). E1 (A < 0) wanders along valid edges:
    #   E0: 1→2, 2→3, 3→4 (R = 1)        E1: 1→2, 2→3, 3→2, 2→3 (R = 0)
    # First add 3→2 (back-tracking) to G, as a success that went back once would.
    g = shop_graph()
    g.add_episodes(
        build(chain(0, [(1, 2), (2, 3), (3, 2), (2, 3), (3, 4)], reward=1, success=True))
    )
    f = build(
        chain(0, [(1, 2), (2, 3), (3, 4)], reward=1.0, success=True),
        chain(0, [(1, 2), (2, 3), (3, 2), (2, 3)], reward=0.0, success=False),
    )
    # spare="reasonable": every step of E1 is an edge of G → all spared, E1 gets 0.
    close(proas(f, state=copy(g)), [R2, R2, R2, 0, 0, 0, 0])
    # spare="progress": progress of E1 = (yes 3→2, yes 2→1, no 1→2, yes 2→1)
    #   spared: rows 0, 1, 3; unmasked: row 2 only (N_u = 1), drift(2) = 1 → A·1·1/1 = A
    close(proas(f, state=copy(g), spare="progress"), [R2, R2, R2, 0, 0, -R2, 0])


def test_reward_shaping_ablation() -> None:
    # r'_t = r_t + 0.1·([progress] − [not reasonable]):
    #   E0: 1→2 +0.1, 2→2 −0.1 (no progress, not an edge), 2→3 +0.1, 3→4 +0.1 → R' = 1.2
    #   E1: 1→2 +0.1, 2→5 −0.1, 5→5 −0.1, 5→2 +0.1−0.1 = 0 → R' = −0.1
    # Dr.GRPO (no std): mean 0.55 → A = ±0.65 on every row (0.5 without shaping)
    adv = proas(LINEAR, state=shop_graph(), shaping="reward", norm_by_std=False)
    close(adv, [0.65] * 4 + [-0.65] * 4)
    close(
        proas(LINEAR, state=shop_graph(), shaping="reward", norm_by_std=False, reward_coef=0.0),
        [0.5] * 4 + [-0.5] * 4,
    )


def test_tree_shared_prefix() -> None:
    # Tree: row0 1→2 is shared; E0 = (0, 1: 2→3, 2: 3→4) succeeds, E1 = (0, 3: 2→5, 4: 5→5).
    # A = ±0.70711. Row 0: E0 gives a (reasonable), E1 masks it (reasonable, A < 0) → a/2.
    # E1: unmasked rows 3, 4 (N_u = 2); progress (yes, no, no) → drift (2, 2, 1);
    #   unmasked Σ = 3 → A·2·(2, 1)/3 = (4A/3, 2A/3) = (−0.94281, −0.47140)
    forest = RolloutForest.from_columns(
        group=[0] * 5,
        parent=[-1, 0, 1, 0, 3],
        state=[1, 2, 3, 2, 5],
        next_state=[2, 3, 4, 5, 5],
        reward=[0, 0, 1, 0, 0],
        success=[False, False, True, False, False],
    )
    close(proas(forest, state=shop_graph()), [R2 / 2, R2, R2, -4 * R2 / 3, -2 * R2 / 3])


def test_graph_with_cycle_and_abstract_states() -> None:
    # G: 1→2, 2→1 (a cycle), 2→3, 3→4; goal 4 → d = (1: 3, 2: 2, 3: 1, 4: 0).
    # Abstract states come from extras (the raw state columns are all 0 and ignored).
    g = ProgressGraph()
    g.add_episodes(
        build(chain(0, [(1, 2), (2, 1), (1, 2), (2, 3), (3, 4)], reward=1, success=True))
    )
    assert g.num_edges == 4
    # E0 success 1→2→3→4; E1 fails oscillating 1→2→1→2→1 (every step an edge of G);
    # E2 fails 1→3 (shortcut, not an edge, progress 3 → 1), 3→7 (7 unknown), 7→7.
    e0 = chain(0, [(1, 2), (2, 3), (3, 4)], reward=1, success=True)
    e1 = chain(0, [(1, 2), (2, 1), (1, 2), (2, 1)], reward=0, success=False)
    e2 = chain(0, [(1, 3), (3, 7), (7, 7)], reward=0, success=False)
    cols = build(e0, e1, e2)
    forest = RolloutForest.from_columns(
        group=cols.group,
        parent=cols.parent,
        reward=cols.reward,
        success=cols.success,
        extras={"abstract_state": cols.state, "abstract_next_state": cols.next_state},
    )
    # GRPO on (1, 0, 0): mean 1/3, std √(1/3) = 0.57735 → A = (1.15470, −0.57735, −0.57735)
    a0, a1 = (2 / 3) / math.sqrt(1 / 3), -(1 / 3) / math.sqrt(1 / 3)
    # E0: all reasonable → a0. E1: all reasonable and A < 0 → all masked → 0 (N_u = 0).
    # E2: nothing reasonable (N_u = 3); progress (yes, no, no) → drift (2, 2, 1), Σ = 5
    #   A·3·d/5 = (1.2A, 1.2A, 0.6A) = (−0.69282, −0.69282, −0.34641)
    adv = proas(forest, state=g)
    close(adv, [a0] * 3 + [0.0] * 4 + [1.2 * a1, 1.2 * a1, 0.6 * a1])


def test_uniform_when_no_drift() -> None:
    # A failed single step 1→3: not an edge (unmasked), progress 1 → 3 → drift 0.
    # No unmasked step with drift > 0 → uniform: A_t = A (not 0/0).
    forest = build(
        chain(0, [(1, 2), (2, 3), (3, 4)], reward=1, success=True),
        chain(0, [(1, 3)], reward=0, success=False),
    )
    close(proas(forest, state=shop_graph()), [R2, R2, R2, -R2])


def test_empty_graph_is_plain_grpo_and_then_learns() -> None:
    g = ProgressGraph()
    # Empty G: nothing is reasonable yet → shaping is off: plain GRPO, and G learns E0.
    close(proas(LINEAR, state=g), grpo(LINEAR).tolist())
    assert g.num_edges == 3 and g.num_updates == 1  # 1→2, 2→3, 3→4 (2→2 self-loop skipped)
    # Second call: G = the first batch's success → the same result as the seeded graph.
    close(proas(LINEAR, state=g), proas(LINEAR, state=shop_graph()).tolist())
    # No state at all: a fresh empty graph each call → GRPO.
    close(proas(LINEAR), grpo(LINEAR).tolist())


def test_min_graph_edges_threshold() -> None:
    # shop_graph has 3 edges: with min_graph_edges=4 shaping is off (GRPO), with 3 on.
    close(proas(LINEAR, state=shop_graph(), min_graph_edges=4), grpo(LINEAR).tolist())
    close(proas(LINEAR, state=shop_graph(), min_graph_edges=3), [R2, 0, R2, R2, 0, -2 * R2, -R2, 0])


def test_update_first() -> None:
    # E0 succeeds through 2→6, 6→4 (new edges). Labelled before the merge (default) these
    # steps are unreasonable → (a, 0, 0); merged first, they are edges → (a, a, a).
    forest = build(
        chain(0, [(1, 2), (2, 6), (6, 4)], reward=1, success=True),
        chain(0, [(1, 5)], reward=0, success=False),
    )
    # E1 (1→5): unreasonable, no progress (3 → ∞) → drift 1 → A (uniform over one step)
    close(proas(forest, state=shop_graph()), [R2, 0, 0, -R2])
    close(proas(forest, state=shop_graph(), update_first=True), [R2, R2, R2, -R2])


def test_action_type_match() -> None:
    assert action_type("search[red shoes]") == "search"
    assert action_type("Click[Buy Now]") == "click"
    assert action_type("look") == "look"
    assert action_type("go to cabinet 1") == "go"
    assert action_type("  ") == ""
    # G seeded with "search[shoes]" from state 1 (1→2). A step "search[hats]" 1→9 is not an
    # edge, but its action type was seen from state 1 → reasonable with edge_or_action.
    demo = build(
        chain(0, [(1, 2), (2, 4)], reward=1, success=True), actions=["search[shoes]", "click[buy]"]
    )
    g = ProgressGraph()
    g.add_episodes(demo)
    forest = build(
        chain(0, [(1, 9), (9, 9)], reward=0, success=False), actions=["search[hats]", "look"]
    )
    reasonable, progress = progress_labels(forest, g, match="edge")
    assert reasonable.tolist() == [False, False] and progress.tolist() == [False, False]
    reasonable, _ = progress_labels(forest, g, match="edge_or_action")
    assert reasonable.tolist() == [True, False]
    with pytest.raises(ValueError, match="needs the action texts"):
        progress_labels(LINEAR, g, match="edge_or_action")


# ------------------------------------------------------------------- the graph itself
def test_graph_counts_goals_and_distances() -> None:
    g = shop_graph()
    sd = g.state_dict()
    assert sd["edges"] == [[1, 2, 1.0], [2, 3, 1.0], [3, 4, 1.0]]
    assert sd["goals"] == [[4, 1.0]]
    d = g.distance(torch.tensor([1, 2, 3, 4, 99]))
    assert d.tolist() == [3.0, 2.0, 1.0, 0.0, math.inf]
    # update merges successes only: LINEAR's E0 adds 1→2, 2→3, 3→4 again, goal 4 again;
    # E1 (failed) adds nothing; the self-loop 2→2 is skipped.
    g.update(LINEAR)
    assert g.state_dict()["edges"] == [[1, 2, 2.0], [2, 3, 2.0], [3, 4, 2.0]]
    assert g.state_dict()["goals"] == [[4, 2.0]]
    # include_self_loops=True keeps 2→2
    g2 = ProgressGraph(include_self_loops=True)
    g2.update(LINEAR)
    assert [e[:2] for e in g2.state_dict()["edges"]] == [[1, 2], [2, 2], [2, 3], [3, 4]]
    # add_episodes(only_successful=False) merges the failure too (2→5, 5→2; 5→5 skipped),
    # but goals come from successes only
    g3 = ProgressGraph()
    g3.add_episodes(LINEAR, only_successful=False)
    assert [e[:2] for e in g3.state_dict()["edges"]] == [[1, 2], [2, 3], [2, 5], [3, 4], [5, 2]]
    assert g3.state_dict()["edges"][0][2] == 2.0 and g3.state_dict()["goals"] == [[4, 1.0]]


def test_invalid_steps_are_not_merged() -> None:
    forest = build(chain(0, [(1, 2), (2, 3)], reward=1, success=True), valid=[True, False])
    g = ProgressGraph()
    g.update(forest)
    assert [e[:2] for e in g.state_dict()["edges"]] == [[1, 2]]
    g = ProgressGraph(include_invalid=True)
    g.update(forest)
    assert [e[:2] for e in g.state_dict()["edges"]] == [[1, 2], [2, 3]]


def test_decay_forgets() -> None:
    # decay 0.5, min_count 0.3: a count of 1 → 0.5 → 0.25 (< 0.3: forgotten).
    g = ProgressGraph(decay=0.5, min_count=0.3)
    g.update(build(chain(0, [(1, 2)], reward=1, success=True)))
    nothing = build(chain(0, [(7, 8)], reward=0, success=False))
    g.update(nothing)
    assert g.state_dict()["edges"] == [[1, 2, 0.5]] and g.state_dict()["goals"] == [[2, 0.5]]
    g.update(nothing)
    assert g.num_edges == 0 and g.num_goals == 0 and g.num_updates == 3


def test_decay_and_pruning_change_the_result() -> None:
    # G = shop_graph + a success 5→2, 2→3, 3→4: edge 5→2 seen once; d(5) = 3.
    def graph(decay: float) -> ProgressGraph:
        g = shop_graph(decay=decay, min_count=0.6)
        g.add_episodes(build(chain(0, [(5, 2), (2, 3), (3, 4)], reward=1, success=True)))
        return g

    # Call 1, E1 = 1→2, 2→5, 5→5, 5→2: steps 0 and 3 are edges → masked; N_u = 2.
    #   progress (yes, no, no, yes: 3 → 2) → drift (2, 2, 1, 0); unmasked Σ = 3
    #   → A·2·(2, 1)/3 = (4A/3, 2A/3) on steps 1, 2
    first = [R2, 0, R2, R2, 0, -4 * R2 / 3, -2 * R2 / 3, 0]
    # The update after call 1 decays 5→2 to 0.5 < min_count 0.6 (the others are seen
    # again in E0) → forgotten; call 2 labels 5→2 unreasonable: the default example's
    # (0, 2A, A, 0). Without decay, call 2 repeats call 1.
    g = graph(0.5)
    close(proas(LINEAR, state=g), first)
    close(proas(LINEAR, state=g), [R2, 0, R2, R2, 0, -2 * R2, -R2, 0])
    g = graph(1.0)
    close(proas(LINEAR, state=g), first)
    close(proas(LINEAR, state=g), first)
    # Pruning 90 % of shop_graph's 3 edges removes round(2.7) = 3: G is empty → GRPO.
    h = shop_graph(prune_frac=0.9)
    close(proas(LINEAR, state=h), grpo(LINEAR).tolist())
    assert h.pruned and h.num_goals == 1


def test_state_dict_round_trip() -> None:
    g = ProgressGraph(decay=0.9)
    demo = build(
        chain(0, [(1, 2), (2, 3), (3, 4)], reward=1, success=True),
        actions=["search[a]", "click[b]", "buy"],
    )
    g.add_episodes(demo)
    g.update(demo)
    big = 2**62 + 12345  # hashed keys are full int64
    g.add_episodes(build(chain(0, [(big, -big)], reward=1, success=True), actions=["look"]))
    g.pruned = True
    text = json.dumps(g.state_dict())
    g2 = ProgressGraph(decay=0.9)
    g2.load_state_dict(json.loads(text))
    assert g2.state_dict() == g.state_dict()
    assert json.dumps(g2.state_dict()) == text
    assert g2.pruned and g2.num_updates == 1
    keys = torch.tensor([1, 2, 3, 4, big, -big])
    assert torch.equal(g2.distance(keys), g.distance(keys))
    assert g.state_dict()["edges"][0][2] == pytest.approx(1.9)  # 1·0.9 + 1
    close(proas(LINEAR, state=g2, frozen=True), proas(LINEAR, state=g, frozen=True).tolist())
    with pytest.raises(ValueError, match="not a ProgressGraph state"):
        g2.load_state_dict({"edges": []})


def test_frozen_graph_does_not_change() -> None:
    g = shop_graph()
    before = g.state_dict()
    proas(LINEAR, state=g, frozen=True)
    proas(LINEAR, state=g, frozen=True, update_first=True)
    assert g.state_dict() == before
    proas(LINEAR, state=g)
    assert g.state_dict() != before and g.num_updates == 1


def test_prune_fraction_is_deterministic() -> None:
    g = ProgressGraph()
    # ten edges i → i+1 (i = 0..9) and ten (state, action type) pairs (one per state)
    texts = ["a[x]", "b[x]", "c[x]", "d[x]", "e[x]", "a", "b", "c", "d", "e"]
    g.add_episodes(
        build(chain(0, [(i, i + 1) for i in range(10)], reward=1, success=True), actions=texts)
    )
    assert g.num_edges == 10 and g.num_action_edges == 10
    edges = {tuple(e[:2]) for e in g.state_dict()["edges"]}

    def pruned(seed: int) -> set:
        h = ProgressGraph()
        h.load_state_dict(g.state_dict())
        h.prune(0.4, seed=seed)
        assert h.num_edges == 6 and h.num_action_edges == 6 and h.num_goals == 1  # 10 − round(4.0)
        return {tuple(e[:2]) for e in h.state_dict()["edges"]}

    a, b = pruned(3), pruned(3)
    assert a == b and a < edges
    assert any(pruned(s) != a for s in range(4, 10))  # another seed, another subset
    # The "G pruned 40 %" ablation: the seeded graph is pruned once, at first use.
    h = ProgressGraph(prune_frac=0.4, prune_seed=3)
    h.load_state_dict(g.state_dict())
    h.pruned = False
    proas(LINEAR, state=h, frozen=True)
    assert {tuple(e[:2]) for e in h.state_dict()["edges"]} == a
    proas(LINEAR, state=h, frozen=True)
    assert h.num_edges == 6  # not pruned twice


def test_registry_and_errors() -> None:
    assert estimator_state_factory("proas") is ProgressGraph
    validate_estimator("proas", {"redistribute": "none", "frozen": True})
    g = shop_graph()
    adv = compute_advantages("proas", LINEAR, {"redistribute": "none"}, state=g)
    close(adv, [R2, 0, R2, R2, 0, -R2, -R2, -R2])
    for bad in (
        {"shaping": "both"},
        {"redistribute": "drift"},
        {"match": "verb"},
        {"spare": "valid"},
        {"min_graph_edges": -1},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            proas(LINEAR, **bad)
    empty = RolloutForest.from_columns(group=[], parent=[])
    assert proas(empty, state=g).shape == (0,) and g.num_updates == 2
    with pytest.raises(TypeError, match="ProgressGraph"):
        proas(LINEAR, state={"edges": []})
    with pytest.raises(ValueError, match="both 'abstract_state' and 'abstract_next_state'"):
        proas(RolloutForest.from_columns(group=[0], parent=[-1], extras={"abstract_state": [1]}))
    with pytest.raises(ValueError, match="int64"):
        proas(
            RolloutForest.from_columns(
                group=[0],
                parent=[-1],
                extras={"abstract_state": [1.5], "abstract_next_state": [2.5]},
            )
        )
    for kwargs in ({"decay": 0.0}, {"min_count": -1.0}, {"prune_frac": 1.0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            ProgressGraph(**kwargs)


# ----------------------------------------------------------------------- properties
KNOBS = st.fixed_dictionaries(
    {
        "shaping": st.sampled_from(["advantage", "reward"]),
        "redistribute": st.sampled_from(["future_drift", "suffix_length", "none"]),
        "match": st.sampled_from(["edge", "edge_or_action"]),
        "spare": st.sampled_from(["reasonable", "progress"]),
        "mask_positive": st.booleans(),
        "mask_negative": st.booleans(),
        "norm_by_std": st.booleans(),
        "update_first": st.booleans(),
        "min_graph_edges": st.integers(0, 3),
    }
)


def seeded(seed: RolloutForest, decay: float = 1.0) -> ProgressGraph:
    g = ProgressGraph(decay=decay, min_count=0.3)
    g.add_episodes(seed, only_successful=False)
    return g


def same_graph(g: ProgressGraph, h: ProgressGraph) -> None:
    """Same keys, flags and (up to float rounding) counts."""
    a, b = g.state_dict(), h.state_dict()
    for name in ("edges", "action_edges", "goals"):
        assert [r[:-1] for r in a[name]] == [r[:-1] for r in b[name]]
        assert [r[-1] for r in a[name]] == pytest.approx([r[-1] for r in b[name]])
    assert (a["num_updates"], a["pruned"]) == (b["num_updates"], b["pruned"])


def copy(g: ProgressGraph) -> ProgressGraph:
    h = ProgressGraph(decay=g.decay, min_count=g.min_count)
    h.load_state_dict(g.state_dict())
    return h


@settings(max_examples=80, deadline=None)
@given(forests(), forests(min_rows=1), KNOBS, st.sampled_from([1.0, 0.5]))
def test_matches_loop_reference(
    seed: RolloutForest, forest: RolloutForest, knobs: dict, decay: float
) -> None:
    g = seeded(seed, decay)
    h = copy(g)
    adv = proas(forest, state=g, **knobs)
    ref = proas_reference(forest, state=h, **knobs)
    torch.testing.assert_close(adv, ref, atol=1e-5, rtol=1e-5)
    same_graph(g, h)
    assert bool(torch.isfinite(adv).all())


@settings(max_examples=50, deadline=None)
@given(forests(), forests(min_rows=1), KNOBS, st.randoms(use_true_random=False))
def test_row_order_independent(
    seed: RolloutForest, forest: RolloutForest, knobs: dict, rnd: random.Random
) -> None:
    order = topological_shuffle(forest, rnd)
    g, h = seeded(seed), seeded(seed)
    adv = proas(forest, state=g, **knobs)
    adv_perm = proas(reorder(forest, order), state=h, **knobs)
    torch.testing.assert_close(adv_perm, adv[order], atol=1e-5, rtol=1e-5)
    same_graph(g, h)


@settings(max_examples=50, deadline=None)
@given(forests(), forests(min_rows=1), KNOBS)
def test_groups_independent(seed: RolloutForest, forest: RolloutForest, knobs: dict) -> None:
    knobs = {**knobs, "update_first": False}  # labels then come from the same prior graph
    adv = proas(forest, state=seeded(seed), **knobs)
    for gid in forest.group.unique().tolist():
        rows = group_rows(forest, gid)
        alone = proas(forest.select(rows), state=seeded(seed), **knobs)
        torch.testing.assert_close(alone, adv[rows], atol=1e-5, rtol=1e-5)


@settings(max_examples=50, deadline=None)
@given(forests(), forests(min_rows=1), KNOBS)
def test_equal_returns_give_zero(seed: RolloutForest, forest: RolloutForest, knobs: dict) -> None:
    forest.reward.fill_(0.0)
    forest.reward[forest.is_leaf()] = 1.0  # every episode returns 1
    knobs = {**knobs, "shaping": "advantage"}
    adv = proas(forest, state=seeded(seed), **knobs)
    # GRPO's singleton rule gives a group of one episode A = R; every other group: 0
    ep = forest.episodes()
    episodes_in_group = (ep.group[:, None] == forest.group[None, :]).sum(0)
    assert torch.equal(adv[episodes_in_group > 1], torch.zeros_like(adv[episodes_in_group > 1]))


@settings(max_examples=50, deadline=None)
@given(forests(min_rows=1, max_groups=6, max_rows=8), KNOBS)
def test_singletons_and_single_steps_finite(forest: RolloutForest, knobs: dict) -> None:
    # one root per group, no children: singleton groups of single-step episodes
    single = RolloutForest.from_columns(
        group=list(range(forest.num_rows)),
        parent=[-1] * forest.num_rows,
        state=forest.state,
        next_state=forest.next_state,
        reward=forest.reward,
        success=forest.success,
        actions=forest.actions,
    )
    g = seeded(forest)
    for f in (forest, single):
        adv = proas(f, state=g, **knobs)
        assert adv.shape == (f.num_rows,) and bool(torch.isfinite(adv).all())


@settings(max_examples=50, deadline=None)
@given(forests(), forests(min_rows=1, linear=True), KNOBS)
def test_negative_episode_keeps_total_penalty(
    seed: RolloutForest, forest: RolloutForest, knobs: dict
) -> None:
    # On chains (one episode per row): Σ_t A_t over an episode with A < 0 is A·N_unmasked,
    # whatever the redistribution (future drift, suffix length, uniform fallback, none).
    knobs = {**knobs, "shaping": "advantage", "update_first": False, "min_graph_edges": 0}
    g = seeded(seed)
    reasonable, progress = progress_labels(forest, g, match=knobs["match"])
    if knobs["spare"] == "progress":
        reasonable = reasonable & progress
    adv = proas(forest, state=g, **knobs).double()
    ep = forest.episodes()
    base = episode_group_advantage(ep.ret, ep.group, norm_by_std=knobs["norm_by_std"])
    for e in range(ep.num_episodes):
        if base[e] < 0:
            path = ep.path(e)
            n_unmasked = int((~reasonable[path]).sum()) if knobs["mask_negative"] else path.numel()
            assert float(adv[path].sum()) == pytest.approx(float(base[e]) * n_unmasked, abs=1e-4)


# ------------------------------------------------------- env-agnostic abstract states
def test_generic_states_read_only_the_verbs_of_accepted_actions() -> None:
    # E0 succeeds: search, click, buy. E1 fails: search, an action the env rejected,
    # click on another item, back. The env's own states (9s) are ignored.
    #   E0 states: start→search, search→click, click→buy
    #   E1 states: start→search, search→search (rejected), search→click, click→back
    forest = build(
        chain(0, [(9, 9)] * 3, reward=1.0, success=True),
        chain(0, [(9, 9)] * 4, reward=0.0, success=False),
        actions=["search[red hat]", "click[2]", "buy", "search[hat]", "dance", "click[1]", "back"],
        valid=[True, True, True, True, False, True, True],
    )
    s, s2 = generic_states(forest)
    h = {name: hash_key(name) for name in ("start", "search", "click", "buy", "back")}
    assert s.tolist() == [
        h[k] for k in ("start", "search", "click", "start", "search", "search", "click")
    ]
    assert s2.tolist() == [
        h[k] for k in ("search", "click", "buy", "search", "search", "click", "back")
    ]
    # G from E0 (generic): start→search→click→buy, goal buy: d = 3, 2, 1, 0
    g = ProgressGraph(abstraction="generic")
    g.update(forest)
    assert g.num_edges == 3 and g.num_goals == 1
    reasonable, progress = progress_labels(forest, g)
    assert reasonable.tolist() == [True, True, True, True, False, True, False]
    assert progress.tolist() == [True, True, True, True, False, True, False]
    # the same forest with the env's states learns nothing: every step is 9 → 9
    env_graph = ProgressGraph()
    env_graph.update(forest)
    assert env_graph.num_edges == 0
    # ProAS on it: A = ±0.70711 (GRPO, R = 1, 0); E0's steps are all reasonable (kept);
    # E1 spares start→search and search→click (reasonable and progress), and the
    # rejected step and `back` share E1's penalty −0.70711 · 2 by Future-Drift: drift
    # (steps from t on that make no progress) is 2 for the rejected step (itself and
    # back), 1 for back: −1.41421 · 2/3 and · 1/3
    adv = proas(forest, state=ProgressGraph(abstraction="generic"), update_first=True,
                spare="progress")  # fmt: skip
    close(adv, [0.70711, 0.70711, 0.70711, 0.0, -0.94281, 0.0, -0.47140])
    with pytest.raises(ValueError, match="read the action texts"):
        generic_states(build(chain(0, [(1, 2)], reward=0.0, success=False)))
    with pytest.raises(ValueError, match="abstraction must be one of"):
        ProgressGraph(abstraction="page")
