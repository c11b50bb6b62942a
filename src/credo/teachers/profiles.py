"""RAPO in training: the reference scored with and without the task's profile.

RAPO (Xu et al. 2026, https://arxiv.org/abs/2606.27025; ``docs/rewards.md#rapo``,
:mod:`credo.objectives.rapo`) weighs each response token by how much the user's profile
explains it under a frozen reference::

    m_t = log π_ref(y_t | profile, x, y<t) − log π_ref(y_t | x, y<t)

An env whose tasks carry a profile (``provides_profiles()`` true; ``profile()`` the
current task's text, found verbatim in its ``instruction()``, and offered as
``privileged_context("profile")``; the ``tools`` env with ``profiles=true``) lets the
trainer compute both terms: the sampler records each step's goal and profile
(:data:`PROFILE_TEXTS`, the texts RAPO's part in the trainer declares), the policy's own
prompt is the profile-conditioned one, and the plain prompt is the same state re-rendered
with the profile cut out of the goal
(:func:`plain_instruction`, :func:`plain_prompts`). :func:`attach_profile_reference`
scores the iteration's rows with the reference under both prompts and attaches them to
the token batch as ``ref_logprobs_profile`` / ``ref_logprobs_plain`` ``[B, L]``, with
the whole iteration's ``(min, max)`` of ``m`` as ``rapo_range`` (``[B, L, 2]``, the same
pair everywhere, so every micro-batch scales ``m`` alike); the update hands them to
``ppo_rapo`` (:func:`credo.objectives.rapo.rapo_extras`).

A loss that needs profiles (``env_features=("profiles",)``: ``ppo_rapo``) with an env
that offers none is refused at config load, in one line
(:func:`credo.train.config.env_features.env_feature_problem`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from credo.data import RolloutForest, TokenBatch
from credo.objectives.rapo import rapo_signal_range
from credo.policy import HFPolicy
from credo.teachers import TeacherRows, score_with_policy
from credo.teachers.teaching import row_histories

__all__ = [
    "PROFILE_TEXTS",
    "attach_profile_reference",
    "plain_instruction",
    "plain_prompts",
]

#: The per-step texts the sampler records for RAPO.
PROFILE_TEXTS = ("instruction", "profile")


_SEPARATORS = " ;,"


def plain_instruction(instruction: str, profile: str) -> str:
    """``instruction`` with the profile cut out (the separators left at the cut and
    doubled spaces removed); unchanged when the profile is empty or absent.

    >>> plain_instruction("refund my kettle ; profile : likes red", "profile : likes red")
    'refund my kettle'
    """
    if not profile or profile not in instruction:
        return instruction
    head, _, tail = instruction.partition(profile)
    head, tail = head.rstrip(_SEPARATORS), tail.lstrip(_SEPARATORS)
    joined = f"{head} ; {tail}" if head and tail else head or tail
    return re.sub(r"\s+", " ", joined).strip()


def plain_prompts(renderer: Any, forest: RolloutForest) -> list[list[int] | None]:
    """Per row, the prompt without the profile (``None`` where the row's goal holds no
    profile: its own prompt is the plain one).

    Args:
        renderer: the policy's renderer (``prompt_ids(instruction, history, observation)``).
        forest: the rows, with ``texts["instruction"]`` and ``texts["profile"]``.
    """
    missing = [n for n in PROFILE_TEXTS if n not in forest.texts]
    if missing:
        raise ValueError(
            f"RAPO needs the rollouts' {' and '.join(missing)} per step: the sampler records "
            "them when SamplerContext.texts holds them (the run's parts declare them)"
        )
    out: list[list[int] | None] = []
    for instr, prof, hist, obs in zip(
        forest.texts["instruction"],
        forest.texts["profile"],
        row_histories(forest),
        forest.observations,
    ):
        plain = plain_instruction(instr, prof)
        out.append(None if plain == instr else list(renderer.prompt_ids(plain, hist, obs)))
    return out


def attach_profile_reference(
    reference: HFPolicy,
    renderer: Any,
    forest: RolloutForest,
    batch: TokenBatch,
    *,
    micro_batch: int = 16,
) -> dict[str, float]:
    """Score ``batch``'s rows with ``reference`` with and without the profile and attach
    ``ref_logprobs_profile``, ``ref_logprobs_plain`` (``[B, L]``) and ``rapo_range``
    (``[B, L, 2]``) to ``batch.token_extras`` (in place).

    Args:
        reference: the frozen reference policy π_ref.
        renderer: the policy's renderer (the plain prompts).
        forest: the iteration's policy rows, in ``batch``'s row order.
        batch: ``forest.to_batch(...)``.
        micro_batch: rows per reference forward pass.

    Returns:
        ``rapo/*`` metrics: ``profile_rows`` (share of rows whose prompt had a profile),
        ``signal_mean`` (mean raw ``m_t`` over loss tokens), ``signal_min`` /
        ``signal_max`` (the range) and ``seconds``.
    """
    t0 = time.perf_counter()
    prompts = plain_prompts(renderer, forest)
    with_profile = score_with_policy(
        reference, TeacherRows.from_batch(batch), micro_batch=micro_batch
    ).logprobs.float()
    plain = score_with_policy(
        reference, TeacherRows.from_batch(batch, prompts), micro_batch=micro_batch
    ).logprobs.float()
    mask = batch.loss_mask
    rng = rapo_signal_range(with_profile, plain, mask)
    batch.token_extras["ref_logprobs_profile"] = with_profile
    batch.token_extras["ref_logprobs_plain"] = plain
    batch.token_extras["rapo_range"] = rng.reshape(1, 1, 2).expand(*mask.shape, 2).clone()
    n = int(mask.sum())
    diff = (with_profile - plain)[mask]
    return {
        "rapo/profile_rows": _share([p is not None for p in prompts]),
        "rapo/signal_mean": float(diff.sum()) / max(1, n),
        "rapo/signal_min": float(rng[0]),
        "rapo/signal_max": float(rng[1]),
        "rapo/seconds": time.perf_counter() - t0,
    }


def _share(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0
