"""The ``judge`` section's check (SERPO, :mod:`credo.teachers.judging`), at config load."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from credo.envs.base import make_env, resolve_env
from credo.teachers.rubric import COMBINE_MODES, PROPOSERS, Rubric
from credo.utils.registry import check_kwargs

#: What the judge may read beside the free text (``judge.context``; the transcript is
#: :func:`credo.teachers.judging.episode_transcript`).
CONTEXTS = ("instruction", "transcript")
#: What files a response as good, neutral or bad (``judge.pool_by``).
POOL_BY = ("env", "rubric", "rank")

__all__ = ["check_judge_config"]


def check_judge_config(cfg: Any, machine: bool = True) -> str | None:
    """One line naming what is wrong with the ``judge`` section (``None``: nothing).

    Checks the names and ranges, that a judge folder exists, that the rubric file loads,
    and that the env offers free text (``free_text(action)``, and ``offers_free_text()``
    true where it has it: the ``tools`` env needs ``env.kwargs.closing=respond``).
    With ``machine=False`` (a config read, not run here: a study's index) a judge folder
    and a rubric file this machine does not have are not asked for (a rubric that is
    there still loads).
    """
    j = cfg.judge
    if not j.enabled:
        return None
    local = j.model != "builtin" and j.model.startswith((".", "/", "~"))
    if local and machine and not Path(j.model).expanduser().exists():
        return (
            f"judge.model={j.model!r}: no such folder (fit and save a judge with "
            "benchmarks/serpo_agreement.py --fit-steps N --save DIR)"
        )
    if j.rubric is not None and (machine or Path(j.rubric).expanduser().exists()):
        try:
            Rubric.load(j.rubric)
        except ValueError as e:
            return f"judge.rubric: {e}"
    if j.combine not in COMBINE_MODES:
        return f"judge.combine must be one of {', '.join(COMBINE_MODES)}, got {j.combine!r}"
    if j.context not in CONTEXTS:
        return f"judge.context must be one of {', '.join(CONTEXTS)}, got {j.context!r}"
    if not math.isfinite(j.coef) or j.coef < 0:
        return f"judge.coef must be a finite number ≥ 0, got {j.coef}"
    if j.combine == "mix" and j.coef > 1:
        return f"judge.combine=mix needs judge.coef in [0, 1], got {j.coef}"
    for key, low in (("micro_batch", 1), ("evolve_every", 0), ("evolve_tasks", 1),
                     ("max_items", 1), ("pool_size", 1)):  # fmt: skip
        if getattr(j, key) < low:
            return f"judge.{key} must be ≥ {low}, got {getattr(j, key)}"
    if j.proposer not in PROPOSERS:
        return f"judge.proposer must be one of {', '.join(PROPOSERS.names())}, got {j.proposer!r}"
    try:
        check_kwargs("rubric proposer", j.proposer, PROPOSERS.get(j.proposer),
                     j.proposer_params, reserved=("rubric", "good", "bad", "judge"))  # fmt: skip
    except ValueError as e:
        return f"judge.proposer_params: {e}"
    if j.pool_by not in POOL_BY:
        return f"judge.pool_by must be one of {', '.join(POOL_BY)}, got {j.pool_by!r}"
    if j.pool_bad > j.pool_good:
        return f"judge.pool_bad ({j.pool_bad}) must be ≤ judge.pool_good ({j.pool_good})"
    try:
        env_cls = resolve_env(cfg.env.name)
    except Exception:
        return None
    if not hasattr(env_cls, "free_text"):
        return (
            f"judge.model is set but env {cfg.env.name!r} has no free text to judge (no "
            "free_text(action) method): use env.name=tools with env.kwargs.closing=respond"
        )
    try:
        env = make_env(cfg.env.name, **cfg.env.kwargs)
    except Exception:
        return None
    offers = getattr(env, "offers_free_text", None)
    if offers is not None and not offers():
        return (
            f"judge.model is set but env {cfg.env.name!r} with kwargs {dict(cfg.env.kwargs)} "
            "closes without free text: set env.kwargs.closing=respond"
        )
    return None
