"""One training iteration, top to bottom:

    tasks ─► sampler ─► RolloutForest ─► [teacher] ─► credit ─► objective ─► optimizer step ─► metrics

With a ``teacher`` section, the teacher scores the policy rows once after the rollouts
(:mod:`credo.train.teaching`): reward routes change the rewards before credit, token
routes the token batch, and an EMA teacher follows the student after the update.

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

from credo.credit import advantage_stats, compute_advantages
from credo.data import RolloutForest
from credo.rollout import RolloutResult, oracle_batch, split_oracle
from credo.train import distributed as dp
from credo.train import fsdp
from credo.train.profiles import attach_profile_reference, needs_profiles
from credo.train.run import Run
from credo.train.state import TrainState
from credo.train.update import UpdateContext, kl_reward_penalty_rows, policy_update

__all__ = ["iteration_seed", "run_iteration"]

# the random streams of an iteration
_TASKS, _SAMPLING, _SHUFFLE, _CHOICES = 0, 1, 2, 3
_TASK_UPDATE = 4  # the task source's own choices after the iteration (RODS's variants)


def iteration_seed(seed: int, iteration: int, stream: int) -> int:
    """The seed of one random stream of one iteration."""
    return int(np.random.SeedSequence([seed, iteration, stream]).generate_state(1)[0])


def run_iteration(run: Run, state: TrainState, it: int) -> dict[str, Any]:
    """Run iteration ``it`` on ``state`` (updated in place) and return its metrics record."""
    cfg = run.cfg
    t0 = time.perf_counter()
    # 1. tasks: this iteration's distinct training tasks, from the task source
    tasks = state.tasks.draw(it, iteration_seed(cfg.train.seed, it, _TASKS))
    # 2. sampler → forest (SERO's oracle continuations ride on top of any sampler); with
    # several processes each samples its share of the groups, gathered before credit
    mine, offset = dp.shard(tasks)
    rollout = run.rollouts(
        state.policy,
        mine,
        generator=torch.Generator().manual_seed(
            dp.rank_seed(iteration_seed(cfg.train.seed, it, _SAMPLING))
        ),
        choice_seed=dp.rank_seed(iteration_seed(cfg.train.seed, it, _CHOICES)),
        state=state.sampler_state,
    )
    rollout = dp.gather_rollouts(rollout, offset)
    forest, oracle_rows = split_oracle(rollout.forest)  # oracle rows: no credit, no RL loss
    trainer = state.trainer or state.policy  # FSDP: the sharded copy (credo.train.fsdp)
    update = UpdateContext(trainer, state.optimizer, cfg, state.reference, zero=state.zero)
    if cfg.objective.kl_reward_coef > 0:  # KL to the reference as a cost in the reward
        penalty = kl_reward_penalty_rows(
            update, forest, beta=cfg.objective.kl_reward_coef, micro_rows=cfg.optim.micro_batch_rows
        )
        forest = forest.with_rewards(forest.reward - penalty)
    t1 = time.perf_counter()
    lesson = (
        state.teaching.lesson(run.renderer, forest, rollout.episodes, state.policy.pad_id)
        if state.teaching
        else None
    )
    forest = lesson.reward(forest) if lesson else forest  # teacher reward routes
    judged = state.judging.reward(forest, tasks, it) if state.judging else None  # SERPO
    forest = judged.forest if judged else forest
    # 3. credit
    adv = compute_advantages(cfg.credit.estimator, forest, cfg.credit.params, state.estimator_state)
    task_metrics = state.tasks.observe(  # the groups' results feed the task source
        tasks, rollout.episodes, iteration_seed(cfg.train.seed, it, _TASK_UPDATE)
    )
    # 4. objective → optimizer step
    oracle = (
        oracle_batch(rollout.forest, pad_id=state.policy.pad_id) if oracle_rows.numel() else None
    )
    shuffle = torch.Generator().manual_seed(iteration_seed(cfg.train.seed, it, _SHUFFLE))
    batch = forest.to_batch(adv, pad_id=state.policy.pad_id)
    rapo = (  # RAPO: the reference scored with and without the tasks' profiles
        attach_profile_reference(state.reference, run.renderer, forest, batch)
        if needs_profiles(cfg) and state.reference is not None
        else {}
    )
    if lesson:  # teacher token routes: advantages, or scores for the loss
        lesson.attach(batch)
    update_metrics = policy_update(update, batch, iteration=it, generator=shuffle, oracle=oracle)
    if state.trainer is not None:  # FSDP: the sampling copy gets the new weights, whole
        fsdp.copy_full_weights(state.trainer, state.policy)
    if state.teaching:
        state.teaching.after_update(state.policy)
    run.weights_updated()
    t2 = time.perf_counter()
    # 5. metrics (and the periodic held-out evaluation)
    state.iteration, state.env_steps_total = it + 1, state.env_steps_total + rollout.env_steps
    record = iteration_metrics(it, rollout, forest, adv, state.env_steps_total, (t0, t1, t2))
    record.update(update_metrics | (lesson.metrics if lesson else {}))
    record.update(task_metrics)
    record.update(rapo | (judged.metrics if judged else {}))
    if cfg.eval.every and state.iteration % cfg.eval.every == 0 and dp.is_main():
        ev = run.evaluate(state.policy, episodes=cfg.eval.periodic_episodes)
        record["eval/success_rate"] = ev.success_rate
    return record


def iteration_metrics(
    it: int,
    rollout: RolloutResult,
    forest: RolloutForest,
    adv: torch.Tensor,
    env_steps_total: int,
    times: tuple[float, float, float],
) -> dict[str, Any]:
    """The iteration's rollout, credit and timing metrics (``docs/metrics.md`` explains
    each); ``forest`` is the RL forest (oracle rows left out), ``times`` the clock at the
    start, after the rollouts and after the update."""
    t0, t1, t2 = times
    eps = rollout.episodes
    n = max(1, len(eps))
    rows = max(1, forest.num_rows)
    return {
        "iteration": it,
        "rollout/success_rate": sum(e.success for e in eps) / n,
        "rollout/return_mean": sum(e.ret for e in eps) / n,
        "rollout/episode_len": sum(len(e) for e in eps) / n,
        "rollout/invalid_rate": float((~forest.valid).sum()) / rows if forest.num_rows else 0.0,
        "rollout/env_errors": sum(e.error is not None for e in eps),
        "rollout/env_steps": rollout.env_steps,
        "rollout/env_steps_total": env_steps_total,
        "rollout/gen_tokens": rollout.generated_tokens,
        "credit/adv_mean": float(adv.mean()) if adv.numel() else 0.0,
        "credit/adv_std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "credit/adv_abs_max": float(adv.abs().max()) if adv.numel() else 0.0,
        "credit/zero_adv_frac": float((adv.abs() < 1e-8).float().mean()) if adv.numel() else 0.0,
        **advantage_stats(adv),
        "time/rollout_s": t1 - t0,
        "time/update_s": t2 - t1,
        "time/iteration_s": t2 - t0,
        "perf/env_steps_per_s": rollout.env_steps / max(1e-9, t1 - t0),
        "perf/gen_tokens_per_s": rollout.generated_tokens / max(1e-9, t1 - t0),
        **top_action(eps),
        **{k: float(v) for k, v in sorted(rollout.stats.items())},
    }


def top_action(episodes: list[Any]) -> dict[str, Any]:
    """The most frequent action text of the iteration's sampled steps (stripped; ties go to
    the first seen), its share of those steps and the share of its occurrences the env
    rejected: ``rollout/top_action`` (at most 40 characters), ``rollout/top_action_share``,
    ``rollout/top_action_invalid`` (none without policy steps). A policy collapsing onto
    one degenerate action shows here first (:mod:`credo.train.health`)."""
    counts: Counter[str] = Counter()
    invalid: Counter[str] = Counter()
    for ep in episodes:
        for step in ep.steps:
            if step.source == "oracle":  # the policy's own actions only
                continue
            action = step.action.strip()
            counts[action] += 1
            invalid[action] += not step.valid
    if not counts:
        return {}
    action, n = counts.most_common(1)[0]
    return {
        "rollout/top_action": action[:40],
        "rollout/top_action_share": n / sum(counts.values()),
        "rollout/top_action_invalid": invalid[action] / n,
    }
