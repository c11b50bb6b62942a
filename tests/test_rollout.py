"""The group sampler, prompt rendering, failing envs and the custom env example."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from credo.envs import StepResult, Task
from credo.envs.base import reset_env, step_env
from credo.policy import Generation, SamplingParams
from credo.rollout import PlainRenderer, Turn, sample_groups
from credo.rollout.sampler import SamplerContext

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.custom_env import GuessEnv


class ScriptedPolicy:
    """Answers every prompt with a fixed action (or the env's oracle, via a callback)."""

    def __init__(self, tokenizer, choose) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer = tokenizer
        self.choose = choose
        self.calls = 0

    def generate(self, prompts, sampling, generator=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        out = []
        for p in prompts:
            text = self.choose(p)
            ids = [
                *self.tokenizer.encode(text, add_special_tokens=False),
                self.tokenizer.eos_token_id,
            ]
            out.append(Generation(ids, torch.full((len(ids),), -0.1), text, True))
        return out


def _tokenizer():  # type: ignore[no-untyped-def]
    from credo.policy import build_word_tokenizer
    from credo.rollout.render import PLAIN_WORDS

    return build_word_tokenizer([*GuessEnv().vocabulary(), *PLAIN_WORDS])


def test_plain_prompt_has_goal_history_window_and_page() -> None:
    r = PlainRenderer(_tokenizer(), history_turns=1)
    text = r.text(
        "find it", [Turn("a", "guess[1]"), Turn("b", "guess[2]")], "the secret is from 3 to 4"
    )
    assert text == ("history : guess[2] page : the secret is from 3 to 4 goal : find it action :")
    assert r.response_ids("guess[3]")[-1] == r.tokenizer.eos_token_id


def test_group_sampler_runs_groups_together_and_builds_a_forest() -> None:
    tok = _tokenizer()
    policy = ScriptedPolicy(tok, lambda p: "guess[8]")
    tasks = [Task.make("train", i) for i in range(3)]
    res = sample_groups(
        SamplerContext(policy, PlainRenderer(tok), GuessEnv, SamplingParams(), 10),
        tasks,
        group_size=4,
    )
    assert len(res.episodes) == 12
    assert policy.calls == 4  # one batched generation per turn, 4 turns at most
    f = res.forest
    assert f.group.unique().tolist() == [0, 1, 2]
    assert all(len(e.steps) in (1, 4) for e in res.episodes)  # right at once, or 4 misses
    assert res.env_steps == f.num_rows == sum(len(e.steps) for e in res.episodes)
    # same task and seed in a group: the same outcome for the same actions
    for g in range(3):
        outs = {e.success for e in res.episodes if e.group == g}
        assert len(outs) == 1


class Exploding(GuessEnv):
    def step(self, action: str) -> StepResult:
        if self.secret % 2 == 0:
            raise RuntimeError("boom")
        return super().step(action)


def test_a_failing_env_fails_its_episode_not_the_run() -> None:
    tok = _tokenizer()
    policy = ScriptedPolicy(tok, lambda p: "guess[1]")
    tasks = [Task.make("train", i) for i in range(12)]
    res = sample_groups(
        SamplerContext(policy, PlainRenderer(tok), Exploding, SamplingParams(), 10),
        tasks,
        group_size=1,
    )
    errors = [e for e in res.episodes if e.error]
    assert errors and all("RuntimeError: boom" in e.error and not e.success for e in errors)
    assert any(e.error is None and e.steps for e in res.episodes)


class NonStringStep(GuessEnv):
    """Odd secrets: ``step`` returns the range as a tuple instead of a string."""

    def step(self, action: str) -> StepResult:
        res = super().step(action)
        if self.secret % 2:
            res.observation = (self.lo, self.hi)  # type: ignore[assignment]
        return res


class NonStringReset(GuessEnv):
    """Odd secrets: ``reset`` returns bytes instead of a string."""

    def reset(self, task: Task, seed: int = 0) -> str:
        obs = super().reset(task, seed)
        return obs.encode() if self.secret % 2 else obs  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("env_cls", "message"),
    [
        (
            NonStringStep,
            "step: TypeError: NonStringStep.step() returned an observation of type tuple",
        ),
        (
            NonStringReset,
            "reset: TypeError: NonStringReset.reset() returned an observation of type bytes",
        ),
    ],
)
def test_a_non_string_observation_fails_its_episode(env_cls: type, message: str) -> None:
    """It used to be formatted into the prompt as ``(1, 3)`` / ``b'...'`` without a word."""
    tok = _tokenizer()
    policy = ScriptedPolicy(tok, lambda p: "guess[1]")
    tasks = [Task.make("train", i) for i in range(12)]
    res = sample_groups(
        SamplerContext(policy, PlainRenderer(tok), env_cls, SamplingParams(), 10),
        tasks,
        group_size=1,
    )
    errors = [e.error for e in res.episodes if e.error]
    assert errors and all(e.startswith(message) and "must be str" in e for e in errors)
    assert len(errors) == sum(_odd(t) for t in tasks)
    assert any(e.error is None and e.steps for e in res.episodes)
    for ep in res.episodes:
        assert all(isinstance(s.observation, str) for s in ep.steps)


def _odd(task: Task) -> bool:
    env = GuessEnv()
    env.reset(task)
    return env.secret % 2 == 1


def test_step_env_and_reset_env_reject_non_string_observations() -> None:
    env = NonStringStep()
    task = next(t for t in (Task.make("train", i) for i in range(20)) if _odd(t))
    assert reset_env(env, task, 0) == "the secret is from 1 to 8"
    with pytest.raises(
        TypeError, match=r"NonStringStep\.step\(\) returned an observation of type tuple"
    ):
        step_env(env, "guess[1]")
    with pytest.raises(TypeError, match=r"NonStringReset\.reset\(\) returned .* type bytes"):
        reset_env(NonStringReset(), task, 0)


def test_malformed_actions_are_env_messages() -> None:
    tok = _tokenizer()
    policy = ScriptedPolicy(tok, lambda p: "number please")
    res = sample_groups(
        SamplerContext(policy, PlainRenderer(tok), GuessEnv, SamplingParams(), 10),
        [Task.make("test", 0)],
        group_size=2,
    )
    steps = res.episodes[0].steps
    assert len(steps) == 4 and not any(s.valid for s in steps)
    assert not bool(res.forest.valid.any())


def test_custom_env_oracle_and_registry() -> None:
    from credo.envs import env_names, make_env

    assert "guess" in env_names()
    env = make_env("examples.custom_env:GuessEnv", high=16, max_turns=5)
    for i in range(50):
        env.reset(Task.make("train", i))
        while True:
            res = env.step(env.oracle_action())
            if res.done:
                break
        assert res.info["success"]


def test_env_import_path_errors_are_clear() -> None:
    from credo.envs import make_env

    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        make_env("no_such_module:Env")
    with pytest.raises(ValueError, match="has no 'Nope'"):
        make_env("examples.custom_env:Nope")


def test_the_goal_is_asked_again_every_turn() -> None:
    """A shopping list's next item becomes the prompt's goal after the first purchase."""
    from credo.envs.shop import ShopEnv
    from credo.policy import build_word_tokenizer
    from credo.rollout.render import PLAIN_WORDS

    env = ShopEnv("multi")
    env.reset(Task.make("train", 0))
    actions = []
    while True:
        a = env.oracle_action()
        actions.append(a)
        if env.step(a).done:
            break
    tok = build_word_tokenizer([*ShopEnv().vocabulary(), *PLAIN_WORDS])
    script = iter(actions)
    policy = ScriptedPolicy(tok, lambda p: next(script))
    res = sample_groups(
        SamplerContext(policy, PlainRenderer(tok), lambda: ShopEnv("multi"), SamplingParams(), 20),
        [Task.make("train", 0)],
        group_size=1,
    )
    ep = res.episodes[0]
    assert ep.success and [s.action for s in ep.steps] == actions
    first_buy = actions.index("buy")
    goal_of = [tok.decode(s.prompt_ids).split("goal : ")[1] for s in ep.steps]
    assert goal_of[0] == goal_of[first_buy] != goal_of[first_buy + 1]
    assert env.goals[1].category in goal_of[first_buy + 1]
