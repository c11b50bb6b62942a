"""The built-in stage kinds ``sft``, ``rl`` and ``eval``, each a thin wrapper of the
command that does the work (``credo sft``'s warm start, ``credo train``, ``credo eval``).

- ``sft``: SFT on the env's (ε-noisy) oracle demonstrations as configured in ``sft.*``
  (:func:`~credo.train.warmstart.warm_start`, cached by config hash unless it starts
  from a given ``policy:``), evaluated on the held-out tasks; makes ``policy``.
- ``rl``: :func:`~credo.train.loop.train` in the stage's ``run/`` folder, from the
  ``policy:`` given (its own warm start off) or from its own warm start; an unfinished
  run is continued with ``train``'s own resume. With ``params.trajectories`` = N > 0 it
  then writes ``trajectories.jsonl``: ``group_size`` episodes of the trained policy on
  each of training tasks 0..N-1 (:mod:`credo.pipeline.trajectories`). Makes ``policy``
  and ``trajectories``.
- ``eval``: the held-out evaluation (:meth:`~credo.train.run.Run.evaluate`) of the
  ``policy:`` given, under the stage's config (e.g. ``env.kwargs.tools: off``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from credo.eval.evaluate import EvalResult
from credo.pipeline.registry import StageContext, StageInterrupted, StageResult, register_stage
from credo.pipeline.trajectories import collect_trajectories, write_trajectories
from credo.train.config import Config, apply_overrides
from credo.train.loop import train
from credo.train.progress import Progress
from credo.train.run import build_run
from credo.train.warmstart import sft_steps, warm_start
from credo.utils.atomic import replace_dir, write_text_atomic

__all__ = ["EvalParams", "RLParams", "eval_rows", "eval_summary", "save_policy"]


def eval_rows(ev: EvalResult, label: str = "held-out") -> list[tuple[str, Any]]:
    """A held-out result as table rows."""
    rows: list[tuple[str, Any]] = [
        (f"{label} episodes", ev.episodes),
        (f"{label} success rate", round(ev.success_rate, 4)),
        (f"{label} success 95% CI", f"{ev.ci_low:.3f}-{ev.ci_high:.3f}"),
        (f"{label} mean return", round(ev.mean_return, 4)),
        (f"{label} invalid-action rate", round(ev.invalid_rate, 4)),
        (f"{label} mean turns", round(ev.mean_turns, 3)),
    ]
    if ev.text_truth is not None:
        rows.append((f"{label} text truth", round(ev.text_truth, 4)))
    rows += [(f"{label} pass^{k}", round(v, 4)) for k, v in ev.pass_hat_k.items()]
    rows += [(f"{label} pass@{k}", round(v, 4)) for k, v in ev.pass_at_k.items()]
    if ev.errors:
        rows.append((f"{label} env errors", ev.errors))
    return rows


def eval_summary(ev: EvalResult) -> dict[str, Any]:
    """The numbers of a held-out result that the pipeline summary shows."""
    return {
        "success_rate": ev.success_rate,
        "ci_low": ev.ci_low,
        "ci_high": ev.ci_high,
        "episodes": ev.episodes,
        "invalid_rate": ev.invalid_rate,
        "mean_turns": ev.mean_turns,
    }


def save_policy(policy: Any, final: Path) -> None:
    """Save ``policy`` as the folder ``final`` by temp-and-rename
    (:func:`~credo.utils.atomic.replace_dir`; an earlier attempt's folder is replaced only
    once the new one is complete)."""
    replace_dir(final, policy.save)


def _write_eval(path: Path, ev: EvalResult) -> None:
    write_text_atomic(path, json.dumps(ev.to_dict(), indent=1))


def _critic_path(ctx: StageContext) -> list[str]:
    """The override that puts the stage's ``critic`` input (a critic stage's folder) in
    ``critic.path``, so the run's actions pass CAST's guard; none without that input."""
    return (
        [f"critic.path={json.dumps(str(ctx.inputs['critic']))}"] if "critic" in ctx.inputs else []
    )


# ------------------------------------------------------------------------------ sft
@register_stage(
    "sft",
    accepts=("policy",),
    makes=("policy",),
    overrides=lambda refs: ["sft.enabled=true", *(["sft.cache=false"] if refs else [])],
)
def sft_stage(ctx: StageContext) -> StageResult:
    """The warm start as configured (see the module docstring); ``policy/`` and
    ``eval.json`` in the stage folder."""
    progress = Progress(enabled=not ctx.quiet)
    run = build_run(ctx.cfg, policy_path=ctx.inputs.get("policy"))
    try:
        with progress.phase(f"{ctx.name}: SFT") as tick:
            policy, ws = warm_start(
                run, on_step=lambda ph, s, n, loss: tick(s, n, f"{ph} loss {loss:.3f}")
            )
        save_policy(policy, ctx.folder / "policy")
        with progress.phase(f"{ctx.name}: held-out eval"):
            ev = run.evaluate(policy)
    finally:
        run.close()
    _write_eval(ctx.folder / "eval.json", ev)
    table = [
        ("demonstration success (noisy)", round(ws.demo_success, 4)),
        ("SFT steps (clean + noisy)", sft_steps(ctx.cfg) + ctx.cfg.sft.noisy_steps),
        ("from the warm-start cache", ws.cached),
        *eval_rows(ev),
    ]
    return StageResult({"policy": "policy"}, table, eval_summary(ev))


# ------------------------------------------------------------------------------- rl
@dataclass
class RLParams:
    """Knobs of the ``rl`` stage.

    Attributes:
        trajectories: after training, sample the trained policy on this many training
            tasks and write the episodes to ``trajectories.jsonl`` (default 0: none).
        group_size: episodes per task for those trajectories (default: the config's
            ``rollout.group_size``).
    """

    trajectories: int = 0
    group_size: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.trajectories, int) and self.trajectories >= 0):
            raise ValueError(f"trajectories must be an integer ≥ 0, got {self.trajectories!r}")
        if self.group_size is not None and not (
            isinstance(self.group_size, int) and self.group_size >= 1
        ):
            raise ValueError(f"group_size must be an integer ≥ 1, got {self.group_size!r}")


def _rl_makes(params: RLParams) -> tuple[str, ...]:
    return ("policy", "trajectories") if params.trajectories > 0 else ("policy",)


@register_stage(
    "rl",
    accepts=("policy", "critic"),
    makes=("policy", "trajectories"),
    params=RLParams,
    made=_rl_makes,
    overrides=lambda refs: ["sft.enabled=false"] if "policy" in refs else [],
)
def rl_stage(ctx: StageContext) -> StageResult:
    """``credo train`` in ``run/`` (continued if an earlier attempt left it unfinished),
    then the trajectories (see the module docstring)."""
    p: RLParams = ctx.params
    where = [f"train.runs_dir={json.dumps(str(ctx.folder))}", "train.name=run"]
    cfg = Config.from_dict(apply_overrides(ctx.cfg.to_dict(), where + _critic_path(ctx)))
    run_dir = ctx.folder / "run"
    resume = run_dir if (run_dir / "config.yaml").exists() else None
    result = train(cfg, resume=resume, quiet=ctx.quiet, policy_path=ctx.inputs.get("policy"))
    if result.interrupted or result.final is None:
        raise StageInterrupted(f"stage {ctx.name!r}: training stopped before it finished")
    table: list[tuple[str, Any]] = [
        ("RL iterations", result.iterations),
        ("continued an unfinished run", resume is not None),
    ]
    if result.warm is not None:
        table += eval_rows(result.warm, "start")
    table += eval_rows(result.final, "trained")
    outputs = {"policy": "run/final_policy"}
    summary = eval_summary(result.final)
    if result.warm is not None:
        summary["start_success_rate"] = result.warm.success_rate
    if p.trajectories > 0:
        run = build_run(cfg, policy_path=run_dir / "final_policy")
        try:
            episodes = collect_trajectories(
                run,
                run.policy,
                tasks=p.trajectories,
                group_size=p.group_size or cfg.rollout.group_size,
                seed=cfg.train.seed,
            )
        finally:
            run.close()
        write_trajectories(ctx.folder / "trajectories.jsonl", episodes)
        wins = sum(e.success for e in episodes)
        table += [
            ("trajectories written", len(episodes)),
            ("successful trajectories", wins),
            ("trajectory success rate", round(wins / max(1, len(episodes)), 4)),
        ]
        outputs["trajectories"] = "trajectories.jsonl"
        summary["trajectories_successful"] = wins
    return StageResult(outputs, table, summary)


# ----------------------------------------------------------------------------- eval
@dataclass
class EvalParams:
    """Knobs of the ``eval`` stage.

    Attributes:
        episodes: held-out tasks (default: the config's ``eval.episodes``).
        greedy: temperature 0 (default false: sampled as in training).
        trials: episodes per task (default 1); with ``ks`` adds pass@k and pass^k.
        ks: the k of pass@k and pass^k, each ≤ ``trials`` (default none).
    """

    episodes: int | None = None
    greedy: bool = False
    trials: int = 1
    ks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.episodes is not None and not (
            isinstance(self.episodes, int) and self.episodes >= 1
        ):
            raise ValueError(f"episodes must be an integer ≥ 1, got {self.episodes!r}")
        if not (isinstance(self.trials, int) and self.trials >= 1):
            raise ValueError(f"trials must be an integer ≥ 1, got {self.trials!r}")
        if not isinstance(self.ks, list) or not all(
            isinstance(k, int) and 1 <= k <= self.trials for k in self.ks
        ):
            raise ValueError(f"ks must be a list of integers in 1..trials, got {self.ks!r}")


@register_stage("eval", needs=("policy",), accepts=("critic",), params=EvalParams)
def eval_stage(ctx: StageContext) -> StageResult:
    """The held-out evaluation of the input policy; ``eval.json`` in the stage folder.

    With ``critic: STAGE`` the policy acts under that critic's guard (CAST's online
    verification at test time: ``critic.on_flag`` says what a flag does, e.g. ``resample``
    in the stage's ``overrides``), and the table adds the guard's flag and redraw counts.
    """
    p: EvalParams = ctx.params
    cfg = Config.from_dict(apply_overrides(ctx.cfg.to_dict(), _critic_path(ctx)))
    run = build_run(cfg, policy_path=ctx.inputs["policy"])
    try:
        policy = run.policy if run.critic is None else run.critic.wrap(run.policy)
        ev = run.evaluate(policy, episodes=p.episodes, greedy=p.greedy, trials=p.trials, ks=p.ks)
        counts = dict(run.critic.counts) if run.critic is not None else {}
    finally:
        run.close()
    _write_eval(ctx.folder / "eval.json", ev)
    rows = eval_rows(ev) + [(f"critic {k}", v) for k, v in counts.items()]
    return StageResult({}, rows, eval_summary(ev))
