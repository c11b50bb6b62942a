"""One training iteration, top to bottom:

    tasks ─► sampler ─► forest ─► [rewards] ─► credit ─► [batch transforms] ─► update ─► [after-update] ─► metrics

Each bracket is the list of the run's parts that take part in that stage, built once from
the config (:mod:`credo.train.parts`): the KL reward penalty, a teacher's reward route and
SERPO's judge change the rewards; SERO's oracle rows, RAPO's reference and a teacher's
token route extend the token batch; FSDP's sampling copy and an EMA teacher follow the new
weights; the periodic evaluation reports after the iteration is timed. How the processes
share the rollouts and the update is the engine's (:class:`~credo.engines.Engine`).

Everything random in iteration ``it`` derives from ``(train.seed, it)`` through separate
streams (task draw, policy sampling, mini-batch shuffles, the sampler's own choices), so
an iteration is reproducible on its own and ``--resume`` continues exactly.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import torch

from credo.credit import advantage_stats
from credo.data import RolloutForest
from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.rollout import RolloutResult, split_oracle
from credo.rollout.envguard import env_error_count
from credo.train.parts import IterationData
from credo.train.run import Run
from credo.train.state import TrainState
from credo.train.update import policy_update

__all__ = ["Clock", "iteration_seed", "rollouts_of", "run_iteration", "sample"]

# the random streams of an iteration
_TASKS, _SAMPLING, _SHUFFLE, _CHOICES = 0, 1, 2, 3
_TASK_UPDATE = 4  # the task source's own choices after the iteration (RODS's variants)


def iteration_seed(seed: int, iteration: int, stream: int) -> int:
    """The seed of one random stream of one iteration."""
    return int(np.random.SeedSequence([seed, iteration, stream]).generate_state(1)[0])


def run_iteration(run: Run, state: TrainState, it: int) -> dict[str, Any]:
    """Run iteration ``it`` on ``state`` (updated in place) and return its metrics record."""
    seed, parts, clock = run.cfg.train.seed, state.parts, Clock()
    # 1-2. this iteration's distinct training tasks, from the task source, and the
    # sampler's rollouts of them → forest (SERO's oracle rows split off: no credit, no
    # RL loss); with rollout.staleness, drawn and sampled ahead (:func:`rollouts_of`)
    env_errors = env_error_count()
    tasks, rollout, version = rollouts_of(run, state, it)
    data = IterationData(it, tasks, rollout, split_oracle(rollout.forest)[0])
    if state.rollouts is not None:
        data.metrics["rollout/staleness"] = float(it - version)
    clock.lap("rollout")
    if data.forest.num_rows == 0:
        if env_error_count() > env_errors:  # the env broke every episode: stop, naming it
            raise ValueError(
                f"every episode of iteration {it} failed before its first step: there is "
                "nothing to train on"
            )
        return _skipped_iteration(run, state, data, clock)
    # 3. rewards: each configured source changes the forest's rewards
    for part in parts.reward:
        part.reward(data)
    clock.lap("reward")
    # 4. credit; the groups' results feed the task source
    data.advantages = state.advantages(data.forest)
    data.metrics.update(
        state.tasks.observe(tasks, rollout.episodes, iteration_seed(seed, it, _TASK_UPDATE))
    )
    # 5. the token batch, and the configured transforms of it
    data.batch = data.forest.to_batch(data.advantages, pad_id=state.policy.pad_id)
    for part in parts.transform:
        part.transform(data)
    # 6. update, then what follows the new weights
    shuffle = torch.Generator().manual_seed(iteration_seed(seed, it, _SHUFFLE))
    data.metrics.update(policy_update(state.update, data.batch, iteration=it, generator=shuffle))
    for part in parts.after_update:
        part.after_update(data)
    run.weights_updated()
    clock.lap("update")
    # 7. metrics (and what reports after the timed part: the periodic evaluation)
    state.iteration, state.env_steps_total = it + 1, state.env_steps_total + rollout.env_steps
    for part in parts.report:
        part.report(data)
    return iteration_metrics(data, state.env_steps_total, clock) | data.metrics


def _skipped_iteration(
    run: Run, state: TrainState, data: IterationData, clock: Clock
) -> dict[str, Any]:
    """The record of an iteration without a single step to train on: every episode
    ended before the policy acted (an agent run whose agents all raised before their
    first model call, or never called it). When an env raised instead (its ``reset``,
    ``snapshot``), :func:`run_iteration` stops the run naming the env's error, since
    every later iteration would fail the same way. There is nothing to give credit to or to
    update on, so the weights stay as they are and the run goes on; the record says so
    with ``rollout/skipped`` = 1 (and the run warns once, :mod:`credo.train.health`).
    The task source still sees the episodes (they failed), and the periodic evaluation
    keeps its cadence."""
    seed, it = run.cfg.train.seed, data.it
    data.advantages = torch.zeros(0)
    data.metrics.update(
        state.tasks.observe(
            data.tasks, data.rollout.episodes, iteration_seed(seed, it, _TASK_UPDATE)
        )
    )
    clock.lap("reward")
    clock.lap("update")
    state.iteration = it + 1
    state.env_steps_total += data.rollout.env_steps
    for part in state.parts.report:
        part.report(data)
    return (
        iteration_metrics(data, state.env_steps_total, clock)
        | data.metrics
        | {"rollout/skipped": 1.0}
    )


def rollouts_of(run: Run, state: TrainState, it: int) -> tuple[list[Task], RolloutResult, int]:
    """Iteration ``it``'s tasks and rollouts, and the version of the weights that sampled
    them (the updates behind them). Synchronous: drawn and sampled now, by the current
    weights (version ``it``). With ``rollout.staleness`` = k: taken from the queue, where
    they were drawn k iterations ago and sampled by the weights of then while the trainer
    updated (:mod:`credo.train.async_rollouts`)."""
    seed = run.cfg.train.seed
    if state.rollouts is None:
        tasks = state.tasks.draw(it, iteration_seed(seed, it, _TASKS))
        return tasks, sample(run, state, tasks, seed, it), it
    return state.rollouts.take(
        it,
        state.policy,
        run.cfg.train.iterations,
        draw=lambda j: state.tasks.draw(j, iteration_seed(seed, j, _TASKS)),
        sample=lambda policy, tasks, j: sample(run, state, tasks, seed, j, policy=policy),
    )


def sample(
    run: Run,
    state: TrainState,
    tasks: list[Task],
    seed: int,
    it: int,
    *,
    policy: HFPolicy | None = None,
) -> RolloutResult:
    """Iteration ``it``'s rollouts of ``tasks`` with the run's sampler, by ``policy``
    (default: the one being trained): with several processes each samples its share of
    the groups from its own streams and the engine gathers them
    (:meth:`~credo.engines.Engine.sample`)."""
    acting = policy if policy is not None else state.policy
    return state.engine.sample(
        lambda mine, sampling, choices: run.rollouts(
            acting,
            mine,
            generator=torch.Generator().manual_seed(sampling),
            choice_seed=choices,
            state=state.sampler_state,
        ),
        tasks,
        iteration_seed(seed, it, _SAMPLING),
        iteration_seed(seed, it, _CHOICES),
    )


class Clock:
    """The iteration's laps: seconds since the previous lap (or the start), by name."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name], self.last = now - self.last, now

    @property
    def total(self) -> float:
        """Seconds from the start to the last lap."""
        return self.last - self.start


def iteration_metrics(data: IterationData, env_steps_total: int, clock: Clock) -> dict[str, Any]:
    """The iteration's rollout, credit and timing metrics (``docs/metrics.md`` explains
    each); ``data.forest`` is the RL forest (oracle rows left out), ``clock`` has the laps
    ``rollout`` (sampling), ``reward`` (the reward sources) and ``update`` (credit, the
    batch transforms, the update and what follows it)."""
    rollout: RolloutResult = data.rollout
    forest, adv = data.forest, data.advantages
    assert adv is not None
    eps = rollout.episodes
    n = max(1, len(eps))
    rows = max(1, forest.num_rows)
    sampling = clock.laps["rollout"]  # the trainer's wait for its rollouts
    # the sampler's own time: the wait, or longer when it sampled ahead (rollout.staleness)
    generating = max(sampling, rollout.seconds)
    return {
        "iteration": data.it,
        "rollout/success_rate": sum(e.success for e in eps) / n,
        "rollout/return_mean": sum(e.ret for e in eps) / n,
        "rollout/episode_len": sum(len(e) for e in eps) / n,
        "rollout/invalid_rate": float((~forest.valid).sum()) / rows if forest.num_rows else 0.0,
        "rollout/env_errors": sum(e.error is not None for e in eps),
        "rollout/env_steps": rollout.env_steps,
        "rollout/env_steps_total": env_steps_total,
        "rollout/gen_tokens": rollout.generated_tokens,
        "rollout/mixed_groups": mixed_groups(eps),
        "credit/adv_mean": float(adv.mean()) if adv.numel() else 0.0,
        "credit/adv_std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "credit/adv_abs_max": float(adv.abs().max()) if adv.numel() else 0.0,
        "credit/zero_adv_frac": float((adv.abs() < 1e-8).float().mean()) if adv.numel() else 0.0,
        **advantage_stats(adv),
        "time/rollout_s": sampling,
        "time/reward_s": clock.laps["reward"],
        "time/update_s": clock.laps["update"],
        "time/iteration_s": clock.total,
        "perf/env_steps_per_s": rollout.env_steps / max(1e-9, generating),
        "perf/gen_tokens_per_s": rollout.generated_tokens / max(1e-9, generating),
        **top_action(forest),
        **success_by_env(eps),
        **{k: float(v) for k, v in sorted(rollout.stats.items())},
    }


def mixed_groups(episodes: list[Any]) -> int:
    """``rollout/mixed_groups``: the iteration's groups (``Episode.group``: a task's
    episodes, a tree's or a merged graph's leaves) whose returns are not all equal, the
    groups from which a group-relative estimator draws any signal."""
    returns: dict[int, set[float]] = {}
    for e in episodes:
        returns.setdefault(e.group, set()).add(round(float(e.ret), 9))
    return sum(len(r) > 1 for r in returns.values())


def success_by_env(episodes: list[Any]) -> dict[str, float]:
    """``rollout/success/<env>``: training success per env of a mixture, for episodes whose
    steps carry ``info["env"]`` (:mod:`credo.envs.mixture`); ``{}`` for one env."""
    wins: dict[str, list[bool]] = {}
    for e in episodes:
        label = e.steps[-1].info.get("env") if e.steps else None
        if label is not None:
            wins.setdefault(str(label), []).append(bool(e.success))
    return {f"rollout/success/{k}": sum(v) / len(v) for k, v in sorted(wins.items())}


def top_action(forest: RolloutForest) -> dict[str, Any]:
    """The most frequent action text among the iteration's RL rows (the policy's own
    steps: oracle rows are split off before; stripped; ties go to the first seen), its
    share of those rows and the share of its occurrences the env rejected:
    ``rollout/top_action`` (at most 40 characters), ``rollout/top_action_share``,
    ``rollout/top_action_invalid`` (none without rows). A policy collapsing onto one
    degenerate action shows here first (:mod:`credo.train.health`)."""
    counts: Counter[str] = Counter()
    invalid: Counter[str] = Counter()
    for action, valid in zip(forest.actions, forest.valid.tolist()):
        action = action.strip()
        counts[action] += 1
        invalid[action] += not valid
    if not counts:
        return {}
    action, n = counts.most_common(1)[0]
    return {
        "rollout/top_action": action[:40],
        "rollout/top_action_share": n / sum(counts.values()),
        "rollout/top_action_invalid": invalid[action] / n,
    }
