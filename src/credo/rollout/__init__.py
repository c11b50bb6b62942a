"""Samplers and prompt rendering."""

from credo.rollout.group import (
    EpisodeRunner,
    RolloutResult,
    episodes_to_forest,
    run_episodes,
    sample_groups,
)
from credo.rollout.render import ChatRenderer, PlainRenderer, Renderer, Turn, make_renderer

#: Sampler names accepted by ``rollout.sampler``.
SAMPLERS: tuple[str, ...] = ("group", "single")

__all__ = [
    "SAMPLERS",
    "ChatRenderer",
    "EpisodeRunner",
    "PlainRenderer",
    "Renderer",
    "RolloutResult",
    "Turn",
    "episodes_to_forest",
    "make_renderer",
    "run_episodes",
    "sample_groups",
]
