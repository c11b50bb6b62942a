"""The training loop, top to bottom.

    tasks ─► sampler ─► RolloutForest ─► credit ─► objective ─► optimizer step
      ▲                                                              │
      └────────── metrics, checkpoints, progress ◄───────────────────┘

:func:`train` sets up a run (folder, env, policy, warm start, held-out baseline), then
runs ``cfg.train.iterations`` iterations of exactly that line, checkpointing as it goes,
and ends with the held-out evaluation of the trained policy. Everything random in an
iteration derives from ``(seed, iteration)``, so ``--resume`` reproduces an uninterrupted
run's metrics exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from credo.credit import compute_advantages, estimator_state_factory
from credo.envs.base import Task
from credo.eval.evaluate import EvalResult, evaluate
from credo.policy.hf import HFPolicy
from credo.policy.lora import shared_reference, trainable_parameters
from credo.rollout import oracle_batch, split_oracle
from credo.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from credo.train.config import Config
from credo.train.logging import MetricsLog, plot_curves, read_metrics
from credo.train.progress import Progress, StopOnInterrupt
from credo.train.sampling import make_sampler_state, sample_rollouts
from credo.train.setup import (
    add_adapters,
    build_env_factory,
    build_policy,
    cache_dir,
    configure_runtime,
    default_max_turns,
    make_run_renderer,
    sampling_params,
    seed_estimator_state,
    warm_start,
)
from credo.train.update import UpdateContext, kl_reward_penalty_rows, policy_update

__all__ = ["TrainResult", "train"]


@dataclass
class TrainResult:
    """What a finished (or interrupted) run reports.

    Attributes:
        run_dir: the run folder.
        iterations: iterations completed.
        warm: held-out result of the warm-start policy (``None`` if not evaluated).
        final: held-out result of the trained policy (``None`` if interrupted).
        interrupted: the run stopped early (Ctrl-C); resume it with ``--resume``.
        seconds: wall time of this invocation.
        metrics: the per-iteration records of the whole run.
    """

    run_dir: Path
    iterations: int
    warm: EvalResult | None
    final: EvalResult | None
    interrupted: bool = False
    seconds: float = 0.0
    metrics: list[dict[str, Any]] = field(default_factory=list)


def _iteration_seed(seed: int, iteration: int, stream: int) -> int:
    return int(np.random.SeedSequence([seed, iteration, stream]).generate_state(1)[0])


def _eval_key(cfg: Config, warm_key: str, builtin: bool) -> str:
    """Cache key of the warm start's held-out evaluation. Rollout settings added after
    the first version enter only when set, so that existing cached evaluations keep
    their keys."""
    from credo.train.config import config_hash
    from credo.train.setup import max_new_tokens

    rollout = asdict(cfg.rollout)
    rollout["max_new_tokens"] = max_new_tokens(cfg, builtin=builtin)
    for k in ("system_prompt", "user_prompt"):
        if rollout[k] is None:
            del rollout[k]
    if not rollout["chat_examples"]:
        del rollout["chat_examples"]
    return config_hash({"warm": warm_key, "eval": asdict(cfg.eval), "rollout": rollout})


def _new_run_dir(cfg: Config) -> Path:
    name = (
        cfg.train.name
        or f"{cfg.recipe}-{cfg.env.name.replace(':', '.')}-{datetime.now():%Y%m%d-%H%M%S}"
    )
    run_dir = Path(cfg.train.runs_dir) / name
    if (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(
            f"{run_dir} already holds a run; use --resume {run_dir} to continue it or pick "
            "another train.name"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def train(cfg: Config, *, resume: Path | None = None, quiet: bool = False) -> TrainResult:
    """Train a policy with RL as configured; see the module docstring.

    Args:
        cfg: the run config (for ``resume``, the one saved in the run folder).
        resume: a run folder to continue from its latest checkpoint.
        quiet: no progress bar (tests, benchmarks).
    """
    t_start = time.perf_counter()
    configure_runtime(cfg)
    run_dir = Path(resume) if resume else _new_run_dir(cfg)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    progress = Progress(enabled=not quiet)

    # --- parts: env, policy, renderer -------------------------------------------
    make_env = build_env_factory(cfg)
    probe_env = make_env()
    max_turns = default_max_turns(cfg, probe_env)
    policy, builtin = build_policy(cfg, probe_env, make_env)
    renderer = make_run_renderer(cfg, policy, builtin, probe_env, make_env)
    sampling = sampling_params(cfg, builtin=builtin)

    def held_out(policy: HFPolicy, episodes: int) -> EvalResult:
        """Success on the first ``episodes`` held-out tasks, sampled as in training
        (without KLPO's auxiliary draws: every recipe's evaluation sees the same random
        stream, so equal policies get equal scores)."""
        return evaluate(
            policy,
            renderer,
            make_env,
            episodes=episodes,
            sampling=dataclasses.replace(sampling, aux_samples=0, topk_logprobs=0),
            max_turns=max_turns,
            seed=cfg.eval.seed,
        )

    # --- warm start and its held-out success (both cached by config hash) --------
    ckpt = latest_checkpoint(run_dir) if resume else None
    lora = cfg.model.lora is not None
    warm_info_path = run_dir / "warmstart.json"
    warm_eval: EvalResult | None = None
    # A LoRA checkpoint holds the adapters only: on resume the warm start is rebuilt as
    # their base (from the cache; recomputed identically if the cache was cleared).
    if cfg.sft.enabled and (ckpt is None or lora):
        phase = "warm start (SFT)" if ckpt is None else "warm start (SFT) as the adapters' base"
        with progress.phase(phase) as tick:
            policy, ws = warm_start(
                cfg,
                policy,
                renderer,
                make_env,
                on_step=lambda ph, s, n, loss: tick(s, n, f"{ph} loss {loss:.3f}"),
            )
    if ckpt is None and cfg.sft.enabled:
        eval_name = f"eval-{_eval_key(cfg, ws.key, builtin)}.json"
        eval_cache = cache_dir() / "warmstart" / ws.key / eval_name
        if eval_cache.exists():
            warm_eval = EvalResult(**json.loads(eval_cache.read_text()))
        warm_meta = {
            "key": ws.key,
            "cached": ws.cached,
            "demo_success": ws.demo_success,
            "seconds": ws.seconds,
        }
    elif ckpt is None:
        warm_meta = {"key": None, "cached": False}
        eval_cache = None
    else:
        warm_meta = json.loads(warm_info_path.read_text()) if warm_info_path.exists() else {}
        eval_cache = None
        if warm_meta.get("eval"):
            warm_eval = EvalResult(**warm_meta["eval"])
    if ckpt is None and warm_eval is None:
        with progress.phase(f"held-out eval of the warm start ({cfg.eval.episodes} episodes)"):
            warm_eval = held_out(policy, cfg.eval.episodes)
        if eval_cache is not None:
            eval_cache.write_text(json.dumps(warm_eval.to_dict()))
    if ckpt is None:
        warm_meta["eval"] = warm_eval.to_dict() if warm_eval else None
        warm_info_path.write_text(json.dumps(warm_meta, indent=1))

    # --- adapters, optimiser, reference, estimator and sampler state; or from a checkpoint
    # With LoRA, RL trains fresh adapters on the warm-start weights, and the reference is
    # the same model with the adapters off; otherwise the reference is a frozen copy.
    policy = add_adapters(cfg, policy)
    ref_policy: HFPolicy | None = None
    needs_reference = (
        cfg.objective.kl_coef > 0
        or cfg.objective.kl_reward_coef > 0
        or (cfg.rollout.oracle_horizon > 0 and cfg.objective.oracle_frozen == "reference")
    )
    if needs_reference and lora:
        ref_policy = shared_reference(policy)
    elif needs_reference:
        ref_policy = HFPolicy(copy.deepcopy(policy.model).eval(), policy.tokenizer, policy.device)
        for p in ref_policy.model.parameters():
            p.requires_grad_(False)
    state_cls = estimator_state_factory(cfg.credit.estimator)
    est_state = state_cls(**cfg.credit.state) if state_cls is not None else None
    sampler_state = make_sampler_state(cfg)
    start_iter, env_steps_total = 0, 0
    if ckpt is not None:
        policy.load_weights(ckpt / "policy")
        if ref_policy is not None and not lora:
            ref_policy.load_weights(run_dir / "reference")
    optimizer = torch.optim.AdamW(
        trainable_parameters(policy.model),
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.betas),
        weight_decay=cfg.optim.weight_decay,
    )
    if ckpt is not None:
        saved = load_checkpoint(ckpt, optimizer)
        start_iter, env_steps_total = saved["iteration"], saved["env_steps_total"]
        if est_state is not None and saved.get("estimator_state") is not None:
            est_state.load_state_dict(saved["estimator_state"])
        if sampler_state is not None and saved.get("sampler_state") is not None:
            sampler_state.load_state_dict(saved["sampler_state"])
    elif ref_policy is not None and not lora:
        ref_policy.save(run_dir / "reference")
    if est_state is not None and ckpt is None:
        seed_estimator_state(cfg, est_state, make_env, renderer, str(policy.device))

    log = MetricsLog(run_dir, resume_from=start_iter if ckpt is not None else None)
    ctx = UpdateContext(policy, optimizer, cfg, ref_policy)

    def checkpoint(iteration: int) -> None:
        save_checkpoint(
            run_dir,
            iteration,
            policy,
            optimizer,
            {
                "env_steps_total": env_steps_total,
                "estimator_state": est_state.state_dict() if est_state is not None else None,
                "sampler_state": (
                    sampler_state.state_dict() if sampler_state is not None else None
                ),
            },
            keep=cfg.train.keep_checkpoints,
        )

    # --- the loop ------------------------------------------------------------
    interrupted = False
    completed = start_iter
    try:
        with progress.training(cfg.train.iterations, start_iter) as bar, StopOnInterrupt() as stop:
            for it in range(start_iter, cfg.train.iterations):
                t0 = time.perf_counter()
                # 1. tasks
                rng = np.random.default_rng(_iteration_seed(cfg.train.seed, it, 0))
                ids = rng.choice(
                    cfg.rollout.train_tasks, size=cfg.rollout.tasks_per_iter, replace=False
                )
                tasks = [Task.make("train", int(i)) for i in ids]
                # 2. rollouts → forest
                gen = torch.Generator().manual_seed(_iteration_seed(cfg.train.seed, it, 1))
                rollout = sample_rollouts(
                    cfg,
                    policy,
                    renderer,
                    make_env,
                    tasks,
                    sampling=sampling,
                    max_turns=max_turns,
                    generator=gen,
                    state=sampler_state,
                    choice_seed=_iteration_seed(cfg.train.seed, it, 3),
                )
                # oracle rows (SERO) stay out of credit and of the RL batch
                forest, oracle_rows = split_oracle(rollout.forest)
                if cfg.objective.kl_reward_coef > 0:  # KL to the reference as a reward cost
                    penalty = kl_reward_penalty_rows(
                        ctx,
                        forest,
                        beta=cfg.objective.kl_reward_coef,
                        micro_rows=cfg.optim.micro_batch_rows,
                    )
                    forest = dataclasses.replace(
                        forest, reward=forest.reward - penalty, _episodes=None
                    )
                t1 = time.perf_counter()
                # 3. credit
                adv = compute_advantages(cfg.credit.estimator, forest, cfg.credit.params, est_state)
                # 4. objective → optimizer step
                batch = forest.to_batch(adv, pad_id=policy.pad_id)
                upd_gen = torch.Generator().manual_seed(_iteration_seed(cfg.train.seed, it, 2))
                extra = {}
                if oracle_rows.numel():
                    extra["oracle"] = oracle_batch(rollout.forest, pad_id=policy.pad_id)
                update_metrics = policy_update(ctx, batch, iteration=it, generator=upd_gen, **extra)
                t2 = time.perf_counter()
                # 5. metrics, checkpoint
                env_steps_total += rollout.env_steps
                completed = it + 1
                record = _iteration_metrics(it, rollout, forest, adv, env_steps_total, t0, t1, t2)
                record.update(update_metrics)
                if cfg.eval.every and completed % cfg.eval.every == 0:
                    ev = held_out(policy, cfg.eval.periodic_episodes)
                    record["eval/success_rate"] = ev.success_rate
                log.write(record)
                bar.update(completed, record)
                if completed % cfg.train.checkpoint_every == 0 or completed == cfg.train.iterations:
                    checkpoint(completed)
                if stop.requested:
                    checkpoint(completed)
                    interrupted = True
                    progress.say(
                        f"stopped: checkpoint saved after iteration {completed}; continue "
                        f"with: credo train --resume {run_dir}"
                    )
                    break
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, keep the last checkpoint
        interrupted = True
        last = latest_checkpoint(run_dir)
        progress.say(
            f"interrupted at once; resume continues from {last or 'the start'}: "
            f"credo train --resume {run_dir}"
        )
    finally:
        log.close()

    metrics = read_metrics(run_dir / "metrics.jsonl")
    final_eval = None
    if not interrupted:
        with progress.phase(f"held-out eval of the trained policy ({cfg.eval.episodes} episodes)"):
            final_eval = held_out(policy, cfg.eval.episodes)
        (run_dir / "final_eval.json").write_text(json.dumps(final_eval.to_dict(), indent=1))
        policy.save(run_dir / "final_policy")
    baselines = {"warm start (held-out)": warm_eval.success_rate} if warm_eval else {}
    if metrics:
        plot_curves(
            {cfg.recipe: metrics},
            run_dir / "curves.png",
            title=f"{cfg.recipe} on {cfg.env.name}",
            baselines=baselines,
        )
    return TrainResult(
        run_dir,
        len(metrics),
        warm_eval,
        final_eval,
        interrupted,
        time.perf_counter() - t_start,
        metrics,
    )


def _iteration_metrics(
    it: int,
    rollout: Any,
    forest: Any,
    adv: torch.Tensor,
    env_steps_total: int,
    t0: float,
    t1: float,
    t2: float,
) -> dict[str, Any]:
    """The iteration's record; ``forest`` is the RL forest (oracle rows left out)."""
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
        "time/rollout_s": t1 - t0,
        "time/update_s": t2 - t1,
        "time/iteration_s": t2 - t0,
        "perf/env_steps_per_s": rollout.env_steps / max(1e-9, t1 - t0),
        "perf/gen_tokens_per_s": rollout.generated_tokens / max(1e-9, t1 - t0),
        **{k: float(v) for k, v in sorted(rollout.stats.items())},
    }
