"""Restarting an episode in the middle: the branch point of every branching sampler.

To branch trajectory τ at depth k (re-sample the action τ took at depth k, keeping its
first k steps), :func:`restore_runner`

1. makes a fresh env and ``reset``\\ s it on τ's task (the env re-creates the task data
   that its snapshot may leave out);
2. for k = 0 checks that ``reset`` gave τ's first observation; for k ≥ 1 restores the
   snapshot taken before τ's step k−1 (:func:`~credo.envs.base.restore_env`: the env's
   own ``restore`` or, for an env without ``snapshot``/``restore``, a deep copy of its
   ``__dict__``) and *replays* τ's action k−1;
3. checks that the env now shows τ's recorded observation at depth k and has τ's
   recorded state key (:func:`~credo.envs.base.check_replay`). The branch's prompt is
   built from the recorded history and observation, so a restore that lands elsewhere
   would make the policy act on a state it is not shown: that is a
   :class:`~credo.envs.base.RestoreDivergence`. An env that raises, hangs or returns a
   non-string observation while being restored is an env error instead
   (:class:`RestoreEnvError`, recorded like any other and contained: the branch is
   dropped whatever ``on_restore_divergence`` says).

The runner it returns starts with τ's first k steps (the same :class:`Step` objects),
history and snapshots, so the branch's first prompt is exactly the prompt τ had at depth
k, and :func:`~credo.rollout.group.trajectories_to_forest` hangs its new rows under τ's
row at depth k−1.

What happens on a divergence is the caller's choice (``rollout.on_restore_divergence``):
``"error"`` (default) raises with a message that says what differed and how to fix the
env; ``"skip"`` drops the branch, counts it in ``stats["rollout/restore_divergences"]``
and logs a warning (:func:`try_restore`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from credo.data import Episode
from credo.envs.base import RestoreDivergence, check_replay, restore_env
from credo.rollout.envguard import EnvCallError, check_observation, env_call, env_phase
from credo.rollout.group import EpisodeRunner, Trajectory, read_instruction

__all__ = ["DIVERGENCE_POLICIES", "RestoreEnvError", "restore_runner", "try_restore"]

#: Accepted values of ``rollout.on_restore_divergence``.
DIVERGENCE_POLICIES = ("error", "skip")

log = logging.getLogger("credo.rollout")


class RestoreEnvError(RestoreDivergence):
    """The env raised, hung or returned a non-string observation while being restored
    (``reset``, ``restore`` or the replayed ``step``): an env error, recorded in
    ``env_errors.jsonl`` like any other, rather than a divergence of a working env."""


def restore_runner(
    make_env: Callable[[], Any],
    trajectory: Trajectory,
    depth: int,
    *,
    env_seed: int = 0,
    source: str = "policy",
    keep_snapshots: bool = True,
) -> EpisodeRunner:
    """A runner at ``trajectory``'s state before its step ``depth`` (see the module doc).

    Args:
        make_env: creates a fresh env.
        trajectory: the path to branch; its runner must have kept snapshots.
        depth: k, the depth whose action will be re-sampled (0 ≤ k < path length).
        env_seed: seed passed to ``env.reset`` (the one the path was sampled with).
        source: ``Step.source`` of the steps the new runner records.
        keep_snapshots: the new runner keeps snapshots too (so it can be branched).

    Raises:
        RestoreDivergence: the restored env does not reproduce the recording.
        ValueError: ``depth`` is out of range or the trajectory has no snapshots.
    """
    src, ep = trajectory.runner, trajectory.episode
    if src is None or src.snapshots is None:
        raise ValueError("restore_runner: the trajectory kept no env snapshots")
    if not 0 <= depth < len(ep.steps):
        raise ValueError(f"restore_runner: depth {depth} not in [0, {len(ep.steps)})")
    where = f"(task {src.task.id}, depth {depth})"
    env = make_env()

    def replay() -> tuple[str, str]:
        obs = check_observation(env, env.reset(src.task, env_seed), "reset")
        if depth > 0:
            restore_env(env, src.snapshots[depth - 1])
            obs = check_observation(env, env.step(ep.steps[depth - 1].action).observation, "step")
        return obs, read_instruction(env, src.instruction)

    try:
        with env_phase("restore"):  # recorded in env_errors.jsonl like any env error
            obs, instruction = env_call(replay, task=src.task.id, turn=depth, call="restore")
        check_replay(
            env,
            observation=obs,
            expected_observation=ep.steps[depth].observation,
            expected_state=ep.steps[depth].state,
            where=where,
        )
    except RestoreDivergence:
        raise
    except EnvCallError as exc:
        cause = exc.cause
        raise RestoreEnvError(
            f"restoring {type(env).__name__} {where} raised {type(cause).__name__}: {cause} "
            f"[{exc.record.location}]"
        ) from cause
    except Exception as exc:
        raise RestoreDivergence(
            f"restoring {type(env).__name__} {where} raised {type(exc).__name__}: {exc}"
        ) from exc
    runner = EpisodeRunner(
        env,
        src.task,
        src.group,
        Episode(group=src.group, steps=list(ep.steps[:depth]), task_id=src.task.id),
        instruction=instruction,  # the goal as it was at that depth
        observation=ep.steps[depth].observation,
        history=list(src.history[:depth]),
        snapshots=list(src.snapshots[:depth]) if keep_snapshots else None,
        source=source,
    )
    return runner


def try_restore(
    make_env: Callable[[], Any],
    trajectory: Trajectory,
    depth: int,
    *,
    on_divergence: str,
    stats: dict[str, float],
    env_seed: int = 0,
    source: str = "policy",
    keep_snapshots: bool = True,
) -> EpisodeRunner | None:
    """:func:`restore_runner`, with the divergence policy applied.

    ``on_divergence="error"`` lets :class:`RestoreDivergence` propagate; ``"skip"``
    returns ``None``, adds 1 to ``stats["rollout/restore_divergences"]`` and logs a
    warning. An env that raises while being restored (:class:`RestoreEnvError`) is an
    env error, not a divergence: whatever the policy, the branch is dropped (``None``),
    counted in ``stats["rollout/restore_env_errors"]`` and recorded in the run's
    ``env_errors.jsonl``. Each call adds the replayed step (depth ≥ 1) to
    ``stats["rollout/restore_steps"]``.
    """
    if on_divergence not in DIVERGENCE_POLICIES:
        raise ValueError(
            f"on_restore_divergence must be one of {DIVERGENCE_POLICIES}, got {on_divergence!r}"
        )
    if depth > 0:
        stats["rollout/restore_steps"] = stats.get("rollout/restore_steps", 0) + 1
    try:
        return restore_runner(
            make_env,
            trajectory,
            depth,
            env_seed=env_seed,
            source=source,
            keep_snapshots=keep_snapshots,
        )
    except RestoreEnvError as exc:  # contained like any env error: the branch is dropped
        stats["rollout/restore_env_errors"] = stats.get("rollout/restore_env_errors", 0) + 1
        log.warning("branch dropped: %s", exc)
        return None
    except RestoreDivergence as exc:
        if on_divergence == "error":
            raise
        stats["rollout/restore_divergences"] = stats.get("rollout/restore_divergences", 0) + 1
        log.warning("branch dropped: %s", exc)
        return None
