"""Picks the sampler named in ``rollout.sampler`` and calls it with the config's knobs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from credo.envs.base import Task
from credo.policy.base import Policy, SamplingParams
from credo.rollout import RolloutResult, sample_groups
from credo.rollout.render import Renderer
from credo.train.config import Config

__all__ = ["sample_rollouts"]


def sample_rollouts(
    cfg: Config,
    policy: Policy,
    renderer: Renderer,
    make_env: Callable[[], Any],
    tasks: Sequence[Task],
    *,
    sampling: SamplingParams,
    max_turns: int,
    generator: torch.Generator,
) -> RolloutResult:
    """One iteration's rollouts with the configured sampler."""
    r = cfg.rollout
    if r.sampler in ("group", "single"):
        return sample_groups(
            policy,
            renderer,
            make_env,
            tasks,
            group_size=1 if r.sampler == "single" else r.group_size,
            sampling=sampling,
            max_turns=max_turns,
            generator=generator,
            invalid_penalty=r.invalid_penalty,
        )
    raise ValueError(f"sampler {r.sampler!r} is not wired into the trainer")
