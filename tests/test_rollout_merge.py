"""GraphPO's merging sampler (``rollout.sampler: merge``): an episode that reaches, by
another path, a state its group already expands stops generating and shares that
continuation. Hand-worked on three switches; end to end in training on TextLights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from credo.envs import StepResult, Task
from credo.policy import Generation, SamplingParams, build_word_tokenizer
from credo.rollout import MergeParams, PlainRenderer, sample_merged
from credo.rollout.render import PLAIN_WORDS
from credo.rollout.sampler import SamplerContext
from credo.train.config import ConfigError, load_config


class Switches:
    """Three lamps, all off at the start; ``flip k`` toggles lamp k; solved when all are on."""

    max_turns = 6

    def reset(self, task: Task, seed: int = 0) -> str:
        self.on = [False, False, False]
        return self.observation()

    def observation(self) -> str:
        return " ".join("on" if x else "off" for x in self.on)

    def step(self, action: str) -> StepResult:
        k = int(action.split()[-1]) - 1
        self.on[k] = not self.on[k]
        won = all(self.on)
        return StepResult(self.observation(), float(won), won, {"valid": True, "success": won})

    def state_key(self) -> str:
        return "".join("1" if x else "0" for x in self.on)

    def snapshot(self) -> list[bool]:
        return list(self.on)

    def restore(self, snap: list[bool]) -> None:
        self.on = list(snap)


class Script:
    """Answers the i-th live episode of the c-th generation with ``moves[c][i]``."""

    def __init__(self, tokenizer, moves: list[list[str]]) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer, self.moves, self.calls, self.rows = tokenizer, moves, 0, 0

    def generate(self, prompts, sampling, generator=None):  # type: ignore[no-untyped-def]
        out = []
        for i, _ in enumerate(prompts):
            text = self.moves[self.calls][i]
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), 0]
            out.append(Generation(ids, torch.full((len(ids),), -0.5), text, True))
        self.calls, self.rows = self.calls + 1, self.rows + len(prompts)
        return out


def _context(moves: list[list[str]]) -> tuple[SamplerContext, Script]:
    tok = build_word_tokenizer(["flip", "1", "2", "3", "on", "off", *PLAIN_WORDS])
    policy = Script(tok, moves)
    return SamplerContext(policy, PlainRenderer(tok), Switches, SamplingParams(), 6), policy


def test_an_episode_reaching_an_expanded_state_by_another_path_shares_its_continuation() -> None:
    ctx, policy = _context(
        [
            ["flip 1", "flip 2", "flip 1"],  # r0 -> 100, r1 -> 010, r2 -> 100 (r0's path)
            ["flip 2", "flip 1", "flip 3"],  # r0 -> 110, r1 -> 110 (another path), r2 -> 101
            ["flip 3", "flip 2"],  # r1 merged into r0: only r0 and r2 generate
        ]
    )
    res = sample_merged(ctx, [Task.make("train", 0)], group_size=3)
    r0, r1, r2 = res.episodes
    assert [s.action for s in r0.steps] == ["flip 1", "flip 2", "flip 3"] and r0.success
    # r1 reached 110 by flip 2, flip 1; its third step is r0's, copied, not generated
    assert [s.action for s in r1.steps] == ["flip 2", "flip 1", "flip 3"] and r1.success
    assert r1.steps[2].info["merged"] and not r0.steps[2].info.get("merged")
    assert r1.steps[2].response_ids == r0.steps[2].response_ids
    assert r1.steps[2].prompt_ids == r0.steps[2].prompt_ids
    assert r1.steps[2] is not r0.steps[2]  # a copy: the forest has a row for each path
    # r2 shared r0's first step's path (flip 1): the same tree node, no merge
    assert [s.action for s in r2.steps] == ["flip 1", "flip 3", "flip 2"] and r2.success
    assert policy.calls == 3 and policy.rows == 8  # 9 steps taken, 8 generated
    assert res.generated_tokens == 8 * 3  # "flip k" + end: 3 tokens each
    assert res.env_steps == 8
    assert res.stats == {
        "rollout/merged_episodes": 1.0,
        "rollout/merged_steps": 1.0,
        "rollout/merged_tokens": 3.0,
    }
    assert res.forest.num_rows == 9
    assert [e.ret for e in res.episodes] == [1.0, 1.0, 1.0]


def test_depth_same_keeps_apart_episodes_that_arrive_later() -> None:
    moves = [
        ["flip 1", "flip 3"],  # r0 -> 100, r1 -> 001
        ["flip 2", "flip 3"],  # r0 -> 110, r1 -> 000
        ["flip 1", "flip 1"],  # r0 -> 010, r1 -> 100: r0 was at 100 after one step, r1 after 3
        ["flip 3", "flip 2"],  # r0 -> 011, r1 -> 110 (r0 was there after two steps)
        ["flip 1", "flip 3"],  # r0 -> 111 (won in 5), r1 -> 111 (won in 5)
    ]
    ctx, _ = _context(moves)
    same = sample_merged(ctx, [Task.make("train", 0)], group_size=2)
    assert same.stats["rollout/merged_episodes"] == 0.0  # 100 at depths 1 and 3
    assert [e.success for e in same.episodes] == [True, True]
    ctx, script = _context(moves)
    anyd = sample_merged(
        ctx, [Task.make("train", 0)], group_size=2, params=MergeParams(depth="any")
    )
    assert anyd.stats == {
        "rollout/merged_episodes": 1.0,
        "rollout/merged_steps": 3.0,
        "rollout/merged_tokens": 9.0,
    }
    r0, r1 = anyd.episodes
    assert r0.success and [s.action for s in r0.steps] == [
        "flip 1", "flip 2", "flip 1", "flip 3", "flip 1",
    ]  # fmt: skip
    # r1 at 100 after 3 steps takes r0's steps from 100 (its 2nd on), cut at 6 turns: the
    # win came at r0's 5th step, which would be r1's 7th, so r1 fails
    assert [s.action for s in r1.steps] == [
        "flip 3", "flip 3", "flip 1", "flip 2", "flip 1", "flip 3",
    ]  # fmt: skip
    assert not r1.success and script.rows == 8  # r0 alone generates turns 4 and 5


def test_bad_merge_settings_are_one_line() -> None:
    with pytest.raises(ValueError, match="min_depth must be an integer ≥ 1, got 0"):
        MergeParams(min_depth=0)
    with pytest.raises(ValueError, match="depth must be same or any"):
        MergeParams(depth="deep")
    with pytest.raises(ConfigError, match=r"rollout\.sampler=merge: oracle continuations"):
        load_config("grpo", ["rollout.sampler=merge", "rollout.oracle_horizon=2"])


@pytest.mark.slow
def test_graphpo_trains_on_merged_rollouts(tmp_path: Path) -> None:
    """Two GraphPO iterations on TextLights with the merging sampler: lamps flipped in
    another order reach the same rows, so episodes merge and tokens are saved, and the
    update has signal (mixed outcomes, non-zero advantages and gradient)."""
    from credo.train.loop import train

    cfg = load_config(
        "graphpo",
        [
            "env.name=gym:credo/TextLights-v0",
            "env.kwargs={make_kwargs: {min_lamps: 6, max_lamps: 9, max_episode_steps: 11}}",
            "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128}",
            "sft.episodes=300",
            "sft.steps=100",
            "sft.noisy_episodes=100",
            "sft.noisy_steps=10",
            "sft.epsilon=0.5",
            "rollout.max_new_tokens=6",
            "rollout.history_turns=0",
            "rollout.sampler=merge",
            "rollout.tasks_per_iter=8",
            "train.iterations=2",
            "train.threads=1",
            "eval.episodes=8",
            f"train.runs_dir={tmp_path}",
            "train.name=m",
        ],
    )
    res = train(cfg, quiet=True)
    rows = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["rollout/merged_episodes"] > 0 and r["rollout/merged_tokens"] > 0
        assert 0 < r["rollout/success_rate"] < 1
        assert r["credit/zero_adv_frac"] < 1 and r["policy/grad_norm"] > 0
