"""Data model: steps, episodes, the columnar rollout forest and token batches."""

from credo.data.batch import TokenBatch
from credo.data.episode import Episode, Step
from credo.data.forest import SOURCES, EpisodeIndex, ForestBuilder, RolloutForest
from credo.data.ops import hash_key

__all__ = [
    "SOURCES",
    "Episode",
    "EpisodeIndex",
    "ForestBuilder",
    "RolloutForest",
    "Step",
    "TokenBatch",
    "hash_key",
]
