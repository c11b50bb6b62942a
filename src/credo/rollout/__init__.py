"""Samplers and prompt rendering.

Samplers (``rollout.sampler``): ``group`` (G episodes per task), ``single`` (one per
task), ``tree`` (TSBPO trees, :mod:`credo.rollout.tree`), ``resample`` (AXPO tool-call
resampling, :mod:`credo.rollout.resample`). Oracle continuations (SERO,
:mod:`credo.rollout.oracle`) are an add-on on top of any of them
(``rollout.oracle_horizon``).
"""

from typing import Any

from credo.rollout.branch import DIVERGENCE_POLICIES, restore_runner, try_restore
from credo.rollout.group import (
    EpisodeRunner,
    ForcedPrefix,
    RolloutResult,
    Trajectory,
    episodes_to_forest,
    run_episodes,
    sample_groups,
    start_runners,
    take_step,
    trajectories_to_forest,
)
from credo.rollout.oracle import (
    ORACLE_STARTS,
    OracleBatch,
    add_oracle_continuations,
    oracle_batch,
    oracle_chains,
    split_oracle,
)
from credo.rollout.render import ChatRenderer, PlainRenderer, Renderer, Turn, make_renderer
from credo.rollout.resample import ResampleParams, sample_resampled
from credo.rollout.tree import LikelihoodAllocator, TreeParams, sample_trees

#: Sampler names accepted by ``rollout.sampler``.
SAMPLERS: tuple[str, ...] = ("group", "single", "tree", "resample")

#: The knobs class of each sampler that has ``rollout.sampler_params``.
SAMPLER_PARAMS: dict[str, type] = {"tree": TreeParams, "resample": ResampleParams}


def sampler_params(name: str, params: dict[str, Any]) -> Any:
    """``rollout.sampler_params`` → the sampler's knobs object (``None`` for samplers
    without knobs). Raises ``ValueError`` naming the bad key or value and the accepted
    keys."""
    import dataclasses

    cls = SAMPLER_PARAMS.get(name)
    if cls is None:
        if params:
            raise ValueError(f"sampler {name!r} has no sampler_params; got {sorted(params)}")
        return None
    fields = [f.name for f in dataclasses.fields(cls)]
    bad = [k for k in params if k not in fields]
    if bad:
        raise ValueError(
            f"sampler {name!r} has no parameter(s) {', '.join(map(repr, bad))}. "
            f"Accepted: {', '.join(fields)}"
        )
    return cls(**params)


__all__ = [
    "DIVERGENCE_POLICIES",
    "ORACLE_STARTS",
    "SAMPLERS",
    "SAMPLER_PARAMS",
    "ChatRenderer",
    "EpisodeRunner",
    "ForcedPrefix",
    "LikelihoodAllocator",
    "OracleBatch",
    "PlainRenderer",
    "Renderer",
    "ResampleParams",
    "RolloutResult",
    "Trajectory",
    "TreeParams",
    "Turn",
    "add_oracle_continuations",
    "episodes_to_forest",
    "make_renderer",
    "oracle_batch",
    "oracle_chains",
    "restore_runner",
    "run_episodes",
    "sample_groups",
    "sample_resampled",
    "sample_trees",
    "sampler_params",
    "split_oracle",
    "start_runners",
    "take_step",
    "trajectories_to_forest",
    "try_restore",
]
