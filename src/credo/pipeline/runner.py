"""Running a pipeline: its stages in order, each in its own folder, resumable per stage.

The pipeline folder (``runs_dir/name``) holds ``pipeline.yaml`` (the file as run, with
the command line), ``summary.md``/``summary.csv`` (one row per stage, rewritten after
each stage), and one folder per stage with that stage's outputs and its table
(``table.md``, ``table.csv``). Every file a stage leaves is written by temp-and-rename.
A stage that finishes writes ``stage.json`` (its digest, outputs, summary, time and the
size and SHA-256 of every file of its outputs) last: that file *is* the mark of a
finished stage. ``--resume`` skips every marked stage whose digest is unchanged and whose
outputs are still the files it wrote (a damaged, truncated or replaced output stops the
pipeline with one line naming the file, before any later stage reads it), and runs the
others; an unfinished stage restarts, or continues where its kind can (the RL stage
continues its training run from the last checkpoint). The folder is locked
(:class:`~credo.utils.lock.RunLock`) while a pipeline runs in it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from credo.pipeline.registry import STAGES, StageContext, StageResult
from credo.pipeline.spec import PipelineError, PipelineSpec, StageSpec
from credo.utils.atomic import remove_leftovers, write_text_atomic
from credo.utils.digest import digest_problem, digests
from credo.utils.lock import RunLock
from credo.utils.markdown import markdown_table

__all__ = ["MARKER", "PipelineResult", "StageRecord", "run_pipeline", "write_table"]

#: The file that marks a finished stage.
MARKER = "stage.json"

#: The summary's columns.
SUMMARY_COLUMNS = (
    "stage",
    "kind",
    "reads",
    "status",
    "held-out success",
    "95% CI",
    "episodes",
    "seconds",
)


@dataclass
class StageRecord:
    """A stage as the pipeline saw it.

    Attributes:
        name: the stage's name.
        kind: its kind.
        status: ``ran``, ``skipped`` (finished earlier, unchanged) or ``pending``.
        outputs: output name → absolute path.
        summary: its summary numbers (:attr:`StageResult.summary`).
        seconds: its wall time (when it ran, in this or an earlier invocation).
        artefacts: size and SHA-256 of every file of its outputs, by path relative to its
            folder (:func:`~credo.utils.digest.digests`).
        inputs: reference name → fingerprint of the input it was made from
            (:func:`fingerprint`); a finished stage whose inputs changed since runs again.
    """

    name: str
    kind: str
    status: str
    outputs: dict[str, Path] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    artefacts: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)


def fingerprint(record: StageRecord, output: str, folder: Path) -> str:
    """A short hash of the digests of ``record``'s ``output`` (every file under it;
    ``folder``: the stage's folder): equal for equal content, so that a stage made from
    that output can tell whether it changed since."""
    rel = record.outputs[output].relative_to(folder).as_posix()
    files = {k: v for k, v in record.artefacts.items() if k == rel or k.startswith(rel + "/")}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class PipelineResult:
    """What :func:`run_pipeline` did: the folder and every stage's record, in order."""

    folder: Path
    stages: list[StageRecord]

    def stage(self, name: str) -> StageRecord:
        """The record of stage ``name``."""
        return next(s for s in self.stages if s.name == name)


def run_pipeline(
    spec: PipelineSpec,
    *,
    resume: bool = False,
    quiet: bool = False,
    say: Callable[[str], None] = print,
) -> PipelineResult:
    """Run ``spec``'s stages in order (see the module docstring).

    Args:
        spec: the pipeline (:func:`~credo.pipeline.spec.load_pipeline`).
        resume: continue the pipeline in ``spec.folder``: skip finished, unchanged stages.
        quiet: no progress bars (the one-line stage reports still go to ``say``).
        say: where the one-line reports go.

    Raises:
        PipelineError: a fresh run's folder already holds a pipeline, ``--resume`` of a
            folder that holds none, or a finished stage whose digest changed.
        StageInterrupted: a stage stopped early (Ctrl-C); the pipeline can be resumed.
    """
    folder = spec.folder
    started = folder / "pipeline.yaml"
    if not resume and started.exists():
        raise PipelineError(
            f"{folder} already holds a pipeline run; continue it with --resume, or give "
            "another name=NAME"
        )
    if resume and not started.exists():
        raise PipelineError(f"{folder} holds no pipeline run to resume (run it without --resume)")
    done = _finished(spec) if resume else {}
    folder.mkdir(parents=True, exist_ok=True)
    lock = RunLock(folder).acquire()
    try:
        if not resume:
            text = yaml.safe_dump(
                {"source": str(spec.source), "command_line": spec.overrides, **spec.raw},
                sort_keys=False,
            )
            write_text_atomic(started, text)
        records: list[StageRecord] = []
        for stage in spec.stages:
            if stage.name in done:
                changed = _changed_inputs(spec, stage, done[stage.name], records)
                if not changed:
                    records.append(done[stage.name])
                    say(f"stage {stage.name} ({stage.kind}): finished earlier, skipped")
                    continue
                say(
                    f"stage {stage.name} ({stage.kind}): its {', '.join(changed)} changed "
                    "since it finished; running it again"
                )
            records.append(_run_stage(spec, stage, records, quiet, say))
            _write_summary(spec, records)
        _write_summary(spec, records)
    finally:
        lock.release()
    return PipelineResult(folder, records)


def _finished(spec: PipelineSpec) -> dict[str, StageRecord]:
    """The stages of ``spec`` marked finished in its folder, checked unchanged."""
    out = {}
    for stage in spec.stages:
        marker = spec.folder / stage.name / MARKER
        if not marker.exists():
            continue
        meta = _read_marker(marker, spec.folder / stage.name)
        if meta.get("digest") != stage.digest:
            raise PipelineError(
                f"stage {stage.name!r} of {spec.folder} finished with another config, kind, "
                "params or input; start a new pipeline (name=NEW_NAME) or delete "
                f"{spec.folder / stage.name} to run it again"
            )
        problem = digest_problem(spec.folder / stage.name, meta.get("artefacts", {}))
        if problem is not None:
            raise PipelineError(
                f"stage {stage.name!r} of {spec.folder} finished, but its output {problem}; "
                f"delete {spec.folder / stage.name} and resume to make it again"
            )
        outputs = {k: spec.folder / stage.name / v for k, v in meta["outputs"].items()}
        out[stage.name] = StageRecord(
            stage.name,
            stage.kind,
            "skipped",
            outputs,
            meta.get("summary", {}),
            meta["seconds"],
            meta.get("artefacts", {}),
            meta.get("inputs", {}),
        )
    return out


def _input_prints(
    spec: PipelineSpec, stage: StageSpec, records: list[StageRecord]
) -> dict[str, str]:
    """The fingerprint of each of ``stage``'s inputs as the earlier stages' records stand."""
    out = {}
    for ref, source in stage.refs.items():
        rec = next(r for r in records if r.name == source)
        if ref in rec.outputs:
            out[ref] = fingerprint(rec, ref, spec.folder / source)
    return out


def _changed_inputs(
    spec: PipelineSpec, stage: StageSpec, done: StageRecord, records: list[StageRecord]
) -> list[str]:
    """The inputs of finished stage ``stage`` that differ from those it was made from
    (an earlier stage ran again and made other content); none for a stage.json of an
    older credo, which recorded none."""
    if not done.inputs:
        return []
    now = _input_prints(spec, stage, records)
    return sorted(ref for ref, was in done.inputs.items() if now.get(ref) != was)


def _read_marker(marker: Path, folder: Path) -> dict[str, Any]:
    """A stage's ``stage.json``, checked to be what :func:`_run_stage` writes (one line
    naming the file otherwise)."""
    try:
        meta = json.loads(marker.read_text())
        ok = (
            isinstance(meta, dict)
            and isinstance(meta.get("outputs"), dict)
            and all(isinstance(v, str) for v in meta["outputs"].values())
            and isinstance(meta.get("seconds"), (int, float))
            and isinstance(meta.get("artefacts", {}), dict)
        )
    except (OSError, ValueError, RecursionError):
        ok = False
    if not ok:
        raise PipelineError(
            f"{marker} is damaged (not the JSON record of a finished stage); delete {folder} "
            "and resume to run that stage again"
        )
    return meta


def _run_stage(
    spec: PipelineSpec,
    stage: StageSpec,
    records: list[StageRecord],
    quiet: bool,
    say: Callable[[str], None],
) -> StageRecord:
    """Run one stage and mark it finished."""
    folder = spec.folder / stage.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).unlink(missing_ok=True)
    remove_leftovers(folder)  # what a killed earlier attempt was writing
    inputs = {}
    for ref, source in stage.refs.items():
        path = next(r for r in records if r.name == source).outputs.get(ref)
        if path is None or not path.exists():
            raise PipelineError(
                f"stage {stage.name!r}: its {ref} from stage {source!r} is missing ({path}); "
                f"delete {spec.folder / source} and resume to make it again"
            )
        inputs[ref] = path
    prints = _input_prints(spec, stage, records)
    say(f"stage {stage.name} ({stage.kind}): running")
    start = time.perf_counter()
    ctx = StageContext(stage.name, stage.cfg, folder, inputs, stage.params, quiet)
    result: StageResult = STAGES.get(stage.kind).fn(ctx)
    seconds = time.perf_counter() - start
    write_table(folder / "table", result.table)
    marker = {
        "kind": stage.kind,
        "digest": stage.digest,
        "outputs": result.outputs,
        "summary": result.summary,
        "seconds": round(seconds, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "artefacts": digests(folder, sorted(result.outputs.values())),
        "inputs": prints,
    }
    write_text_atomic(folder / MARKER, json.dumps(marker, indent=1))
    line = _success_text(result.summary)
    say(f"stage {stage.name} ({stage.kind}): done in {seconds:.1f} s{line}")
    outputs = {k: folder / v for k, v in result.outputs.items()}
    return StageRecord(
        stage.name,
        stage.kind,
        "ran",
        outputs,
        result.summary,
        seconds,
        marker["artefacts"],
        prints,
    )


def _success_text(summary: dict[str, Any]) -> str:
    if "success_rate" not in summary:
        return ""
    return f", held-out success {summary['success_rate']:.1%} ({summary.get('episodes')} episodes)"


def write_table(stem: Path, rows: list[tuple[str, Any]]) -> None:
    """Write ``(quantity, value)`` rows as ``stem.md`` (a markdown table) and ``stem.csv``,
    each atomically."""
    _write_both(stem, ("quantity", "value"), [[str(k), _cell(v)] for k, v in rows])


def _write_both(stem: Path, header: tuple[str, ...], rows: list[list[str]]) -> None:
    write_text_atomic(stem.with_suffix(".md"), markdown_table(header, rows))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_text_atomic(stem.with_suffix(".csv"), buf.getvalue())


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _write_summary(spec: PipelineSpec, records: list[StageRecord]) -> None:
    """``summary.md`` and ``summary.csv``: one row per stage of ``spec`` (pending ones
    too)."""
    by_name = {r.name: r for r in records}
    rows = []
    for stage in spec.stages:
        rec = by_name.get(stage.name) or StageRecord(stage.name, stage.kind, "pending")
        s = rec.summary
        has = "success_rate" in s
        rows.append(
            [
                stage.name,
                stage.kind,
                ", ".join(f"{k}: {v}" for k, v in stage.refs.items()) or "-",
                rec.status,
                f"{s['success_rate']:.4f}" if has else "-",
                f"{s['ci_low']:.3f}-{s['ci_high']:.3f}" if has else "-",
                str(s.get("episodes", "-")),
                f"{rec.seconds:.1f}" if rec.status != "pending" else "-",
            ]
        )
    _write_both(spec.folder / "summary", SUMMARY_COLUMNS, rows)
