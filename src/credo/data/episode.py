"""Plain-Python records of what happened in an episode: :class:`Step` and :class:`Episode`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Episode", "Step"]


@dataclass
class Step:
    """One turn: the action taken on an observation, and what the env answered.

    Attributes:
        observation: the raw observation the action was taken on (no history).
        action: the action text as parsed from the response (the decoded response if
            it could not be parsed).
        reward: immediate reward of this step.
        terminal: the env ended the episode after this step.
        valid: the env could parse and execute the action.
        state: canonical state key (``Env.state_key()`` before the action), as a string
            or already hashed to int64.
        next_state: key of the state the action led to.
        source: ``"policy"``, ``"oracle"`` or ``"resample"``.
        prompt_ids: token ids the policy saw.
        response_ids: token ids it produced (including the end-of-action token).
        logprobs: the sampler's log-probability of each response token.
        info: anything else the env or sampler reported (JSON-able).
        token_data: per-response-token tensors (first dimension = ``len(response_ids)``),
            e.g. KLPO's auxiliary tokens ``aux_ids [n, M]``; they travel to the token batch.
        texts: named strings about the state the action was taken in, recorded when a
            teacher needs them (``instruction``: the goal shown; a privileged kind such
            as ``oracle``: the env's privileged text); they travel to the forest.
    """

    observation: str
    action: str
    reward: float = 0.0
    terminal: bool = False
    valid: bool = True
    state: str | int = ""
    next_state: str | int = ""
    source: str = "policy"
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    token_data: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)


@dataclass
class Episode:
    """A root-to-leaf path of steps for one task instance.

    Attributes:
        group: id of the task instance (GRPO's prompt group) within an iteration.
        steps: the turns, first to last.
        task_id: the task's identifier (e.g. ``"shop/train/123"``).
        success: the task was fully solved.
        error: set when the env raised; the episode then counts as failed.
    """

    group: int
    steps: list[Step]
    task_id: str = ""
    success: bool = False
    error: str | None = None

    @property
    def ret(self) -> float:
        """R: the sum of the step rewards."""
        return float(sum(s.reward for s in self.steps))

    def __len__(self) -> int:
        return len(self.steps)
