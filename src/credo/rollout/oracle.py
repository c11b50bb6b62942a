"""Oracle continuations for SERO: the env's oracle, run from states the policy reached.
[recon]

SERO (``docs/algorithms.md#sero``) adds supervised
signal from a training-time oracle without touching the RL part: from states the
policy actually reached, restore the env and let its ``oracle_action()`` act for K
steps; keep the continuation only if it executes. The auxiliary loss
(:mod:`credo.objectives.sero`) raises the policy's likelihood of those oracle actions,
weighted by how reachable they are for the policy.

:func:`add_oracle_continuations` is an add-on on top of any sampler (``rollout.
oracle_horizon`` > 0). Per group it picks ``per_group`` distinct policy rows at random
(``start="all"``: any row; ``"failed"``: rows on a failed episode's path), restores the
env at each one's state s_t (:mod:`credo.rollout.branch`: the state *before* the row's
action, checked by replaying the step that led there) and runs the oracle for up to
``horizon`` steps (fewer when the env ends the episode). The first oracle action is the
alternative to the policy's action at s_t, with exactly the prompt the policy had
there. A continuation is kept only if every oracle action is valid (the env parsed and
executed it) and the env never raised; otherwise it is dropped whole.

In the forest the oracle steps are rows with ``source="oracle"``, siblings of the start
row (under its parent; roots of the group for t = 0), appended after every policy row.
They are not policy episodes: the trainer computes advantages on the forest without
them (:func:`split_oracle`; so the RL reward, advantages and ratios are exactly the
base method's) and ``to_batch`` gives them ``pg_mask = False``, so they never receive
policy-gradient loss. Their ``old_logprobs`` are zeros (nothing sampled them).
:func:`oracle_batch` turns them into the SERO loss's batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from credo.data import SOURCES, RolloutForest, TokenBatch
from credo.data.ops import segment_max
from credo.rollout.branch import try_restore
from credo.rollout.envguard import EnvCallError, env_call, env_phase
from credo.rollout.group import RolloutResult, Trajectory, take_step, trajectories_to_forest
from credo.rollout.sampler import SamplerContext

__all__ = [
    "ORACLE",
    "ORACLE_STARTS",
    "OracleBatch",
    "add_oracle_continuations",
    "oracle_batch",
    "oracle_chains",
    "split_oracle",
]

ORACLE = SOURCES.index("oracle")
#: Accepted ``start`` values (``rollout.oracle_start``).
ORACLE_STARTS = ("all", "failed")


def add_oracle_continuations(
    result: RolloutResult,
    ctx: SamplerContext,
    *,
    horizon: int,
    per_group: int = 2,
    start: str = "all",
) -> RolloutResult:
    """``result`` plus oracle continuations (see the module docstring).

    Args:
        result: a sampler's output whose trajectories kept env snapshots.
        ctx: the sampler's context: its env factory (the env must have
            ``oracle_action()``), renderer (builds the oracle rows' prompts and response
            tokens), turn cap (counted from the root), ``choices`` (the RNG of the start
            choice; the policy's sampling RNG is not touched), env seed and
            ``on_divergence`` (see :mod:`credo.rollout.branch`).
        horizon: K ≥ 1, most oracle steps per continuation.
        per_group: start states per group (default 2; fewer when a group has fewer rows).
        start: ``"all"`` (default) or ``"failed"`` (only rows on failed paths).

    Returns:
        A new :class:`RolloutResult`: the same episodes, the forest with the oracle rows
        appended, ``env_steps`` including the oracle's steps, and ``stats`` with
        ``rollout/oracle_continuations`` (kept), ``rollout/oracle_dropped`` and
        ``rollout/oracle_steps`` (rows kept).
    """
    make_env, renderer, max_turns = ctx.make_env, ctx.renderer, ctx.max_turns
    if horizon < 1:
        raise ValueError(f"oracle horizon must be ≥ 1, got {horizon}")
    if start not in ORACLE_STARTS:
        raise ValueError(f"oracle start must be one of {ORACLE_STARTS}, got {start!r}")
    if per_group < 1:
        raise ValueError(f"oracle per_group must be ≥ 1, got {per_group}")
    trajectories = list(result.trajectories)
    if not trajectories:
        raise ValueError("add_oracle_continuations: the sampler result has no trajectories")
    forest, owner = trajectories_to_forest(trajectories)
    stats = dict(result.stats)
    candidate = forest.source != ORACLE
    if start == "failed" and forest.num_rows:
        ep = forest.episodes()
        failed = (~ep.success).to(torch.float64)[ep.episode_of]
        on_failed = segment_max(failed, ep.rows, forest.num_rows) > 0
        candidate &= on_failed
    kept = dropped = steps_kept = 0
    oracle_trajs: list[Trajectory] = []
    for g in torch.unique(forest.group).tolist():
        rows = torch.nonzero(candidate & (forest.group == g), as_tuple=False).flatten()
        if rows.numel() == 0:
            continue
        chosen = rows[torch.randperm(rows.numel(), generator=ctx.choices)[:per_group]]
        for row in chosen.sort().values.tolist():
            src, depth = int(owner[row]), int(forest.t[row])
            runner = try_restore(
                make_env,
                trajectories[src],
                depth,
                on_divergence=ctx.on_divergence,
                stats=stats,
                env_seed=ctx.env_seed,
                source="oracle",
                keep_snapshots=False,
            )
            if runner is None:
                dropped += 1
                continue
            if not hasattr(runner.env, "oracle_action"):
                raise ValueError(
                    f"{type(runner.env).__name__} has no oracle_action(): oracle continuations "
                    "(rollout.oracle_horizon > 0) need one"
                )
            ok = True
            for _ in range(horizon):
                if runner.done or (
                    max_turns is not None and len(runner.episode.steps) >= max_turns
                ):
                    break
                try:
                    with env_phase("oracle"):
                        action = env_call(
                            runner.env.oracle_action,
                            task=runner.task.id,
                            turn=len(runner.episode.steps) + 1,
                            call="oracle_action",
                        )
                except EnvCallError:  # recorded in env_errors.jsonl; the continuation is dropped
                    ok = False
                    break
                response = renderer.response_ids(action)
                with env_phase("oracle"):
                    stepped = take_step(
                        runner,
                        action,
                        prompt_ids=renderer.prompt_ids(
                            runner.instruction, runner.history, runner.observation
                        ),
                        response_ids=response,
                        logprobs=[0.0] * len(response),
                    )
                if not stepped or not runner.episode.steps[-1].valid:
                    ok = False
                    break
            new = len(runner.episode.steps) - depth
            if ok and new > 0:
                oracle_trajs.append(Trajectory(runner.episode, src, depth, runner))
                kept += 1
                steps_kept += new
            else:
                dropped += 1
    forest, _ = trajectories_to_forest(trajectories + oracle_trajs)
    stats["rollout/oracle_continuations"] = float(kept)
    stats["rollout/oracle_dropped"] = float(dropped)
    stats["rollout/oracle_steps"] = float(steps_kept)
    return RolloutResult(
        forest=forest,
        episodes=result.episodes,
        env_steps=result.env_steps + steps_kept,
        generated_tokens=result.generated_tokens,
        seconds=result.seconds,
        stats=stats,
        trajectories=trajectories + oracle_trajs,
    )


def split_oracle(forest: RolloutForest) -> tuple[RolloutForest, torch.Tensor]:
    """``(policy_forest, oracle_rows)``: the forest without its oracle rows (the very
    forest the base sampler would have produced, rows in the same order) and the
    oracle rows' indices ``[M]``. Without oracle rows, ``forest`` itself is returned."""
    oracle = forest.source == ORACLE
    if not bool(oracle.any()):
        return forest, torch.zeros(0, dtype=torch.long)
    keep = torch.nonzero(~oracle, as_tuple=False).flatten()
    if bool(
        oracle[forest.parent[keep].clamp(min=0)].masked_fill(forest.parent[keep] < 0, False).any()
    ):
        raise ValueError("a policy row hangs under an oracle row: cannot split the forest")
    return forest.select(keep), torch.nonzero(oracle, as_tuple=False).flatten()


def oracle_chains(forest: RolloutForest) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The oracle continuations of ``forest``: ``(rows [M], chain [M], position [M])``.

    A continuation (chain) starts at an oracle row whose parent is not an oracle row;
    ``chain`` numbers them 0.. in row order, ``position`` is k, the step within the
    continuation (0 for its first oracle action).
    """
    n = forest.num_rows
    oracle = forest.source == ORACLE
    parent = forest.parent
    first = oracle & ~torch.where(
        parent >= 0, oracle[parent.clamp(min=0)], torch.zeros_like(oracle)
    )
    start = torch.where(first, torch.arange(n), torch.full((n,), -1, dtype=torch.long))
    for depth in range(1, int(forest.t.max()) + 1 if n else 0):
        rows = torch.nonzero(oracle & ~first & (forest.t == depth), as_tuple=False).flatten()
        start[rows] = start[parent[rows]]
    rows = torch.nonzero(oracle, as_tuple=False).flatten()
    starts = torch.nonzero(first, as_tuple=False).flatten()
    chain_of_start = torch.full((n,), -1, dtype=torch.long)
    chain_of_start[starts] = torch.arange(starts.numel())
    chain = chain_of_start[start[rows]]
    position = forest.t[rows] - forest.t[start[rows]]
    return rows, chain, position


@dataclass
class OracleBatch:
    """The SERO loss's input: the oracle rows as tokens, with their continuation ids.

    Attributes:
        tokens: ``[M, L]`` token batch of the oracle rows (``pg_mask`` all False).
        chain: ``[M]`` continuation id of each row (0..num_chains−1).
        position: ``[M]`` step k of each row within its continuation.
        num_chains: number of continuations S.
    """

    tokens: TokenBatch
    chain: torch.Tensor
    position: torch.Tensor
    num_chains: int

    def __len__(self) -> int:
        return len(self.tokens)


def oracle_batch(forest: RolloutForest, *, pad_id: int = 0) -> OracleBatch | None:
    """The oracle rows of ``forest`` as an :class:`OracleBatch` (``None`` if none)."""
    rows, chain, position = oracle_chains(forest)
    if rows.numel() == 0:
        return None
    tokens = forest.to_batch(torch.zeros(forest.num_rows), rows=rows, pad_id=pad_id)
    return OracleBatch(tokens, chain, position, int(chain.max()) + 1)
