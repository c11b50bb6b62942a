"""``credo sft`` and ``credo eval``: the warm start alone, and evaluation of a policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from credo.eval.evaluate import evaluate
from credo.policy.hf import HFPolicy
from credo.train.config import Config, load_config
from credo.train.progress import Progress
from credo.train.setup import (
    add_adapters,
    build_env_factory,
    build_policy,
    configure_runtime,
    default_max_turns,
    make_run_renderer,
    sampling_params,
    warm_start,
)

__all__ = ["evaluate_target", "run_sft"]


def run_sft(cfg: Config, *, episodes: int | None = None, quiet: bool = False) -> dict[str, Any]:
    """Warm-start (or load it from the cache) and evaluate it on held-out tasks."""
    progress = Progress(enabled=not quiet)
    configure_runtime(cfg)
    make_env = build_env_factory(cfg)
    env = make_env()
    policy, builtin = build_policy(cfg, env, make_env)
    renderer = make_run_renderer(cfg, policy, builtin, env, make_env)
    with progress.phase("warm start (SFT)") as tick:
        policy, ws = warm_start(
            cfg,
            policy,
            renderer,
            make_env,
            on_step=lambda ph, s, n, loss: tick(s, n, f"{ph} loss {loss:.3f}"),
        )
    with progress.phase("held-out eval"):
        ev = evaluate(
            policy,
            renderer,
            make_env,
            episodes=episodes or cfg.eval.episodes,
            sampling=sampling_params(cfg, builtin=builtin),
            max_turns=default_max_turns(cfg, env),
            seed=cfg.eval.seed,
        )
    return {"eval": ev, "path": ws.path, "cached": ws.cached}


def evaluate_target(
    *,
    run_dir: Path | None,
    model: str | None,
    env: str | None,
    episodes: int,
    greedy: bool = False,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Evaluate a run's trained policy (or latest checkpoint), or a model.

    ``model`` may be a folder, a hub name or a credo alias (``smollm2-135m``: the
    pretrained model zero-shot, in the chat format, with its default response cap). A
    run trained with LoRA is rebuilt as it was trained (base model, warm start from the
    cache, adapters) and its saved adapters loaded.
    """
    if run_dir is None and model is None:
        raise ValueError("give a run folder or --model NAME_OR_PATH")
    extra = list(overrides or [])
    if env:
        extra.append(f"env.name={env}")
    if run_dir is not None:
        cfg_path = Path(run_dir) / "config.yaml"
        if not cfg_path.exists():
            raise ValueError(f"{run_dir} is not a run folder (no config.yaml)")
        from credo.train.config import apply_overrides

        cfg = Config.from_dict(apply_overrides(yaml.safe_load(cfg_path.read_text()), extra))
        configure_runtime(cfg)
        from credo.train.checkpoint import latest_checkpoint

        folder = Path(run_dir) / "final_policy"
        label = "trained policy"
        if not folder.exists():
            ckpt = latest_checkpoint(Path(run_dir))
            if ckpt is None:
                raise ValueError(f"{run_dir} has neither a final policy nor a checkpoint")
            folder, label = ckpt / "policy", f"checkpoint {ckpt.name}"
        make_env = build_env_factory(cfg)
        e = make_env()
        if (folder / "adapter_config.json").exists():
            policy, builtin = build_policy(cfg, e, make_env)
            if cfg.sft.enabled:
                renderer = make_run_renderer(cfg, policy, builtin, e, make_env)
                policy, _ = warm_start(cfg, policy, renderer, make_env)
            policy = add_adapters(cfg, policy)
            policy.load_weights(folder)
        else:
            policy = HFPolicy.from_pretrained(folder)
            builtin = cfg.model.name is None
    else:
        cfg = load_config("grpo", [f"model.name={model}", *extra])
        configure_runtime(cfg)
        make_env = build_env_factory(cfg)
        e = make_env()
        policy, builtin = build_policy(cfg, e, make_env)
        label = str(model)
    renderer = make_run_renderer(cfg, policy, builtin, e, make_env)
    ev = evaluate(
        policy,
        renderer,
        make_env,
        episodes=episodes,
        sampling=sampling_params(cfg, greedy=greedy, builtin=builtin),
        max_turns=default_max_turns(cfg, e),
        seed=cfg.eval.seed,
    )
    return {"eval": ev, "label": label, "env": cfg.env.name}
