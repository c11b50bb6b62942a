"""The tree sampler (TSBPO): shapes, budgets, shared prefixes, allocators, the fit."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.credit import compute_advantages
from credo.envs import Task
from credo.envs.shop import ShopEnv
from credo.policy import SamplingParams, build_word_tokenizer
from credo.rollout import PlainRenderer, sample_groups
from credo.rollout.render import PLAIN_WORDS
from credo.rollout.sampler import SamplerContext
from credo.rollout.tree import (
    FEATURES,
    LikelihoodAllocator,
    TreeParams,
    choose_nodes,
    likelihood_root_count,
    node_features,
    sample_trees,
    uniform_root_count,
)
from test_rollout import ScriptedPolicy, _tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.custom_env import GuessEnv

SHOP_ACTIONS = ["search[red wool scarf]", "click[1]", "click[2]", "choose[m]", "buy", "back"]


def random_policy(tok, actions, seed=0):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    return ScriptedPolicy(tok, lambda p: rng.choice(actions))


def shop_setup(seed: int = 0):  # type: ignore[no-untyped-def]
    tok = build_word_tokenizer([*ShopEnv().vocabulary(), *PLAIN_WORDS])
    return random_policy(tok, SHOP_ACTIONS, seed), PlainRenderer(tok)


def trees(budget: int, params: TreeParams, *, tasks: int = 3, seed: int = 0, **kw):  # type: ignore[no-untyped-def]
    policy, renderer = shop_setup(seed)
    ctx = SamplerContext(
        policy, renderer, ShopEnv, SamplingParams(), 9, choices=torch.Generator().manual_seed(seed)
    )
    res = sample_trees(
        ctx, [Task.make("train", i) for i in range(tasks)], group_size=budget, params=params, **kw
    )
    return res, policy, renderer


@pytest.mark.parametrize(
    ("budget", "root_fraction", "rounds", "roots"),
    [(8, 0.5, 1, 4), (8, 0.25, 2, 2), (5, 0.5, 1, 3), (1, 0.5, 1, 1), (6, 1.0, 1, 6)],
)
def test_uniform_trees_have_exact_shapes_and_budgets(
    budget: int, root_fraction: float, rounds: int, roots: int
) -> None:
    params = TreeParams(allocator="uniform", root_fraction=root_fraction, rounds=rounds)
    res, _, _ = trees(budget, params)
    f = res.forest
    ep = f.episodes()
    # every tree has exactly B leaves and round(fraction·B) roots (halves round up: 5·½ → 3)
    assert torch.bincount(ep.group, minlength=3).tolist() == [budget] * 3
    assert torch.bincount(f.group[f.parent < 0], minlength=3).tolist() == [roots] * 3
    assert res.stats["rollout/tree_branches"] == 3 * (budget - roots)
    assert len(res.episodes) == 3 * budget
    # a branch point is a row with ≥ 2 children, or a root position shared by siblings
    assert int((f.num_children() > 1).sum()) >= (1 if budget > roots else 0)
    # each row is one env step taken once, each response token generated once
    assert res.env_steps == f.num_rows
    assert res.generated_tokens == sum(r.numel() for r in f.response_ids)
    # episodes are the root-to-leaf paths, prefix steps shared (not re-generated)
    assert sorted(len(e.steps) for e in res.episodes) == sorted(ep.length.tolist())
    copied = sum(len(s.response_ids) for e in res.episodes for s in e.steps)
    if budget > roots:
        assert res.generated_tokens < copied
    assert all(e.group == tr.episode.group for e, tr in zip(res.episodes, res.trajectories))


def test_branch_prompts_equal_the_prefix_episode_prompts() -> None:
    res, _, renderer = trees(8, TreeParams(allocator="uniform"))
    f = res.forest
    assert res.stats["rollout/tree_branches"] == 12
    checked = 0
    for tr in res.trajectories:
        if tr.source < 0:
            continue
        src = res.trajectories[tr.source].episode
        first = tr.episode.steps[tr.prefix]
        # the branch's first prompt is the source's prompt at that depth, token for token
        assert first.prompt_ids == src.steps[tr.prefix].prompt_ids
        assert first.observation == src.steps[tr.prefix].observation
        assert tr.episode.steps[: tr.prefix] == src.steps[: tr.prefix]  # same Step objects
        # and it is what the renderer makes of the shared history
        runner = tr.runner
        hist = runner.history[: tr.prefix]
        assert first.prompt_ids == renderer.prompt_ids(runner.instruction, hist, first.observation)
        checked += 1
    assert checked == 12
    # in the forest: siblings (same parent, same tree) saw the same prompt
    for p in torch.unique(f.parent[f.parent >= 0]).tolist():
        kids = torch.nonzero(f.parent == p, as_tuple=False).flatten().tolist()
        assert all(torch.equal(f.prompt_ids[kids[0]], f.prompt_ids[c]) for c in kids)


def test_trees_are_deterministic_and_estimators_run_on_them() -> None:
    a, _, _ = trees(6, TreeParams(allocator="uniform", rounds=2), seed=3)
    b, _, _ = trees(6, TreeParams(allocator="uniform", rounds=2), seed=3)
    assert torch.equal(a.forest.parent, b.forest.parent)
    assert a.forest.actions == b.forest.actions
    for name in ("tsbpo", "grpo", "gigpo"):
        adv = compute_advantages(name, a.forest)
        assert adv.shape == (a.forest.num_rows,) and bool(torch.isfinite(adv).all())


def test_trees_without_nodes_to_branch_get_roots() -> None:
    # high = 1: the secret is 1 and "guess[1]" wins at once, so every path has one row
    # (depth 0 only): nothing to branch at, every leaf is a root, B stays exact
    tok = _tokenizer()
    res = sample_trees(
        SamplerContext(
            ScriptedPolicy(tok, lambda p: "guess[1]"),
            PlainRenderer(tok),
            lambda: GuessEnv(high=1),
            SamplingParams(),
            4,
        ),
        [Task.make("train", i) for i in range(2)],
        params=TreeParams(allocator="uniform"),
        group_size=4,
    )
    f = res.forest
    assert f.num_rows == 8 and bool((f.parent == -1).all())
    assert res.stats["rollout/tree_branches"] == 0 and res.stats["rollout/tree_roots"] == 4


def test_tree_is_cheaper_than_groups_at_equal_leaves() -> None:
    # same policy behaviour, 8 leaves per task: branches start mid-episode
    tasks = [Task.make("train", i) for i in range(4)]
    policy, renderer = shop_setup(1)
    group = sample_groups(
        SamplerContext(policy, renderer, ShopEnv, SamplingParams(), 9), tasks, group_size=8
    )
    res, _, _ = trees(8, TreeParams(allocator="uniform"), tasks=4, seed=1)
    assert res.forest.episodes().num_episodes == group.forest.episodes().num_episodes == 32
    assert res.generated_tokens < group.generated_tokens
    assert res.env_steps < group.env_steps


# ---------------------------------------------------------------------- allocators
def test_root_counts_by_hand() -> None:
    assert uniform_root_count(8, 0.5) == 4
    assert uniform_root_count(5, 0.5) == 3  # 2.5 rounds up
    assert uniform_root_count(1, 0.5) == 1
    assert uniform_root_count(8, 0.01) == 1  # at least one root
    # p₀ = ½: n = 2 mixes with 1 − ¼ − ¼ = ½ < 0.7; n = 3: 1 − ⅛ − ⅛ = ¾ ≥ 0.7 → 3
    kw = dict(min_roots=2, max_root_fraction=0.75, mix_target=0.7)
    assert likelihood_root_count(8, 0.5, **kw) == 3
    # p₀ = 0.9: 1 − 0.9ⁿ − 0.1ⁿ is 0.18, 0.27, 0.34, 0.41, 0.47 for n = 2..6, never 0.7;
    # capped at ⌊0.75·8⌋ = 6 roots (2 branches left)
    assert likelihood_root_count(8, 0.9, **kw) == 6
    # a budget below min_roots: all roots
    assert likelihood_root_count(1, 0.5, **kw) == 1


def test_allocator_prefers_nodes_with_p_near_one_half() -> None:
    # synthetic likelihood p(d) = σ(−2 + 4d): p = ½ at depth d = 0.5
    alloc = LikelihoodAllocator()
    alloc.mean = torch.tensor([-2.0, 4.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    d = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], dtype=torch.float64)
    phi = torch.zeros(9, len(FEATURES), dtype=torch.float64)
    phi[:, 0], phi[:, 1] = 1.0, d
    p = alloc.predict(phi)
    assert float(p[4]) == 0.5
    scores = p * (1 - p)
    # p(1−p) = 0.25 at d = 0.5; 0.2403 at d = 0.4 and 0.6 (z = ∓0.4); 0.2139 at 0.3/0.7.
    # A second branch at d = 0.5 is worth 0.25/2 = 0.125, less than any of those, so
    # 5 picks take the five nodes nearest p = ½, the middle one first.
    picks = choose_nodes(scores, 5, torch.Generator().manual_seed(0))
    assert int(picks[0]) == 4
    assert sorted(picks.tolist()) == [2, 3, 4, 5, 6]
    # a very confident model puts both branches on the one risky node once others fade
    sharp = torch.tensor([0.25, 0.0, 0.0, 0.001])
    assert choose_nodes(sharp, 2, None).tolist() == [0, 0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(0, 30), st.integers(0, 1000))
def test_uniform_choice_spreads_before_repeating(n: int, k: int, seed: int) -> None:
    picks = choose_nodes(torch.ones(n), k, torch.Generator().manual_seed(seed))
    assert picks.numel() == k
    counts = torch.bincount(picks, minlength=n)
    assert int(counts.max() - counts.min()) <= 1  # every node once before any twice


def test_likelihood_fit_recovers_a_logistic_model() -> None:
    # data from p = σ(1 − 3d + 2·progress): the fit's mean approaches (1, −3, 0, 2, 0)
    g = torch.Generator().manual_seed(0)
    true = torch.tensor([1.0, -3.0, 0.0, 2.0, 0.0], dtype=torch.float64)
    alloc = LikelihoodAllocator(decay=1.0, l2=1.0)
    for _ in range(5):
        n = 4000
        d = torch.rand(n, generator=g, dtype=torch.float64)
        prog = torch.rand(n, generator=g, dtype=torch.float64)
        phi = torch.stack(
            [
                torch.ones(n, dtype=torch.float64),
                d,
                d * d,
                prog,
                torch.zeros(n, dtype=torch.float64),
            ],
            1,
        )
        phi[:, 2] = 0.0  # leave d² out of the data so that the truth is identifiable
        y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(phi @ true)).double()
        alloc.update(phi, y, torch.ones(n, dtype=torch.float64))
    torch.testing.assert_close(alloc.mean[[0, 1, 3]], true[[0, 1, 3]], atol=0.15, rtol=0)
    assert alloc.updates == 5 and alloc.examples == 20000
    # the state goes through JSON exactly (checkpoints)
    clone = LikelihoodAllocator(decay=1.0)
    clone.load_state_dict(json.loads(json.dumps(alloc.state_dict())))
    assert torch.equal(clone.mean, alloc.mean) and torch.equal(clone.precision, alloc.precision)


def test_soft_targets_equal_repeated_examples_and_decay_forgets() -> None:
    # one row with target ¾ and weight 4 is the same data as 3 successes and 1 failure
    phi = torch.tensor([[1.0, 0.5, 0.25, 0.0, 0.0]], dtype=torch.float64)
    a, b = LikelihoodAllocator(), LikelihoodAllocator()
    a.update(phi, torch.tensor([0.75]), torch.tensor([4.0]))
    b.update(phi.repeat(4, 1), torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.ones(4))
    torch.testing.assert_close(a.mean, b.mean)
    torch.testing.assert_close(a.precision, b.precision)
    # an update without data only forgets: P ← 0.9·P + 0.1·λI, the mean stays
    before = a.precision.clone()
    a.update(torch.zeros(0, 5, dtype=torch.float64), torch.zeros(0), torch.zeros(0))
    torch.testing.assert_close(a.precision, 0.9 * before + 0.1 * torch.eye(5, dtype=torch.float64))


def test_node_features_by_hand() -> None:
    from credo.data import RolloutForest

    # chain 0 → 1 → 2 (row 1 invalid), progress after each step 0.25, 0.5, 1.0; T = 4
    f = RolloutForest.from_columns(
        group=[0, 0, 0],
        parent=[-1, 0, 1],
        valid=[True, False, True],
        extras={"progress": [0.25, 0.5, 1.0]},
    )
    phi = node_features(f, 4)
    expected = torch.tensor(
        [
            [1, 0.0, 0.0, 0.0, 0.0],  # root: depth 0, nothing before it
            [1, 0.25, 0.0625, 0.25, 0.0],  # after a valid step with progress ¼
            [1, 0.5, 0.25, 0.5, 0.5],  # 1 invalid action among 2 before it
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(phi, expected)


def test_likelihood_trees_update_the_state_and_split_by_it() -> None:
    alloc = LikelihoodAllocator()
    params = TreeParams(allocator="likelihood", min_roots=2, mix_target=0.7)
    res, _, _ = trees(8, params, state=alloc)
    f = res.forest
    # before any data p₀ = ½ → 3 roots (see test_root_counts_by_hand), 5 branches
    assert res.stats["rollout/tree_p_root"] == 0.5
    assert torch.bincount(f.group[f.parent < 0]).tolist() == [3, 3, 3]
    assert torch.bincount(f.episodes().group).tolist() == [8, 8, 8]
    # the fit saw every row, weighted by the leaves below it (Σ = Σ path lengths)
    assert alloc.updates == 1
    assert alloc.examples == pytest.approx(float(f.episodes().length.sum()))
    # the random policy rarely buys the right scarf: p₀ falls, the split follows it
    p0 = float(torch.sigmoid(alloc.mean[0]))
    assert p0 < 0.5
    expected = likelihood_root_count(8, p0, min_roots=2, max_root_fraction=0.75, mix_target=0.7)
    res2, _, _ = trees(8, params, state=alloc, seed=1)
    assert res2.stats["rollout/tree_p_root"] == pytest.approx(p0)
    assert res2.stats["rollout/tree_roots"] == expected
    assert math.isfinite(res2.stats["rollout/tree_branch_depth"])


def test_bad_params_are_clear() -> None:
    with pytest.raises(ValueError, match="allocator must be one of uniform, likelihood"):
        TreeParams(allocator="greedy")
    with pytest.raises(ValueError, match="root_fraction must be in"):
        TreeParams(root_fraction=0)
    with pytest.raises(ValueError, match="budget must be"):
        trees(0, TreeParams())
