"""Studies whose arms are pipelines (``credo study``, :mod:`credo.commands.study`): SpatialCLI against its no-tool
control, CAST against its controls — comparisons of several stages each, not of one
training run.

An arm names a pipeline file instead of a recipe::

    arms:
      - {name: spatialcli, pipeline: pipelines/spatialcli.yaml}
      - {name: no-tool, pipeline: pipelines/spatialcli_notools.yaml}

Every arm runs once per seed (``train.seed=S``, the study's and the arm's overrides as
the pipeline's ``key=value`` overrides, so they reach every stage) into
``<study folder>/<arm>-seed<S>``, up to ``jobs`` pipelines at a time, each a ``credo
pipeline`` process with its log beside the folder. A stopped study resumes: a finished
pipeline is only read, an unfinished one continues with ``--resume`` (finished stages
are kept). The table has one row per arm and stage that measured held-out success (the
warm start's SFT, the RL stage's final evaluation, every ``eval`` stage), a column per
seed and the mean ± sd (and pass^k where an ``eval`` stage ran several trials per task);
it is written as ``compare.md`` and ``compare.json`` like a
recipe study's, so the page and the index are made the same way.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from credo.commands.compare import RunFailed, RunStopped
from credo.commands.study import PipelineArm, Study, publish
from credo.pipeline.runner import MARKER
from credo.pipeline.spec import PipelineError, load_pipeline
from credo.train.config import ConfigError
from credo.utils.atomic import write_text_atomic
from credo.utils.markdown import markdown_table

__all__ = ["check_pipeline_study", "pipeline_folder", "run_pipeline_study", "run_pipelines"]


def _overrides(arm: PipelineArm, common: Sequence[str], seed: int, out_dir: Path) -> list[str]:
    return [
        *common,
        *arm.overrides,
        f"train.seed={seed}",
        f"name={arm.name}-seed{seed}",
        f"runs_dir={out_dir}",
    ]


def pipeline_folder(arm: PipelineArm, seed: int, out_dir: Path) -> Path:
    """Where ``arm``'s pipeline with ``seed`` runs."""
    return Path(out_dir) / f"{arm.name}-seed{seed}"


def check_pipeline_arm(arm: PipelineArm, common: Sequence[str]) -> list[str]:
    """Load ``arm``'s pipeline with the study's overrides (every stage's config is
    checked); returns its stage names.

    Raises:
        ConfigError: the file, a key or a value is wrong (one line).
    """
    try:
        spec = load_pipeline(arm.file, _overrides(arm, common, 0, Path("runs")))
    except (PipelineError, ConfigError) as exc:
        raise ConfigError(f"arm {arm.name}: {exc}") from None
    return [s.name for s in spec.stages]


def check_pipeline_study(study: Study) -> None:
    """Load every pipeline arm of ``study`` with its overrides (before any compute).

    Raises:
        ConfigError: one line naming the study file, the arm and what is wrong.
    """
    for arm in study.pipelines:
        try:
            check_pipeline_arm(arm, study.common_overrides())
        except ConfigError as exc:
            raise ConfigError(f"study {study.path}: {exc}") from None


def run_pipeline_study(
    study: Study,
    *,
    out_root: Path = Path("runs/studies"),
    docs: Path | None = Path("docs/studies"),
    jobs: int = 1,
    on_run: Callable[[str, int, int, int], None] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """:func:`~credo.commands.study.run_study` for a study of pipelines: every arm ×
    seed into ``out_root/<name>``, then its page and the index in ``docs``."""
    check_pipeline_study(study)
    out_dir = Path(out_root) / study.name
    data = run_pipelines(
        study.pipelines,
        study.seeds,
        common=study.common_overrides(),
        out_dir=out_dir,
        jobs=jobs,
        on_run=on_run,
    )
    publish(study, out_dir, docs, command)
    return data


def _finished(folder: Path, stages: Sequence[str]) -> bool:
    return all((folder / s / MARKER).exists() for s in stages)


def run_pipelines(
    arms: Sequence[PipelineArm],
    seeds: Sequence[int],
    *,
    common: Sequence[str],
    out_dir: Path,
    jobs: int = 1,
    on_run: Callable[[str, int, int, int], None] | None = None,
) -> dict[str, Any]:
    """Run every arm × seed (see the module docstring) and write the table.

    Returns:
        ``compare.json``'s content: the seeds and one row per arm and measured stage.

    Raises:
        ConfigError: ``jobs`` < 1.
        RunFailed: a pipeline failed (after the others finished); names its log.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs must be a positive number of processes, got {jobs}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [(arm, seed) for arm in arms for seed in seeds]
    stages = {arm.name: check_pipeline_arm(arm, common) for arm in arms}
    pending = [
        (arm, seed)
        for arm, seed in runs
        if not _finished(pipeline_folder(arm, seed, out_dir), stages[arm.name])
    ]
    running: list[tuple[subprocess.Popen[bytes], Any, str, str]] = []  # proc, log, run, arm
    failed: list[str] = []
    stopped: list[str] = []  # exited cleanly before their last stage (a signal): resumable
    try:
        while pending or running:
            while pending and len(running) < jobs and not failed and not stopped:
                arm, seed = pending.pop(0)
                if on_run is not None:
                    on_run(arm.name, seed, runs.index((arm, seed)), len(runs))
                folder = pipeline_folder(arm, seed, out_dir)
                cmd = [sys.executable, "-m", "credo", "pipeline", arm.file, "--quiet"]
                if (folder / "pipeline.yaml").exists():
                    cmd.append("--resume")
                cmd += _overrides(arm, common, seed, out_dir)
                log = folder.with_suffix(".log").open("ab")
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
                running.append((proc, log, folder.name, arm.name))
            time.sleep(1.0)
            for item in list(running):
                proc, log, name, arm_name = item
                if proc.poll() is None:
                    continue
                log.close()
                running.remove(item)
                if proc.returncode != 0:
                    failed.append(f"{name} (exit {proc.returncode}, {out_dir / name}.log)")
                elif not _finished(out_dir / name, stages[arm_name]):
                    stopped.append(name)
            if (failed or stopped) and not running:
                break
    finally:
        for proc, log, *_ in running:  # interrupted: each pipeline stops where it can resume
            proc.wait()
            log.close()
    if failed:
        raise RunFailed(f"{len(failed)} pipeline(s) failed: {'; '.join(failed)}")
    if stopped:
        raise RunStopped(
            f"{len(stopped)} pipeline(s) stopped before their last stage "
            f"({', '.join(stopped)}): run the same command again to continue"
        )
    return write_table(arms, seeds, stages=stages, out_dir=out_dir)


def _stage_success(folder: Path, stages: Sequence[str]) -> dict[str, tuple[str, float, dict]]:
    """Stage name → (kind, held-out success, pass^k by k) of the stages of a finished
    pipeline that measured held-out success, in the pipeline's order; pass^k from an
    ``eval`` stage's ``eval.json`` with ``trials`` > 1 (else empty)."""
    out: dict[str, tuple[str, float, dict]] = {}
    for stage in stages:
        meta = json.loads((folder / stage / MARKER).read_text())
        summary = meta.get("summary", {})
        if "success_rate" in summary:
            ev = folder / stage / "eval.json"
            passk = (json.loads(ev.read_text()).get("pass_hat_k") or {}) if ev.exists() else {}
            out[stage] = (
                str(meta.get("kind", "")),
                float(summary["success_rate"]),
                {str(k): float(v) for k, v in passk.items()},
            )
    return out


def write_table(
    arms: Sequence[PipelineArm],
    seeds: Sequence[int],
    *,
    stages: Mapping[str, Sequence[str]],
    out_dir: Path,
) -> dict[str, Any]:
    """``compare.md`` and ``compare.json`` in ``out_dir`` from the finished pipelines
    (``stages``: each arm's stage names, in order): one row per arm and measured stage,
    held-out success per seed, mean ± sd, and pass^k (mean ± sd) for each k an ``eval``
    stage measured with several trials per task ("—" in the other rows)."""
    rows: list[dict[str, Any]] = []
    for arm in arms:
        folders = [pipeline_folder(arm, s, out_dir) for s in seeds]
        per_seed = [_stage_success(f, stages[arm.name]) for f in folders]
        for stage in per_seed[0]:
            row = {
                "arm": arm.name,
                "stage": stage,
                "kind": per_seed[0][stage][0],
                "success": [p[stage][1] for p in per_seed],
            }
            ks = set.intersection(*(set(p[stage][2]) for p in per_seed))
            if ks:  # pass^k where every seed's evaluation has it
                row["pass_hat_k"] = {
                    k: [p[stage][2][k] for p in per_seed] for k in sorted(ks, key=int)
                }
            rows.append(row)
    all_ks = sorted({k for r in rows for k in r.get("pass_hat_k", {})}, key=int)
    table = []
    for r in rows:
        passk = r.get("pass_hat_k", {})
        table.append(
            [
                r["arm"],
                f"{r['stage']} ({r['kind']})",
                _mean_sd(r["success"]),
                " ".join(f"{100 * x:.1f}" for x in r["success"]),
                *(_mean_sd(passk[k]) if k in passk else "—" for k in all_ks),
            ]
        )
    data = {"seeds": list(seeds), "rows": rows}
    write_text_atomic(out_dir / "compare.json", json.dumps(data, indent=1))
    md = markdown_table(
        [
            "arm",
            "stage (kind)",
            "held-out success, mean ± sd",
            f"per seed ({', '.join(map(str, seeds))})",
            *(f"pass^{k}, mean ± sd" for k in all_ks),
        ],
        table,
    )
    write_text_atomic(out_dir / "compare.md", md + "\n")
    return data


def _mean_sd(values: Sequence[float]) -> str:
    """Rates as ``"m.m % ± s.s"`` in percent (no sd for one seed)."""
    v = [100 * x for x in values]
    sd = f" ± {statistics.stdev(v):.1f}" if len(v) > 1 else ""
    return f"{statistics.fmean(v):.1f} %{sd}"
