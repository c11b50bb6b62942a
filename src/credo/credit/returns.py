"""Raw episode return as the advantage: A = R, no baseline (REINFORCE).

KLPO (``docs/algorithms.md#klpo``) regresses on the sequence reward R itself: its loss needs no
group centring, no std scaling and no critic, so the trainer passes R unchanged. Every
row of an episode gets the episode's return (a row shared by several episodes, in a
tree, gets their mean). [code]
"""

from __future__ import annotations

import torch

from credo.credit.registry import register_estimator
from credo.data import RolloutForest

__all__ = ["episode_return"]


@register_estimator("return")
def episode_return(forest: RolloutForest) -> torch.Tensor:
    """``A = R`` broadcast to each episode's rows → ``[N]``."""
    return forest.episode_values_to_rows(forest.episodes().ret).to(torch.float32)
