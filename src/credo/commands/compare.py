"""``credo compare``: several recipes × seeds on the same tasks and budget.

Every run of a seed uses the same warm start (cached by config hash), the same training
tasks (they derive from ``(seed, iteration)``) and the same number of iterations, episodes
and held-out tasks; recipes differ only in what they configure. The comparison folder holds
one run folder per (recipe, seed), ``compare.json``, ``compare.md`` (the table) and
``compare.png`` (success vs. env steps for all recipes). Runs already finished are reused,
and an interrupted one is resumed, so a comparison can be stopped and restarted; a run
folder there that holds a run of another config (the overrides changed since) stops the
comparison before it trains, naming the folder and the first key that differs.

What is compared are **arms**: a name, a recipe and the arm's own overrides
(:class:`Arm`), so that one recipe may appear several times with different settings (a
study's arms, :mod:`credo.commands.study`). ``credo compare --recipes`` makes one arm per
recipe, named after it; there an override ``RECIPE:key=value`` applies to that recipe only
(:func:`split_overrides`): ``opd:teacher.path=RUN`` gives the teacher to ``opd`` without
giving one to ``grpo``.

With ``jobs`` > 1, runs train side by side, each in its own ``credo train`` process (one
core each: pass ``train.threads=1``, the built-in model's default). A warm start is trained
once: the runs that share one wait until the first of them has finished.

"Env steps to reach the reference" uses the training rollouts' success rate (a moving
average over ``smooth`` iterations, averaged over seeds) against the reference recipe's
final value (its mean over the last ``smooth`` iterations): rollouts are sampled as the
held-out evaluation is, on training tasks, and cost nothing extra.

Asked with ``trials`` n > 1 and ``ks``, every trained policy is also evaluated with n
trials per held-out task (:meth:`~credo.train.run.Run.evaluate`, saved in the run's
``passk_eval.json``) and the table gains a pass^k column per k (mean over seeds).
"""

from __future__ import annotations

import json
import math
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from credo.commands.records import (
    config_difference,
    record_problem,
    record_warm_start,
    restore_warm_start,
    write_record,
)
from credo.eval.passk import check_ks
from credo.train.checkpoint import checkpoint_iteration, latest_checkpoint
from credo.train.config import Config, ConfigError, load_config
from credo.train.finish import unfinished_reason
from credo.train.logging import read_metrics
from credo.train.loop import train
from credo.train.progress import interrupt_on_term
from credo.train.warmstart import warm_start_folder, warm_start_key
from credo.utils.atomic import write_file_atomic, write_text_atomic
from credo.utils.markdown import markdown_table
from credo.utils.safe_yaml import read_yaml_file

__all__ = [
    "Arm",
    "RecipeSummary",
    "RunFailed",
    "RunStopped",
    "arms_from_recipes",
    "compare",
    "split_overrides",
]


class RunFailed(RuntimeError):
    """A run of a comparison trained in its own process failed (the message names its log)."""


class RunStopped(RunFailed):
    """A run stopped before its end (SIGTERM, Ctrl-C: its checkpoint is kept); the same
    command continues it."""


def _stopped(names: Sequence[str]) -> RunStopped:
    return RunStopped(
        f"{len(names)} run(s) stopped before their end, checkpoints kept ({', '.join(names)}): "
        "run the same command again to continue"
    )


@dataclass(frozen=True)
class Arm:
    """One arm of a comparison: ``name`` (its table row and run folders
    ``<name>-seed<S>``), the ``recipe`` (a name or a path) and the arm's own ``key=value``
    ``overrides`` (applied after the overrides common to every arm)."""

    name: str
    recipe: str
    overrides: tuple[str, ...] = ()


def arms_from_recipes(recipes: Sequence[str], overrides: Sequence[str] = ()) -> list[Arm]:
    """One arm per recipe, named after the recipe (a path: its file stem), with the
    ``RECIPE:key=value`` overrides that name it (:func:`split_overrides`)."""
    scoped = split_overrides(recipes, [o for o in overrides if ":" in o.split("=", 1)[0]])
    return [Arm(Path(r).stem, r, tuple(scoped[r])) for r in recipes]


@dataclass
class RecipeSummary:
    """One arm's results over the seeds (``recipe``: the arm's name)."""

    recipe: str
    final: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    iteration_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    curves: list[list[tuple[int, float]]] = field(default_factory=list)
    steps_to_reference: int | None = None
    #: ``steps_to_reference`` over the reference recipe's own (``None`` if either is)
    steps_ratio: float | None = None
    #: the same seed by seed: env steps to the reference's final training success *on
    #: that seed*, over the reference's own (``None``: not reached on that seed)
    seed_steps_ratio: list[float | None] = field(default_factory=list)
    #: per seed, (generated tokens so far, training success) per iteration
    token_curves: list[list[tuple[int, float]]] = field(default_factory=list)
    #: generated tokens to the reference's final training success over the reference's
    #: own (success at equal generation cost: trees and merged groups share prefixes)
    tokens_ratio: float | None = None
    #: held-out success minus the reference recipe's, seed by seed
    delta: list[float] = field(default_factory=list)
    pass_hat_k: dict[str, list[float]] = field(default_factory=dict)
    health: dict[str, list[float]] = field(default_factory=dict)
    #: held-out truth of the episodes' free text, seed by seed (``EvalResult.text_truth``;
    #: empty where the env has none)
    text_truth: list[float] = field(default_factory=list)
    #: held-out success per env of a mixture, seed by seed (``EvalResult.by_env``)
    by_env: dict[str, list[float]] = field(default_factory=dict)
    #: held-out success of each seed's weakest env (``EvalResult.weakest_env``)
    weakest: list[float] = field(default_factory=list)
    #: held-out success on each ``eval.shifted`` setting, seed by seed
    shifted: dict[str, list[float]] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.final) if self.final else float("nan")

    @property
    def median(self) -> float:
        return statistics.median(self.final) if self.final else float("nan")

    @property
    def spread(self) -> float:
        return statistics.stdev(self.final) if len(self.final) > 1 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "final": self.final,
            "warm": self.warm,
            "mean": self.mean,
            "std": self.spread,
            "median": self.median,
            "delta": self.delta,
            "steps_ratio": self.steps_ratio,
            "seed_steps_ratio": self.seed_steps_ratio,
            "tokens_ratio": self.tokens_ratio,
            "iteration_s": statistics.fmean(self.iteration_s) if self.iteration_s else None,
            "update_s": statistics.fmean(self.update_s) if self.update_s else None,
            "steps_to_reference": self.steps_to_reference,
            "pass_hat_k": self.pass_hat_k,
            "health": {k: statistics.fmean(v) for k, v in self.health.items()},
            "text_truth": self.text_truth,
            "by_env": self.by_env,
            "weakest": self.weakest,
            "shifted": self.shifted,
        }


def _moving(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _mean_curve(curves: list[list[tuple[int, float]]], window: int) -> list[tuple[float, float]]:
    n = min(len(c) for c in curves)
    xs = [statistics.fmean(c[i][0] for c in curves) for i in range(n)]
    ys = [statistics.fmean(c[i][1] for c in curves) for i in range(n)]
    return list(zip(xs, _moving(ys, window)))


def split_overrides(recipes: Sequence[str], overrides: Sequence[str]) -> dict[str, list[str]]:
    """Each recipe's overrides: the plain ``key=value`` ones (every recipe) in order, plus
    the ``RECIPE:key=value`` ones that name it (``RECIPE`` as given in ``recipes``, or
    its file stem).

    Raises:
        ConfigError: a scoped override names a recipe that is not compared.
    """
    out: dict[str, list[str]] = {r: [] for r in recipes}
    for item in overrides:
        key = item.split("=", 1)[0]
        if ":" not in key:
            for r in recipes:
                out[r].append(item)
            continue
        name, rest = item.split(":", 1)
        hits = [r for r in recipes if name in (r, Path(r).stem)]
        if not hits:
            raise ConfigError(
                f"override {item!r} is for recipe {name!r}, which is not compared; "
                f"compared: {', '.join(recipes)} (RECIPE:key=value applies to RECIPE only)"
            )
        for r in hits:
            out[r].append(rest)
    return out


def _run_one(cfg: Config, run_dir: Path, records: Path | None = None) -> dict[str, Any]:
    if not _finished(run_dir):
        resume = _resumable(run_dir)
        if resume is not None:
            cfg = Config.from_saved(read_yaml_file(run_dir / "config.yaml"))
        train(cfg, resume=resume, quiet=True)
        if not _finished(run_dir):  # stopped by a signal: a checkpoint, no final result
            raise _stopped([run_dir.name])
    _record(run_dir, records)
    return _result(run_dir)


def _record(run_dir: Path, records: Path | None) -> None:
    """Record the finished run ``run_dir`` in ``records`` (unless its record is current),
    and keep its warm start there if it is small."""
    if records is None:
        return
    record = Path(records) / run_dir.name
    cfg = Config.from_saved(read_yaml_file(run_dir / "config.yaml"))
    if record_problem(record, cfg) is not None or _differs(run_dir, record):
        write_record(run_dir, record)
    key = json.loads((run_dir / "warmstart.json").read_text()).get("key")
    if key:
        record_warm_start(key, Path(records))


def _differs(run_dir: Path, record: Path) -> bool:
    """The record's final evaluation is not the run's (another run of the same config)."""
    return (run_dir / "final_eval.json").read_bytes() != (record / "final_eval.json").read_bytes()


def _finished(run_dir: Path) -> bool:
    """Every artefact of the run is complete (:mod:`credo.train.finish`)."""
    done = checkpoint_iteration(latest_checkpoint(run_dir))
    return unfinished_reason(run_dir, done) is None


def _check_run_folders(out_dir: Path, names: list[str], configs: list[Config]) -> None:
    """A run folder already in ``out_dir`` (finished, or stopped and to be resumed) must
    hold the run it is named for: one trained with another config (the study's overrides
    changed since) would be resumed or read as this run's result.

    Raises:
        ConfigError: the first such folder, with the first key that differs.
    """
    for name, cfg in zip(names, configs):
        if (out_dir / name / "config.yaml").is_file():
            problem = config_difference(out_dir / name, cfg)
            if problem is not None:
                raise ConfigError(
                    f"run folder {out_dir / name} holds a run of another config ({problem}); "
                    "move it away or pass another output folder, then run again"
                )


def _resumable(run_dir: Path) -> Path | None:
    return run_dir if (run_dir / "checkpoints").exists() else None


def _result(run_dir: Path) -> dict[str, Any]:
    final_path = run_dir / "final_eval.json"
    warm = json.loads((run_dir / "warmstart.json").read_text())
    final = json.loads(final_path.read_text())
    return {
        "final": final["success_rate"],
        "text_truth": final.get("text_truth"),
        "by_env": {k: v["success_rate"] for k, v in (final.get("by_env") or {}).items()},
        "shifted": {k: v["success_rate"] for k, v in (final.get("shifted") or {}).items()},
        "warm": (warm.get("eval") or {}).get("success_rate"),
        "metrics": read_metrics(run_dir / "metrics.jsonl"),
    }


def _passk_one(cfg: Config, run_dir: Path, trials: int, ks: Sequence[int]) -> dict[str, float]:
    """pass^k of a finished run's trained policy (``passk_eval.json``, reused when it
    was made with the same ``trials`` and ``ks``)."""
    from credo.commands.evaluate import evaluate_target

    path = run_dir / "passk_eval.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["trials"] == trials and sorted(saved["pass_hat_k"]) == sorted(map(str, ks)):
            return saved["pass_hat_k"]
    ev = evaluate_target(
        run_dir=run_dir, model=None, env=None, episodes=cfg.eval.episodes, trials=trials, ks=ks
    )
    result = ev["eval"]
    write_text_atomic(
        path,
        json.dumps(
            {"trials": trials, "pass_hat_k": result.pass_hat_k, "pass_at_k": result.pass_at_k},
            indent=1,
        ),
    )
    return result.pass_hat_k


def compare(
    arms: Sequence[Arm] | Sequence[str],
    seeds: list[int],
    *,
    overrides: list[str] | None = None,
    out_dir: Path,
    reference: str | None = None,
    smooth: int = 5,
    on_run: Callable[[str, int, int, int], None] | None = None,
    trials: int = 1,
    ks: Sequence[int] = (),
    jobs: int = 1,
    records: Path | None = None,
) -> list[RecipeSummary]:
    """Train every arm with every seed; write the table and plot; return summaries.

    Args:
        arms: the arms (:class:`Arm`), or recipe names/paths: one arm each, named after
            the recipe, with the ``RECIPE:key=value`` overrides of ``overrides``.
        seeds: training seeds.
        overrides: ``key=value`` overrides applied to every run (same budget for all);
            with recipe names, ``RECIPE:key=value`` to that recipe's runs only
            (:func:`split_overrides`).
        out_dir: the comparison folder.
        reference: the arm whose final success defines "env steps to reach" (default:
            ``grpo`` if compared, else the first arm).
        smooth: moving-average window (iterations) of the success curves.
        on_run: called with ``(arm, seed, index, total)`` before each run trained (index
            and total count the runs to train: recorded runs are not).
        trials, ks: with ``ks``, also pass^k of every trained policy over ``trials``
            episodes per held-out task (each k ≤ ``trials``).
        jobs: runs trained side by side, each in its own process (default 1: one after
            the other, in this process). Either way runs stopped before their end
            (checkpoints kept) resume first, then the others in seed, arm order.
        records: a folder of run records (:mod:`credo.commands.records`): a run whose
            record there matches its config is read from it, not trained; every run
            trained here is recorded there when it finishes, with its seed's warm start
            when small, and a run to train starts from that recorded warm start (default:
            none).
    """
    common = list(overrides or [])
    if arms and isinstance(arms[0], str):
        arms = arms_from_recipes(arms, common)  # type: ignore[arg-type]
        common = [o for o in common if ":" not in o.split("=", 1)[0]]
    arms = list(arms)  # type: ignore[arg-type]
    if not arms or not seeds:
        raise ConfigError("compare needs at least one recipe and one seed")
    if jobs < 1:
        raise ConfigError(f"--jobs must be a positive number of processes, got {jobs}")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ConfigError(f"arm names must differ: {', '.join(names)}")
    ks = check_ks(ks, trials)
    ref_name = reference or ("grpo" if "grpo" in names else names[0])
    if ref_name not in names:
        raise ConfigError(
            f"--reference {ref_name!r} is not one of the compared recipes: {', '.join(names)}"
        )
    out_dir = Path(out_dir)
    # every config is loaded (and so checked) before the first run trains
    runs = [(seed, arm, f"{arm.name}-seed{seed}") for seed in seeds for arm in arms]
    run_overrides = [
        [
            *common,
            *arm.overrides,
            f"train.seed={seed}",
            f"train.runs_dir={out_dir}",
            f"train.name={name}",
        ]
        for seed, arm, name in runs
    ]
    configs = [load_config(arm.recipe, o) for (_, arm, _), o in zip(runs, run_overrides)]
    _check_one_env(names, configs[: len(arms)])
    _check_run_folders(out_dir, [name for _, _, name in runs], configs)
    out_dir.mkdir(parents=True, exist_ok=True)
    # a run recorded with this config (an earlier session's) is read, not trained; a
    # record cannot give the trained policy pass^k evaluates
    recorded = {
        i
        for i, ((_, _, name), cfg) in enumerate(zip(runs, configs))
        if records is not None and not ks and not _finished(out_dir / name)
        and record_problem(Path(records) / name, cfg) is None
    }  # fmt: skip
    to_train = [i for i in range(len(runs)) if i not in recorded]
    # runs stopped before their end (checkpoints kept) go first: a session's partial work
    # is finished before new runs start, not left to a session that may lack the folder
    to_train.sort(key=lambda i: _resumable(out_dir / runs[i][2]) is None)
    if records is not None:  # a seed's recorded warm start, not one retrained here
        for key in {
            warm_start_key(configs[i])
            for i in to_train
            if configs[i].sft.enabled and configs[i].sft.cache
        }:
            restore_warm_start(key, Path(records))
    if jobs > 1:
        trained = _run_parallel(
            [runs[i] for i in to_train],
            [run_overrides[i] for i in to_train],
            [configs[i] for i in to_train],
            out_dir,
            jobs,
            on_run,
            records,
        )
    else:
        trained = []
        for k, i in enumerate(to_train):  # numbered among the runs to train, as with jobs
            seed, arm, name = runs[i]
            if on_run is not None:
                on_run(arm.name, seed, k, len(to_train))
            trained.append(_run_one(configs[i], out_dir / name, records))
    by_run = dict(zip(to_train, trained))
    results = [
        by_run[i] if i in by_run else _result(Path(records) / runs[i][2])  # type: ignore[arg-type]
        for i in range(len(runs))
    ]
    summaries = {a.name: RecipeSummary(a.name) for a in arms}
    for (_, arm, name), cfg, res in zip(runs, configs, results):
        s = summaries[arm.name]
        s.final.append(res["final"])
        if res["warm"] is not None:
            s.warm.append(res["warm"])
        if res["text_truth"] is not None:
            s.text_truth.append(res["text_truth"])
        for env, v in res.get("by_env", {}).items():
            s.by_env.setdefault(env, []).append(v)
        if res.get("by_env"):
            s.weakest.append(min(res["by_env"].values()))
        for label, v in res.get("shifted", {}).items():
            s.shifted.setdefault(label, []).append(v)
        m = res["metrics"]
        s.curves.append([(r["rollout/env_steps_total"], r["rollout/success_rate"]) for r in m])
        s.token_curves.append(_token_curve(m))
        s.iteration_s.append(statistics.fmean(r["time/iteration_s"] for r in m))
        s.update_s.append(statistics.fmean(r["time/update_s"] for r in m))
        for k, v in _health(m, smooth).items():
            s.health.setdefault(k, []).append(v)
        for k, v in (_passk_one(cfg, out_dir / name, trials, ks) if ks else {}).items():
            s.pass_hat_k.setdefault(k, []).append(v)

    threshold = relate_to_reference(list(summaries.values()), ref_name, smooth)
    _write(out_dir, list(summaries.values()), ref_name, threshold, seeds, common, smooth)
    return list(summaries.values())


def _run_parallel(
    runs: list[tuple[int, Arm, str]],
    run_overrides: list[list[str]],
    configs: list[Config],
    out_dir: Path,
    jobs: int,
    on_run: Callable[[str, int, int, int], None] | None,
    records: Path | None = None,
) -> list[dict[str, Any]]:
    """Train ``runs`` with up to ``jobs`` ``credo train`` processes at a time (each run's
    output in ``<out_dir>/<name>.log``). Runs that share a warm start wait until the
    first of them (the one that trains it) has finished; finished runs are only read.
    Each run is a session of its own, so Ctrl-C or SIGTERM reaches it once, through this
    process: interrupted, it sends each running run one SIGINT (finish the iteration,
    checkpoint, stop) and waits for them.

    Raises:
        RunFailed: a run failed (after the others have finished); names its log.
    """
    keys = [
        warm_start_key(cfg) if cfg.sft.enabled else f"none-{i}" for i, cfg in enumerate(configs)
    ]
    pending = [i for i in range(len(runs)) if not _finished(out_dir / runs[i][2])]
    first = {keys[i]: i for i in reversed(pending)}  # the run that trains each warm start
    running: dict[int, tuple[subprocess.Popen[bytes], Any]] = {}
    done: set[int] = set(range(len(runs))) - set(pending)
    finished_before = sorted(done)  # recorded below; the others as each one finishes
    failed: list[str] = []
    stopped: list[str] = []  # exited cleanly before their end (a signal): resumable

    def ready(i: int) -> bool:  # the warm start it needs is trained (or it trains it)
        key = keys[i]
        cached = (warm_start_folder(key) / "warmstart.json").exists()
        return cached or first[key] == i or first[key] in done

    try:
        with interrupt_on_term():  # SIGTERM stops the study as Ctrl-C does
            while pending or running:
                startable = [] if failed or stopped else [i for i in pending if ready(i)]
                for i in startable[: jobs - len(running)]:
                    pending.remove(i)
                    seed, arm, name = runs[i]
                    if on_run is not None:
                        on_run(arm.name, seed, i, len(runs))
                    resume = _resumable(out_dir / name)
                    cmd = [sys.executable, "-m", "credo", "train", "--quiet"]
                    if resume is not None:
                        cmd += ["--resume", str(resume)]
                    else:
                        cmd += ["--recipe", arm.recipe, *run_overrides[i]]
                    log = (out_dir / f"{name}.log").open("ab")
                    running[i] = (
                        subprocess.Popen(
                            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                        ),
                        log,
                    )
                time.sleep(1.0)
                for i, (proc, log) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    log.close()
                    del running[i]
                    done.add(i)
                    if proc.returncode != 0:
                        failed.append(
                            f"{runs[i][2]} (exit {proc.returncode}, {out_dir / runs[i][2]}.log)"
                        )
                    elif not _finished(out_dir / runs[i][2]):
                        stopped.append(runs[i][2])
                    else:
                        _record(out_dir / runs[i][2], records)
                if (failed or stopped) and not running:
                    break  # no new run starts after a failure or a stop
    finally:
        for proc, _ in running.values():  # interrupted: each run checkpoints and stops
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, log in running.values():
            proc.wait()
            log.close()
    if failed:
        raise RunFailed(f"{len(failed)} run(s) failed: {'; '.join(failed)}")
    if stopped:
        raise _stopped(stopped)
    for i in finished_before:  # recorded now if not yet
        _record(out_dir / runs[i][2], records)
    return [_result(out_dir / name) for _, _, name in runs]


def _check_one_env(recipes: Sequence[str], configs: Sequence[Config]) -> None:
    """Every recipe trains on the same env: a recipe may name its own (``rapo``'s is
    ``tools`` with profiles), and success rates on different envs do not compare.

    Raises:
        ConfigError: the recipes' envs differ; names each and how to set one for all.
    """
    envs = {r: (c.env.name, c.env.kwargs) for r, c in zip(recipes, configs)}
    if any(e != envs[recipes[0]] for e in envs.values()):  # dicts: key order is no difference
        each = ", ".join(f"{r} on {n} {k}" for r, (n, k) in envs.items())
        raise ConfigError(
            f"compared recipes train on different envs ({each}): set one env for all with "
            "--env NAME and env.kwargs=..."
        )


def _token_curve(metrics: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(generated tokens so far, training success) per iteration of one run."""
    total, out = 0, []
    for r in metrics:
        total += int(r.get("rollout/gen_tokens", 0))
        out.append((total, r["rollout/success_rate"]))
    return out


def relate_to_reference(summaries: list[RecipeSummary], ref_name: str, smooth: int) -> float:
    """Fill every summary's ``steps_to_reference``, ``steps_ratio``, ``seed_steps_ratio``,
    ``tokens_ratio`` and ``delta`` against the recipe ``ref_name``; return the threshold:
    the reference's final training success (mean over its last ``smooth`` iterations of
    the seed-averaged moving average).

    ``steps_to_reference`` is the first env-step count at which a recipe's seed-averaged
    moving-average training success reaches the threshold; ``seed_steps_ratio`` does the
    same per seed, against the reference's final value and env steps on that seed;
    ``delta`` pairs the held-out success seed by seed (the seeds share a warm start, which
    differs far more between seeds than recipes do within one). ``tokens_ratio`` is
    ``steps_ratio`` counted in generated tokens instead of env steps (``None`` without
    token curves)."""
    ref = next(s for s in summaries if s.recipe == Path(ref_name).stem)
    threshold, ref_steps = _reach(ref.curves, smooth)
    ref_tokens = _reach(ref.token_curves, smooth, threshold)[1] if ref.token_curves else None
    ref_seeds = [_reach([c], smooth) for c in ref.curves]
    for s in summaries:
        s.steps_to_reference = _reach(s.curves, smooth, threshold)[1]
        s.steps_ratio = _ratio(s.steps_to_reference, ref_steps)
        if s.token_curves:
            s.tokens_ratio = _ratio(_reach(s.token_curves, smooth, threshold)[1], ref_tokens)
        s.seed_steps_ratio = [
            _ratio(_reach([c], smooth, level)[1], steps)
            for c, (level, steps) in zip(s.curves, ref_seeds)
        ]
        s.delta = [a - b for a, b in zip(s.final, ref.final)]
    return threshold


def _reach(
    curves: list[list[tuple[int, float]]], smooth: int, threshold: float | None = None
) -> tuple[float, int | None]:
    """``(threshold, env steps)``: the first env-step count at which the seed-averaged
    moving average of ``curves`` reaches ``threshold`` (default: its own final value,
    the mean of its last ``smooth`` points), or ``None`` if it never does."""
    curve = _mean_curve(curves, smooth)
    if threshold is None:
        threshold = statistics.fmean(y for _, y in curve[-smooth:])
    return threshold, next((int(x) for x, y in curve if y >= threshold), None)


def _ratio(steps: int | None, ref_steps: int | None) -> float | None:
    return steps / ref_steps if steps is not None and ref_steps else None


#: The whole run's generated tokens over its mixed groups (``rollout/mixed_groups``: the
#: groups whose returns differ, the only ones a group-relative estimator learns from).
TOKENS_PER_MIXED_GROUP = "tokens_per_mixed_group"

#: training-health and cost columns: metric → (column, format); each the mean over a run's
#: last ``smooth`` iterations (how the run ended), but :data:`TOKENS_PER_MIXED_GROUP`,
#: over the whole run; then over the seeds ("—" when a recipe does not log it; a column
#: no recipe logs is left out).
HEALTH_COLUMNS = {
    "rollout/episode_len": ("episode len", "{:.1f}"),
    "rollout/invalid_rate": ("invalid", "{:.1%}"),
    "policy/entropy": ("entropy", "{:.2f}"),
    "rollout/gen_tokens": ("gen tokens/it", "{:,.0f}"),
    TOKENS_PER_MIXED_GROUP: ("gen tokens per mixed group", "{:,.0f}"),
    "credit/adv_abs_p99": ("|A| p99", "{:.2f}"),
    "policy/clip_frac": ("clip frac", "{:.3f}"),
    "teacher/seconds": ("teacher s/iteration", "{:.2f}"),
}


def _health_keys(summaries: list[RecipeSummary]) -> list[str]:
    """The :data:`HEALTH_COLUMNS` metrics that at least one recipe logged."""
    return [k for k in HEALTH_COLUMNS if any(s.health.get(k) for s in summaries)]


def _health(metrics: list[dict[str, Any]], smooth: int) -> dict[str, float]:
    """The :data:`HEALTH_COLUMNS` metrics of one run: means over its last ``smooth``
    iterations (metrics the run did not log are left out)."""
    tail = metrics[-max(1, smooth) :]
    out = {
        k: statistics.fmean(float(r[k]) for r in tail if k in r)
        for k in HEALTH_COLUMNS
        if any(k in r for r in tail)
    }
    groups = sum(int(r.get("rollout/mixed_groups", 0)) for r in metrics)
    if groups:
        out[TOKENS_PER_MIXED_GROUP] = (
            sum(int(r.get("rollout/gen_tokens", 0)) for r in metrics) / groups
        )
    return out


def _table_rows(summaries: list[RecipeSummary]) -> list[list[str]]:
    health = _health_keys(summaries)
    texts = any(s.text_truth for s in summaries)
    envs = _envs(summaries)
    rows = []
    for s in summaries:
        rows.append(
            [
                s.recipe,
                _mean_sd(s.final),
                f"{s.median:.1%}",
                " ".join(f"{v:.1%}" for v in s.final),
                _signed_points(s.delta),
                f"{statistics.fmean(s.warm):.1%}" if s.warm else "—",
                f"{s.steps_to_reference:,}" if s.steps_to_reference is not None else "not reached",
                f"{s.steps_ratio:.2f}×" if s.steps_ratio is not None else "—",
                _per_seed_ratios(s.seed_steps_ratio),
                f"{s.tokens_ratio:.2f}×" if s.tokens_ratio is not None else "—",
                f"{statistics.fmean(s.iteration_s):.2f}",
                f"{statistics.fmean(s.update_s):.2f}",
                *(
                    HEALTH_COLUMNS[k][1].format(statistics.fmean(s.health[k]))
                    if s.health.get(k)
                    else "—"
                    for k in health
                ),
                *(f"{statistics.fmean(v):.1%}" for v in s.pass_hat_k.values()),
                *([_mean_sd(s.text_truth)] if texts else []),
                *([_mean_sd(s.weakest)] if envs else []),
                *(_mean_sd(s.by_env.get(e, [])) for e in envs),
                *(_mean_sd(s.shifted.get(x, [])) for x in _shifted(summaries)),
            ]
        )
    return rows


def _shifted(summaries: list[RecipeSummary]) -> list[str]:
    """The ``eval.shifted`` labels, in order of first appearance ([] without)."""
    return list(dict.fromkeys(x for s in summaries for x in s.shifted))


def _envs(summaries: list[RecipeSummary]) -> list[str]:
    """The envs of a mixture, sorted ([] for one env)."""
    return sorted({e for s in summaries for e in s.by_env})


def _mean_sd(values: list[float]) -> str:
    """``41.2% ± 3.0%``: mean ± sample sd over the seeds ("—" without values); the
    success and text-truth columns of the table."""
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1%} ± {sd:.1%}"


def _signed_points(delta: list[float]) -> str:
    """``+3.5, +3.1 (+2.0 +3.1 +5.4)``: the mean and the median of per-seed
    differences, then each, in percentage points ("—" without them)."""
    if not delta:
        return "—"
    each = " ".join(f"{100 * d:+.1f}" for d in delta)
    mean, median = 100 * statistics.fmean(delta), 100 * statistics.median(delta)
    return f"{mean:+.1f}, {median:+.1f} ({each})"


def _per_seed_ratios(ratios: list[float | None]) -> str:
    """``0.61× (0.55× 0.61× not reached)``: the median over seeds (a seed that never got
    there counts as the largest), then each ("—" without them)."""
    if not ratios:
        return "—"
    med = statistics.median_high([math.inf if r is None else r for r in ratios])
    each = " ".join("not reached" if r is None else f"{r:.2f}×" for r in ratios)
    return f"{'not reached' if math.isinf(med) else f'{med:.2f}×'} ({each})"


def _columns(summaries: list[RecipeSummary]) -> list[str]:
    """:data:`COLUMNS`, plus a pass^k column per k when pass^k was asked for, the
    held-out text truth where the env knows it, on a mixture of envs the weakest env's
    success and each env's, and each ``eval.shifted`` setting's."""
    ks = list(summaries[0].pass_hat_k) if summaries else []
    health = [HEALTH_COLUMNS[k][0] for k in _health_keys(summaries)]
    texts = ["held-out text truth (mean ± sd)"] if any(s.text_truth for s in summaries) else []
    envs = _envs(summaries)
    per_env = [f"held-out {e} (mean ± sd)" for e in envs]
    weakest = ["weakest env, held-out (mean ± sd)"] if envs else []
    shifted = [f"held-out, shifted: {x} (mean ± sd)" for x in _shifted(summaries)]
    return [
        *COLUMNS, *health, *(f"held-out pass^{k}" for k in ks), *texts, *weakest, *per_env,
        *shifted,
    ]  # fmt: skip


COLUMNS = [
    "recipe",
    "held-out success (mean ± sd)",
    "median",
    "per seed",
    "Δ vs reference, points: mean, median (per seed)",
    "warm start",
    "env steps to reference",
    "× reference's env steps",
    "× reference's env steps, same seed: median (per seed)",
    "× reference's generated tokens",
    "s/iteration",
    "update s/iteration",
]


def _write(
    out_dir: Path,
    summaries: list[RecipeSummary],
    ref: str,
    threshold: float,
    seeds: list[int],
    overrides: list[str],
    smooth: int,
) -> None:
    write_text_atomic(
        out_dir / "compare.json",
        json.dumps(
            {
                "reference": ref,
                "threshold": threshold,
                "seeds": seeds,
                "overrides": overrides,
                "recipes": [s.to_dict() for s in summaries],
            },
            indent=1,
        ),
    )
    table = markdown_table(_columns(summaries), _table_rows(summaries))
    reference = (
        f"Reference: {ref}'s final training success {threshold:.1%} "
        f"({smooth}-iteration moving average, mean over seeds {seeds})."
    )
    write_text_atomic(out_dir / "compare.md", f"{table}\n{reference}\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for s in summaries:
        curve = _mean_curve(s.curves, smooth)
        xs, ys = zip(*curve)
        n = len(xs)
        per_seed = [_moving([y for _, y in c[:n]], smooth) for c in s.curves]
        low = [min(p[i] for p in per_seed) for i in range(n)]
        high = [max(p[i] for p in per_seed) for i in range(n)]
        (line,) = ax.plot(xs, ys, label=f"{s.recipe} (held-out {s.mean:.0%})")
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
    ax.axhline(threshold, linestyle=":", color="grey")
    ax.set_xlabel("env steps")
    ax.set_ylabel("training success rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"credo compare ({len(seeds)} seeds; band = min–max over seeds)")
    fig.tight_layout()
    try:
        write_file_atomic(
            out_dir / "compare.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png")
        )
    finally:
        plt.close(fig)


def summary_table_rows(summaries: list[RecipeSummary]) -> tuple[list[str], list[list[str]]]:
    """The columns and rows of the comparison table (for the CLI)."""
    return _columns(summaries), _table_rows(summaries)
