"""Picks the sampler named in ``rollout.sampler`` and calls it with the config's knobs.

``group``/``single`` → :func:`~credo.rollout.sample_groups`; ``tree`` →
:func:`~credo.rollout.sample_trees`; ``resample`` → :func:`~credo.rollout.
sample_resampled`. With ``rollout.oracle_horizon`` > 0, SERO's oracle continuations are
added on top of whichever sampler ran (:func:`~credo.rollout.add_oracle_continuations`).

A sampler that learns across iterations keeps a *sampler state* (the tree sampler's
likelihood allocator): :func:`make_sampler_state` builds it, the trainer passes it to
every :func:`sample_rollouts` call and saves its ``state_dict()`` in checkpoints, as it
does the estimator's state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from credo.envs.base import Task
from credo.policy.base import Policy, SamplingParams
from credo.rollout import (
    LikelihoodAllocator,
    RolloutResult,
    add_oracle_continuations,
    sample_groups,
    sample_resampled,
    sample_trees,
    sampler_params,
)
from credo.rollout.render import Renderer
from credo.train.config import Config

__all__ = ["make_sampler_state", "sample_rollouts"]


def make_sampler_state(cfg: Config) -> Any | None:
    """The configured sampler's state across iterations, or ``None`` if it keeps none.

    ``tree`` with the ``likelihood`` allocator: a :class:`~credo.rollout.
    LikelihoodAllocator` with the config's ``fit_decay`` and ``fit_l2``.
    """
    params = sampler_params(cfg.rollout.sampler, cfg.rollout.sampler_params)
    if cfg.rollout.sampler == "tree" and params.allocator == "likelihood":
        return LikelihoodAllocator(params.fit_decay, params.fit_l2)
    return None


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
    state: Any = None,
    choice_seed: int = 0,
) -> RolloutResult:
    """One iteration's rollouts with the configured sampler.

    Args:
        cfg: the run config.
        policy: samples the actions.
        renderer: builds prompts and parses actions.
        make_env: creates a fresh env.
        tasks: this iteration's tasks.
        sampling: sampling parameters.
        max_turns: the turn cap.
        generator: the policy's sampling RNG.
        state: the sampler state from :func:`make_sampler_state` (updated in place).
        choice_seed: seed of the samplers' own random choices (branch nodes, oracle
            start states), kept apart from ``generator`` so that an add-on never changes
            the policy's samples.
    """
    r = cfg.rollout
    params = sampler_params(r.sampler, r.sampler_params)
    oracle = r.oracle_horizon > 0
    choices = torch.Generator().manual_seed(choice_seed)
    common = dict(
        sampling=sampling,
        max_turns=max_turns,
        generator=generator,
        invalid_penalty=r.invalid_penalty,
    )
    if r.sampler in ("group", "single"):
        result = sample_groups(
            policy,
            renderer,
            make_env,
            tasks,
            group_size=1 if r.sampler == "single" else r.group_size,
            keep_snapshots=oracle,
            **common,
        )
    elif r.sampler == "tree":
        result = sample_trees(
            policy,
            renderer,
            make_env,
            tasks,
            budget=r.group_size,
            params=params,
            state=state,
            choice_generator=choices,
            on_divergence=r.on_restore_divergence,
            **common,
        )
    elif r.sampler == "resample":
        result = sample_resampled(
            policy,
            renderer,
            make_env,
            tasks,
            group_size=r.group_size,
            params=params,
            on_divergence=r.on_restore_divergence,
            **common,
        )
    else:
        raise ValueError(f"sampler {r.sampler!r} is not wired into the trainer")
    if oracle:
        result = add_oracle_continuations(
            result,
            make_env,
            renderer,
            horizon=r.oracle_horizon,
            per_group=r.oracle_per_group,
            start=r.oracle_start,
            max_turns=max_turns,
            generator=choices,
            on_divergence=r.on_restore_divergence,
        )
    return result
