"""``train``: build the run, warm-start, iterate, checkpoint, evaluate.

:func:`train` builds the run's parts (:func:`~credo.train.run.build_run`) before it
creates any folder, so a wrong env or model stops at once; it then warm-starts
(:func:`~credo.train.warmstart.start_policy`), starts or resumes the training state
(:class:`~credo.train.state.TrainState`), runs ``train.iterations`` iterations of
:func:`~credo.train.iteration.run_iteration`, checkpointing as it goes, and ends with the
held-out evaluation of the trained policy. A first Ctrl-C finishes the current iteration
and saves a checkpoint; ``--resume`` continues the run exactly.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from credo.eval.evaluate import EvalResult
from credo.train.checkpoint import latest_checkpoint
from credo.train.config import Config
from credo.train.iteration import run_iteration
from credo.train.logging import MetricsLog, plot_curves, read_metrics
from credo.train.progress import Progress, StopOnInterrupt
from credo.train.run import Run, build_run
from credo.train.state import TrainState
from credo.train.warmstart import start_policy
from credo.utils.atomic import write_text_atomic

__all__ = ["TrainResult", "train"]


@dataclass
class TrainResult:
    """What a finished (or interrupted) run reports.

    Attributes:
        run_dir: the run folder.
        iterations: iterations completed.
        warm: held-out result of the policy RL started from (``None`` if not evaluated).
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


def train(cfg: Config, *, resume: Path | None = None, quiet: bool = False) -> TrainResult:
    """Train a policy with RL as configured; see the module docstring.

    Args:
        cfg: the run config (for ``resume``, the one saved in the run folder).
        resume: a run folder to continue from its latest checkpoint.
        quiet: no progress bar (tests, benchmarks).
    """
    t_start = time.perf_counter()
    run = build_run(cfg)
    try:
        return _train(run, resume, quiet, t_start)
    finally:
        run.close()  # an agent run's policy server lives exactly as long as the run


def _train(run: Run, resume: Path | None, quiet: bool, t_start: float) -> TrainResult:
    cfg = run.cfg
    run_dir = Path(resume) if resume else _new_run_dir(cfg)
    write_text_atomic(run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    progress = Progress(enabled=not quiet)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    policy, warm = start_policy(run, run_dir, resuming=checkpoint is not None, progress=progress)
    state = TrainState.start(run, run_dir, policy, checkpoint)
    log = MetricsLog(run_dir, resume_from=state.iteration if checkpoint is not None else None)
    total, interrupted = cfg.train.iterations, False
    try:
        with progress.training(total, state.iteration) as bar, StopOnInterrupt() as stop:
            for it in range(state.iteration, total):
                record = run_iteration(run, state, it)
                log.write(record)
                bar.update(state.iteration, record)
                done = state.iteration
                if done % cfg.train.checkpoint_every == 0 or done == total or stop.requested:
                    state.save(run_dir, cfg.train.keep_checkpoints)
                if stop.requested:
                    interrupted = True
                    progress.say(
                        f"stopped: checkpoint saved after iteration {done}; continue "
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
    final = None if interrupted else _finish(run, state, run_dir, progress)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    if metrics:
        baselines = {"warm start (held-out)": warm.success_rate} if warm else {}
        title = f"{cfg.recipe} on {cfg.env.name}"
        plot_curves({cfg.recipe: metrics}, run_dir / "curves.png", title=title, baselines=baselines)
    seconds = time.perf_counter() - t_start
    return TrainResult(run_dir, len(metrics), warm, final, interrupted, seconds, metrics)


def _finish(run: Run, state: TrainState, run_dir: Path, progress: Progress) -> EvalResult:
    """The trained policy's held-out evaluation (``final_eval.json``) and its weights
    (``final_policy/``)."""
    with progress.phase(f"held-out eval of the trained policy ({run.cfg.eval.episodes} episodes)"):
        final = run.evaluate(state.policy)
    write_text_atomic(run_dir / "final_eval.json", json.dumps(final.to_dict(), indent=1))
    state.policy.save(run_dir / "final_policy")
    return final


def _new_run_dir(cfg: Config) -> Path:
    """A new run folder: ``train.name``, or ``<recipe>-<env>-<time>`` (the env name made
    safe for a folder name: ``pkg/mod.py:Env`` → ``pkg.mod.py.Env``)."""
    env = re.sub(r"[^A-Za-z0-9_.-]+", ".", cfg.env.name).strip(".")
    name = cfg.train.name or f"{cfg.recipe}-{env}-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = Path(cfg.train.runs_dir) / name
    if (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(
            f"{run_dir} already holds a run; use --resume {run_dir} to continue it or pick "
            "another train.name"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir
