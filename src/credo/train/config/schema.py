"""The config schema: one typed dataclass per section, every field documented with its
default, and the checked conversion of a plain mapping (YAML) into them.

:meth:`Config.from_dict` builds a :class:`Config` from a mapping (unknown keys and wrong
types fail with the valid keys or the expected type) and validates it
(:mod:`credo.train.config.validate`). ``Config.to_dict()`` is what a run saves as
``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from credo.policy.lora import LoRAConfig
from credo.policy.tiny import TinyModelConfig
from credo.train.config.errors import ConfigError

__all__ = [
    "Config",
    "ConfigError",
    "CreditConfig",
    "CriticConfig",
    "EnvConfig",
    "EvalConfig",
    "JudgeConfig",
    "ModelConfig",
    "OPRDConfig",
    "ObjectiveConfig",
    "OptimConfig",
    "RolloutConfig",
    "SFTConfig",
    "TasksConfig",
    "TeacherConfig",
    "TrainConfig",
]


@dataclass
class EnvConfig:
    """Which environment to train on.

    Attributes:
        name: registry name (``credo envs`` lists them) or ``module:Class``. Default
            ``shop``.
        kwargs: keyword arguments for the env's constructor, e.g. ``{difficulty: multi}``.
    """

    name: str = "shop"
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    """The policy model.

    Attributes:
        name: ``None`` (default) for the built-in tiny model, else a credo alias
            (``smollm2-135m``: a real pretrained model, no download; see
            :mod:`credo.policy.models`), a Hugging Face model name or a local folder
            loaded with ``AutoModelForCausalLM``.
        tiny: size of the built-in model (ignored when ``name`` is set).
        dtype: ``float32`` (default), ``bfloat16``, ``float16``, or ``auto`` (bfloat16 on
            a GPU that supports it, else float32) for HF models.
        device: ``cpu`` (default), ``cuda``, ``cuda:1``, ``auto`` (cuda when available).
        lora: LoRA adapters, e.g. ``{r: 8, alpha: 16, target_modules: [q_proj, v_proj]}``
            (see :class:`~credo.policy.lora.LoRAConfig`; needs ``peft``). ``None``
            (default) trains every weight. With LoRA only the adapters are trained,
            optimised and checkpointed, and the KL reference is the same model with the
            adapters switched off (no second copy).
        gradient_checkpointing: recompute activations in the backward pass instead of
            keeping them (default false): less memory, about a third more compute.
        mixed_precision: ``None`` (default) or ``bf16``: weights, gradients and optimizer
            state stay float32 (``dtype: float32``) while forward passes run under
            ``torch.autocast`` in bfloat16, the output head (the log-probs) in float32
            (:mod:`credo.policy.precision`). Much faster on CPUs with bfloat16 units
            (AMX) and on GPUs; log-probs then differ from float32 by about 1e-2.
    """

    name: str | None = None
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    dtype: str = "float32"
    device: str = "cpu"
    lora: LoRAConfig | None = None
    gradient_checkpointing: bool = False
    mixed_precision: str | None = None


@dataclass
class RolloutConfig:
    """How episodes are sampled each iteration.

    Attributes:
        sampler: ``group`` (G episodes per task, default), ``single`` (one episode per
            task: ``group_size`` is ignored; KLPO), ``tree`` (TSBPO: one tree of
            ``group_size`` leaves per task, roots plus branches restarted from env
            snapshots; :mod:`credo.rollout.tree`) or ``resample`` (AXPO: groups of
            ``group_size``, plus re-sampled tool calls in all-failed groups;
            :mod:`credo.rollout.resample`).
        sampler_params: the sampler's knobs (``tree``: :class:`credo.rollout.TreeParams`,
            e.g. ``{allocator: uniform}``; ``resample``: :class:`credo.rollout.
            ResampleParams`, e.g. ``{budget: 0.25}``); unknown keys fail at load time.
        tasks_per_iter: distinct training tasks per iteration (default 16).
        group_size: G, episodes per task (default 8); the tree sampler's budget B.
        temperature: sampling temperature (default 1.0; evaluation uses the same).
        top_p: nucleus mass (default 1.0).
        max_new_tokens: response cap per turn; ``None`` (default) = 16 for the built-in
            model (actions are a few words), 48 for HF chat models (room for a few words
            around the action).
        history_turns: past turns shown in the prompt: for the built-in model their
            actions, for chat models (observation, action) turns. ``None`` (default) = 3
            for the built-in model, 2 for HF chat models. The built-in model's prompt
            shows the page and the past actions only: with two, on ``shop/multi`` an
            invalid ``choose`` and a ``back`` pushed the ``click`` that opened an item out
            of view, and GRPO's policy re-opened the item it had found wanting until its
            turns ran out (``studies/history-multi.yaml``; 2 was the default until
            2026-12-07). Chat models keep the 2 their LLM results were measured with.
        notes: the built-in model's response may state a note before its action,
            ``<note> action : <action>``; the action is what follows the last ``action :``
            (default false: the whole response is the action). SpatialCLI's internalised
            policy states the tool's answer so (:mod:`credo.pipeline.internalise`);
            evaluate it with ``rollout.notes=true`` and room for the note in
            ``max_new_tokens``.
        history_tokens: token budget of the episode's history in the prompt (default 0:
            ``history_turns`` as above). When > 0 it replaces ``history_turns``: past
            (observation, action) turns, for the built-in model too, kept most recent
            first while they fit, left-out turns marked (see
            :mod:`credo.rollout.render`). The built-in model needs
            ``history_tokens + 128 ≤ model.tiny.max_position_embeddings``.
        system_prompt: chat models: the system message template, with ``{instruction}``
            and ``{action_format}`` placeholders (default ``None``: credo's, see
            :data:`~credo.rollout.render.DEFAULT_SYSTEM_PROMPT`).
        user_prompt: chat models: the user message template, with ``{instruction}`` and
            ``{observation}`` (default ``None``: goal and observation).
        chat_examples: chat models: demonstration episodes of the env's oracle (on
            training tasks) shown before the episode, a few-shot prompt (default 0:
            zero-shot).
        max_turns: sampler turn cap; ``None`` (default) trusts the env's own limit and
            caps at 64.
        invalid_penalty: subtracted from an invalid action's reward (default 0.0).
        train_tasks: size of the training task pool, seeds ``0..train_tasks-1``
            (default 100000; tasks are drawn from it each iteration).
        aux_samples: M auxiliary tokens drawn from the sampler at every generated
            position (KLPO; default 0 = none).
        topk_logprobs: K, the sampler's K most likely tokens and their log-probs stored
            at every generated position (KLPO's ``kl: topk``; default 0 = none).
        oracle_horizon: K, oracle steps per SERO oracle continuation, an add-on on top
            of any sampler (:mod:`credo.rollout.oracle`; default 0 = off). The env needs
            ``oracle_action()``. The continuations feed ``objective.oracle_coef``'s loss
            and never the policy-gradient loss.
        oracle_per_group: start states per group for oracle continuations (default 2).
        oracle_start: where they start: ``all`` (any state the policy reached,
            default) or ``failed`` (states on failed episodes only).
        on_restore_divergence: what the branching samplers (tree, resample, oracle)
            do when a restored env does not reproduce the recorded observation: ``error``
            (default: stop with a message that says how to fix the env) or ``skip``
            (drop that branch, count it in ``rollout/restore_divergences``, log a
            warning).
        step_timeout: seconds one env call (``reset``, ``step``, ``snapshot``, ...) may
            take before its episode fails, is written to ``env_errors.jsonl`` and the env
            is replaced by a fresh one (default 60: generous for envs that call a web
            service or run code, and a hung env still costs at most a minute per
            episode); ``null`` or 0 = no limit. Main thread only (a ``SIGALRM`` timer).
        agent: train an agent written against the OpenAI API instead of running the env
            loop: ``package.module:function`` or ``path/to/file.py:function``, an
            ``agent(task, client, session_id)`` (``async def`` or ``def``) returning the
            reward or ``{reward: r, success: bool}`` (``credo train --agent``; needs the ``serve``
            extra; :mod:`credo.agent.sampler`). The rollouts and the held-out evaluation
            then go through the agent, with the policy served on 127.0.0.1. Default
            ``None``: the env loop of ``sampler``.
        agent_timeout_s: the longest one agent episode may take, in seconds; a slower
            episode fails (reward 0, counted in ``rollout/agent_timeouts``), not the run
            (default 300).
        agent_concurrency: most agent episodes at once (default ``None``: as many as the
            server batches at once, 64, so that the timeout measures an agent, not the
            queue of all of an iteration's requests). 1 makes agent runs bit-for-bit
            reproducible, ``--resume`` included; with more, which requests share a batch
            depends on timing.
        kv_reuse: keep each episode's KV cache between its turns and feed only the new
            tokens when the next prompt starts with what the model already read (default
            true; :mod:`credo.policy.kvcache`). Prompts that do not extend it (a sliding
            history window, a template that rewrites earlier turns) get a full prefill,
            decided from the token ids; models whose cache is not a plain per-layer
            key/value list (sliding-window or recurrent layers) switch it off by
            themselves. Exact: the samples are those without reuse (up to floating-point
            summation order).
        kv_cache_mb: most MiB of cached keys and values kept between turns (default 1024);
            beyond it the least recently used episodes lose their cache and fall back to a
            full prefill. The caches of finished episodes are freed at once.
        engine: what generates the rollouts (:mod:`credo.policy.engine`): ``hf`` (default:
            the trainer's own model, in process) or ``vllm`` (a vLLM engine synced with the
            trainer's weights after every update; the ``vllm`` extra and a CUDA GPU,
            ``docs/engines/vllm.md``). The held-out evaluation always uses ``hf``.
        engine_params: the engine's knobs (``vllm``: :class:`credo.policy.vllm_engine.
            VLLMParams`, e.g. ``{gpu_memory_utilization: 0.3, lora: merge}``); unknown keys
            fail at load time.
        staleness: k, asynchronous rollouts (default 0: synchronous). With k ≥ 1 a
            worker (``async_worker``) samples the next iterations while the trainer
            updates, each iteration ``j`` by the weights after ``max(0, j − k)`` updates;
            the batch's log-probs are that sampler's (``objective.tis_cap`` corrects
            against them). One process, a sampler without state across iterations
            (:mod:`credo.train.async_rollouts`, ``docs/engines/async.md``).
        async_worker: what samples ahead with ``staleness`` ≥ 1: ``thread`` (default: a
            thread of the trainer's process) or ``process`` (a forked child with its own
            interpreter, weights sent once per update through shared memory, one torch
            thread; the same rollouts, more overlap where Python dominates the step; needs
            ``fork``).
        env_workers: N, Ray actors that hold the rollouts' envs (default 0; 0 and 1 keep
            them in this process). With N ≥ 2 the env calls of each batch (every live
            episode's ``reset`` or ``step``) run in parallel across the actors while the
            policy still generates in one batch here (:mod:`credo.rollout.ray_envs`,
            ``docs/engines/ray.md``; needs the ``ray`` extra). Exact: the same samples
            and metrics as in process.
        ray_address: the Ray cluster the env actors run on (e.g. ``ray://head:10001`` or
            ``auto``); default ``None``: a local Ray started by credo (or the one already
            running in the process).
        env_timeout_s: seconds one env call may run on its actor before the actor counts
            as hung (default 30); a hung or dead actor is replaced and its envs rebuilt
            by replaying their episodes (same task, seed and actions), so metrics equal
            a run without the fault. Must be below ``step_timeout`` when that is set.
        env_retries: replacements of a failed call's actor before its episode fails as
            an env error (``env_errors.jsonl``) and the run goes on (default 2).
    """

    sampler: str = "group"
    sampler_params: dict[str, Any] = field(default_factory=dict)
    tasks_per_iter: int = 16
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None
    history_turns: int | None = None
    notes: bool = False
    history_tokens: int = 0
    system_prompt: str | None = None
    user_prompt: str | None = None
    chat_examples: int = 0
    max_turns: int | None = None
    invalid_penalty: float = 0.0
    train_tasks: int = 100_000
    aux_samples: int = 0
    topk_logprobs: int = 0
    oracle_horizon: int = 0
    oracle_per_group: int = 2
    oracle_start: str = "all"
    on_restore_divergence: str = "error"
    step_timeout: float | None = 60.0
    agent: str | None = None
    agent_timeout_s: float = 300.0
    agent_concurrency: int | None = None
    kv_reuse: bool = True
    kv_cache_mb: float = 1024.0
    engine: str = "hf"
    engine_params: dict[str, Any] = field(default_factory=dict)
    staleness: int = 0
    async_worker: str = "thread"
    env_workers: int = 0
    ray_address: str | None = None
    env_timeout_s: float = 30.0
    env_retries: int = 2

    @property
    def sampler_in_use(self) -> str:
        """The sampler the rollouts go through: ``agent`` when ``agent`` is set (the
        agent's own episodes, :mod:`credo.agent`), else ``sampler``."""
        return "agent" if self.agent is not None else self.sampler


@dataclass
class TasksConfig:
    """Where each iteration's training tasks come from (:mod:`credo.tasks`).

    Attributes:
        source: ``fixed`` (default: ``rollout.tasks_per_iter`` distinct seeds drawn
            uniformly from ``rollout.train_tasks`` every iteration) or ``rods`` (a
            buffer that follows the capability boundary: boundary tasks spawn variants,
            mastered and dead tasks retire; :mod:`credo.tasks.rods`).
        params: the source's knobs (``rods``: :class:`credo.tasks.RodsParams`, e.g.
            ``{seed_pool: 64, max_pool: 256, tau_v: 0.5, tau_hi: 0.9, retire_after: 2}``);
            unknown keys fail at load time.
    """

    source: str = "fixed"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class CreditConfig:
    """The advantage estimator.

    Attributes:
        estimator: registry name (``grpo`` default; ``credo recipes`` shows what each
            recipe uses). Unknown names fail with the list of valid ones.
        params: keyword arguments of the estimator function.
        state: keyword arguments for a stateful estimator's state object (ProAS's
            ``ProgressGraph``: ``decay``, ``prune_frac``, ...).
        seed_graph: how a stateful estimator's graph starts: ``empty`` (default),
            ``demonstrations`` (the env's clean oracle episodes) or ``teacher`` (the
            successful episodes of the policy in ``teacher``).
        seed_episodes: episodes used to seed it (default 200).
        teacher: a policy folder (e.g. a run's ``final_policy``) for ``seed_graph: teacher``.
    """

    estimator: str = "grpo"
    params: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    seed_graph: str = "empty"
    seed_episodes: int = 200
    teacher: str | None = None


@dataclass
class ObjectiveConfig:
    """The policy loss.

    Attributes:
        loss: registry name (``ppo`` default).
        params: keyword arguments of the loss function (e.g. ``clip_low``).
        aggregation: how token losses become a scalar (default ``token-mean``).
        aggregation_params: knobs of the aggregation mode, if any.
        kl_coef: weight of a KL(π ‖ π_ref) loss term to the frozen warm-start policy
            (default 0: no reference model is kept).
        kl_estimator: ``k1``, ``k2`` or ``k3`` (default).
        kl_reward_coef: β of a KL *reward penalty*: each step's reward loses
            β·Σ_tokens k(π_old, π_ref) before credit assignment (default 0: none). Uses
            the same reference and estimator as ``kl_coef``; both can be on.
        entropy_coef: c_H, weight of an entropy bonus (default 0: none). The loss loses
            c_H·Σ w·H, H the policy's entropy over the vocabulary at each loss token
            (at ``rollout.temperature``), w the aggregation weights. On shop/multi
            0.01 and 0.001 did not narrow GRPO's seed spread
            (docs/studies/entropy-bonus-multi.md).
        oracle_coef: λ_O, weight of SERO's oracle-continuation loss L_O
            (:mod:`credo.objectives.sero`; default 0: none, the base method exactly).
            Needs ``rollout.oracle_horizon`` ≥ 1.
        oracle_weight: the policy-reachability weight of an oracle step: ``product``
            (default: product of the frozen policy's probabilities of the oracle actions
            before it), ``geomean`` (of their per-token geometric means) or ``none``.
        oracle_weight_min: lower clip of that weight, in [0, 1] (default 0: none).
        oracle_weight_inclusive: also count the step's own action in its weight
            (default false).
        oracle_frozen: the frozen policy of the weights: ``iteration`` (default: the
            policy as it was when the iteration's rollouts were sampled) or
            ``reference`` (the warm-start policy, kept as for ``kl_coef``).
        tis_cap: C of truncated importance sampling for the sampler/trainer mismatch
            (:mod:`credo.objectives.tis`): each token's policy-gradient term is multiplied
            by ``min(π_trainer_old/π_engine, C)`` (default ``None``: off; e.g. 2 with
            ``rollout.engine=vllm``). Needs ``optim.recompute_old_logprobs``.
    """

    loss: str = "ppo"
    params: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "token-mean"
    aggregation_params: dict[str, Any] = field(default_factory=dict)
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_reward_coef: float = 0.0
    entropy_coef: float = 0.0
    oracle_coef: float = 0.0
    oracle_weight: str = "product"
    oracle_weight_min: float = 0.0
    oracle_weight_inclusive: bool = False
    oracle_frozen: str = "iteration"
    tis_cap: float | None = None


@dataclass
class OptimConfig:
    """Optimiser and update schedule.

    Attributes:
        lr: AdamW learning rate (default 3e-4).
        lr_schedule: how the learning rate changes over the run's iterations (default
            ``constant``). ``linear``: ``lr · (1 − it / train.iterations)`` at iteration
            ``it`` (0-based), the full rate first and ``lr / train.iterations`` last, as
            CleanRL's PPO anneals it and TRL's linear default decays it; set at the start
            of each iteration's update, so ``--resume`` continues it exactly (an annealed
            run is not extended). Measured with GRPO, 3 seeds (docs/studies/lr-schedule-*):
            on TextLights 91.5 % ± 3.0 held out against 84.7 % ± 8.5, the final weights no
            longer off their last iterations; on ``shop/multi`` 84.9 % ± 14.6 against
            80.7 % ± 8.2 (two seeds +8, the plateaued seed −3.2); on the default run
            92.4 % ± 11.7 against 91.8 % ± 8.2. Not the default: the spread widened on two
            of the three.
        weight_decay: AdamW weight decay (default 0).
        betas: AdamW betas (default ``[0.9, 0.999]``).
        grad_clip: max gradient norm (default 1.0).
        epochs: passes over each iteration's batch (default 1).
        minibatches: optimizer steps per epoch (default 4: each iteration's batch is
            split into four mini-batches, one clipped step each, so from the second step
            on the PPO ratio differs from 1 and the clip acts, as verl's PPO mini-batches
            and TRL's reuse of a generation batch do). Chosen by learning in the
            update-schedule studies (``studies/update-schedule-*.yaml``): on TextLights
            1 × 4 reached 94.9 % held-out (sd 3.9, 3 seeds) against 75.6 % (sd 3.4) with
            one step per batch. ``1`` is the earlier default (one step per batch, ratio
            exactly 1). The cost per iteration is the same: the rows are split, not
            repeated.
        micro_batch_rows: rows per forward/backward (gradient accumulation; default 256).
        micro_batch_tokens: also cap each forward/backward at this many padded tokens
            (rows × longest row; default ``None``: rows only). Chat prompts vary from a
            hundred to a thousand tokens, so a token budget (e.g. 4096 for SmolLM2 on a
            CPU) bounds activation memory where a row count does not.
        recompute_old_logprobs: score π_old with the trainer before updating (default
            true) rather than trusting the sampler's numbers.
        skip_zero_advantage: leave the episodes whose advantages are all exactly 0 (GRPO
            groups with one outcome) out of the update's forward and backward passes and
            out of the π_old scoring (default false). The gradient and the optimizer step
            are unchanged up to float rounding: the aggregation weights are still those of
            the whole mini-batch, and a mini-batch with nothing left still takes its (zero
            gradient) step. Needs a loss registered as advantage-weighted (``ppo``,
            ``holder``, ``holder_token``, ``ppo_rapo``), ``objective.kl_coef`` = 0 and
            ``objective.entropy_coef`` = 0. The ``policy/*`` metrics then describe the
            scored rows only; ``policy/skipped_rows`` is the share left out.
        max_kl: a trust region on each iteration's update (default ``0.2``; ``None``: none).
            After every optimizer step the policy is scored on the mini-batch it stepped on;
            when its KL to the sampler (k3, mean per loss token) exceeds ``max_kl``, the
            step is undone (weights and optimizer state) and the iteration's remaining steps
            are skipped. It stops one step on little evidence (a batch with one or two mixed
            groups) from moving a nearly deterministic policy far, as Spinning Up's PPO
            stops at its ``target_kl``, but undoes the step that crossed the line instead of
            keeping it. At 0.2 it acts only on such steps: on TextLights (3 seeds) and
            ``shop/multi`` it undid no step and the runs are the same as without it; on the
            default run it undid one step per seed and turned a collapse (0.0 % held out)
            into 82.4 % (docs/results.md#the-default-run,
            docs/studies/trust-region-multi.md). 0.05 undoes more and cost ``shop/multi``
            15.1 points in mean. Costs one forward pass (no grad) of each mini-batch (about
            1.13× the iteration's time for the built-in model) and one copy of the trainable
            weights and the optimizer's state (3× the trainable weights with AdamW; small
            with LoRA), kept in host memory, pinned, when the weights are on a GPU, so it
            adds no GPU memory (``benchmarks/trust_region_snapshot.py``). Off
            under FSDP and DeepSpeed ZeRO, which shard the optimizer's state (the run says
            so). Metrics: ``policy/kl_after_step``, ``policy/steps_kept``,
            ``policy/steps_undone``.
        zero_grad_step: take the optimizer step when a mini-batch's gradient is exactly
            zero (every advantage 0 and no other loss term). AdamW would then still move
            the weights by its moments, with no evidence in the batch. Default false: the
            step is skipped (the optimizer's moments do not advance either); measured in
            docs/studies/zero-grad-step.md (GRPO 33.5 → 36.2 %, ProAS's pruned teacher
            26.3 ± 22.7 → 38.7 ± 3.0 %, its collapsed seed did not collapse). true is the
            behaviour of every result published before 2026-12-04 and of the golden
            metrics (tests/test_train_golden.py pins it). Under DeepSpeed ZeRO every step
            is taken (its engine steps itself).
    """

    lr: float = 3e-4
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0
    epochs: int = 1
    minibatches: int = 4
    micro_batch_rows: int = 256
    micro_batch_tokens: int | None = None
    recompute_old_logprobs: bool = True
    skip_zero_advantage: bool = False
    max_kl: float | None = 0.2
    zero_grad_step: bool = False


@dataclass
class SFTConfig:
    """Warm start by supervised fine-tuning on the env's oracle demonstrations.

    Attributes:
        enabled: run the warm start (default true; the env needs ``oracle_action``).
        episodes: clean demonstration episodes (default 8000).
        steps: optimizer steps on clean demonstrations (default ``None``: the env's
            ``sft_steps`` attribute if it has one, else 2500; on `shop` the clean phase
            has every skill, at 97–100 % greedy accuracy per page, by step 1500–2000 for
            the seeds we probed; `tools` asks for 6000, since copying ids and names from
            tool results comes late in SFT).
        noisy_episodes: ε-noisy demonstration episodes (default 3000).
        noisy_steps: further steps on the noisy demonstrations (default 300).
        epsilon: probability of a random plausible action in a noisy demonstration
            (default 0.3).
        batch_size: rows per step (default 32).
        lr: peak learning rate (default 1e-3), cosine-decayed. At 3e-3 the clean phase
            was unstable: loss spikes undid skills it had learned, and whether the
            warm start could click the in-budget item depended on the seed.
        noisy_lr: learning rate of the noisy phase (default 1e-3).
        privileged: also teach the model to read the env's privileged text (a kind its
            ``privileged_context`` offers, e.g. ``oracle``; default ``None``): oracle steps
            also give rows whose prompt carries that text, rendered as the teacher's
            prompts are (``teacher.placement``, ``teacher.template``). A self-teacher
            (``teacher.kind: self``) needs it on a model trained from scratch, which
            otherwise never saw such text (docs/algorithms.md#rényi-opsd). ``anchor``
            (MT-SDPO): the text of each oracle step of a successful demonstration is that
            episode's own actions through ``teacher.sanitiser``, as the teacher reads a
            verified trajectory of the task.
        privileged_share: the share of those rows added to each phase's rows (default
            0.5; in (0, 1]).
        privileged_steps: optimizer steps on those rows alone, before the clean phase
            (default 0; needs ``privileged``). Mixed in with the plain rows from the
            start, the 64-wide model on TextLights never learned to copy the oracle's
            action from the text (log p of that action −1.08 with it, −1.05 without, even
            after 1000 steps at share 1); 200 steps on the text rows first teach the
            copy (−0.27 with, −3.9 without), and the clean phase then keeps it
            (docs/algorithms.md#rényi-opsd).
        agent_reply: with ``rollout.agent``, the warm start runs the agent itself with
            the env's oracle answering in the model's place, each reply written as this
            template (e.g. ``"Action: {action}"``), or ``tool_call`` (the action as a
            tool call, for an agent that sends ``tools=`` and reads
            ``message.tool_calls``; the env needs ``action_as_call``, as ``tools`` has),
            and trains on the exact prompts the agent sent (:mod:`credo.agent.demos`,
            ``docs/serve.md``). Default ``None``:
            credo's own prompts (the env's oracle demonstrations as credo renders them).
        cache: reuse a warm start with the same config hash from the cache folder
            (``$CREDO_CACHE`` or ``~/.cache/credo``; default true).
        seed: the warm start's seed: the built-in model's initial weights, the
            demonstrations and the SFT shuffles (default ``None``: ``train.seed``). Set it
            to run RL with several ``train.seed`` values from one warm start.
    """

    enabled: bool = True
    episodes: int = 8000
    steps: int | None = None
    noisy_episodes: int = 3000
    noisy_steps: int = 300
    epsilon: float = 0.3
    batch_size: int = 32
    lr: float = 1e-3
    noisy_lr: float = 1e-3
    privileged: str | None = None
    privileged_share: float = 0.5
    privileged_steps: int = 0
    agent_reply: str | None = None
    cache: bool = True
    seed: int | None = None


@dataclass
class EvalConfig:
    """Held-out evaluation.

    Attributes:
        episodes: held-out episodes (one per held-out task) for the warm-start vs
            trained table (default 500).
        every: also evaluate every N iterations on ``periodic_episodes`` (0 = never).
        periodic_episodes: episodes of the periodic evaluation (default 100).
        seed: sampling seed of the evaluation (default 1234).
        shifted: held-out evaluations of the trained policy on other settings of the
            env, out of the training distribution (default none): ``[{label, kwargs}]``,
            each ``kwargs`` merged into ``env.kwargs`` (e.g. ``[{label: hard, kwargs:
            {difficulty: hard}}]``), ``eval.episodes`` held-out tasks each, the same
            sampling. Reported in ``final_eval.json`` (``shifted``), by ``credo train``
            and as columns of ``credo compare``/``credo study``.
    """

    episodes: int = 500
    every: int = 0
    periodic_episodes: int = 100
    seed: int = 1234
    shifted: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TrainConfig:
    """The run itself.

    Attributes:
        iterations: RL iterations (default 100).
        seed: everything random derives from it (default 0).
        threads: torch CPU threads (default 0: choose, :mod:`credo.utils.threads`: 1
            for the built-in model, whose 128-wide matrices gain little from more and
            lose most of the run when other jobs share the cores; for a Hugging Face
            model the cores not busy, usable cores minus the load average).
        checkpoint_every: iterations between checkpoints (default 1: every iteration,
            so a crash or ``kill -9`` loses at most the iteration under way). Measured:
            a checkpoint of the default built-in model (0.33 M parameters, with its AdamW
            moments) takes about 55 ms on one CPU core, 2–5 % of a default iteration;
            for a large model whose checkpoints take long, raise it. A Ctrl-C, a
            SIGTERM, the last iteration and an env failure (a non-finite reward) also
            save one.
        keep_checkpoints: most recent checkpoints to keep (default 2).
        runs_dir: where run folders go (default ``runs``).
        name: run folder name under ``runs_dir`` (default ``<recipe>-<env>-<timestamp>``):
            letters, digits, ``_``, ``-`` and ``.`` (not first), at most 128 characters;
            never a path (no ``/``, ``..`` or absolute name).
    """

    iterations: int = 100
    seed: int = 0
    threads: int = 0
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    runs_dir: str = "runs"
    name: str | None = None


@dataclass
class OPRDConfig:
    """OPRD's dense reward ``α·Δ_t``, ``Δ_t = log π_T^RL(y_t) − log π_T^base(y_t)``
    (``teacher.route: oprd``; :mod:`credo.objectives.oprd`, docs/algorithms.md#oprd).

    Attributes:
        alpha: α, the scale of the teacher's policy shift (default 1.0; > 0, α > 1
            amplifies).
        accept: the rows the verifier accepts, the only ones rewarded: ``success`` (default:
            rows of successful episodes), ``valid`` (valid actions),
            ``success_and_valid``, ``all``, or ``agree`` (every row, each with only the
            teachers whose shift points the way its episode's verdict does: up on a
            success, down on a failure; the paper's "directions the verifier supports").
        clip: clamp each token's Δ to ``[−clip, clip]`` before scaling (default ``None``:
            no clamp).
        reduce: how a row's token rewards become its step reward: ``sum`` (default) or
            ``mean``.
        episode_reduce: how the step rewards add up over an episode: ``sum`` (default:
            every step keeps its reward, so an episode's teacher reward grows with its
            length) or ``mean`` (each step's reward divided by its episode's step count:
            an episode's teacher reward is the mean over its steps, whatever its length).
        teachers: more OPRD teachers beside ``teacher.path``, each a mapping ``{path:
            RUN, base_path: FOLDER}`` (``base_path`` optional: ``<path>/reference``);
            every teacher scores every sample (default ``[]``: one teacher).
        combine: how several teachers' shifts combine per sample: ``mean`` (default:
            the mean of the teachers' Δ), ``verifier`` (the mean over the teachers whose
            shift on that sample agrees with the verifier, as under ``accept: agree``;
            none agreeing: no teacher reward) or ``likelihood`` (the one teacher whose
            RL policy is most likely to have produced the sample, the highest
            ``Σ_t log π_T^RL(y_t)``, teaches it alone).
    """

    alpha: float = 1.0
    accept: str = "success"
    clip: float | None = None
    reduce: str = "sum"
    episode_reduce: str = "sum"
    teachers: list[dict[str, Any]] = field(default_factory=list)
    combine: str = "mean"


@dataclass
class TeacherConfig:
    """A teacher that scores the student's own rollouts (on-policy distillation, OPRD,
    MT-SDPO, Rényi OPSD; :mod:`credo.teachers`, :mod:`credo.teachers.teaching`).

    Every iteration the teacher scores the tokens the student sampled, in its own context,
    once, after the rollouts; the scores then reach the update by one **route**.

    Attributes:
        kind: ``None`` (default: no teacher), ``run`` (a finished credo run folder, a
            checkpoint folder ``RUN/checkpoints/step_N`` or a model folder), ``hf`` (a
            Hugging Face model folder), ``self`` (the student itself, reading privileged
            context), ``frozen`` (the run's frozen reference, the warm start, reading
            privileged context) or ``ema`` (an EMA copy of the student). A teacher must share the
            student's tokenizer and vocabulary (checked before any compute).
        path: the folder of a ``run`` or ``hf`` teacher (default ``None``).
        base_path: the base model of an OPRD teacher (``route: oprd``): default ``None``
            = ``<path>/reference`` (the teacher run's saved warm start, kept by runs with
            a KL to their reference).
        topk: K, the teacher's K most likely tokens stored per response token (and the
            student's log-probs of the same ids gathered in its forward pass): the top-K
            head plus a tail bucket of the distillation KL (default 0: none).
        full: store the teacher's whole distribution instead (``K = V``; vocabularies of
            at most 4096 tokens such as the built-in model's; default false). On the
            built-in model prefer it: a top-K head barely moves a flat teacher's tail.
        micro_batch: rows per teacher forward pass (default 16).
        temperature: the teacher's logits are divided by it (default 1.0: its own
            distribution).
        ema_decay: ``d`` of an ``ema`` teacher, ``θ_EMA ← d·θ_EMA + (1−d)·θ`` after each
            optimiser step (default 0.99).
        privileged: text the teacher reads and the student never sees, put into its
            prompt: ``None`` (default: the student's own prompt), ``oracle`` /
            ``feedback`` / ``solution`` (asked from the env at each step, see
            ``privileged_context`` in :mod:`credo.envs.base`; the env's rows without
            such text keep the student's prompt and get no teacher signal) or ``anchor``
            (MT-SDPO's verified context: another successful episode of the same group,
            else a cached one of the same task, through ``sanitiser``).
        placement: the prompt field that gets the privileged text: ``instruction``
            (default) or ``observation``.
        template: how the field and the text combine (default ``"{text} ; {privileged}"``).
        sanitiser: what an ``anchor`` keeps of a verified episode's actions: ``none``
            (default: all), ``drop_final`` (all but the final answer) or ``shop`` (the
            searches only); see :mod:`credo.teachers.sanitise`.
        sanitiser_params: the sanitiser's knobs (e.g. ``{n: 2}`` for ``drop_final``).
        context_cache: ``anchor``: verified contexts kept per task across iterations for
            groups without a success this iteration (default 0: none; checkpointed).
        pool: ``anchor``: MT-SDPO's pool of domain teachers (run, checkpoint or model
            folders with the student's tokenizer; default none). Each plays a task once,
            greedily, the first time a group of that task has no verified rollout; the
            members that solve it are the task's eligible set, and their sanitised
            episodes are the external contexts the EMA teacher reads (before the
            ``context_cache``'s). Checkpointed (:mod:`credo.teachers.pool`).
        aggregate: ``anchor``: ``one`` (default: the first candidate context, a verified
            sibling else an external one) or ``all`` (every candidate, up to
            ``max_contexts``; the target is the mean of the teacher's distributions over
            them; needs ``full``: the contexts must score the same ids).
        max_contexts: contexts read per episode with ``aggregate: all`` (default 4; each
            costs one more teacher pass over that episode's rows).
        route: how the scores reach the update (a route registered in
            :mod:`credo.teachers.routes`): ``loss`` (default: a distillation loss,
            ``objective.loss`` ``opd``, ``mt_sdpo`` or ``renyi_opsd``, reads them),
            ``row_reward`` (the dense reward ``−coef·(log π_θ − log π_T)`` summed per step
            is added to the env reward before credit assignment), ``token_advantage``
            (the same reward per token added to the advantages after credit assignment)
            ``oprd`` (OPRD's ``α·Δ`` per step before credit assignment; ``oprd``) or
            ``oprd_token`` (OPRD's ``α·Δ_t`` per token added to the advantages after
            credit assignment, never rescaled by a group's standard deviation).
        reward_coef: the scale of the ``row_reward`` / ``token_advantage`` reward
            (default 1.0; > 0).
        reward_clip: clamp each token's reward to ``[−clip, clip]`` (default ``None``).
        reward_reduce: ``row_reward``: ``sum`` (default) or ``mean`` over the step's
            tokens.
        oprd: OPRD's knobs (:class:`OPRDConfig`).
    """

    kind: str | None = None
    path: str | None = None
    base_path: str | None = None
    topk: int = 0
    full: bool = False
    micro_batch: int = 16
    temperature: float = 1.0
    ema_decay: float = 0.99
    privileged: str | None = None
    placement: str = "instruction"
    template: str = "{text} ; {privileged}"
    sanitiser: str = "none"
    sanitiser_params: dict[str, Any] = field(default_factory=dict)
    context_cache: int = 0
    pool: list[str] = field(default_factory=list)
    aggregate: str = "one"
    max_contexts: int = 4
    route: str = "loss"
    reward_coef: float = 1.0
    reward_clip: float | None = None
    reward_reduce: str = "sum"
    oprd: OPRDConfig = field(default_factory=OPRDConfig)

    @property
    def enabled(self) -> bool:
        """A teacher is configured (``kind`` is set)."""
        return self.kind is not None

    def rollout_texts(self) -> tuple[str, ...]:
        """The per-step texts the sampler must record for this teacher
        (``SamplerContext.texts``): none without privileged context, the goal for an
        ``anchor``, the goal and the env's privileged text of that kind otherwise."""
        if not self.enabled or self.privileged is None:
            return ()
        if self.privileged == "anchor":
            return ("instruction",)
        return ("instruction", self.privileged)


@dataclass
class CriticConfig:
    """CAST's online verification (:mod:`credo.critics.verify`, ``docs/cast.md``): a
    trained critic judges every sampled action before the env executes it.

    Attributes:
        path: a critic folder (``critic.json``, ``critic.safetensors``, tokenizer) written
            by the ``critic`` stage (:func:`credo.commands.cast.critic_stage`); ``None``
            (default) turns verification off.
        threshold: flag an action when the critic's p(error) ≥ threshold (default 0.5).
        on_flag: ``log`` (default: record the flag only), ``resample`` (re-draw the
            action, up to ``max_resamples`` times) or ``penalise`` (subtract ``penalty``
            from that step's reward).
        max_resamples: re-draws per flagged action with ``resample`` (default 2).
        penalty: reward subtracted from a flagged step with ``penalise`` (default 0.1).
    """

    path: str | None = None
    threshold: float = 0.5
    on_flag: str = "log"
    max_resamples: int = 2
    penalty: float = 0.1


@dataclass
class JudgeConfig:
    """A judge that scores the free-text part of episodes against a rubric (SERPO;
    :mod:`credo.teachers.judging`, docs/rewards.md).

    Every iteration, each episode whose last action carries free text (the env's
    ``free_text(action)``, e.g. the tools env's ``respond{"message": ...}`` with
    ``env.kwargs.closing=respond``) is scored by the judge on every rubric item, ``s_k =
    p_yes/(p_yes + p_no)`` from its verdict-token probabilities, and the rubric reward
    ``Σ_k w_k·s_k`` is combined with the env's reward on the episode's last step before
    credit assignment. The judge's cost is reported (``judge/*`` metrics).

    Attributes:
        model: ``None`` (default: no judge), ``builtin`` (a fresh built-in model over the
            env's words and the verdict words: for tests; its verdicts are noise), or an
            HF model: a folder, an alias such as ``smollm2-135m`` (the packaged
            SmolLM2-135M-Instruct, offline) or a hub name.
        rubric: a YAML file of rubric items (bounded safe YAML: a list of questions or
            of ``{question, weight}``, or a mapping with ``items``); default ``None``: the
            built-in rubric for messages to a customer (:data:`credo.teachers.judging.
            DEFAULT_RUBRIC`).
        coef: the weight of the rubric reward (default 1.0; ``mix``: in [0, 1]).
        combine: how it combines with the env's reward: ``add`` (default: ``env +
            coef·rubric``), ``replace`` (``coef·rubric``; the env's rewards are
            dropped), ``mix`` (``(1−coef)·env + coef·rubric``) or ``gated`` (``env +
            coef·rubric`` only on episodes the env counts as solved).
        context: what the judge reads beside the text: ``instruction`` (default: the
            task's instruction, e.g. the ticket) or ``transcript`` (the instruction, then
            every observation the policy acted on: the tool results a message should
            report; :func:`credo.teachers.judging.episode_transcript`).
        micro_batch: prompts per judge forward pass (default 16).
        evolve_every: evolve the rubric every N iterations (default 0: never).
        proposer: who proposes rubric changes from contrasting pools: ``judge`` (default:
            the judge model asked for a question the good response passes and the bad
            one fails), ``contrast`` (a question about a word every good response uses
            and no bad one) or ``separation`` (reweight / remove items that do not
            separate good from bad).
        proposer_params: the proposer's knobs (default none).
        evolve_tasks: tasks (with both good and bad responses) asked per evolution
            (default 1).
        max_items: the rubric never grows past this many items (default 16).
        pool_by: what sorts responses into the good / neutral / bad pools: ``env``
            (default: the episode's env return), ``rubric`` (the rubric reward over
            ``Σ_k w_k``) or ``rank`` (the response's rank among its task's responses of
            the iteration, as a quantile in [0, 1]: with the default thresholds the top
            quarter of a group is good and the bottom quarter bad; no reward needed).
        pool_good: a response scoring at least this is good (default 0.75).
        pool_bad: at most this is bad (default 0.25).
        pool_size: responses kept per task and pool (default 16).
    """

    model: str | None = None
    rubric: str | None = None
    coef: float = 1.0
    combine: str = "add"
    context: str = "instruction"
    micro_batch: int = 16
    evolve_every: int = 0
    proposer: str = "judge"
    proposer_params: dict[str, Any] = field(default_factory=dict)
    evolve_tasks: int = 1
    max_items: int = 16
    pool_by: str = "env"
    pool_good: float = 0.75
    pool_bad: float = 0.25
    pool_size: int = 16

    @property
    def enabled(self) -> bool:
        """A judge is configured (``model`` is set)."""
        return self.model is not None


#: Keys added to the config after runs were saved with it, each with the value that gives
#: the behaviour a run saved before it had (:meth:`Config.from_saved`). A new key whose
#: default is not the old behaviour must be listed here.
ADDED_LATER: dict[tuple[str, str], Any] = {
    ("optim", "lr_schedule"): "constant",  # 2026-12-06; the rate was constant before
}


@dataclass
class Config:
    """A whole run. ``recipe`` records which recipe it came from."""

    recipe: str = "grpo"
    description: str = ""
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def warm_start_seed(self) -> int:
        """The seed of the warm start (``sft.seed``, else ``train.seed``)."""
        return self.train.seed if self.sft.seed is None else self.sft.seed

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        """Build and validate a config from a mapping; :class:`ConfigError` names the
        first wrong key or value and what is accepted."""
        from credo.train.config.validate import validate

        cfg = _build(cls, data, "")
        validate(cfg)
        return cfg

    @classmethod
    def from_saved(cls, data: dict[str, Any]) -> Config:
        """A run's saved ``config.yaml`` (a run folder's or a study record's) as a config:
        a key added after the file was written (:data:`ADDED_LATER`) takes the value that
        gives the behaviour the run had, not today's default, so ``--resume`` continues
        it as it trained and a record stands for the run it records."""
        data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
        for (section, key), then in ADDED_LATER.items():
            body = data.get(section)
            if isinstance(body, dict) and key not in body:
                body[key] = then
        return cls.from_dict(data)


# ----------------------------------------------------------------- building
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert ``value`` to the annotated type ``tp`` (clear error otherwise)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping like {{key: value}}, got {value!r}")
        return dict(value)
    if origin is list or tp is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list like [a, b], got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    raise ConfigError(f"{where}: unsupported type {_type_name(tp)}")


def _build(cls: Any, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        full = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown key {full!r}.{hint} Valid keys: {', '.join(names)}")
    kwargs = {}
    for k, v in data.items():
        kwargs[k] = _coerce(v, hints[k], f"{prefix + '.' if prefix else ''}{k}")
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a section's own checks (e.g. LoRAConfig.__post_init__)
        raise ConfigError(str(exc)) from None
