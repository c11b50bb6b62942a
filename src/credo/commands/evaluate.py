"""``credo eval``: the held-out evaluation of a run's trained policy, or of a model.

It builds the run with :func:`~credo.train.run.build_run` and scores with its held-out
evaluator, so on the same config a policy gets the same numbers here as in ``credo
train``'s table (and as ``credo sft``'s, :mod:`credo.commands.sft`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from credo.critics.labeller import LABEL_RULES
from credo.critics.mistakes import has_label_rule
from credo.train.checkpoint import latest_checkpoint
from credo.train.config import Config, apply_overrides, load_config
from credo.train.run import add_adapters, build_run
from credo.train.warmstart import warm_start
from credo.utils.safe_yaml import read_yaml_file

__all__ = ["evaluate_target"]


def evaluate_target(
    *,
    run_dir: Path | None,
    model: str | None,
    env: str | None,
    episodes: int,
    greedy: bool = False,
    overrides: list[str] | None = None,
    trials: int = 1,
    ks: tuple[int, ...] = (),
    mistakes: bool = False,
) -> dict[str, Any]:
    """Evaluate a run's trained policy (or latest checkpoint), or a model.

    ``model`` may be a folder, a hub name or a credo alias (``smollm2-135m``: the
    pretrained model zero-shot, in the chat format, with its default response cap). A
    run trained with LoRA is rebuilt as it was trained (base model, warm start from the
    cache, adapters) and its saved adapters loaded. ``trials`` episodes per task and
    ``ks`` add pass@k and pass^k (:meth:`~credo.train.run.Run.evaluate`). ``mistakes``:
    label every action with the env's label rule (:mod:`credo.critics.mistakes`); an env
    without one is refused before anything is built.
    """
    if run_dir is None and model is None:
        raise ValueError("give a run folder or --model NAME_OR_PATH")
    extra = list(overrides or [])
    if env:
        extra.append(f"env.name={env}")
    if run_dir is None:
        cfg = load_config("grpo", [f"model.name={model}", *extra])
        _check_mistakes(cfg, mistakes)
        run = build_run(cfg)
        policy, label = run.policy, str(model)
    else:
        cfg_path = Path(run_dir) / "config.yaml"
        if not cfg_path.exists():
            raise ValueError(f"{run_dir} is not a run folder (no config.yaml)")
        cfg = Config.from_saved(apply_overrides(read_yaml_file(cfg_path), extra))
        _check_mistakes(cfg, mistakes)
        folder, label = _trained_folder(Path(run_dir))
        if (folder / "adapter_config.json").exists():
            run = build_run(cfg)
            policy = run.policy
            if cfg.sft.enabled:
                policy, _ = warm_start(run)
            policy = add_adapters(cfg, policy)
            policy.load_weights(folder)
        else:
            run = build_run(cfg, policy_path=folder)
            policy = run.policy
    try:
        ev = run.evaluate(
            policy, episodes=episodes, greedy=greedy, trials=trials, ks=ks, mistakes=mistakes
        )
    finally:
        run.close()
    return {"eval": ev, "label": label, "env": run.cfg.env.name}


def _check_mistakes(cfg: Config, mistakes: bool) -> None:
    """``--mistakes`` needs an env with a label rule, and the trainer's own episodes."""
    if not mistakes:
        return
    if not has_label_rule(cfg.env.name):
        raise ValueError(
            f"--mistakes labels actions with the env's label rule; env {cfg.env.name!r} has "
            f"none (envs with one: {', '.join(LABEL_RULES.names())})"
        )
    if cfg.rollout.agent:
        raise ValueError("--mistakes labels the trainer's own episodes, not an agent's")


def _trained_folder(run_dir: Path) -> tuple[Path, str]:
    """A run's trained policy folder (else its latest checkpoint's) and a label for it."""
    folder = run_dir / "final_policy"
    if folder.exists():
        return folder, "trained policy"
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir} has neither a final policy nor a checkpoint")
    return ckpt / "policy", f"checkpoint {ckpt.name}"
