"""A run's parts, built once from its config: :class:`Run` and :func:`build_run`.

Every command (``train``, ``sft``, ``eval``, ``compare``, ``play``) and every benchmark
starts with ``run = build_run(cfg)`` and passes ``run`` down; nothing else builds an env
factory, a policy, a renderer or sampling settings. The run owns the held-out evaluator
(:meth:`Run.evaluate`), so the train table, ``credo sft`` and ``credo eval`` score a policy
with the same tasks, sampling and random stream.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from credo.agent.demos import TOOL_CALL, tool_call_words
from credo.critics.mistakes import label_mistakes
from credo.critics.verify import CriticGuard, guard_from_config
from credo.envs.base import Task, make_env, resolve_env
from credo.eval.evaluate import EvalResult, evaluate
from credo.policy.base import SamplingParams
from credo.policy.engine import EngineView, GenerationEngine, HFEngine, make_engine
from credo.policy.hf import HFPolicy
from credo.policy.lora import apply_lora
from credo.policy.models import model_problem
from credo.policy.precision import enable_mixed_precision
from credo.policy.tiny import create_tiny_policy, is_tiny
from credo.policy.tokenizer import split_words
from credo.rollout import (
    RolloutResult,
    SamplerContext,
    add_oracle_continuations,
    make_sampler_state,
    sample,
    sampler_params,
    sampler_spec,
)
from credo.rollout.envcheck import check_round_trip, collect_words, preflight
from credo.rollout.ray_envs import EnvPool
from credo.rollout.render import Renderer, make_renderer, oracle_examples, plain_words
from credo.train.config import Config
from credo.train.parts.base import rollout_texts
from credo.utils.threads import auto_threads

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "Run",
    "add_adapters",
    "build_renderer",
    "build_run",
    "env_factory",
    "env_pool",
    "env_vocabulary",
    "history_turns",
    "max_new_tokens",
    "model_problem",
    "sampling_for",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: ``rollout.max_new_tokens: null`` means this many tokens per response.
DEFAULT_MAX_NEW_TOKENS = {"builtin": 16, "hf": 48}

#: ``rollout.history_turns: null`` means this many past turns in the prompt (the built-in
#: model's are actions only; see :class:`~credo.train.config.schema.RolloutConfig`).
DEFAULT_HISTORY_TURNS = {"builtin": 3, "hf": 2}


@dataclass
class Run:
    """The parts of a run, built once by :func:`build_run`.

    Attributes:
        cfg: the run's config.
        make_env: a zero-argument function making a fresh env.
        policy: the policy as built (the built-in model untrained, or the HF model as
            loaded, or the folder given to :func:`build_run`); training continues from
            the warm start, which may replace it.
        builtin: the policy is credo's built-in model (plain prompts, 16-token responses).
        renderer: builds prompts and parses actions (plain, or chat for HF models).
        sampling: the rollouts' sampling parameters (with KLPO's auxiliary draws and
            top-K head when the config asks for them).
        max_turns: the sampler's turn cap.
        sampler: the sampler the rollouts go through (``rollout.sampler``, or ``agent``
            with ``rollout.agent``) and :attr:`sampler_params` its knobs.
        session: the state of a sampler registered with ``run_state`` (the ``agent``
            sampler's session: its policy server lives as long as the run;
            :meth:`close` stops it), through which the rollouts and the held-out
            evaluation go; else ``None``.
        engine: what generates the rollouts (``rollout.engine``, :mod:`credo.policy.
            engine`); re-synced with the trainer's weights once after every update (at
            the first generation that follows it, :meth:`sampling_policy`).
        weights_version: updates so far (:meth:`weights_updated`).
        shifted: per ``eval.shifted`` label, a zero-argument function making the env
            with that entry's options (:meth:`evaluate_shifted`).
        env_pool: with ``rollout.env_workers`` ≥ 2, the Ray actors the rollouts' envs
            live in (:class:`credo.rollout.ray_envs.EnvPool`), started by the first
            :meth:`sampler_context` (commands that only evaluate never start them) and
            stopped by :meth:`close`; else ``None`` (the rollouts use :attr:`make_env`).
    """

    cfg: Config
    make_env: Callable[[], Any]
    policy: HFPolicy
    builtin: bool
    renderer: Renderer
    sampling: SamplingParams
    max_turns: int
    sampler: str = "group"
    sampler_params: Any = None
    session: Any = None
    engine: GenerationEngine | None = None
    weights_version: int = 0
    env_pool: EnvPool | None = None
    critic: CriticGuard | None = None
    shifted: dict[str, Callable[[], Any]] = field(default_factory=dict)
    _synced: tuple[int, int] | None = field(default=None, init=False, repr=False)

    def sampler_context(
        self,
        policy: HFPolicy | None = None,
        *,
        generator: torch.Generator | None = None,
        choice_seed: int = 0,
        sampling: SamplingParams | None = None,
    ) -> SamplerContext:
        """The context a sampler needs for ``policy`` (default: the run's) in this run:
        its renderer, env factory, turn cap and the config's rollout settings; ``sampling``
        defaults to the run's."""
        r = self.cfg.rollout
        return SamplerContext(
            policy=policy if policy is not None else self.policy,
            renderer=self.renderer,
            make_env=self.rollout_env_factory(),
            sampling=sampling if sampling is not None else self.sampling,
            max_turns=self.max_turns,
            generator=generator,
            choices=torch.Generator().manual_seed(choice_seed),
            invalid_penalty=r.invalid_penalty,
            on_divergence=r.on_restore_divergence,
            keep_snapshots=r.oracle_horizon > 0,
            texts=rollout_texts(self.cfg),  # the parts' (a teacher's, RAPO's goal and profile)
        )

    def rollout_env_factory(self) -> Callable[[], Any]:
        """The rollouts' env factory: :attr:`make_env`, or with ``rollout.env_workers`` ≥ 2
        the Ray pool's (:func:`env_pool`, started here on first use)."""
        if self.env_pool is None:
            self.env_pool = env_pool(self.cfg, self.make_env)
        return self.env_pool.make if self.env_pool is not None else self.make_env

    def rollouts(
        self,
        policy: HFPolicy,
        tasks: list[Task],
        *,
        generator: torch.Generator | None,
        choice_seed: int = 0,
        state: Any = None,
    ) -> RolloutResult:
        """``tasks`` sampled with the configured sampler (``rollout.sampler`` and its
        ``sampler_params``; ``state``: its state across iterations), plus SERO's oracle
        continuations when ``rollout.oracle_horizon`` > 0; with ``critic.path`` every action
        is verified first (:mod:`credo.critics.verify`)."""
        r = self.cfg.rollout
        sync_start = time.perf_counter()
        synced = self._synced
        policy = self.sampling_policy(policy)
        sync_s = time.perf_counter() - sync_start if self._synced != synced else None
        acting = self.critic.wrap(policy) if self.critic is not None else policy
        ctx = self.sampler_context(acting, generator=generator, choice_seed=choice_seed)
        if self.session is not None:  # the sampler's own run-long state (the agent's server)
            return sample(
                self.sampler,
                ctx,
                tasks,
                group_size=r.group_size,
                params=self.sampler_params,
                state=self.session,
            )
        result = sample(
            self.sampler,
            ctx,
            tasks,
            group_size=r.group_size,
            params=self.sampler_params,
            state=state,
        )
        if self.critic is not None:
            result = self.critic.finish(result)
        if r.oracle_horizon > 0:
            result = add_oracle_continuations(
                result,
                ctx,
                horizon=r.oracle_horizon,
                per_group=r.oracle_per_group,
                start=r.oracle_start,
            )
        if sync_s is not None and not isinstance(self.engine, HFEngine):
            result.stats["engine/sync_s"] = sync_s
        return result

    def sampling_policy(self, policy: HFPolicy) -> Any:
        """What the samplers get for ``policy``: the policy itself with the ``hf`` engine;
        else an :class:`~credo.policy.engine.EngineView` whose ``generate`` goes to the
        engine, which gets ``policy``'s weights first when they changed since its last
        sync (a new policy object, or :meth:`weights_updated`)."""
        if self.engine is None or isinstance(self.engine, HFEngine):
            return policy
        key = (id(policy), self.weights_version)
        if self._synced != key:
            self.engine.sync_weights(policy)
            self._synced = key
        return EngineView(policy, self.engine)

    def evaluate(
        self,
        policy: HFPolicy | None = None,
        *,
        episodes: int | None = None,
        greedy: bool = False,
        trials: int = 1,
        ks: Sequence[int] = (),
        make_env: Callable[[], Any] | None = None,
        mistakes: bool = False,
    ) -> EvalResult:
        """Held-out success of ``policy`` (default: the run's) on the first ``episodes``
        held-out tasks (default ``eval.episodes``), sampled as in training but without
        KLPO's auxiliary draws or top-K head, from the seed ``eval.seed``: every recipe
        and every command sees the same random stream, so equal policies get equal
        scores. ``greedy``: temperature 0. ``trials`` episodes per task and ``ks`` (each
        ≤ ``trials``) add pass@k and pass^k (:mod:`credo.eval.passk`). A run whose sampler
        keeps a run-long session is evaluated through it (an agent run through its agent,
        :meth:`~credo.agent.sampler.AgentSession.evaluate`), one trial per task.
        ``make_env``: another setting of the env (default: the run's own; a session's
        evaluation has its own, and the config check refuses ``eval.shifted`` there).
        ``mistakes``: label every action with the env's label rule and tally how the
        episodes went wrong (:mod:`credo.critics.mistakes`; not through an agent)."""
        sampling = dataclasses.replace(
            self.sampling,
            temperature=0.0 if greedy else self.sampling.temperature,
            aux_samples=0,
            topk_logprobs=0,
        )
        episodes = self.cfg.eval.episodes if episodes is None else episodes
        if mistakes and self.session is not None:
            raise ValueError(
                "mistakes are labelled from the trainer's own episodes, not an agent's"
            )
        if self.session is not None:
            return self.session.evaluate(
                policy if policy is not None else self.policy,
                sampling,
                episodes=episodes,
                seed=self.cfg.eval.seed,
            )
        make_env = make_env if make_env is not None else self.make_env
        return evaluate(
            policy if policy is not None else self.policy,
            self.renderer,
            make_env,
            episodes=episodes,
            sampling=sampling,
            max_turns=self.max_turns,
            seed=self.cfg.eval.seed,
            trials=trials,
            ks=ks,
            summarize=partial(label_mistakes, self.cfg.env.name, make_env) if mistakes else None,
        )

    def evaluate_shifted(self, policy: HFPolicy | None = None) -> dict[str, dict[str, Any]]:
        """Held-out success of ``policy`` (default: the run's) on each ``eval.shifted``
        setting of the env: ``eval.episodes`` tasks, sampled as :meth:`evaluate` samples
        (the same seed); ``{label: {success_rate, ci_low, ci_high, episodes,
        env_kwargs}}``."""
        out: dict[str, dict[str, Any]] = {}
        for entry in self.cfg.eval.shifted:
            label = str(entry["label"])
            res = self.evaluate(policy, make_env=self.shifted[label])
            out[label] = {
                "success_rate": res.success_rate,
                "ci_low": res.ci_low,
                "ci_high": res.ci_high,
                "episodes": res.episodes,
                "env_kwargs": dict(entry.get("kwargs", {})),
            }
        return out

    def new_sampler_state(self) -> Any:
        """The state the configured sampler keeps across iterations (``None`` if none):
        its run-long session (the agent's), else a fresh state of its own."""
        if self.session is not None:
            return self.session
        return make_sampler_state(self.sampler, self.sampler_params)

    def weights_updated(self) -> None:
        """Call after each policy update (an agent run stamps later calls with it; the
        engine gets the new weights before its next generation)."""
        self.weights_version += 1
        if self.session is not None:
            self.session.weights_updated()

    def close(self) -> None:
        """Release what the run holds beyond memory: an agent run's policy server, the
        generation engine, the env workers' Ray actors (and the local Ray, if the pool
        started it)."""
        if self.session is not None:
            self.session.close()
        if self.engine is not None:
            self.engine.close()
        if self.env_pool is not None:
            self.env_pool.close()
            self.env_pool = None


def build_run(cfg: Config, *, policy_path: Path | None = None) -> Run:
    """Build a run's parts from its config (see :class:`Run`), failing before any
    training compute on an env or model that cannot be made: a model that cannot load
    (:func:`model_problem`), an env that fails the brief protocol check
    (:func:`credo.rollout.envcheck.preflight`: types, determinism, snapshots when the
    sampler branches, ``oracle_action`` when the warm start needs it) or whose oracle
    actions do not survive the tokenizer round trip.

    Args:
        cfg: the run config.
        policy_path: load the policy from this folder (a saved run's ``final_policy`` or a
            checkpoint's ``policy``) instead of building it from ``model``.
    """
    torch.set_num_threads(threads_for(cfg))
    if policy_path is None and (problem := model_problem(cfg.model.name)):
        raise ValueError(problem)
    make = env_factory(cfg)
    r = cfg.rollout
    sampler = sampler_spec(r.sampler_in_use)
    preflight(
        make,
        needs_oracle=cfg.sft.enabled and policy_path is None,
        snapshots=sampler.branches or r.oracle_horizon > 0,
    )
    env = make()
    cap = getattr(env, "max_turns", None)
    if cfg.rollout.max_turns is not None:
        max_turns = cfg.rollout.max_turns
    else:
        max_turns = int(cap) + 1 if isinstance(cap, int) else 64
    policy = (
        HFPolicy.from_pretrained(policy_path)
        if policy_path is not None
        else _policy(cfg, env, make)
    )
    # the built-in model, made here or loaded from a folder it was saved in (a warm
    # start's, a run's): its plain prompts and response cap either way
    builtin = cfg.model.name is None or is_tiny(policy)
    enable_mixed_precision(policy.model, cfg.model.mixed_precision)  # a saved policy too
    policy.configure_kv_reuse(cfg.rollout.kv_reuse, cfg.rollout.kv_cache_mb)
    renderer = build_renderer(cfg, policy, builtin=builtin, env=env, make=make)
    check_round_trip(make, [Task.make("train", i) for i in range(2)], policy.tokenizer, renderer)
    knobs = (
        sampler.configure(cfg)
        if sampler.configure
        else sampler_params(sampler.name, r.sampler_params)
    )
    session = make_sampler_state(sampler.name, knobs) if sampler.run_state else None
    sampling = sampling_for(cfg, builtin=builtin)
    engine = make_engine(cfg.rollout.engine, cfg.rollout.engine_params)
    critic = guard_from_config(cfg.critic)
    shifted = {str(e["label"]): _shifted_env(cfg, e) for e in cfg.eval.shifted}
    return Run(
        cfg, make, policy, builtin, renderer, sampling, max_turns, sampler.name, knobs, session,
        engine, critic=critic, shifted=shifted,
    )  # fmt: skip


def build_renderer(
    cfg: Config, policy: HFPolicy, *, builtin: bool, env: Any, make: Callable[[], Any]
) -> Renderer:
    """The renderer for ``policy``'s tokenizer: plain for the built-in model, chat (with
    the configured templates and ``rollout.chat_examples`` oracle demonstrations)
    otherwise.

    Args:
        cfg: the run config.
        policy: its tokenizer encodes the prompts.
        builtin: the built-in model.
        env: an env instance (its action format).
        make: the env factory (for the few-shot demonstrations).
    """
    examples: list[Any] = []
    if not builtin and cfg.rollout.chat_examples > 0:
        examples = oracle_examples(make, cfg.rollout.chat_examples)
    return make_renderer(
        policy.tokenizer,
        builtin=builtin,
        history_turns=history_turns(cfg, builtin=builtin),
        env=env,
        system_prompt=cfg.rollout.system_prompt,
        user_prompt=cfg.rollout.user_prompt,
        examples=examples,
        history_tokens=cfg.rollout.history_tokens,
        notes=cfg.rollout.notes,
    )


def threads_for(cfg: Config) -> int:
    """torch's CPU threads for a run: ``train.threads``, or with 0 the choice of
    :func:`credo.utils.threads.auto_threads` (1 for the built-in model, the idle cores for
    a Hugging Face model)."""
    return cfg.train.threads or auto_threads(cfg.model.name is None)


def sampling_for(cfg: Config, *, builtin: bool) -> SamplingParams:
    """The rollouts' sampling parameters for a built-in or an HF policy (their response
    caps differ, see :func:`max_new_tokens`)."""
    r = cfg.rollout
    return SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        max_new_tokens=max_new_tokens(cfg, builtin=builtin),
        aux_samples=r.aux_samples,
        topk_logprobs=r.topk_logprobs,
    )


def max_new_tokens(cfg: Config, *, builtin: bool) -> int:
    """``rollout.max_new_tokens``, or its model-dependent default (16 built-in, 48 HF)."""
    if cfg.rollout.max_new_tokens is not None:
        return cfg.rollout.max_new_tokens
    return DEFAULT_MAX_NEW_TOKENS["builtin" if builtin else "hf"]


def history_turns(cfg: Config, *, builtin: bool) -> int:
    """``rollout.history_turns``, or its model-dependent default (3 built-in, 2 HF)."""
    if cfg.rollout.history_turns is not None:
        return cfg.rollout.history_turns
    return DEFAULT_HISTORY_TURNS["builtin" if builtin else "hf"]


def env_factory(cfg: Config) -> Callable[[], Any]:
    """A zero-argument function making a fresh env; fails early on bad names/options."""
    factory = resolve_env(cfg.env.name)
    kwargs = dict(cfg.env.kwargs)
    make_env(cfg.env.name, **kwargs)  # raises a clear error now rather than mid-run

    def make() -> Any:
        return factory(**kwargs)

    return make


def _shifted_env(cfg: Config, entry: dict[str, Any]) -> Callable[[], Any]:
    """The env factory of one ``eval.shifted`` entry (its options merged into
    ``env.kwargs``); an env that rejects them is one line naming the entry."""
    kwargs = {**cfg.env.kwargs, **entry.get("kwargs", {})}
    try:
        return env_factory(
            dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, kwargs=kwargs))
        )
    except ValueError as exc:
        raise ValueError(f"eval.shifted {entry['label']!r}: {exc}") from None


def env_pool(cfg: Config, make: Callable[[], Any]) -> EnvPool | None:
    """The Ray actors of ``rollout.env_workers`` ≥ 2 (``None`` below: envs in process)."""
    r = cfg.rollout
    if r.env_workers < 2:
        return None
    return EnvPool(
        make,
        r.env_workers,
        address=r.ray_address,
        timeout_s=r.env_timeout_s,
        retries=r.env_retries,
    )


def env_vocabulary(
    env: Any, make: Callable[[], Any], episodes: int = 200, history_tokens: int = 0
) -> list[str]:
    """Words for the built-in tokenizer: ``env.vocabulary()`` when the env has it, else
    the words seen in the instructions, observations and actions of ``episodes`` episodes
    (words never seen become ``<unk>``). The actions are the oracle's and sampled ones
    when the env offers ``oracle_action``/``sample_action``, else a random walk over the
    words the env prints (its observations, instruction and ``action_format()``).

    Raises:
        EnvCheckError: an env with neither ``oracle_action`` nor ``sample_action`` accepts
            none of the words it prints as an action; the message says which method to
            add (:func:`credo.rollout.envcheck.collect_words`).
    """
    words = plain_words(history_tokens)  # the plain format's own (and its history mark)
    if hasattr(env, "vocabulary"):
        return [*env.vocabulary(), *words]
    return sorted({*words, *collect_words(make, episodes)})


def _policy(cfg: Config, env: Any, make: Callable[[], Any]) -> HFPolicy:
    """The untrained policy: the built-in tiny model, or an HF model (``model.name``, a
    folder, an alias such as ``smollm2-135m`` or a hub name), with gradient checkpointing
    when asked. LoRA adapters are added later (:func:`add_adapters`), after the warm
    start."""
    device = cfg.model.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.model.name is None:
        words = env_vocabulary(env, make, history_tokens=cfg.rollout.history_tokens)
        if cfg.sft.agent_reply == TOOL_CALL:  # the words of a tool call
            schemas = env.tool_schemas() if hasattr(env, "tool_schemas") else []
            names = [t["function"]["name"] for t in schemas]
            words = [*words, *tool_call_words(names)]
        elif cfg.sft.agent_reply is not None:  # the words of the agent's reply format
            words = [*words, *split_words(cfg.sft.agent_reply.replace("{action}", " "))]
        seed = cfg.warm_start_seed if cfg.sft.enabled else cfg.train.seed  # SFT's start
        policy = create_tiny_policy(words, cfg.model.tiny, seed=seed)
        policy.model.to(device)
        policy.device = torch.device(device)
    else:
        from credo.policy.models import resolve_model

        path = resolve_model(cfg.model.name)
        policy = HFPolicy.from_pretrained(path, device=device, dtype=_dtype(cfg, device))
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(policy.model)
    return policy


def _dtype(cfg: Config, device: str) -> torch.dtype:
    """``model.dtype`` with ``auto`` resolved: bfloat16 on a CUDA device that supports it,
    else float32 (CPU bf16 matmuls are slow and lossy on most CPUs)."""
    if cfg.model.dtype != "auto":
        return _DTYPES[cfg.model.dtype]
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute each block's activations in the backward pass (non-reentrant, so frozen
    inputs under LoRA need no special care). transformers ≥ 5.x calls it activation
    checkpointing."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def add_adapters(cfg: Config, policy: HFPolicy) -> HFPolicy:
    """The policy with fresh LoRA adapters when ``model.lora`` is set (else as is); the
    adapters' random init derives from ``train.seed``."""
    if cfg.model.lora is None:
        return policy
    return apply_lora(policy, cfg.model.lora, seed=cfg.train.seed)
