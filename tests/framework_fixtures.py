"""The world of tests/test_agent_frameworks.py: an env on which an untrained model's
episodes get graded, different rewards.

The examples trained there (``examples/agents_sdk_agent.py``, ``examples/langgraph_agent.py``)
return the env's own return, unchanged; on ``shop`` or ``GuessEnv`` the built-in model
before any training earns 0 in nearly every episode, so every advantage would be 0 and a
short run could not show a learning signal. :class:`SayEnv` pays each reply by the share
of its words that are ``yes``, which differs between almost any two samples.
"""

from __future__ import annotations

from typing import Any

from credo.envs import StepResult


class SayEnv:
    """Two turns of "say yes". Each turn pays half the share of the reply's words that are
    ``yes`` (so an episode's return is in [0, 1]); success is a return of 1."""

    max_turns = 2

    def reset(self, task: Any, seed: int = 0) -> str:
        self.turn, self.total = 0, 0.0
        return "say yes"

    def instruction(self) -> str:
        return "say yes"

    def step(self, action: str) -> StepResult:
        self.turn += 1
        words = action.split()
        pay = 0.5 * (words.count("yes") / len(words) if words else 0.0)
        self.total += pay
        done = self.turn >= self.max_turns
        info = {"valid": True, "success": done and self.total == 1.0}
        return StepResult(f"turn {self.turn}", pay, done, info)

    def state_key(self) -> str:
        return f"turn-{self.turn}"

    def snapshot(self) -> tuple[int, float]:
        return self.turn, self.total

    def restore(self, snap: tuple[int, float]) -> None:
        self.turn, self.total = snap

    def oracle_action(self) -> str:
        return "yes"

    def vocabulary(self) -> list[str]:
        return ["say", "yes", "no", "turn", "1", "2"]
