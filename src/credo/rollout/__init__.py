"""Samplers and prompt rendering.

Samplers (``rollout.sampler``, registered in :mod:`credo.rollout.sampler`): ``group`` (G
episodes per task) and ``single`` (one per task), :mod:`credo.rollout.group`; ``tree``
(TSBPO trees, :mod:`credo.rollout.tree`); ``resample`` (AXPO tool-call resampling,
:mod:`credo.rollout.resample`). Oracle continuations (SERO, :mod:`credo.rollout.oracle`)
are an add-on on top of any of them (``rollout.oracle_horizon``).
"""

from credo.rollout.branch import DIVERGENCE_POLICIES, restore_runner, try_restore
from credo.rollout.group import (
    EpisodeRunner,
    ForcedPrefix,
    RolloutResult,
    Trajectory,
    episodes_to_forest,
    run_episodes,
    sample_groups,
    sample_single,
    start_runners,
    take_step,
    trajectories_to_forest,
)
from credo.rollout.merge import MergeParams, sample_merged
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
from credo.rollout.sampler import (
    SAMPLERS,
    SamplerContext,
    SamplerSpec,
    make_sampler_state,
    register_sampler,
    sample,
    sampler_names,
    sampler_params,
    sampler_spec,
)
from credo.rollout.tree import LikelihoodAllocator, TreeParams, sample_trees

__all__ = [
    "DIVERGENCE_POLICIES",
    "ORACLE_STARTS",
    "SAMPLERS",
    "ChatRenderer",
    "EpisodeRunner",
    "ForcedPrefix",
    "LikelihoodAllocator",
    "MergeParams",
    "OracleBatch",
    "PlainRenderer",
    "Renderer",
    "ResampleParams",
    "RolloutResult",
    "SamplerContext",
    "SamplerSpec",
    "Trajectory",
    "TreeParams",
    "Turn",
    "add_oracle_continuations",
    "episodes_to_forest",
    "make_renderer",
    "make_sampler_state",
    "oracle_batch",
    "oracle_chains",
    "register_sampler",
    "restore_runner",
    "run_episodes",
    "sample",
    "sample_groups",
    "sample_merged",
    "sample_resampled",
    "sample_single",
    "sample_trees",
    "sampler_names",
    "sampler_params",
    "sampler_spec",
    "split_oracle",
    "start_runners",
    "take_step",
    "trajectories_to_forest",
    "try_restore",
]
