"""Snapshot/restore for branching: the deepcopy fallback and divergence detection."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from credo.envs import RestoreDivergence, StepResult, Task, restore_env, snapshot_env
from credo.envs.shop import ShopEnv
from credo.policy import SamplingParams
from credo.rollout import PlainRenderer, restore_runner, sample_groups, try_restore
from credo.rollout.sampler import SamplerContext
from credo.rollout.tree import TreeParams, sample_trees
from test_rollout import ScriptedPolicy, _tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.custom_env import GuessEnv


class PlainGuess:
    """GuessEnv's rules without snapshot()/restore(): credo must deep-copy it."""

    def __init__(self, high: int = 8, max_turns: int = 4) -> None:
        self.inner = GuessEnv(high, max_turns)
        self.log: list[str] = []  # mutable state inside a nested container

    def reset(self, task: Task, seed: int = 0) -> str:
        self.log = []
        return self.inner.reset(task, seed)

    def instruction(self) -> str:
        return self.inner.instruction()

    def step(self, action: str) -> StepResult:
        self.log.append(action)
        return self.inner.step(action)

    def state_key(self) -> str:
        return f"{self.inner.state_key()}|{len(self.log)}"


class ForgetfulGuess(GuessEnv):
    """restore() that does nothing: a restored env stays where reset left it."""

    def restore(self, snap: tuple) -> None:
        pass


class NoisyGuess(GuessEnv):
    """A step whose observation is not a function of the state (a hidden RNG)."""

    _rng = random.Random(0)

    def step(self, action: str) -> StepResult:
        res = super().step(action)
        res.observation += f" ; noise {self._rng.randint(1, 8)}"
        return res


def test_deepcopy_fallback_round_trips_an_env_without_snapshot() -> None:
    env = PlainGuess()
    env.reset(Task.make("train", 5))
    env.step("guess[4]")
    snap = snapshot_env(env)
    assert isinstance(snap, dict) and snap["log"] == ["guess[4]"]
    before = (env.inner.lo, env.inner.hi, env.inner.turn, list(env.log))
    env.step("guess[2]")
    env.step("guess[7]")
    for _ in range(2):  # one snapshot restores any number of times
        restore_env(env, snap)
        assert (env.inner.lo, env.inner.hi, env.inner.turn, env.log) == before
        env.step("guess[1]")
    assert snap["log"] == ["guess[4]"]  # the snapshot itself never changes
    with pytest.raises(TypeError, match="deep copies of its __dict__"):
        restore_env(env, ("not", "a", "dict"))


def test_an_env_with_its_own_snapshot_uses_it() -> None:
    env = ShopEnv()
    env.reset(Task.make("train", 1))
    env.step(env.oracle_action())
    snap = snapshot_env(env)
    assert not isinstance(snap, dict)  # shop's own _State, not a __dict__ copy
    key, obs = env.state_key(), env.observation()
    env.step("back")
    restore_env(env, snap)
    assert (env.state_key(), env.observation()) == (key, obs)


def _run(make_env, per_task: int = 2, seed: int = 0):  # type: ignore[no-untyped-def]
    tok = _tokenizer()
    rng = random.Random(seed)
    policy = ScriptedPolicy(tok, lambda p: f"guess[{rng.randint(1, 8)}]")
    return sample_groups(
        SamplerContext(
            policy, PlainRenderer(tok), make_env, SamplingParams(), 4, keep_snapshots=True
        ),
        [Task.make("train", i) for i in range(3)],
        group_size=per_task,
    )


def test_restore_runner_reproduces_the_recorded_state() -> None:
    for make_env in (GuessEnv, PlainGuess):
        res = _run(make_env)
        tr = max(res.trajectories, key=lambda t: len(t.episode.steps))
        assert len(tr.episode.steps) >= 3
        for depth in range(len(tr.episode.steps)):
            r = restore_runner(make_env, tr, depth)
            step = tr.episode.steps[depth]
            assert r.env.state_key() == step.state
            assert r.observation == step.observation
            assert r.episode.steps == tr.episode.steps[:depth] and not r.done
            assert [t.action for t in r.history] == [s.action for s in tr.episode.steps[:depth]]
            # the restored env then behaves as the recorded one did
            out = r.env.step(step.action)
            assert out.done == step.terminal
            if depth + 1 < len(tr.episode.steps):
                assert out.observation == tr.episode.steps[depth + 1].observation


def test_a_diverging_restore_is_detected() -> None:
    res = _run(ForgetfulGuess)
    tr = next(t for t in res.trajectories if len(t.episode.steps) >= 3)
    # depth 0 needs no restore (reset reproduces it); depth 2 restores the state after
    # step 0, but this env's restore keeps the reset state: replaying step 1 from there
    # shows another range than the recorded one
    restore_runner(ForgetfulGuess, tr, 0)
    with pytest.raises(RestoreDivergence, match=r"ForgetfulGuess \(task train/\d+, depth 2\)"):
        restore_runner(ForgetfulGuess, tr, 2)
    stats: dict[str, float] = {}
    assert try_restore(ForgetfulGuess, tr, 2, on_divergence="skip", stats=stats) is None
    assert stats == {"rollout/restore_steps": 1, "rollout/restore_divergences": 1}
    with pytest.raises(RestoreDivergence, match=r"rollout\.on_restore_divergence=skip"):
        try_restore(ForgetfulGuess, tr, 2, on_divergence="error", stats={})
    with pytest.raises(ValueError, match="on_restore_divergence must be one of"):
        try_restore(ForgetfulGuess, tr, 2, on_divergence="ignore", stats={})


def test_a_nondeterministic_env_is_detected_by_its_replayed_observation() -> None:
    res = _run(NoisyGuess)
    tr = next(t for t in res.trajectories if len(t.episode.steps) >= 2)
    with pytest.raises(RestoreDivergence, match=r"observation .* != recorded"):
        restore_runner(NoisyGuess, tr, 1)


def test_tree_sampler_on_diverging_envs_errors_or_keeps_its_budget() -> None:
    tok = _tokenizer()
    rng = random.Random(0)
    policy = ScriptedPolicy(tok, lambda p: f"guess[{rng.randint(2, 7)}]")

    def ctx(make_env, on_divergence: str = "error") -> SamplerContext:  # type: ignore[no-untyped-def]
        return SamplerContext(
            policy, PlainRenderer(tok), make_env, SamplingParams(), 4, on_divergence=on_divergence
        )

    kw = dict(group_size=4, params=TreeParams(allocator="uniform"))
    tasks = [Task.make("train", i) for i in range(3)]
    with pytest.raises(RestoreDivergence):
        sample_trees(ctx(ForgetfulGuess), tasks, **kw)
    res = sample_trees(ctx(ForgetfulGuess, "skip"), tasks, **kw)
    # branches at depth ≥ 2 diverge and become roots; depth-1 branches restore the
    # reset state, which is right for them: either way every tree keeps 4 leaves
    assert res.stats["rollout/restore_divergences"] >= 1
    assert torch.bincount(res.forest.episodes().group).tolist() == [4, 4, 4]
    # an env without snapshot()/restore() branches through the deepcopy fallback
    plain = sample_trees(ctx(PlainGuess), tasks, **kw)
    assert plain.stats["rollout/tree_branches"] == 6
    assert "rollout/restore_divergences" not in plain.stats
