"""The env protocol checks (credo.rollout.envcheck): each check catches the mistake it is
for, names the method to fix, and passes a correct env."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from credo.envs import StepResult, Task
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.envcheck import (
    EnvCheckError,
    action_candidates,
    check_env,
    collect_words,
    preflight,
    round_trip,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.custom_env import GuessEnv


class GlobalRandomGuess(GuessEnv):
    """Ignores task.seed: the secret comes from a shared random stream."""

    _rng = random.Random(0)

    def reset(self, task: Task, seed: int = 0) -> str:
        obs = super().reset(task, seed)
        self.secret = self._rng.randint(1, self.high)
        return obs


class ForgetfulGuess(GuessEnv):
    def restore(self, snap: tuple) -> None:
        pass


class SilentEnd(GuessEnv):
    def step(self, action: str) -> StepResult:
        res = super().step(action)
        res.info.pop("success", None)
        return res


def test_a_correct_env_passes() -> None:
    tok = build_word_tokenizer(GuessEnv().vocabulary())
    report = check_env(GuessEnv, tasks=4, tokenizer=tok)
    assert report.ok and report.problems == [] and report.errors == []
    assert len(report.passed) == 3


def test_determinism_names_task_seed() -> None:
    report = check_env(GlobalRandomGuess, tasks=6)
    assert not report.ok
    assert any("not deterministic" in p and "task.seed" in p for p in report.problems)


def test_snapshot_round_trip() -> None:
    report = check_env(ForgetfulGuess, tasks=4)
    assert any("restoring a snapshot" in p for p in report.problems)
    assert check_env(ForgetfulGuess, tasks=4, snapshots=False).ok
    with pytest.raises(EnvCheckError, match="snapshot"):
        preflight(ForgetfulGuess, needs_oracle=True, snapshots=True)
    preflight(ForgetfulGuess, needs_oracle=True, snapshots=False)  # the group sampler


def test_last_step_needs_success() -> None:
    problems = check_env(SilentEnd, tasks=2).problems
    assert problems and all("info['success']" in p for p in problems)


def test_round_trip_is_what_step_receives() -> None:
    tok = build_word_tokenizer(["guess", "3", "[", "]"])
    assert round_trip("guess[3]", tok) == "guess [ 3 ]"
    assert round_trip("guess[7]", tok) == "guess [ ]"  # an unknown word is dropped


def test_vocabulary_coverage_names_the_missing_words() -> None:
    tok = build_word_tokenizer(["guess", "the", "secret"])
    (problem,) = check_env(GuessEnv, tasks=2, tokenizer=tok).problems
    assert "lacks" in problem and "vocabulary()" in problem


def test_random_walk_finds_action_words_it_is_shown() -> None:
    class Listed(GuessEnv):
        oracle_action = None  # type: ignore[assignment]
        sample_action = None  # type: ignore[assignment]
        vocabulary = None  # type: ignore[assignment]

        def action_format(self) -> str:
            return "guess 1 2 3 4 5 6 7 8"

        def step(self, action: str) -> StepResult:
            return super().step("guess " + action if action.isdigit() else action)

    env = Listed()
    assert "guess" in action_candidates(env, env.reset(Task.make("train", 0)))
    words = collect_words(Listed, episodes=20)
    assert {"guess", "1", "8"} <= set(words)
