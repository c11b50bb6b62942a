"""Oracle continuations (SERO): where they start, what is kept, and no PG loss on them."""

from __future__ import annotations

import random

import pytest
import torch

from credo.data import SOURCES, RolloutForest
from credo.envs import StepResult, Task
from credo.envs.shop import ShopEnv
from credo.objectives import LossInputs, aggregation_weights, get_loss
from credo.policy import SamplingParams, build_word_tokenizer
from credo.rollout import (
    PlainRenderer,
    add_oracle_continuations,
    oracle_batch,
    oracle_chains,
    sample_groups,
    split_oracle,
)
from credo.rollout.render import PLAIN_WORDS
from credo.rollout.sampler import SamplerContext
from test_rollout import ScriptedPolicy

ORACLE = SOURCES.index("oracle")
ACTIONS = ["search[red wool scarf]", "click[1]", "click[2]", "choose[m]", "buy", "back"]


def _oracle_ctx(renderer, make_env, **kw):  # type: ignore[no-untyped-def]
    """The oracle add-on reads the env factory, renderer, turn cap and choice RNG only."""
    return SamplerContext(None, renderer, make_env, SamplingParams(), 10**9, **kw)


def _groups(make_env=ShopEnv, seed: int = 0, tasks: int = 4):  # type: ignore[no-untyped-def]
    tok = build_word_tokenizer([*ShopEnv().vocabulary(), *PLAIN_WORDS])
    rng = random.Random(seed)
    renderer = PlainRenderer(tok)
    res = sample_groups(
        SamplerContext(
            ScriptedPolicy(tok, lambda p: rng.choice(ACTIONS)),
            renderer,
            make_env,
            SamplingParams(),
            9,
            keep_snapshots=True,
        ),
        [Task.make("train", i) for i in range(tasks)],
        group_size=3,
    )
    return res, renderer


def test_continuations_hang_under_reached_states_and_follow_the_oracle() -> None:
    base, renderer = _groups()
    res = add_oracle_continuations(
        base,
        SamplerContext(
            None,
            renderer,
            ShopEnv,
            SamplingParams(),
            10**9,
            choices=torch.Generator().manual_seed(1),
        ),
        horizon=3,
        per_group=2,
    )
    f = res.forest
    n = base.forest.num_rows
    assert bool((f.source[n:] == ORACLE).all()) and f.num_rows > n
    assert res.episodes is base.episodes  # no new policy episodes
    assert res.stats["rollout/oracle_continuations"] == 8  # 2 per group, shop's oracle is valid
    assert res.stats["rollout/oracle_steps"] == f.num_rows - n
    assert res.env_steps == base.env_steps + f.num_rows - n
    assert res.generated_tokens == base.generated_tokens  # the oracle samples nothing
    rows, chain, position = oracle_chains(f)
    for c in range(8):
        mine = rows[chain == c]
        assert position[chain == c].tolist() == list(range(mine.numel()))
        assert 1 <= mine.numel() <= 3
        first = int(mine[0])
        # a sibling of the policy row it starts from: same parent, depth and prompt
        siblings = torch.nonzero(
            (f.parent == f.parent[first]) & (f.source != ORACLE) & (f.group == f.group[first]),
            as_tuple=False,
        ).flatten()
        assert siblings.numel() >= 1
        assert any(torch.equal(f.prompt_ids[first], f.prompt_ids[int(s)]) for s in siblings)
        assert all(bool(f.valid[int(r)]) for r in mine)
        assert all(float(torch.as_tensor(f.old_logprobs[int(r)]).abs().sum()) == 0 for r in mine)
    # the oracle's actions: replaying them from the start state solves the rest
    tr = res.trajectories[-1]
    env = ShopEnv()
    env.reset(Task.make("train", 3))
    for s in tr.episode.steps:
        if s.source == "oracle":
            assert s.action == env.oracle_action()
        env.step(s.action)


def test_split_gives_back_the_base_forest_exactly() -> None:
    base, renderer = _groups()
    res = add_oracle_continuations(base, _oracle_ctx(renderer, ShopEnv), horizon=2)
    policy_forest, oracle_rows = split_oracle(res.forest)
    b = base.forest
    assert oracle_rows.tolist() == list(range(b.num_rows, res.forest.num_rows))
    for name in ("group", "parent", "t", "state", "next_state", "reward", "terminal", "source",
                 "valid", "success"):  # fmt: skip
        assert torch.equal(getattr(policy_forest, name), getattr(b, name)), name
    assert policy_forest.actions == b.actions
    assert all(torch.equal(x, y) for x, y in zip(policy_forest.prompt_ids, b.prompt_ids))
    assert sorted(policy_forest.extras) == sorted(b.extras)
    assert split_oracle(b)[0] is b and split_oracle(b)[1].numel() == 0


def test_failed_start_uses_only_failed_paths() -> None:
    base, renderer = _groups(tasks=6)
    res = add_oracle_continuations(
        base,
        _oracle_ctx(renderer, ShopEnv),
        horizon=1,
        per_group=3,
        start="failed",
    )
    f = res.forest
    ep = base.forest.episodes()
    on_failed = torch.zeros(base.forest.num_rows, dtype=torch.bool)
    on_failed[ep.rows[~ep.success[ep.episode_of]]] = True
    rows, _, _ = oracle_chains(f)
    for r in rows.tolist():  # the policy row each continuation replaced is on a failed path
        sib = [
            int(s)
            for s in torch.nonzero((f.parent == f.parent[r]) & (f.source != ORACLE)).flatten()
            if int(f.group[s]) == int(f.group[r])
        ]
        assert any(bool(on_failed[s]) for s in sib)


class BadOracleShop(ShopEnv):
    """An oracle that answers nonsense on the results page: such continuations fail."""

    def oracle_action(self) -> str:
        return "dance" if self._s.page == "results" else super().oracle_action()


def test_continuations_that_do_not_execute_are_dropped() -> None:
    base, renderer = _groups(BadOracleShop)
    res = add_oracle_continuations(
        base,
        _oracle_ctx(renderer, BadOracleShop),
        horizon=3,
        per_group=3,
    )
    kept, dropped = res.stats["rollout/oracle_continuations"], res.stats["rollout/oracle_dropped"]
    assert kept + dropped == 12 and dropped > 0
    f = res.forest
    assert bool(f.valid[f.source == ORACLE].all())  # no invalid oracle row survives
    assert "dance" not in [a for a, s in zip(f.actions, f.source.tolist()) if s == ORACLE]


class NoOracle:
    def __init__(self) -> None:
        self.env = ShopEnv()

    def reset(self, task: Task, seed: int = 0) -> str:
        return self.env.reset(task, seed)

    def step(self, action: str) -> StepResult:
        return self.env.step(action)

    def state_key(self) -> str:
        return self.env.state_key()


def test_an_env_without_oracle_is_a_clear_error() -> None:
    base, renderer = _groups(NoOracle)
    with pytest.raises(ValueError, match="has no oracle_action"):
        add_oracle_continuations(base, _oracle_ctx(renderer, NoOracle), horizon=1)
    with pytest.raises(ValueError, match="horizon must be"):
        add_oracle_continuations(base, _oracle_ctx(renderer, NoOracle), horizon=0)


def test_oracle_chains_by_hand() -> None:
    # rows: 0 → 1 policy; oracle chain A = 2 → 3 under row 0; chain B = 4 (a root);
    # chain C = 5 → 6 → 7 under row 1
    f = RolloutForest.from_columns(
        group=[0] * 8,
        parent=[-1, 0, 0, 2, -1, 1, 5, 6],
        source=[0, 0, 1, 1, 1, 1, 1, 1],
    )
    rows, chain, position = oracle_chains(f)
    assert rows.tolist() == [2, 3, 4, 5, 6, 7]
    assert chain.tolist() == [0, 0, 1, 2, 2, 2]
    assert position.tolist() == [0, 1, 0, 0, 1, 2]


def test_oracle_rows_never_receive_policy_gradient() -> None:
    base, renderer = _groups()
    res = add_oracle_continuations(base, _oracle_ctx(renderer, ShopEnv), horizon=3)
    f = res.forest
    oracle = f.source == ORACLE
    # give oracle rows huge advantages: they must still not reach the PG loss
    adv = torch.where(oracle, torch.full((f.num_rows,), 100.0), torch.ones(f.num_rows))
    batch = f.to_batch(adv)
    assert torch.equal(batch.pg_mask, ~oracle)
    assert not bool(batch.loss_mask[oracle].any())
    logprobs = (-torch.rand(batch.input_ids.shape, dtype=torch.float64)).requires_grad_(True)
    mask = batch.loss_mask
    inputs = LossInputs(
        logprobs=logprobs,
        old_logprobs=logprobs.detach() - 0.05,
        advantages=batch.advantages.double(),
        mask=mask,
        weights=aggregation_weights(
            mask, "token-mean", episode=batch.episode, turn=batch.turn
        ).double(),
        episode=batch.episode,
        turn=batch.turn,
    )
    loss, _ = get_loss("ppo")(inputs)
    loss.backward()
    assert float(logprobs.grad[oracle].abs().sum()) == 0.0
    assert float(logprobs.grad[~oracle].abs().sum()) > 0.0
    # the SERO batch holds exactly the oracle rows, with their chains
    ob = oracle_batch(f)
    assert ob.tokens.row.tolist() == torch.nonzero(oracle).flatten().tolist()
    assert not bool(ob.tokens.pg_mask.any()) and ob.num_chains == int(ob.chain.max()) + 1
    assert oracle_batch(base.forest) is None
