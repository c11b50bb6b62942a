"""Building a run's parts from its config: env factory, policy, renderer, warm start."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from credo.envs.base import make_env, resolve_env
from credo.policy.base import SamplingParams
from credo.policy.hf import HFPolicy
from credo.policy.lora import apply_lora, merge_lora
from credo.policy.tiny import create_tiny_policy
from credo.rollout.render import PLAIN_WORDS, Renderer, make_renderer, oracle_examples
from credo.train.config import Config, config_hash
from credo.train.sft import collect_demonstrations, sft_train
from credo.utils.cache import cache_dir

__all__ = [
    "WarmStart",
    "add_adapters",
    "build_env_factory",
    "build_policy",
    "cache_dir",
    "configure_runtime",
    "default_max_turns",
    "enable_gradient_checkpointing",
    "env_vocabulary",
    "make_run_renderer",
    "max_new_tokens",
    "resolve_device",
    "resolve_dtype",
    "sampling_params",
    "seed_estimator_state",
    "warm_start",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: ``rollout.max_new_tokens: null`` means this many tokens per response.
DEFAULT_MAX_NEW_TOKENS = {"builtin": 16, "hf": 48}


def configure_runtime(cfg: Config) -> None:
    """Process-wide settings a run asks for (torch CPU threads)."""
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)


def build_env_factory(cfg: Config) -> Callable[[], Any]:
    """A zero-argument function making a fresh env; fails early on bad names/options."""
    factory = resolve_env(cfg.env.name)
    kwargs = dict(cfg.env.kwargs)
    make_env(cfg.env.name, **kwargs)  # raises a clear error now rather than mid-run

    def make() -> Any:
        return factory(**kwargs)

    return make


def default_max_turns(cfg: Config, env: Any) -> int:
    """The sampler's turn cap: the config's, else the env's ``max_turns`` + 1, else 64."""
    if cfg.rollout.max_turns is not None:
        return cfg.rollout.max_turns
    env_cap = getattr(env, "max_turns", None)
    return int(env_cap) + 1 if isinstance(env_cap, int) else 64


def env_vocabulary(env: Any, make: Callable[[], Any], episodes: int = 200) -> list[str]:
    """Words for the built-in tokenizer: ``env.vocabulary()`` when the env has it, else
    the words seen in the instructions, observations and oracle/random actions of a few
    episodes (words never seen become ``<unk>``)."""
    if hasattr(env, "vocabulary"):
        return [*env.vocabulary(), *PLAIN_WORDS]
    import random

    from credo.envs.base import Task
    from credo.policy.tokenizer import split_words

    words: set[str] = set(PLAIN_WORDS)
    rng = random.Random(0)
    e = make()
    for i in range(episodes):
        obs = e.reset(Task.make("train", i), 0)
        words.update(split_words(e.instruction() if hasattr(e, "instruction") else obs))
        for _ in range(64):
            words.update(split_words(obs))
            if hasattr(e, "oracle_action") and (
                not hasattr(e, "sample_action") or rng.random() < 0.7
            ):
                action = e.oracle_action()
            elif hasattr(e, "sample_action"):
                action = e.sample_action(rng)
            else:
                break
            words.update(split_words(action))
            res = e.step(action)
            obs = res.observation
            if res.done:
                break
    return sorted(words)


def max_new_tokens(cfg: Config, *, builtin: bool) -> int:
    """``rollout.max_new_tokens``, or its model-dependent default (16 built-in, 48 HF)."""
    if cfg.rollout.max_new_tokens is not None:
        return cfg.rollout.max_new_tokens
    return DEFAULT_MAX_NEW_TOKENS["builtin" if builtin else "hf"]


def sampling_params(cfg: Config, *, greedy: bool = False, builtin: bool = True) -> SamplingParams:
    """The rollout's sampling parameters (``greedy``: temperature 0, no auxiliary draws;
    ``builtin`` picks the default response cap, see :func:`max_new_tokens`)."""
    return SamplingParams(
        temperature=0.0 if greedy else cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=max_new_tokens(cfg, builtin=builtin),
        aux_samples=0 if greedy else cfg.rollout.aux_samples,
        topk_logprobs=0 if greedy else cfg.rollout.topk_logprobs,
    )


def resolve_device(cfg: Config) -> str:
    """``model.device`` with ``auto`` resolved (cuda when available, else cpu)."""
    if cfg.model.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.model.device


def resolve_dtype(cfg: Config, device: str) -> torch.dtype:
    """``model.dtype`` with ``auto`` resolved: bfloat16 on a CUDA device that supports it,
    else float32 (CPU bf16 matmuls are slow and lossy on most CPUs)."""
    if cfg.model.dtype != "auto":
        return _DTYPES[cfg.model.dtype]
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def build_policy(cfg: Config, env: Any, make: Callable[[], Any]) -> tuple[HFPolicy, bool]:
    """The untrained policy: the built-in tiny model, or an HF model (``model.name``, a
    folder, an alias such as ``smollm2-135m`` or a hub name), with gradient checkpointing
    when asked. LoRA adapters are added later (:func:`add_adapters`), after the warm start.

    Returns ``(policy, builtin)``.
    """
    device = resolve_device(cfg)
    if cfg.model.name is None:
        policy = create_tiny_policy(env_vocabulary(env, make), cfg.model.tiny, seed=cfg.train.seed)
        policy.model.to(device)
        policy.device = torch.device(device)
        builtin = True
    else:
        from credo.policy.models import resolve_model

        path = resolve_model(cfg.model.name)
        policy = HFPolicy.from_pretrained(path, device=device, dtype=resolve_dtype(cfg, device))
        builtin = False
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(policy.model)
    return policy, builtin


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


@dataclass
class WarmStart:
    """What the warm start did (or found in the cache).

    Attributes:
        key: config hash identifying the warm start.
        cached: loaded from the cache rather than trained.
        demo_success: success rate of the noisy demonstrations.
        seconds: time spent training (0 when cached).
        path: the cached policy folder.
    """

    key: str
    cached: bool
    demo_success: float
    seconds: float
    path: Path


def warm_start_key(cfg: Config) -> str:
    """Hash of everything the warm start depends on, the code included. Model and prompt
    settings enter only when they differ from their defaults (the built-in model's keys
    stay short and stable)."""
    model: dict[str, Any] = {"name": cfg.model.name, "tiny": asdict(cfg.model.tiny)}
    if cfg.model.lora is not None:
        model["lora"] = asdict(cfg.model.lora)
    if cfg.model.dtype != "float32":
        model["dtype"] = cfg.model.dtype
    key: dict[str, Any] = {
        "env": asdict(cfg.env),
        "model": model,
        "sft": {k: v for k, v in asdict(cfg.sft).items() if k != "cache"},
        "history_turns": cfg.rollout.history_turns,
        "seed": cfg.train.seed,
        "code": _code_fingerprint(cfg),
    }
    prompt = {
        k: getattr(cfg.rollout, k)
        for k in ("system_prompt", "user_prompt")
        if getattr(cfg.rollout, k) is not None
    }
    if cfg.rollout.chat_examples:
        prompt["chat_examples"] = cfg.rollout.chat_examples
    if prompt:
        key["prompt"] = prompt
    return config_hash(key)


def _code_fingerprint(cfg: Config) -> str:
    """Hash of the code a warm start depends on: the env's module, the prompt renderer,
    the demonstrations/SFT code and the built-in model. Editing any of them (e.g. your
    env's observations) invalidates cached warm starts instead of silently reusing them."""
    import hashlib
    import inspect

    from credo.policy import tiny, tokenizer
    from credo.rollout import render
    from credo.train import sft

    modules = [render, sft, tiny, tokenizer]
    try:
        env_module = inspect.getmodule(resolve_env(cfg.env.name))
        if env_module is not None:
            modules.append(env_module)
    except (TypeError, ValueError):
        pass
    digest = hashlib.sha256()
    for m in modules:
        try:
            digest.update(inspect.getsource(m).encode())
        except (OSError, TypeError):
            digest.update(m.__name__.encode())
    return digest.hexdigest()[:16]


def warm_start(
    cfg: Config,
    policy: HFPolicy,
    renderer: Renderer,
    make: Callable[[], Any],
    *,
    on_step: Callable[[str, int, int, float], None] | None = None,
) -> tuple[HFPolicy, WarmStart]:
    """SFT on clean, then on ε-noisy oracle demonstrations; cached by config hash.

    With ``model.lora`` the warm start trains LoRA adapters and merges them into the
    weights at the end: the result (and the cached folder) is always a plain model, on
    which RL then trains fresh adapters. A cached warm start is loaded into ``policy``
    itself (its dtype, device and gradient checkpointing stay as built).

    ``on_step(phase, step, total, loss)`` reports progress. Returns the (possibly
    reloaded) policy and what happened.
    """
    key = warm_start_key(cfg)
    folder = cache_dir() / "warmstart" / key
    meta_path = folder / "warmstart.json"
    if cfg.sft.cache and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        policy.load_weights(folder / "policy")
        _name_base(policy, folder / "policy")
        return policy, WarmStart(key, True, meta["demo_success"], 0.0, folder / "policy")
    policy = add_adapters(cfg, policy)
    sft = cfg.sft
    start = time.perf_counter()
    clean = collect_demonstrations(
        make, renderer, episodes=sft.episodes, epsilon=0.0, seed=cfg.train.seed
    )
    noisy = collect_demonstrations(
        make,
        renderer,
        episodes=sft.noisy_episodes,
        epsilon=sft.epsilon,
        seed=cfg.train.seed + 1,
        first_task=sft.episodes,
    )
    torch.manual_seed(cfg.train.seed)
    total = sft.steps + sft.noisy_steps

    def report(phase: str, offset: int) -> Callable[[int, float], None]:
        return lambda step, loss: (
            on_step(phase, offset + step + 1, total, loss) if on_step else None
        )

    if sft.steps:
        sft_train(
            policy,
            clean.rows(),
            steps=sft.steps,
            batch_size=sft.batch_size,
            lr=sft.lr,
            seed=cfg.train.seed,
            on_step=report("clean demos", 0),
        )
    if sft.noisy_steps:
        sft_train(
            policy,
            noisy.rows(),
            steps=sft.noisy_steps,
            batch_size=sft.batch_size,
            lr=sft.noisy_lr,
            seed=cfg.train.seed + 1,
            warmup=0,
            on_step=report("noisy demos", sft.steps),
        )
    policy = merge_lora(policy)
    seconds = time.perf_counter() - start
    if cfg.sft.cache:
        tmp = folder.with_name(folder.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        policy.save(tmp / "policy")
        (tmp / "warmstart.json").write_text(
            json.dumps(
                {"demo_success": noisy.success_rate, "seconds": seconds, "config": asdict(cfg.sft)}
            )
        )
        if folder.exists():
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, folder)
        _name_base(policy, folder / "policy")
    return policy, WarmStart(key, False, noisy.success_rate, seconds, folder / "policy")


def seed_estimator_state(
    cfg: Config, state: Any, make: Callable[[], Any], renderer: Renderer, device: str
) -> int:
    """Seed a stateful estimator (ProAS's graph) as ``credit.seed_graph`` says.

    ``demonstrations``: the env's clean oracle episodes on training tasks the RL loop
    is unlikely to draw (seeds from 10⁸). ``teacher``: the successful episodes of the
    policy folder ``credit.teacher`` on the same tasks. Returns the episodes added.
    """
    mode = cfg.credit.seed_graph
    if mode == "empty":
        return 0
    from credo.rollout.group import episodes_to_forest, sample_groups

    first = 100_000_000
    if mode == "demonstrations":
        demos = collect_demonstrations(
            make,
            renderer,
            episodes=cfg.credit.seed_episodes,
            epsilon=0.0,
            seed=cfg.train.seed,
            first_task=first,
        )
        episodes = demos.episodes
    else:
        from credo.envs.base import Task

        teacher = HFPolicy.from_pretrained(cfg.credit.teacher, device=device)
        tasks = [Task.make("train", first + i) for i in range(cfg.credit.seed_episodes)]
        gen = torch.Generator().manual_seed(cfg.train.seed)
        probe = make()
        res = sample_groups(
            teacher,
            renderer,
            make,
            tasks,
            group_size=1,
            sampling=sampling_params(cfg),
            max_turns=default_max_turns(cfg, probe),
            generator=gen,
        )
        episodes = res.episodes
    state.add_episodes(episodes_to_forest(episodes), only_successful=True)
    return sum(e.success for e in episodes)


def _name_base(policy: HFPolicy, path: Path) -> None:
    """Record ``path`` as where the model's weights live (LoRA adapters saved later name
    it as their base model)."""
    policy.model.name_or_path = str(path)
    policy.model.config._name_or_path = str(path)


def make_run_renderer(
    cfg: Config,
    policy: HFPolicy,
    builtin: bool,
    env: Any,
    make: Callable[[], Any] | None = None,
) -> Renderer:
    """The run's renderer: plain for the built-in model, chat (with the configured
    templates and ``rollout.chat_examples`` oracle demonstrations) otherwise.

    Args:
        cfg: the run config.
        policy: its tokenizer decides the format.
        builtin: the built-in model.
        env: an env instance (its action format).
        make: env factory for the few-shot demonstrations (default: from ``cfg``).
    """
    examples: list[Any] = []
    if not builtin and cfg.rollout.chat_examples > 0:
        examples = oracle_examples(make or build_env_factory(cfg), cfg.rollout.chat_examples)
    return make_renderer(
        policy.tokenizer,
        builtin=builtin,
        history_turns=cfg.rollout.history_turns,
        env=env,
        system_prompt=cfg.rollout.system_prompt,
        user_prompt=cfg.rollout.user_prompt,
        examples=examples,
    )
