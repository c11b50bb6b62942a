"""Held-out evaluation: success over N episodes of N distinct held-out tasks."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from credo.envs.base import Task
from credo.policy.base import Policy, SamplingParams
from credo.rollout.envguard import env_phase
from credo.rollout.group import sample_groups
from credo.rollout.render import Renderer
from credo.rollout.sampler import SamplerContext

__all__ = ["EvalResult", "evaluate", "wilson_interval"]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class EvalResult:
    """Held-out metrics.

    Attributes:
        episodes: number of episodes (one per held-out task).
        success_rate: fraction solved.
        ci_low, ci_high: 95 % Wilson interval of the success rate.
        mean_return: mean episode return.
        invalid_rate: fraction of steps whose action the env rejected.
        mean_turns: mean episode length.
        errors: episodes that failed because the env raised, hung or returned a value of
            the wrong type (each one is also written to the run's ``env_errors.jsonl``
            under ``credo train``).
        first_error: the first such episode's error (task and the env's own message), or
            ``None``.
    """

    episodes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_return: float
    invalid_rate: float
    mean_turns: float
    errors: int
    first_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(
    policy: Policy,
    renderer: Renderer,
    make_env: Callable[[], Any],
    *,
    episodes: int,
    sampling: SamplingParams,
    max_turns: int,
    split: str = "test",
    seed: int = 0,
    chunk: int = 256,
    first_task: int = 0,
) -> EvalResult:
    """Run one episode on each of ``episodes`` tasks of ``split`` and report metrics.

    Tasks are ``Task.make(split, first_task + i)``: the same tasks for every policy, so
    two policies are compared on identical held-out tasks. Sampling uses its own seeded
    generator, so an evaluation does not disturb the training RNG streams. An env that
    raises or hangs fails its episode (counted in ``errors``, recorded with phase
    ``eval``); a non-finite reward stops the evaluation
    (:class:`~credo.rollout.envguard.EnvFailure`).
    """
    ctx = SamplerContext(
        policy, renderer, make_env, sampling, max_turns, torch.Generator().manual_seed(seed)
    )
    eps = []
    steps = invalid = 0
    for start in range(0, episodes, chunk):
        tasks = [
            Task.make(split, first_task + i) for i in range(start, min(episodes, start + chunk))
        ]
        with env_phase("eval"):
            res = sample_groups(ctx, tasks, group_size=1)
        eps.extend(res.episodes)
        steps += res.env_steps
        invalid += int((~res.forest.valid).sum()) if res.forest.num_rows else 0
    wins = sum(e.success for e in eps)
    failed = [e for e in eps if e.error is not None]
    lo, hi = wilson_interval(wins, len(eps))
    return EvalResult(
        episodes=len(eps),
        success_rate=wins / max(1, len(eps)),
        ci_low=lo,
        ci_high=hi,
        mean_return=sum(e.ret for e in eps) / max(1, len(eps)),
        invalid_rate=invalid / max(1, steps),
        mean_turns=steps / max(1, len(eps)),
        errors=len(failed),
        first_error=f"task {failed[0].task_id}: {failed[0].error}" if failed else None,
    )
