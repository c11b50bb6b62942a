"""GraphPO's sampling: equivalent states merge *while sampling*, so that a shared suffix
is generated once (Sun et al. 2026, "GraphPO: Graph-based Policy Optimization for
Reasoning Models", https://arxiv.org/abs/2606.18954; docs/algorithms.md#graphpo).

``rollout.sampler: merge`` runs G episodes per task like the group sampler, one batched
generation per turn, and before each turn looks at where every live episode stands. An
episode that has reached, by a *different* path (another sequence of actions), an env
state that an earlier episode of its group already acted from (the same ``state_key``)
merges into it: it generates nothing more, and once the group is done its remaining
steps are copies of the steps the earlier episode took from that state (same prompts,
tokens, sampler log-probs and rewards; ``info["merged"]``), its outcome that episode's.
The rollouts form a DAG whose merged nodes are expanded once: the tokens and env steps
the followers would have spent are saved (``rollout/merged_tokens``,
``rollout/merged_steps``), and every path through the DAG is still an episode of the
group with its own return, so any estimator reads it (``graphpo`` merges the same
states for credit). Episodes on the same path (the same actions so far) are the same
node of a tree, not a merge: they go on independently, so the group keeps its G draws
at every node it reaches by one path.

An episode merges only into one that still generates its own steps (not into a follower),
so the merges never form a cycle, also in envs whose states repeat (``back``).
A copied suffix keeps the turn cap counted from the follower's root: cut at
``max_turns``, the follower fails unless the suffix ended within it. With
``min_depth`` (default 1) merges happen from that depth on. Needs no env snapshots; with
SERO's oracle continuations (which restart from a step's snapshot) it is refused.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from credo.envs.base import Task
from credo.rollout.group import (
    EpisodeRunner,
    RolloutResult,
    run_episodes,
    runners_result,
    start_runners,
)
from credo.rollout.sampler import SamplerContext, register_sampler

__all__ = ["MergeParams", "sample_merged"]


@dataclass
class MergeParams:
    """Knobs of the ``merge`` sampler (``rollout.sampler_params``).

    Attributes:
        min_depth: the fewest steps an episode has taken before it may merge (default 1;
            the root is every episode's shared start).
        depth: ``same`` (default): merge only episodes that reached the state after as
            many steps, since an env's own step limit (``max_episode_steps``, a turn count
            in its state) is seldom in its ``state_key`` and an episode arriving later would
            not have had the leader's turns left; ``any``: merge whatever the depth (the
            copied suffix is still cut at ``rollout.max_turns``), for envs whose future
            does not depend on the step count.
    """

    min_depth: int = 1
    depth: str = "same"

    def __post_init__(self) -> None:
        if isinstance(self.min_depth, bool) or not isinstance(self.min_depth, int):
            raise ValueError(f"min_depth must be an integer ≥ 1, got {self.min_depth!r}")
        if self.min_depth < 1:
            raise ValueError(f"min_depth must be an integer ≥ 1, got {self.min_depth}")
        if self.depth not in ("same", "any"):
            raise ValueError(f"depth must be same or any, got {self.depth!r}")


def _actions(r: EpisodeRunner) -> tuple[str, ...]:
    return tuple(s.action for s in r.episode.steps)


def _copy_suffix(
    follower: EpisodeRunner, leader: EpisodeRunner, at: int, max_turns: int
) -> tuple[int, int]:
    """Append ``leader``'s steps from index ``at`` to ``follower`` (cut at the turn cap);
    returns the steps and tokens copied."""
    suffix = leader.episode.steps[at:]
    room = max(0, max_turns - len(follower.episode.steps))
    copied = [dataclasses.replace(s, info={**s.info, "merged": True}) for s in suffix[:room]]
    follower.episode.steps.extend(copied)
    whole = len(copied) == len(suffix)
    follower.episode.success = leader.episode.success if whole else False
    follower.episode.error = leader.episode.error if whole else None
    return len(copied), sum(len(s.response_ids) for s in copied)


def _merge_problem(cfg: object) -> str | None:
    """The config check: no oracle continuations (they restart from step snapshots, which
    a merged episode's copied steps do not have)."""
    if getattr(getattr(cfg, "rollout", None), "oracle_horizon", 0) > 0:
        return (
            "rollout.sampler=merge: oracle continuations (rollout.oracle_horizon) restart "
            "from step snapshots, which merged episodes' copied steps do not have; set "
            "rollout.oracle_horizon=0 or use rollout.sampler=group"
        )
    return None


@register_sampler("merge", params=MergeParams, check=_merge_problem)
def sample_merged(
    ctx: SamplerContext,
    tasks: Sequence[Task],
    *,
    group_size: int,
    params: MergeParams | None = None,
    state: None = None,
) -> RolloutResult:
    """``group_size`` episodes per task with GraphPO's merging (module docstring)."""
    p = params or MergeParams()
    start = time.perf_counter()
    runners = start_runners(ctx.make_env, tasks, group_size, env_seed=ctx.env_seed)
    # (group, state[, depth]) -> the runner that acts from it first, its step index, its path
    first: dict[tuple[int, str, int], tuple[EpisodeRunner, int, tuple[str, ...]]] = {}
    follows: dict[int, tuple[EpisodeRunner, EpisodeRunner, int]] = {}

    def on_turn(live: list[EpisodeRunner]) -> None:
        for r in live:
            if not r.episode.steps:
                continue  # the root: every episode's start
            path = _actions(r)
            at = len(path) if p.depth == "same" else -1
            key = (r.group, str(r.episode.steps[-1].next_state), at)
            seen = first.get(key)
            if seen is None:
                first[key] = (r, len(path), path)
            elif (
                seen[2] != path  # reached by another path: a merge
                and len(path) >= p.min_depth
                and seen[0] is not r
                and id(seen[0]) not in follows  # into a runner that generates its own
            ):
                follows[id(r)] = (r, seen[0], seen[1])
                r.done = True

    env_steps, gen_tokens = run_episodes(runners, ctx, on_turn)
    merged_steps = merged_tokens = 0
    resolved: set[int] = set()

    def resolve(r: EpisodeRunner) -> None:  # a leader that itself merged is resolved first
        if id(r) in resolved or id(r) not in follows:
            return
        resolved.add(id(r))
        _, leader, at = follows[id(r)]
        resolve(leader)
        nonlocal merged_steps, merged_tokens
        n, t = _copy_suffix(r, leader, at, ctx.max_turns)
        merged_steps, merged_tokens = merged_steps + n, merged_tokens + t

    for r in runners:
        resolve(r)
    stats = {
        "rollout/merged_episodes": float(len(follows)),
        "rollout/merged_steps": float(merged_steps),
        "rollout/merged_tokens": float(merged_tokens),
    }
    return runners_result(runners, env_steps, gen_tokens, start, stats)
