"""MT-SDPO's teacher contexts as text: the chosen verified trajectory, sanitised.

:func:`credo.objectives.select_contexts` picks, per sample (episode), a self-anchor (a
verified rollout of its group) or an external context; :func:`anchor_texts` turns that
choice into the text the EMA teacher reads — the anchor episode's actions through a
sanitiser (:mod:`credo.teachers.sanitise`), or the external context as given (already
sanitised when it was cached). The trainer then renders each row's teacher prompt with
:func:`credo.teachers.privileged_prompts` (every row of an episode gets its episode's
text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from credo.teachers.sanitise import sanitise

__all__ = ["anchor_texts"]


def anchor_texts(
    source: torch.Tensor,
    index: torch.Tensor,
    episode_actions: Sequence[Sequence[str]],
    external: Sequence[str] = (),
    *,
    sanitiser: str = "none",
    **params: Any,
) -> list[str | None]:
    """Per sample, the teacher context text (``None``: no context).

    Args:
        source: ``[N]`` int64 from ``ContextChoice.source`` (0 none, 1 self, 2 external).
        index: ``[N]`` int64 from ``ContextChoice.index``.
        episode_actions: per sample (the same N episodes), its actions in order.
        external: the external contexts ``ContextChoice.index`` points into (texts).
        sanitiser: name of the sanitiser applied to self-anchors (default ``none``).
        **params: the sanitiser's knobs.
    """
    if source.shape != index.shape or source.dim() != 1:
        raise ValueError(
            f"anchor_texts: source and index must both be [N], got {list(source.shape)} and "
            f"{list(index.shape)}"
        )
    if len(episode_actions) != source.shape[0]:
        raise ValueError(
            f"anchor_texts: {len(episode_actions)} episodes for {source.shape[0]} samples"
        )
    out: list[str | None] = []
    for src, idx in zip(source.tolist(), index.tolist()):
        if src == 1:
            text = sanitise(sanitiser, episode_actions[idx], **params)
        elif src == 2:
            if not 0 <= idx < len(external):
                raise ValueError(
                    f"anchor_texts: external context {idx} does not exist ({len(external)} given)"
                )
            text = external[idx]
        elif src == 0:
            text = ""
        else:
            raise ValueError(f"anchor_texts: unknown source code {src}; valid: 0, 1, 2")
        out.append(text or None)
    return out
