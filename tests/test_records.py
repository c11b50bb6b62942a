"""Run records (:mod:`credo.commands.records`): a study continues in another session, on
another machine, from the records of the runs it finished, and retrains a run whose
recorded config is not the config it would run with now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import credo.commands.compare as compare_mod
import credo.commands.records as records_mod
from credo.commands.compare import Arm, compare
from credo.commands.records import (
    RECORD_FILES,
    cpu_name,
    record_commits,
    record_cpus,
    record_problem,
    record_warm_start,
)
from credo.commands.study import load_study, run_study
from credo.train.config import ConfigError, load_config
from small_run import SMALL

COMMON = [*SMALL, "eval.episodes=8", "train.iterations=1"]
ARMS = [Arm("one", "grpo", ("optim.minibatches=1",)), Arm("two", "grpo", ("optim.minibatches=2",))]


def test_a_comparison_reads_recorded_runs_instead_of_training_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = tmp_path / "records"
    first = compare(ARMS, [0], overrides=COMMON, out_dir=tmp_path / "a", records=records)
    for name in ("one-seed0", "two-seed0"):
        for f in (*RECORD_FILES, "record.json"):
            assert (records / name / f).is_file()
        run = tmp_path / "a" / name
        for f in RECORD_FILES:  # the record is the run's own files
            assert (records / name / f).read_bytes() == (run / f).read_bytes()
        info = json.loads((records / name / "record.json").read_text())
        assert info["commit"] and info["recorded"].endswith("UTC")
        assert info["cpu"] == cpu_name()
    # another session: no run folders, only the records; nothing may train
    monkeypatch.setattr(compare_mod, "train", lambda *a, **k: pytest.fail("trained again"))
    again = compare(ARMS, [0], overrides=COMMON, out_dir=tmp_path / "b", records=records)
    assert [s.final for s in again] == [s.final for s in first]
    assert [s.warm for s in again] == [s.warm for s in first]
    assert [s.curves for s in again] == [s.curves for s in first]
    assert not (tmp_path / "b" / "one-seed0").exists()
    assert (tmp_path / "b" / "compare.md").read_text() == (
        tmp_path / "a" / "compare.md"
    ).read_text()


def test_a_record_of_another_config_is_not_used(tmp_path: Path) -> None:
    records = tmp_path / "records"
    arm = [Arm("one", "grpo", ("optim.minibatches=1",))]
    compare(arm, [0], overrides=COMMON, out_dir=tmp_path / "a", records=records)
    changed = load_config("grpo", [*COMMON, "optim.minibatches=1", "optim.lr=1e-4"])
    assert record_problem(records / "one-seed0", changed) == (
        f"optim.lr is 0.0001 now, 0.0005 in {records / 'one-seed0'}"
    )
    # where the run folder is does not matter
    moved = load_config(
        "grpo", [*COMMON, "optim.minibatches=1", "train.runs_dir=/elsewhere", "train.name=x"]
    )
    assert record_problem(records / "one-seed0", moved) is None
    # retrained with the new config, and re-recorded
    stamp = (records / "one-seed0" / "record.json").stat().st_mtime_ns
    compare(arm, [0], overrides=[*COMMON, "optim.lr=1e-4"], out_dir=tmp_path / "b", records=records)
    assert (tmp_path / "b" / "one-seed0" / "final_eval.json").exists()
    assert record_problem(records / "one-seed0", changed) is None
    assert (records / "one-seed0" / "record.json").stat().st_mtime_ns != stamp


def test_a_run_folder_of_another_config_is_neither_read_nor_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study whose overrides changed, run again into the same folder, found the old
    runs there: a finished one was read as the new arm's result and a stopped one was
    resumed with its old config. Now the comparison names the folder and the key, and
    trains nothing."""
    arm = [Arm("one", "grpo", ("optim.minibatches=1",))]
    out = tmp_path / "a"
    compare(arm, [0], overrides=COMMON, out_dir=out)
    monkeypatch.setattr(compare_mod, "train", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr(compare_mod, "_run_parallel", lambda *a, **k: pytest.fail("trained"))
    expected = (
        f"run folder {out / 'one-seed0'} holds a run of another config "
        f"(optim.lr is 0.0001 now, 0.0005 in {out / 'one-seed0'}); "
        "move it away or pass another output folder, then run again"
    )
    for jobs in (1, 2):
        with pytest.raises(ConfigError) as err:
            compare(arm, [0], overrides=[*COMMON, "optim.lr=1e-4"], out_dir=out, jobs=jobs)
        assert str(err.value) == expected
    # stopped before its end (no final evaluation): not resumed either
    (out / "one-seed0" / "final_eval.json").unlink()
    with pytest.raises(ConfigError, match="holds a run of another config"):
        compare(arm, [0], overrides=[*COMMON, "optim.lr=1e-4"], out_dir=out)
    # the same config still resumes (here: finishes the run's last artefact)
    monkeypatch.undo()
    again = compare(arm, [0], overrides=COMMON, out_dir=out)
    assert (out / "one-seed0" / "final_eval.json").is_file()
    assert len(again[0].final) == 1


def test_an_incomplete_record_is_named(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("{}")
    cfg = load_config("grpo", COMMON)
    assert record_problem(tmp_path / "r", cfg) == (
        f"{tmp_path / 'r'} lacks warmstart.json, final_eval.json, metrics.jsonl, record.json"
    )


def test_record_commits_oldest_first(tmp_path: Path) -> None:
    for name, commit, when in (("b", "222", "2026-12-05 10:00 UTC"), ("a", "111", "2026-12-04 09:00 UTC"), ("c", "222", "2026-12-06 10:00 UTC")):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(
            json.dumps({"commit": commit, "recorded": when})
        )
    assert record_commits(tmp_path) == ["111", "222"]


def test_a_study_page_names_its_records(tmp_path: Path) -> None:
    path = tmp_path / "studies" / "tiny.yaml"
    path.parent.mkdir()
    path.write_text(
        yaml.safe_dump(
            {
                "title": "two schedules",
                "claim": "more steps per batch learn more",
                "overrides": COMMON,
                "seeds": [0],
                "reference": "one",
                "arms": [{"name": a.name, "recipe": a.recipe, "overrides": list(a.overrides)} for a in ARMS],
            }
        )
    )  # fmt: skip
    study = load_study(path)
    records = path.parent / "records"
    run_study(study, out_root=tmp_path / "runs", docs=tmp_path / "docs", records=records)
    assert sorted(p.name for p in (records / "tiny").iterdir()) == [
        "one-seed0",
        "two-seed0",
        "warmstarts",
    ]
    page = (tmp_path / "docs" / "tiny.md").read_text()
    (commit,) = record_commits(records / "tiny")
    assert (
        "Run records (each run's config, evaluations and metrics): "
        "[`studies/records/tiny/`](../../studies/records/tiny/), "
        f"trained at credo `{commit[:12]}` on {cpu_name()}." in page
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_a_seeds_warm_start_is_kept_and_trains_the_next_session_s_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run trained in a later session (here: another cache, on this CPU) starts from the
    warm start its seed's recorded runs started from, loaded from the records, not
    retrained (which on another CPU gives other weights)."""
    from credo.train.warmstart import warm_start_folder

    records = tmp_path / "records"
    compare(ARMS[:1], [0], overrides=COMMON, out_dir=tmp_path / "a", records=records)
    key = json.loads((tmp_path / "a" / "one-seed0" / "warmstart.json").read_text())["key"]
    kept = records / "warmstarts" / key
    assert _files(kept) == _files(warm_start_folder(key))  # weights and held-out evaluation
    assert "policy/model.safetensors" in _files(kept)
    # the next session: an empty cache; run "one" is recorded, run "two" trains from the kept
    # warm start (SFT would fail)
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path / "fresh-cache"))
    monkeypatch.setattr(
        "credo.train.warmstart.sft_train", lambda *a, **k: pytest.fail("warm start retrained")
    )
    compare(ARMS, [0], overrides=COMMON, out_dir=tmp_path / "b", records=records)
    two = json.loads((tmp_path / "b" / "two-seed0" / "warmstart.json").read_text())
    one = json.loads((records / "one-seed0" / "warmstart.json").read_text())
    assert two["key"] == key and two["cached"] is True
    assert two["eval"]["success_rate"] == one["eval"]["success_rate"]
    assert _files(warm_start_folder(key)) == _files(kept)
    assert record_cpus(records) == [cpu_name()]


def test_a_large_warm_start_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from credo.train.warmstart import warm_start_folder

    compare(ARMS[:1], [0], overrides=COMMON, out_dir=tmp_path / "a")
    key = json.loads((tmp_path / "a" / "one-seed0" / "warmstart.json").read_text())["key"]
    assert (warm_start_folder(key) / "warmstart.json").is_file()
    monkeypatch.setattr(records_mod, "MAX_WARM_START_MB", 0.001)  # an LLM's, say
    assert record_warm_start(key, tmp_path / "records") is False
    assert not (tmp_path / "records" / "warmstarts").exists()
    assert record_warm_start("no-such-key", tmp_path / "records") is False
    monkeypatch.setattr(records_mod, "MAX_WARM_START_MB", 32)
    assert record_warm_start(key, tmp_path / "records") is True
