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
from credo.policy.tiny import create_tiny_policy
from credo.rollout.render import PLAIN_WORDS, Renderer, make_renderer
from credo.train.config import Config, config_hash
from credo.train.sft import collect_demonstrations, sft_train

__all__ = [
    "WarmStart",
    "build_env_factory",
    "build_policy",
    "cache_dir",
    "configure_runtime",
    "default_max_turns",
    "env_vocabulary",
    "sampling_params",
    "seed_estimator_state",
    "warm_start",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """``$CREDO_CACHE``, else ``~/.cache/credo``."""
    return Path(os.environ.get("CREDO_CACHE", Path.home() / ".cache" / "credo"))


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


def sampling_params(cfg: Config, *, greedy: bool = False) -> SamplingParams:
    return SamplingParams(
        temperature=0.0 if greedy else cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        aux_samples=0 if greedy else cfg.rollout.aux_samples,
    )


def build_policy(cfg: Config, env: Any, make: Callable[[], Any]) -> tuple[HFPolicy, bool]:
    """The untrained policy: the built-in tiny model, or an HF model (``model.name``).

    Returns ``(policy, builtin)``.
    """
    device = cfg.model.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.model.name is None:
        policy = create_tiny_policy(env_vocabulary(env, make), cfg.model.tiny, seed=cfg.train.seed)
        policy.model.to(device)
        policy.device = torch.device(device)
        return policy, True
    from credo.policy.models import resolve_model

    path = resolve_model(cfg.model.name)
    policy = HFPolicy.from_pretrained(path, device=device, dtype=_DTYPES[cfg.model.dtype])
    return policy, False


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
    return config_hash(
        {
            "env": asdict(cfg.env),
            "model": {"name": cfg.model.name, "tiny": asdict(cfg.model.tiny)},
            "sft": {k: v for k, v in asdict(cfg.sft).items() if k != "cache"},
            "history_turns": cfg.rollout.history_turns,
            "seed": cfg.train.seed,
            "code": _code_fingerprint(cfg),
        }
    )


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

    ``on_step(phase, step, total, loss)`` reports progress. Returns the (possibly
    reloaded) policy and what happened.
    """
    key = warm_start_key(cfg)
    folder = cache_dir() / "warmstart" / key
    meta_path = folder / "warmstart.json"
    if cfg.sft.cache and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        loaded = HFPolicy.from_pretrained(folder / "policy", device=str(policy.device))
        return loaded, WarmStart(key, True, meta["demo_success"], 0.0, folder / "policy")
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


def make_run_renderer(cfg: Config, policy: HFPolicy, builtin: bool, env: Any) -> Renderer:
    return make_renderer(
        policy.tokenizer, builtin=builtin, history_turns=cfg.rollout.history_turns, env=env
    )
