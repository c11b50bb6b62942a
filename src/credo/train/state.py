"""The training state: everything an iteration changes, started, saved and resumed as one.

:class:`TrainState` holds the policy being trained, its optimizer, the frozen reference
(when the loss or a configured part needs one: :func:`credo.train.parts.run_needs`), the
estimator's state (ProAS's progress graph), the sampler's state (the tree sampler's
allocator), the task source, the engine (:class:`~credo.engines.Engine`: a sharded trainer
or DeepSpeed around the optimizer), the run's parts (:mod:`credo.train.parts`: an EMA
teacher's weights, the context cache, SERPO's rubric are checkpointed with their part),
the update's context, the iterations done and the env steps taken.
:meth:`TrainState.start` builds it for a fresh run or restores it from a run's latest
checkpoint; :meth:`TrainState.save` writes a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from credo.credit import compute_advantages, estimator_state_factory
from credo.data import RolloutForest
from credo.engines import Engine, fsdp, zero
from credo.engines import distributed as dp
from credo.engines.zero import Zero
from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.policy.lora import shared_reference, trainable_parameters
from credo.policy.tiny import is_tiny
from credo.rollout import SamplerContext, sample_groups
from credo.rollout.group import episodes_to_forest
from credo.tasks import TaskSource, TaskSourceContext, make_task_source
from credo.train.async_rollouts import AsyncRollouts
from credo.train.checkpoint import load_checkpoint, save_checkpoint
from credo.train.parts import PartContext, Parts, build_parts, check_sharded, run_needs
from credo.train.run import Run, add_adapters, build_renderer, sampling_for
from credo.train.sft import collect_demonstrations
from credo.train.update import UpdateContext, UpdateSettings
from credo.utils.atomic import replace_dir

__all__ = ["TrainState", "seed_estimator_state"]


@dataclass
class TrainState:
    """What training changes (see the module docstring).

    Attributes:
        policy: the policy being trained (under FSDP the full sampling copy).
        optimizer: AdamW over the trainer's trainable parameters.
        reference: the frozen reference policy, or ``None`` when nothing needs one.
        estimator: the advantage estimator (``credit.estimator``) and
            :attr:`estimator_params` its knobs.
        estimator_state: a stateful estimator's state, or ``None``.
        sampler_state: a stateful sampler's state, or ``None``.
        tasks: the task source (``tasks.source``; RODS's buffer is state too).
        engine: how the processes share the work (:class:`~credo.engines.Engine`: FSDP's
            sharded trainer, DeepSpeed's ZeRO engine, or neither).
        parts: the run's parts, built once (:mod:`credo.train.parts`).
        update: the update's context: the trainer, the optimizer, the update's settings,
            the reference, the engine and the parts (:mod:`credo.train.update`).
        iteration: iterations completed.
        env_steps_total: env steps taken by all iterations so far.
        rollouts: the iterations sampled ahead with ``rollout.staleness`` ≥ 1
            (:mod:`credo.train.async_rollouts`), or ``None`` (synchronous).
    """

    policy: HFPolicy
    optimizer: torch.optim.Optimizer
    reference: HFPolicy | None
    estimator_state: Any
    sampler_state: Any
    tasks: TaskSource
    engine: Engine
    parts: Parts
    update: UpdateContext
    estimator: str = "grpo"
    estimator_params: dict[str, Any] = field(default_factory=dict)
    iteration: int = 0
    env_steps_total: int = 0
    rollouts: AsyncRollouts | None = None

    @classmethod
    def start(
        cls, run: Run, run_dir: Path, policy: HFPolicy, checkpoint: Path | None
    ) -> TrainState:
        """The state RL starts from: ``policy`` (the warm start) with fresh LoRA adapters
        when configured, the reference, a new optimizer and new estimator and sampler
        states; or, with ``checkpoint``, all of them as that checkpoint saved them.

        A full-weight reference is a frozen copy of the warm start, saved once in
        ``run_dir/reference`` (and loaded from there on resume); under LoRA it is the
        same model with the adapters switched off.
        """
        cfg = run.cfg
        lora = cfg.model.lora is not None
        policy = add_adapters(cfg, policy)
        reference: HFPolicy | None = None
        needs_reference = "reference" in run_needs(cfg)
        if needs_reference and lora:
            reference = shared_reference(policy)
        elif needs_reference:
            reference = policy.frozen_copy()
        factory = estimator_state_factory(cfg.credit.estimator)
        est_state = factory(**cfg.credit.state) if factory is not None else None
        smp_state = run.new_sampler_state()
        if checkpoint is not None:
            policy.load_weights(checkpoint / "policy")
            if reference is not None and not lora:
                reference.load_weights(run_dir / "reference")
        engine = Engine()
        if dp.sharded():  # as train() checked; also for a caller that starts the state itself
            fsdp.check_config(cfg, dp.sharding_name())
            check_sharded(cfg, dp.sharding_name())  # a refused part raises; notices: train()
        if dp.sharded() and fsdp.requested():  # the optimizer updates a sharded copy
            engine.trainer = fsdp.shard_policy(policy, fsdp.settings())
        trainer = engine.trainer or policy
        optimizer = torch.optim.AdamW(
            trainable_parameters(trainer.model),
            lr=cfg.optim.lr,
            betas=tuple(cfg.optim.betas),
            weight_decay=cfg.optim.weight_decay,
        )
        tasks = _task_source(run)
        parts = build_parts(PartContext(cfg, run, policy, reference, engine, run_dir))
        if dp.sharded() and zero.requested():  # DeepSpeed ZeRO-1/2 around the AdamW
            engine.zero = Zero(policy.model, optimizer, cfg, zero.stage())
        update = UpdateContext(
            trainer, optimizer, UpdateSettings.from_config(cfg), reference, engine, parts.update
        )
        state = cls(
            policy, optimizer, reference, est_state, smp_state, tasks, engine, parts, update
        )
        state.estimator, state.estimator_params = cfg.credit.estimator, dict(cfg.credit.params)
        if cfg.rollout.staleness > 0:
            if dp.world_size() > 1:
                raise ValueError(
                    f"rollout.staleness={cfg.rollout.staleness} runs in one process; this "
                    f"run has {dp.world_size()} (use rollout.staleness=0)"
                )
            kv = (cfg.rollout.kv_reuse, cfg.rollout.kv_cache_mb)
            state.rollouts = AsyncRollouts(
                cfg.rollout.staleness, kv_reuse=kv, worker=cfg.rollout.async_worker
            )
            if checkpoint is not None:
                state.rollouts.load(checkpoint, policy)
        if checkpoint is not None:
            saved = load_checkpoint(checkpoint, engine.loaded_optimizer(optimizer))
            state.iteration, state.env_steps_total = saved["iteration"], saved["env_steps_total"]
            for obj, key in (
                (est_state, "estimator_state"),
                (smp_state, "sampler_state"),
                (state.tasks, "task_source"),
            ):
                if obj is not None and saved.get(key) is not None:
                    obj.load_state_dict(saved[key])
            for part in parts.all.values():
                key = part.checkpoint_key
                part.load(checkpoint, saved.get(key) if key is not None else None)
            return state
        if reference is not None and not lora and dp.is_main():  # by temp-and-rename
            replace_dir(run_dir / "reference", reference.save)
        if est_state is not None:
            seed_estimator_state(run, est_state)
        return state

    def advantages(self, forest: RolloutForest) -> torch.Tensor:
        """``[N]`` the estimator's advantages of ``forest``'s rows (a stateful estimator's
        state learns from it)."""
        return compute_advantages(
            self.estimator, forest, self.estimator_params, self.estimator_state
        )

    def save(self, run_dir: Path, keep: int) -> Path | None:
        """Write checkpoint ``step_<iteration>`` (keeping the ``keep`` newest) on rank 0;
        every rank calls it (a sharded optimizer's state is gathered first), the others
        get ``None``."""
        optimizer = self.engine.saved_optimizer(self.optimizer)  # a collective when sharded
        if not dp.is_main():
            return None
        parts = self.parts.all.values()
        return save_checkpoint(
            run_dir,
            self.iteration,
            self.policy,
            optimizer,
            {
                "env_steps_total": self.env_steps_total,
                "estimator_state": _state_dict(self.estimator_state),
                "sampler_state": _state_dict(self.sampler_state),
                "task_source": _state_dict(self.tasks),
                **{p.checkpoint_key: p.state_dict() for p in parts if p.checkpoint_key},
            },
            keep=keep,
            write_extra=lambda folder: self._write_extra(folder),
        )

    def _write_extra(self, folder: Path) -> None:
        """The parts' files, and what is in flight with asynchronous rollouts."""
        for part in self.parts.all.values():
            part.write(folder)
        if self.rollouts is not None:
            self.rollouts.write(folder, self.iteration)


def _task_source(run: Run) -> TaskSource:
    """The task source ``tasks.source`` names, for this run's pool and env."""
    r = run.cfg.rollout
    ctx = TaskSourceContext(r.train_tasks, r.tasks_per_iter, run.make_env)
    return make_task_source(run.cfg.tasks.source, run.cfg.tasks.params, ctx)


def _state_dict(obj: Any) -> Any:
    return obj.state_dict() if obj is not None else None


def seed_estimator_state(run: Run, state: Any) -> int:
    """Seed a stateful estimator (ProAS's graph) as ``credit.seed_graph`` says.

    ``demonstrations``: the env's clean oracle episodes on training tasks the RL loop
    is unlikely to draw (seeds from 10⁸). ``teacher``: the successful episodes of the
    policy folder ``credit.teacher`` on the same tasks, sampled with that policy's own
    response cap (a Hugging Face teacher writes 48 tokens by default, the built-in model
    16). Returns the successful episodes added.
    """
    cfg = run.cfg
    mode = cfg.credit.seed_graph
    if mode == "empty":
        return 0
    first = 100_000_000
    if mode == "demonstrations":
        episodes = collect_demonstrations(
            run.make_env,
            run.renderer,
            episodes=cfg.credit.seed_episodes,
            epsilon=0.0,
            seed=cfg.train.seed,
            first_task=first,
        ).episodes
    else:
        teacher = HFPolicy.from_pretrained(cfg.credit.teacher, device=str(run.policy.device))
        builtin = is_tiny(teacher)
        ctx = SamplerContext(
            teacher,
            build_renderer(cfg, teacher, builtin=builtin, env=run.make_env(), make=run.make_env),
            run.make_env,
            sampling_for(cfg, builtin=builtin),
            run.max_turns,
            torch.Generator().manual_seed(cfg.train.seed),
        )
        tasks = [Task.make("train", first + i) for i in range(cfg.credit.seed_episodes)]
        episodes = sample_groups(ctx, tasks, group_size=1).episodes
    state.add_episodes(episodes_to_forest(episodes), only_successful=True)
    return sum(e.success for e in episodes)
