"""MT-SDPO's teacher contexts as text: the verified trajectories each sample reads.

:func:`credo.objectives.candidate_contexts` marks, per sample (episode), the verified
rollouts of its group it may read (self-anchors), or, when its group has none, the
external contexts of its task (a pool teacher's or the student's earlier verified
trajectory, already sanitised); :func:`anchor_sets` turns those marks into the texts the
EMA teacher reads — a self-anchor's actions through a sanitiser
(:mod:`credo.teachers.sanitise`), at most ``limit`` per sample, in candidate order. The
trainer then renders each row's teacher prompts with
:func:`credo.teachers.privileged_prompts` (every row of an episode gets its episode's
texts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from credo.teachers.sanitise import sanitise

__all__ = ["anchor_sets"]


def anchor_sets(
    own: torch.Tensor,
    external_cand: torch.Tensor,
    episode_actions: Sequence[Sequence[str]],
    external: Sequence[str] = (),
    *,
    limit: int = 1,
    sanitiser: str = "none",
    **params: Any,
) -> list[list[str]]:
    """Per sample, the texts of its first ``limit`` candidate contexts (empty: none).

    Args:
        own: ``[N, N]`` bool, sample j's episode anchors sample i (self-anchors).
        external_cand: ``[N, M]`` bool, external context m is a candidate of sample i.
        episode_actions: per sample (the same N episodes), its actions in order.
        external: the M external contexts (texts, already sanitised).
        limit: contexts kept per sample (≥ 1; 1 is the first candidate alone).
        sanitiser: name of the sanitiser applied to self-anchors (default ``none``).
        **params: the sanitiser's knobs.

    A candidate whose sanitised text is empty gives no context (and is not replaced by
    the next one).
    """
    n = len(episode_actions)
    if own.shape != (n, n) or external_cand.dim() != 2 or external_cand.shape[0] != n:
        raise ValueError(
            f"anchor_sets: own must be [N, N] and external_cand [N, M] for N = {n} episodes, "
            f"got {list(own.shape)} and {list(external_cand.shape)}"
        )
    if external_cand.shape[1] != len(external):
        raise ValueError(
            f"anchor_sets: {external_cand.shape[1]} external candidates for "
            f"{len(external)} external contexts"
        )
    if limit < 1:
        raise ValueError(f"anchor_sets: limit must be >= 1, got {limit}")
    out: list[list[str]] = []
    for i in range(n):
        texts = [sanitise(sanitiser, episode_actions[j], **params) for j in _true(own[i], limit)]
        texts += [external[m] for m in _true(external_cand[i], limit - len(texts))]
        out.append([t for t in texts if t])
    return out


def _true(row: torch.Tensor, k: int) -> list[int]:
    """The first ``k`` indices where ``row`` is true."""
    return row.nonzero().flatten()[: max(0, k)].tolist()
