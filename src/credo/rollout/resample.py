"""Resample sampler for AXPO: re-sample the tool calls of all-failed groups. [page; recon]

AXPO (Kang et al. 2026, https://arxiv.org/abs/2605.28774; docs/algorithms.md#axpo) targets
*tool collapse*: many groups that use tools fail entirely and give GRPO no signal. After
an ordinary group rollout (:func:`~credo.rollout.group.sample_groups`, G episodes per
task), for every **all-failed** group (no episode succeeded) that has **tool-call steps**
(actions for which the env's ``is_tool_call(action)`` is true; ``shop``: ``search[...]``):

1. each tool-call step gets a confidence: the mean token probability of its tool-call
   tokens, mean_j exp(log q_j) over the response tokens after any kept thinking;
2. the steps are ranked by confidence, lowest first, over all such groups, taking at most
   ``max_points_per_group`` steps per group, and each chosen step gets ``per_point``
   resamples until the budget of ⌊``budget`` · (number of episodes)⌋ extra episodes
   (default +25 %) is spent (the last chosen step may get fewer);
3. each resample restores the env at the chosen step (the snapshot before it; see
   :mod:`credo.rollout.branch`), keeps the episode's prefix and — with
   ``keep_thinking`` — the step's thinking (the response tokens up to the last
   ``think_end``, e.g. ``</think>``, which are given to the policy as the start of its
   response), and samples the tool call and everything after it.

In the forest the resampled steps are rows with ``source="resample"``, hanging under
the last kept row of the original episode (−1 when step 0 was resampled): the shape
:func:`credo.credit.axpo.axpo` reads (each resampled set, i.e. the resamples of one
step, is its own advantage partition; the prefix gets the recovery reward). Groups with
any success, and groups without tool calls, are left exactly as sampled. All resamples
of an iteration advance together, one batched ``generate`` call per turn.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from credo.data import Step
from credo.envs.base import Task
from credo.rollout.branch import try_restore
from credo.rollout.group import (
    ForcedPrefix,
    RolloutResult,
    Trajectory,
    run_episodes,
    sample_groups,
    trajectories_to_forest,
)
from credo.rollout.sampler import SamplerContext, register_sampler

__all__ = [
    "ResampleParams",
    "action_confidence",
    "resample_points",
    "sample_resampled",
    "thinking_length",
]


@dataclass
class ResampleParams:
    """Knobs of the resample sampler (``rollout.sampler_params`` with ``sampler:
    resample``). G is ``rollout.group_size``.

    Attributes:
        budget: extra episodes as a share of the iteration's episodes, ⌊budget · n⌋
            (default 0.25, AXPO's +25 %; 0 turns resampling off).
        per_point: resamples of each chosen tool-call step (default 2: a resampled set
            with a baseline of its own).
        max_points_per_group: most tool-call steps resampled per group (default 4).
        keep_thinking: keep the chosen step's thinking and re-sample only what follows
            (default true; a response without ``think_end`` has no thinking).
        think_end: the text that closes the thinking (default ``"</think>"``).
    """

    budget: float = 0.25
    per_point: int = 2
    max_points_per_group: int = 4
    keep_thinking: bool = True
    think_end: str = "</think>"

    def __post_init__(self) -> None:
        if not 0 <= self.budget <= 10:
            raise ValueError(f"resample budget must be in [0, 10], got {self.budget}")
        if self.per_point < 1:
            raise ValueError(f"resample per_point must be ≥ 1, got {self.per_point}")
        if self.max_points_per_group < 1:
            raise ValueError(
                f"resample max_points_per_group must be ≥ 1, got {self.max_points_per_group}"
            )
        if self.keep_thinking and not self.think_end:
            raise ValueError("resample think_end must be a non-empty string")


def thinking_length(step: Step, tokenizer: Any, think_end: str) -> int:
    """Number of leading response tokens of ``step`` up to and including its last
    ``think_end`` (0 when the decoded response has none)."""
    ids = step.response_ids
    text = tokenizer.decode(ids, skip_special_tokens=False)
    count = text.count(think_end)
    if count == 0:
        return 0
    for j in range(1, len(ids) + 1):
        if tokenizer.decode(ids[:j], skip_special_tokens=False).count(think_end) >= count:
            return j
    return 0


def action_confidence(step: Step, skip: int = 0) -> float:
    """Mean token probability mean_j exp(log q_j) of ``step``'s response tokens after the
    first ``skip`` (the kept thinking); 1.0 for a step without such tokens."""
    lp = torch.as_tensor(step.logprobs[skip:], dtype=torch.float64)
    return float(lp.exp().mean()) if lp.numel() else 1.0


def resample_points(
    group: torch.Tensor,
    confidence: torch.Tensor,
    *,
    budget: int,
    per_point: int,
    max_points_per_group: int,
) -> torch.Tensor:
    """How many resamples each candidate step gets → ``[P]`` int64.

    Candidates are ranked by ``confidence`` (lowest first; ties by index); a candidate
    beyond the first ``max_points_per_group`` of its group gets 0; the others, in rank
    order, get ``per_point`` each until ``budget`` is spent (the last one may get
    fewer). The counts sum to min(budget, per_point · allowed candidates).

    Args:
        group: ``[P]`` group id of each candidate.
        confidence: ``[P]`` its confidence.
        budget: resamples to spend (≥ 0).
        per_point: resamples per chosen candidate.
        max_points_per_group: candidates allowed per group.
    """
    p = confidence.numel()
    if p == 0:
        return torch.zeros(0, dtype=torch.long)
    order = torch.argsort(confidence.to(torch.float64), stable=True)
    g_sorted = group[order]
    by_group = torch.argsort(g_sorted, stable=True)  # keeps the confidence order inside
    gs = g_sorted[by_group]
    pos = torch.arange(p)
    is_start = torch.ones(p, dtype=torch.bool)
    is_start[1:] = gs[1:] != gs[:-1]
    first = torch.cummax(torch.where(is_start, pos, torch.zeros_like(pos)), 0).values
    rank = torch.empty(p, dtype=torch.long)
    rank[by_group] = pos - first  # rank within the group, in confidence order
    allowed = (rank < max_points_per_group).to(torch.long)
    before = torch.cumsum(per_point * allowed, 0) - per_point * allowed
    counts_sorted = (budget - before).clamp(min=0, max=per_point) * allowed
    counts = torch.empty(p, dtype=torch.long)
    counts[order] = counts_sorted
    return counts


@register_sampler("resample", params=ResampleParams, branches=True)
def sample_resampled(
    ctx: SamplerContext,
    tasks: Sequence[Task],
    *,
    group_size: int,
    params: ResampleParams | None = None,
    state: None = None,
) -> RolloutResult:
    """Group rollouts plus AXPO tool-call resamples (see the module docstring).

    Args:
        ctx: policy, renderer, env factory, sampling, turn cap (of every path, counted
            from its root) and the policy's RNG (the original episodes are the ones
            :func:`~credo.rollout.group.sample_groups` draws with it).
        tasks: the tasks; task ``i`` is group ``i``.
        group_size: G, the original episodes per task.
        params: the knobs (default :class:`ResampleParams` ()).
        state: unused (the resample sampler keeps no state).

    Returns:
        The forest of originals and resamples; ``episodes`` lists both (originals
        first). ``stats``: ``rollout/resample_groups`` (all-failed groups with a tool
        call), ``rollout/resample_points`` (steps resampled), ``rollout/resampled``
        (resample episodes), ``rollout/resample_recovered`` (of them, successes) and
        ``rollout/resample_confidence`` (mean confidence of the chosen steps).
    """
    params = params or ResampleParams()
    start = time.perf_counter()
    base = sample_groups(
        dataclasses.replace(ctx, keep_snapshots=True), tasks, group_size=group_size
    )
    trajectories = list(base.trajectories)
    stats: dict[str, float] = {}
    failed_groups = set(range(len(tasks))) - {
        tr.episode.group for tr in trajectories if tr.episode.success
    }
    cand: list[tuple[int, int, int]] = []  # (trajectory, depth, thinking tokens)
    cand_group: list[int] = []
    cand_conf: list[float] = []
    for k, tr in enumerate(trajectories):
        env = tr.runner.env if tr.runner is not None else None
        if tr.episode.group not in failed_groups or not hasattr(env, "is_tool_call"):
            continue
        for depth, step in enumerate(tr.episode.steps):
            if not env.is_tool_call(step.action):
                continue
            think = (
                thinking_length(step, ctx.policy.tokenizer, params.think_end)
                if params.keep_thinking
                else 0
            )
            cand.append((k, depth, think))
            cand_group.append(tr.episode.group)
            cand_conf.append(action_confidence(step, think))
    counts = resample_points(
        torch.tensor(cand_group, dtype=torch.long),
        torch.tensor(cand_conf, dtype=torch.float64),
        budget=math.floor(params.budget * len(base.episodes)),
        per_point=params.per_point,
        max_points_per_group=params.max_points_per_group,
    )
    runners = []
    chosen_conf = []
    for (k, depth, think), c, conf in zip(cand, counts.tolist(), cand_conf):
        if c == 0:
            continue
        chosen_conf.append(conf)
        step = trajectories[k].episode.steps[depth]
        for _ in range(c):
            runner = try_restore(
                ctx.make_env,
                trajectories[k],
                depth,
                on_divergence=ctx.on_divergence,
                stats=stats,
                env_seed=ctx.env_seed,
                source="resample",
            )
            if runner is None:
                continue
            if think:
                runner.forced = ForcedPrefix(
                    list(step.response_ids[:think]),
                    list(step.logprobs[:think]),
                    {k2: v[:think] for k2, v in step.token_data.items()},
                )
            trajectories.append(Trajectory(runner.episode, k, depth, runner))
            runners.append(runner)
    env_steps, tokens = run_episodes(runners, ctx)
    stats["rollout/resample_groups"] = float(len({cand_group[i] for i in range(len(cand))}))
    stats["rollout/resample_points"] = float(len(chosen_conf))
    stats["rollout/resampled"] = float(len(runners))
    stats["rollout/resample_recovered"] = float(sum(r.episode.success for r in runners))
    stats["rollout/resample_confidence"] = sum(chosen_conf) / max(1, len(chosen_conf))
    return RolloutResult(
        forest=trajectories_to_forest(trajectories)[0],
        episodes=[tr.episode for tr in trajectories],
        env_steps=base.env_steps + env_steps,
        generated_tokens=base.generated_tokens + tokens,
        seconds=time.perf_counter() - start,
        stats=stats,
        trajectories=trajectories,
    )
