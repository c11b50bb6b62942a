"""A full disk or a read-only folder ends in one line, not a traceback (issue 46, item 5).

Nothing was lost before either (every file is written by temp-and-rename, and a resume
after freeing space was exact), but the user got a traceback instead of which file, why,
and what to do. The real kernel errors (``RLIMIT_FSIZE``: ``EFBIG``) are exercised in
the slow hostile-input suite (``tests/test_hostile_inputs.py``).
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from credo.cli import main
from credo.utils.storage import StorageError, storage_problem
from small_run import TINY_RUN

TINY = [*TINY_RUN, "train.iterations=2"]


class SafetensorLike(Exception):
    """What safetensors (Rust) raises: the OS error only in its message."""


def test_refused_writes_are_recognised_and_others_are_not() -> None:
    full = OSError(errno.ENOSPC, "No space left on device", "runs/r/metrics.jsonl")
    assert storage_problem(full) == (
        errno.ENOSPC,
        "runs/r/metrics.jsonl: no space left on the device (No space left on device)",
    )
    rust = SafetensorLike("Error while serializing: I/O error: File too large (os error 27)")
    assert storage_problem(rust) == (
        errno.EFBIG,
        "the file is larger than this process may write (File too large)",
    )
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", "/ro/x")
        except OSError as inner:
            raise RuntimeError("while saving") from inner
    except RuntimeError as outer:
        assert storage_problem(outer) == (
            errno.EROFS,
            "/ro/x: the file system is read-only (Read-only file system)",
        )
    assert storage_problem(FileNotFoundError(errno.ENOENT, "No such file", "x")) is None
    assert storage_problem(ValueError("os error 28 without the parentheses")) is None
    made = StorageError("the line", errno.ENOSPC)
    made.__cause__ = full
    assert storage_problem(made)[1].startswith("runs/r/metrics.jsonl: no space left")


def test_a_read_only_runs_folder_is_one_line_before_any_compute(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch, capsys
) -> None:
    from credo.train import loop

    def read_only(run_dir: Path, progress: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system", str(run_dir))

    monkeypatch.setattr(loop, "_new_run_dir", read_only)
    code = main(["train", *TINY, f"train.runs_dir={tmp_path}", "train.name=r", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"error: {tmp_path / 'r'}: the file system is read-only (Read-only file system); "
        f"make {tmp_path / 'r'} writable (or set train.runs_dir to a writable folder) and "
        "start again\n"
    )


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_run_resumes(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch, capsys
) -> None:
    from credo.train import checkpoint

    real = checkpoint.save_file

    def full(tensors: Any, path: str) -> None:
        if "step_2" in path:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real(tensors, path)

    monkeypatch.setattr(checkpoint, "save_file", full)
    run = tmp_path / "r"
    code = main(["train", *TINY, f"train.runs_dir={tmp_path}", "train.name=r", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {run / 'checkpoints'}/.step_2.")
    assert err.endswith(
        f": no space left on the device (No space left on device); {run} keeps the run up to "
        f"step_1; free some space and continue with: credo train --resume {run}\n"
    )
    monkeypatch.setattr(checkpoint, "save_file", real)  # space freed
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert (run / "final_eval.json").exists() and (run / "checkpoints" / "step_2").is_dir()


def test_a_full_disk_in_a_pipeline_stage_is_one_line_with_the_resume(  # type: ignore[no-untyped-def]
    tmp_path, capsys
) -> None:
    from credo.pipeline import StageContext, StageResult, register_stage
    from credo.pipeline.cli import main as pipeline_main

    @register_stage("test_disk_full", makes=("policy",))
    def _full(ctx: StageContext) -> StageResult:
        raise OSError(errno.ENOSPC, "No space left on device", str(ctx.folder / "w.bin"))

    path = tmp_path / "p.yaml"
    path.write_text("name: p\nstages:\n  - {name: only, kind: test_disk_full}\n")
    runs = tmp_path / "runs"
    assert pipeline_main([str(path), f"runs_dir={runs}"]) == 2
    assert capsys.readouterr().err == (
        f"error: {runs / 'p' / 'only' / 'w.bin'}: no space left on the device (No space left "
        f"on device); finished stages are kept: free some space and continue with: credo "
        f"pipeline {path} --resume runs_dir={runs}\n"
    )
