"""The training state: everything an iteration changes, started, saved and resumed as one.

:class:`TrainState` holds the policy being trained, its optimizer, the frozen reference
(when a KL term, SERO's reference weights or Rényi OPSD need one), the estimator's state
(ProAS's progress graph), the sampler's state (the tree sampler's allocator), the
teachers (:class:`~credo.train.teaching.Teaching`: an EMA teacher's weights and the
context cache are checkpointed), the iterations done and the env steps taken.
:meth:`TrainState.start` builds it for a fresh run or restores
it from a run's latest checkpoint; :meth:`TrainState.save` writes a checkpoint.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from credo.credit import estimator_state_factory
from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.policy.lora import shared_reference, trainable_parameters
from credo.policy.tiny import is_tiny
from credo.rollout import SamplerContext, sample_groups
from credo.rollout.group import episodes_to_forest
from credo.tasks import TaskSource, TaskSourceContext, make_task_source
from credo.train import distributed as dp
from credo.train import fsdp, zero
from credo.train.checkpoint import load_checkpoint, save_checkpoint
from credo.train.judging import Judging
from credo.train.profiles import needs_profiles
from credo.train.run import Run, add_adapters, build_renderer, sampling_for
from credo.train.sft import collect_demonstrations
from credo.train.teaching import Teaching
from credo.train.zero import Zero
from credo.utils.atomic import replace_dir

__all__ = ["TrainState", "seed_estimator_state"]


@dataclass
class TrainState:
    """What training changes (see the module docstring).

    Attributes:
        policy: the policy being trained.
        optimizer: AdamW over its trainable parameters.
        reference: the frozen reference policy, or ``None`` when nothing needs one.
        estimator_state: a stateful estimator's state, or ``None``.
        sampler_state: a stateful sampler's state, or ``None``.
        teaching: the run's teachers (``teacher`` section), or ``None``.
        judging: the run's judge and rubric (``judge`` section, SERPO), or ``None``.
        iteration: iterations completed.
        env_steps_total: env steps taken by all iterations so far.
        tasks: the task source (``tasks.source``; RODS's buffer is state too).
        trainer: with an accelerate FSDP config, the sharded copy of ``policy`` that the
            optimizer updates (``policy`` is then the full sampling copy, refreshed after
            every update: :mod:`credo.train.fsdp`); ``None`` otherwise.
        zero: with an accelerate DeepSpeed config, the ZeRO-1/2 engine around
            ``optimizer`` (:mod:`credo.train.zero`); ``None`` otherwise.
    """

    policy: HFPolicy
    optimizer: torch.optim.Optimizer
    reference: HFPolicy | None
    estimator_state: Any
    sampler_state: Any
    teaching: Teaching | None = None
    iteration: int = 0
    env_steps_total: int = 0
    tasks: TaskSource | None = None
    judging: Judging | None = None
    trainer: HFPolicy | None = None
    zero: Zero | None = None

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
        needs_reference = _needs_reference(cfg)
        if needs_reference and lora:
            reference = shared_reference(policy)
        elif needs_reference:
            reference = HFPolicy(
                copy.deepcopy(policy.model).eval(), policy.tokenizer, policy.device
            )
            for p in reference.model.parameters():
                p.requires_grad_(False)
        factory = estimator_state_factory(cfg.credit.estimator)
        est_state = factory(**cfg.credit.state) if factory is not None else None
        smp_state = run.new_sampler_state()
        if checkpoint is not None:
            policy.load_weights(checkpoint / "policy")
            if reference is not None and not lora:
                reference.load_weights(run_dir / "reference")
        trainer = None
        if dp.sharded():
            fsdp.check_config(cfg, dp.sharding_name())
        if dp.sharded() and fsdp.requested():  # the optimizer updates a sharded copy
            trainer = fsdp.shard_policy(policy, fsdp.settings())
        optimizer = torch.optim.AdamW(
            trainable_parameters((trainer or policy).model),
            lr=cfg.optim.lr,
            betas=tuple(cfg.optim.betas),
            weight_decay=cfg.optim.weight_decay,
        )
        teaching = Teaching.build(cfg, policy, reference)
        state = cls(
            policy, optimizer, reference, est_state, smp_state, teaching, tasks=_task_source(run)
        )
        state.judging = Judging.from_run(cfg, run.make_env, run_dir, policy.device)  # SERPO
        state.trainer = trainer
        if dp.sharded() and zero.requested():  # DeepSpeed ZeRO-1/2 around the AdamW
            state.zero = Zero(policy.model, optimizer, cfg, zero.stage())
        if checkpoint is not None:
            view: Any = optimizer  # full (1-process) state in the files, in every mode
            if trainer is not None:
                view = fsdp.FullStateOptimizer(optimizer)
            elif state.zero is not None:
                view = state.zero
            saved = load_checkpoint(checkpoint, view)
            state.iteration, state.env_steps_total = saved["iteration"], saved["env_steps_total"]
            for obj, key in (
                (est_state, "estimator_state"),
                (smp_state, "sampler_state"),
                (state.tasks, "task_source"),
                (state.judging, "judge_state"),
            ):
                if obj is not None and saved.get(key) is not None:
                    obj.load_state_dict(saved[key])
            if teaching is not None:
                teaching.load(checkpoint, saved.get("teacher_state"))
            return state
        if reference is not None and not lora and dp.is_main():  # by temp-and-rename
            replace_dir(run_dir / "reference", reference.save)
        if est_state is not None:
            seed_estimator_state(run, est_state)
        return state

    def save(self, run_dir: Path, keep: int) -> Path | None:
        """Write checkpoint ``step_<iteration>`` (keeping the ``keep`` newest) on rank 0;
        every rank calls it (a sharded trainer's optimizer state is gathered first), the
        others get ``None``."""
        optimizer: Any = self.optimizer
        if self.trainer is not None:  # a collective: full AdamW moments, one file set
            optimizer = fsdp.gathered_optimizer(self.optimizer)
        elif self.zero is not None:  # the same for DeepSpeed's fragments
            optimizer = self.zero.gathered()
        if not dp.is_main():
            return None
        return save_checkpoint(
            run_dir,
            self.iteration,
            self.policy,
            optimizer,
            {
                "env_steps_total": self.env_steps_total,
                "estimator_state": _state_dict(self.estimator_state),
                "sampler_state": _state_dict(self.sampler_state),
                **({"teacher_state": self.teaching.state_dict()} if self.teaching else {}),
                "task_source": _state_dict(self.tasks),
                **({"judge_state": self.judging.state_dict()} if self.judging else {}),
            },
            keep=keep,
            write_extra=self.teaching.write if self.teaching else None,
        )


def _task_source(run: Run) -> TaskSource:
    """The task source ``tasks.source`` names, for this run's pool and env."""
    r = run.cfg.rollout
    ctx = TaskSourceContext(r.train_tasks, r.tasks_per_iter, run.make_env)
    return make_task_source(run.cfg.tasks.source, run.cfg.tasks.params, ctx)


def _state_dict(obj: Any) -> Any:
    return obj.state_dict() if obj is not None else None


def _needs_reference(cfg: Any) -> bool:
    obj = cfg.objective
    return (
        obj.kl_coef > 0
        or obj.kl_reward_coef > 0
        or (cfg.rollout.oracle_horizon > 0 and obj.oracle_frozen == "reference")
        or (cfg.teacher.enabled and obj.loss == "renyi_opsd")  # Rényi OPSD's z_ref
        or needs_profiles(cfg)  # RAPO's reference with and without the profile
    )


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
