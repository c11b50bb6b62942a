"""``train``: build the run, warm-start, iterate, checkpoint, evaluate.

:func:`train` builds the run's parts (:func:`~credo.train.run.build_run`) before it
creates any folder, so a wrong env or model stops at once; it then warm-starts
(:func:`~credo.train.warmstart.start_policy`), starts or resumes the training state
(:class:`~credo.train.state.TrainState`), runs ``train.iterations`` iterations of
:func:`~credo.train.iteration.run_iteration`, checkpointing as it goes, and ends with the
held-out evaluation of the trained policy. A first Ctrl-C (or SIGTERM) finishes the
current iteration and saves a checkpoint; ``--resume`` continues the run exactly.

What keeps a run safe: the run folder is locked (:class:`~credo.utils.lock.RunLock`)
before any work in it, so two runs never share one; every file is written by
temp-and-rename (``config.yaml``, checkpoints, ``latest``, the rewritten
``metrics.jsonl``, ``final_policy/``, ``curves.png``, ``final_eval.json``; new metrics
lines are single appends), and ``final_eval.json``, written last with the digests of
``final_policy/``, marks a finished run (:mod:`credo.train.finish`); env calls are guarded
(:mod:`credo.rollout.envguard`: exceptions, hangs past ``rollout.step_timeout`` and
wrong types fail one episode and are written to ``env_errors.jsonl``, the first few
shown); a non-finite reward stops the run with a checkpoint of the iteration's start; a
Ctrl-C or SIGTERM during set-up, the warm start or the final evaluation stops with one
line and the resume command, also under ``--quiet``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from credo.engines import distributed as dp
from credo.engines import fsdp
from credo.eval.evaluate import EvalResult
from credo.rollout.envguard import EnvErrorLog, EnvFailure, env_guard
from credo.train.checkpoint import clean_partial, latest_checkpoint, restore_rng, rng_snapshot
from credo.train.config import Config
from credo.train.finish import remove_final_leftovers, save_final_policy, write_final_eval
from credo.train.health import HealthMonitor
from credo.train.iteration import run_iteration
from credo.train.logging import MetricsLog, plot_curves, read_metrics
from credo.train.parts import check_parts, check_sharded
from credo.train.progress import Progress, StopOnInterrupt, interrupt_on_term
from credo.train.run import Run, build_run
from credo.train.state import TrainState
from credo.train.warmstart import start_policy
from credo.utils.atomic import write_text_atomic
from credo.utils.lock import RunLock, pid_alive
from credo.utils.storage import StorageError, storage_fix, storage_problem

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
        rank: this process's rank when several trained together (only rank 0 reports).
    """

    run_dir: Path
    iterations: int
    warm: EvalResult | None
    final: EvalResult | None
    interrupted: bool = False
    seconds: float = 0.0
    metrics: list[dict[str, Any]] = field(default_factory=list)
    rank: int = 0


def train(
    cfg: Config,
    *,
    resume: Path | None = None,
    quiet: bool = False,
    policy_path: Path | None = None,
) -> TrainResult:
    """Train a policy with RL as configured; see the module docstring.

    Args:
        cfg: the run config (for ``resume``, the one saved in the run folder).
        resume: a run folder to continue from its latest checkpoint.
        quiet: no progress bar (tests, benchmarks); errors and the resume hint are
            still printed.
        policy_path: start from the policy saved in this folder (a pipeline stage's
            output, :mod:`credo.pipeline`) instead of building it from ``model``; with
            ``sft.enabled=false`` it is the policy RL starts from (a checkpoint, when
            resuming, still replaces its weights).

    Raises:
        RunLocked: another live process works in the run folder.
        FileExistsError: a fresh run's folder already holds a run.
        EnvFailure: the env broke the run (a non-finite reward, every warm-start
            demonstration failing, an iteration that failed after env errors); the
            message starts with the env's own error.
        StorageError: the machine refused a write (a full disk, a quota, a read-only or
            unwritable folder): one line naming the file, what survived and how to go on.
    """
    where: list[Path] = []  # the run folder, once known
    try:
        return _train(cfg, resume, quiet, policy_path, where)
    except Exception as exc:  # a full disk or a read-only folder: one line, what to do
        refused = storage_problem(exc)
        if refused is None:
            raise
        folder = where[0] if where else Path(cfg.train.runs_dir)
        raise _storage_error(*refused, folder) from exc


def _train(
    cfg: Config, resume: Path | None, quiet: bool, policy_path: Path | None, where: list[Path]
) -> TrainResult:
    """:func:`train` (see there); ``where`` receives the run folder once it is known."""
    t_start = time.perf_counter()
    joined = not dp.active() and dp.setup(cfg.model.device)  # torchrun: N processes
    progress = Progress(enabled=not quiet and dp.is_main())
    run_dir = Path(resume) if resume else dp.broadcast_object(_run_dir_for(cfg))
    where.append(run_dir)
    lock: RunLock | None = None
    main = dp.is_main()  # rank 0 alone locks and writes the run folder
    try:
        with interrupt_on_term():
            if resume:  # the folder exists: lock it before any work
                lock = dp.main_first(lambda: _lock(run_dir, progress) if main else None)
            run = build_run(cfg, policy_path=policy_path)
            check_parts(cfg, run)  # e.g. a bad teacher folder stops before any run folder
            if dp.sharded():  # accelerate's FSDP/DeepSpeed: what they cannot train stops here
                fsdp.check_config(cfg, dp.sharding_name())
                left_off = check_sharded(cfg, dp.sharding_name())  # every rank: it may refuse
                for line in left_off if main else []:
                    progress.warn(line)  # once, from rank 0
            if not resume:  # a wrong env or model has stopped before any folder exists
                lock = dp.main_first(lambda: _new_run_dir(run_dir, progress) if main else None)
    except KeyboardInterrupt:
        if lock is not None:
            lock.release()
        progress.warn("interrupted during set-up; nothing was trained")
        return TrainResult(run_dir, 0, None, None, True, time.perf_counter() - t_start)
    assert lock is not None or not main  # taken above for both a fresh and a resumed run
    try:
        return _train_locked(run, run_dir, resume is not None, progress, t_start)
    finally:
        run.close()  # an agent run's policy server lives exactly as long as the run
        if lock is not None:
            lock.release()
        if joined:
            dp.teardown()


def _train_locked(
    run: Run, run_dir: Path, resuming: bool, progress: Progress, t_start: float
) -> TrainResult:
    """:func:`train` once the run is built and its folder locked."""
    cfg = run.cfg
    own = dp.rank_dir(run_dir)  # the run folder on rank 0, ranks/<r>/ on the others
    errors = EnvErrorLog(own / "env_errors.jsonl", say=progress.warn)
    with env_guard(step_timeout=cfg.rollout.step_timeout, log=errors):
        try:
            with interrupt_on_term():
                if dp.is_main():
                    _write_config(run_dir, cfg)
                    clean_partial(run_dir)
                    remove_final_leftovers(run_dir)
                    dp.note_processes(run_dir, resuming=resuming, say=progress.warn)
                checkpoint = latest_checkpoint(run_dir) if resuming else None
                policy, warm = dp.main_first(  # the others find rank 0's cached warm start
                    lambda: start_policy(
                        run, run_dir, resuming=checkpoint is not None, progress=progress
                    )
                )
                state = TrainState.start(run, run_dir, policy, checkpoint)
                dp.check_same_weights(state.policy.model)
        except KeyboardInterrupt:
            progress.warn(
                "interrupted before the first iteration (the warm start is cached once "
                f"finished); start again with: credo train --resume {run_dir}"
            )
            return TrainResult(run_dir, 0, None, None, True, time.perf_counter() - t_start)
        log = MetricsLog(
            own,
            resume_from=state.iteration,
            purge_step=state.env_steps_total + 1 if resuming else None,
        )
        if log.missing:
            progress.warn(
                f"warning: {log.path} lacks iterations {log.missing} (the file was cut "
                "short); they stay missing, the run continues"
            )
        interrupted = _iterate(run, state, run_dir, log, errors, progress, saved=checkpoint)
        final = None
        if not dp.is_main():  # rank 0 evaluates and saves the trained policy
            warm = None
        elif not interrupted:
            try:
                with interrupt_on_term():
                    final = _finish(run, state, run_dir, progress, warm)
            except KeyboardInterrupt:
                interrupted = True
                progress.warn(
                    "interrupted during the final evaluation; redo it with: "
                    f"credo train --resume {run_dir}"
                )
    metrics = read_metrics(own / "metrics.jsonl")
    if final is None and metrics and dp.is_main():  # a finished run's were drawn by _finish
        _plot(cfg, run_dir, metrics, warm, None)
    seconds = time.perf_counter() - t_start
    return TrainResult(
        run_dir, len(metrics), warm, final, interrupted, seconds, metrics, rank=dp.rank()
    )


def _iterate(
    run: Run,
    state: TrainState,
    run_dir: Path,
    log: MetricsLog,
    errors: EnvErrorLog,
    progress: Progress,
    *,
    saved: Path | None,
) -> bool:
    """The iterations, checkpointing as configured; returns whether the run was
    interrupted. A first Ctrl-C or SIGTERM stops after the iteration under way (saved);
    a second stops at once (the last checkpoint stays)."""
    cfg = run.cfg
    total, every = cfg.train.iterations, cfg.train.checkpoint_every
    last_saved = state.iteration if saved is not None else None
    health = HealthMonitor(cfg)  # warns when a run learns nothing (credo.train.health)
    if state.iteration > 0 and dp.is_main():  # resumed: the trends carry on, no repeats
        health.replay(read_metrics(log.path))
    try:
        with (
            progress.training(total, state.iteration) as bar,
            StopOnInterrupt(progress.warn) as stop,
        ):
            for it in range(state.iteration, total):
                rng, errors_before = rng_snapshot(), (errors.count, len(errors.records))
                try:
                    record = run_iteration(run, state, it)
                except Exception as exc:
                    if (
                        state.iteration == it
                        and last_saved != it
                        and isinstance(exc, EnvFailure)
                        and dp.is_main()
                        and not dp.sharded()  # FSDP, DeepSpeed: saving is a collective
                    ):
                        # nothing of this iteration was applied: save the state it started
                        # from, with the RNG states it started with
                        restore_rng(rng)
                        state.save(run_dir, cfg.train.keep_checkpoints)
                        last_saved = it
                    raise _iteration_error(exc, it, errors, errors_before, run_dir) from exc
                log.write(record)
                if dp.is_main():
                    health.observe(record)
                errors.flush()
                bar.update(state.iteration, record)
                done = state.iteration
                stopping = dp.any_rank(stop.requested)  # every rank stops after the same one
                if done % every == 0 or done == total or stopping:
                    state.save(run_dir, cfg.train.keep_checkpoints)  # written by rank 0
                    last_saved = done
                if stopping:
                    progress.warn(
                        f"stopped: checkpoint saved after iteration {done}; continue "
                        f"with: credo train --resume {run_dir}"
                    )
                    return True
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, keep the last checkpoint
        last = latest_checkpoint(run_dir)
        progress.warn(
            f"interrupted at once; resume continues from {last or 'the start'}: "
            f"credo train --resume {run_dir}"
        )
        return True
    finally:
        if state.rollouts is not None:  # the worker sampling ahead stops
            state.rollouts.close()
        state.engine.close()  # no collective follows: the process groups can go
        log.close()
        errors.flush()
    return False


def _iteration_error(
    exc: Exception, it: int, errors: EnvErrorLog, before: tuple[int, int], run_dir: Path
) -> Exception:
    """The error the user sees when iteration ``it`` fails: the env's own error first
    when the env failed in it (rather than what that caused downstream, e.g. a forest
    without token data), and where the run can continue from. ``before``: the log's
    ``(count, len(records))`` when the iteration started."""
    last = latest_checkpoint(run_dir)
    resume = (
        f"resume continues after {last.name}: credo train --resume {run_dir}"
        if last is not None
        else f"no checkpoint yet; start again with: credo train --resume {run_dir}"
    )
    if isinstance(exc, EnvFailure):
        return EnvFailure(f"iteration {it}: {exc}. {resume}")
    new = errors.count - before[0]
    if new > 0:
        first = errors.records[before[1]] if len(errors.records) > before[1] else None
        what = first.line() if first is not None else "see env_errors.jsonl"
        return EnvFailure(
            f"iteration {it} failed after the env raised {new} time(s) in it; the env's first "
            f"error: {what} (all in {errors.path}); the iteration then stopped with "
            f"{type(exc).__name__}: {exc}. {resume}"
        )
    return exc


def _storage_error(code: int, line: str, run_dir: Path) -> StorageError:
    """The one line of a write the machine refused (``line``: which file, why): what
    survived and how to go on. Every file is written by temp-and-rename, so the run is
    intact up to its last complete checkpoint."""
    fix = storage_fix(code, run_dir)
    if (run_dir / "config.yaml").exists():
        last = latest_checkpoint(run_dir)
        kept = f"up to {last.name}" if last is not None else "(no checkpoint yet)"
        then = f"{run_dir} keeps the run {kept}; {fix} and continue with: credo train --resume {run_dir}"
    else:
        then = f"{fix} (or set train.runs_dir to a writable folder) and start again"
    return StorageError(f"{line}; {then}", code)


def _write_config(run_dir: Path, cfg: Config) -> None:
    """``config.yaml``, rewritten atomically and only when it changes."""
    path = run_dir / "config.yaml"
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    if not path.exists() or path.read_text() != text:
        write_text_atomic(path, text)


def _lock(run_dir: Path, progress: Progress) -> RunLock:
    """Lock ``run_dir`` (:class:`~credo.utils.lock.RunLock`), saying so when a dead
    process's lock is taken over."""
    lock = RunLock(run_dir).acquire()
    if lock.stale is not None and not pid_alive(int(lock.stale.get("pid", 0))):
        progress.warn(
            f"note: {run_dir} was locked by process {lock.stale.get('pid')}, which is no "
            "longer running; lock taken over"
        )
    return lock


def _finish(
    run: Run, state: TrainState, run_dir: Path, progress: Progress, warm: EvalResult | None
) -> EvalResult:
    """The run's last writes (:mod:`credo.train.finish`), each by temp-and-rename and in
    this order: the trained policy's weights (``final_policy/``), the curves with its
    held-out result, then that result (``final_eval.json``, the mark of a finished run,
    with the digests of ``final_policy/``)."""
    with progress.phase(f"held-out eval of the trained policy ({run.cfg.eval.episodes} episodes)"):
        final = run.evaluate(state.policy)
    if run.shifted:
        with progress.phase(f"held-out eval on the shifted settings ({', '.join(run.shifted)})"):
            final.shifted = run.evaluate_shifted(state.policy)
    save_final_policy(state.policy, run_dir)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    if metrics:
        _plot(run.cfg, run_dir, metrics, warm, final)
    write_final_eval(run_dir, final.to_dict(), state.iteration)
    return final


def _plot(
    cfg: Config,
    run_dir: Path,
    metrics: list[dict[str, Any]],
    warm: EvalResult | None,
    final: EvalResult | None,
) -> None:
    """``curves.png``: the run's curves, its starting policy's held-out success and,
    once it finished, the trained policy's."""
    start = "warm start (SFT)" if cfg.sft.enabled else "initial policy (no warm start)"
    plot_curves(
        {cfg.recipe: metrics},
        run_dir / "curves.png",
        title=f"{cfg.recipe} on {cfg.env.name}",
        baselines={f"{start}, held-out": warm.success_rate} if warm else {},
        final={cfg.recipe: final.success_rate} if final else None,
    )


def _run_dir_for(cfg: Config) -> Path:
    """A new run's folder: ``train.name``, or ``<recipe>-<env>-<time>`` (the env name made
    safe for a folder name: ``pkg/mod.py:Env`` → ``pkg.mod.py.Env``)."""
    env = re.sub(r"[^A-Za-z0-9_.-]+", ".", cfg.env.name).strip(".")
    name = cfg.train.name or f"{cfg.recipe}-{env}-{datetime.now():%Y%m%d-%H%M%S}"
    return Path(cfg.train.runs_dir) / name


def _new_run_dir(run_dir: Path, progress: Progress) -> RunLock:
    """Create and lock a new run's folder; refuse a folder that holds a run already."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(run_dir, progress)
    if (run_dir / "metrics.jsonl").exists():
        lock.release()
        raise FileExistsError(
            f"{run_dir} already holds a run; use --resume {run_dir} to continue it or pick "
            "another train.name"
        )
    return lock
