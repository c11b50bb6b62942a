"""``credo pipeline``: stage skip and resume, one-line errors before any compute, and the
SpatialCLI pipeline end to end on the built-in model."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from credo.pipeline import (
    PipelineError,
    StageContext,
    StageResult,
    load_pipeline,
    register_stage,
    run_pipeline,
)
from credo.pipeline.cli import main as pipeline_main
from credo.pipeline.spec import changed_settings
from credo.pipeline.trajectories import read_trajectories
from credo.train.config import Config

ROOT = Path(__file__).resolve().parents[1]
SPATIALCLI = ROOT / "pipelines" / "spatialcli.yaml"

# --------------------------------------------------------------- resume (test kinds)
CALLS: dict[str, int] = {"make": 0, "use": 0}
FAIL_USE = {"on": True}
MADE = {"value": "21"}  # what test_make writes


@dataclass
class _UseParams:
    scale: int = 2


@register_stage("test_make", makes=("policy",))
def _make(ctx: StageContext) -> StageResult:
    CALLS["make"] += 1
    (ctx.folder / "weights.txt").write_text(MADE["value"])
    return StageResult({"policy": "weights.txt"}, [("value", 21)])


@register_stage("test_use", needs=("policy",), params=_UseParams)
def _use(ctx: StageContext) -> StageResult:
    CALLS["use"] += 1
    if FAIL_USE["on"]:
        raise KeyboardInterrupt  # killed half-way: no marker is written
    value = int(ctx.inputs["policy"].read_text()) * ctx.params.scale
    return StageResult({}, [("value", value)], {"value": value})


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


TWO_STAGES = """
name: two
recipe: grpo
overrides: {train.threads: 1}
stages:
  - {name: first, kind: test_make}
  - {name: second, kind: test_use, policy: first}
"""


def test_a_finished_stage_is_skipped_on_resume(tmp_path: Path) -> None:
    CALLS.update(make=0, use=0)
    FAIL_USE["on"] = True
    path = _write(tmp_path / "two.yaml", TWO_STAGES)
    spec = load_pipeline(path, [f"runs_dir={tmp_path / 'runs'}"])
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(spec, quiet=True, say=lambda _: None)
    folder = tmp_path / "runs" / "two"
    assert (folder / "first" / "stage.json").exists()
    assert not (folder / "second" / "stage.json").exists()
    assert CALLS == {"make": 1, "use": 1}
    summary = (folder / "summary.csv").read_text().splitlines()
    assert [r.split(",")[3] for r in summary[1:]] == ["ran", "pending"]
    with pytest.raises(
        PipelineError, match="already holds a pipeline run; continue it with --resume"
    ):
        run_pipeline(spec, quiet=True)
    FAIL_USE["on"] = False
    said: list[str] = []
    res = run_pipeline(spec, resume=True, quiet=True, say=said.append)
    assert CALLS == {"make": 1, "use": 2}  # the first stage did not run again
    assert said[0] == "stage first (test_make): finished earlier, skipped"
    assert [s.status for s in res.stages] == ["skipped", "ran"]
    assert res.stage("second").summary == {"value": 42}
    assert (folder / "second" / "table.md").read_text() == (
        "| quantity | value |\n|---|---|\n| value | 42 |\n"
    )
    assert list(csv.reader((folder / "second" / "table.csv").open())) == [
        ["quantity", "value"],
        ["value", "42"],
    ]
    res = run_pipeline(spec, resume=True, quiet=True, say=lambda _: None)  # all done
    assert CALLS == {"make": 1, "use": 2} and [s.status for s in res.stages] == ["skipped"] * 2
    changed = load_pipeline(path, [f"runs_dir={tmp_path / 'runs'}", "train.seed=5"])
    with pytest.raises(PipelineError, match=r"stage 'first' of .* finished with another config"):
        run_pipeline(changed, resume=True, quiet=True)
    with pytest.raises(PipelineError, match="holds no pipeline run to resume"):
        run_pipeline(load_pipeline(path, [f"runs_dir={tmp_path / 'other'}"]), resume=True)


def _two_finished(tmp_path: Path) -> tuple[Path, Path]:
    """TWO_STAGES run to its end; returns the file and the pipeline folder."""
    FAIL_USE["on"] = False
    MADE["value"] = "21"
    path = _write(tmp_path / "two.yaml", TWO_STAGES)
    run_pipeline(load_pipeline(path, [f"runs_dir={tmp_path / 'runs'}"]), quiet=True)
    return path, tmp_path / "runs" / "two"


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("20", "was changed after it was written (its SHA-256 differs)"),
        ("2", "has 1 bytes, 2 were written"),
        (None, "is missing"),
    ],
)
def test_resume_checks_the_content_of_finished_stages_outputs(
    damage: str | None, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 46, item 6: a tampered but valid output was used silently (the held-out
    success of the stage reading it went from 12.5 % to 0 %), a truncated one gave a
    traceback. Each output's size and SHA-256 are recorded in ``stage.json``, and
    ``--resume`` names the file that changed before any stage reads it."""
    path, folder = _two_finished(tmp_path)
    weights = folder / "first" / "weights.txt"
    marker = json.loads((folder / "first" / "stage.json").read_text())
    assert marker["artefacts"] == {
        "weights.txt": {
            "bytes": 2,
            "sha256": "6f4b6612125fb3a0daecd2799dfd6c9c299424fd920f9b308110a2c1fbd8f443",
        }
    }
    (folder / "second" / "stage.json").unlink()  # the second stage will read it again
    if damage is None:
        weights.unlink()
    else:
        weights.write_text(damage)
    code = pipeline_main([str(path), "--resume", f"runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"stage 'first' of {folder} finished, but its output {weights} {problem}" in err
    assert f"delete {folder / 'first'} and resume" in err
    assert not (folder / "second" / "stage.json").exists()


def test_a_damaged_stage_json_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, folder = _two_finished(tmp_path)
    marker = folder / "first" / "stage.json"
    marker.write_text(marker.read_text()[:40])
    code = pipeline_main([str(path), "--resume", f"runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"error: {marker} is damaged (not the JSON record of a finished stage); delete "
        f"{folder / 'first'} and resume to run that stage again\n"
    )


def test_a_stage_whose_input_was_made_again_differently_runs_again(tmp_path: Path) -> None:
    path, folder = _two_finished(tmp_path)
    spec = load_pipeline(path, [f"runs_dir={tmp_path / 'runs'}"])
    (folder / "first" / "stage.json").unlink()  # killed: the first stage runs again ...
    MADE["value"] = "22"  # ... and makes other content
    said: list[str] = []
    res = run_pipeline(spec, resume=True, quiet=True, say=said.append)
    assert [s.status for s in res.stages] == ["ran", "ran"]
    assert "stage second (test_use): its policy changed since it finished; running it again" in said
    assert res.stage("second").summary == {"value": 44}
    MADE["value"] = "21"
    (folder / "first" / "stage.json").unlink()  # made again, the same content as recorded
    res = run_pipeline(spec, resume=True, quiet=True, say=lambda _: None)
    assert [s.status for s in res.stages] == ["ran", "ran"]  # 21 ≠ the 22 second read
    (folder / "first" / "stage.json").unlink()
    res = run_pipeline(spec, resume=True, quiet=True, say=lambda _: None)
    assert [s.status for s in res.stages] == ["ran", "skipped"]  # same content: kept


def test_digests_hash_the_settings_away_from_the_defaults() -> None:
    default = {"a": 1, "b": {"c": 2, "d": None}, "e": [1]}
    value = {"a": 1, "b": {"c": 3, "d": None}, "e": [1], "new": 5}
    assert changed_settings(value, default) == {"b": {"c": 3}, "new": 5}
    assert changed_settings({"b": {"c": 2, "d": {"x": 1}}}, default) == {"b": {"d": {"x": 1}}}
    assert changed_settings([1], default) == [1] and changed_settings(value, None) == value


def test_a_field_added_at_its_default_keeps_finished_stages_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later credo that adds a config field at its default
    must not invalidate every finished stage: ``--resume`` would refuse them all."""
    path = _write(tmp_path / "two.yaml", TWO_STAGES)
    over = [f"runs_dir={tmp_path / 'runs'}"]
    before = [s.digest for s in load_pipeline(path, over).stages]
    plain = Config.to_dict
    monkeypatch.setattr(Config, "to_dict", lambda self: {**plain(self), "later": {"knob": 1}})
    assert [s.digest for s in load_pipeline(path, over).stages] == before
    # a setting away from its default still changes the digest, and the later stage's
    changed = [s.digest for s in load_pipeline(path, [*over, "train.seed=5"]).stages]
    assert changed[0] != before[0] and changed[1] != before[1]
    assert (
        load_pipeline(path, [*over, "stages.second.params.scale=3"]).stages[1].digest != before[1]
    )


# ------------------------------------------------------------------- bad input
BAD = {
    "unknown_kind": (
        "stages:\n  - {name: a, kind: sftt}\n",
        "stage 'a': unknown stage kind 'sftt'. Did you mean 'sft'?",
    ),
    "missing_reference": (
        "stages:\n  - {name: a, kind: sft}\n  - {name: b, kind: eval, policy: c}\n",
        "stage 'b': policy: 'c' is not an earlier stage (earlier stages: a)",
    ),
    "needs_reference": (
        "stages:\n  - {name: a, kind: eval}\n",
        "stage 'a': a eval stage needs policy: STAGE",
    ),
    "no_trajectories": (
        "stages:\n  - {name: a, kind: rl}\n"
        "  - {name: b, kind: internalise, policy: a, trajectories: a}\n",
        "stage 'b': trajectories: stage 'a' (rl) makes no trajectories",
    ),
    "bad_param": (
        "stages:\n  - {name: a, kind: sft}\n  - {name: b, kind: eval, policy: a, params: {epsiodes: 3}}\n",
        "unknown param(s) 'epsiodes'; a eval stage accepts: episodes, greedy, trials, ks",
    ),
    "bad_config": (
        "stages:\n  - {name: a, kind: sft, overrides: {optim.lr: -1}}\n",
        "stage 'a': optim.lr",
    ),
    "bad_env_kwarg": (
        "stages:\n  - {name: a, kind: sft, overrides: {env.kwargs.tools: maybe}}\n",
        "stage 'a': env: shop tools must be on or off (true/false), got 'maybe'",
    ),
    "bad_yaml": ("stages: [\n  - {name: a\n", "pipeline "),
    "unknown_key": ("stage:\n  - {name: a, kind: sft}\n", "unknown key(s) 'stage'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_before_compute(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, expected = BAD[case]
    path = _write(tmp_path / "p.yaml", text)
    assert pipeline_main([str(path), f"runs_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err, err
    assert not (tmp_path / "runs").exists()  # nothing was started


@pytest.mark.slow
def test_bad_input_through_the_credo_command(tmp_path: Path) -> None:
    """The real command, in a subprocess (one: each costs an interpreter start): an
    override naming no stage. Missing files are refused in-process below."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CREDO_CACHE": str(tmp_path / "c")}
    bad = _write(tmp_path / "p.yaml", BAD["unknown_kind"][0])
    for args, expected in (
        ([str(bad), "stages.zz.train.seed=3"], "stages.NAME.key=value names a stage of"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "credo.cli", "pipeline", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
        assert proc.stdout == ""


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert pipeline_main([str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"error: pipeline file {tmp_path / 'nope.yaml'} does not exist (give a .yaml pipeline file)\n"
    )


# ------------------------------------------------------------------ end to end
#: Any shipped pipeline shrunk to a test: a small model and warm start, one RL iteration.
TINY_STAGES = [
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 4, intermediate_size: 64}",
    "sft.episodes=100",
    "sft.steps=40",
    "sft.noisy_episodes=20",
    "sft.noisy_steps=5",
    "rollout.tasks_per_iter=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "train.iterations=1",
    "eval.episodes=6",
]

#: spatialcli.yaml shrunk to a test.
SMALL = [
    *TINY_STAGES,
    "env.kwargs.difficulty=easy",
    "stages.rl_tools.params.trajectories=3",
    "stages.internalise.params.steps=3",
    "stages.internalise.params.batch_size=4",
    "stages.internalise.params.success_only=false",
]


@pytest.mark.slow
def test_spatialcli_end_to_end(tmp_path: Path) -> None:
    spec = load_pipeline(SPATIALCLI, [*SMALL, f"runs_dir={tmp_path}"])
    assert [(s.name, s.kind) for s in spec.stages] == [
        ("sft_tools", "sft"),
        ("rl_tools", "rl"),
        ("eval_rl_tools_on", "eval"),
        ("eval_rl_tools_off", "eval"),
        ("internalise", "internalise"),
        ("eval_tools_off", "eval"),
    ]
    tools = {s.name: s.cfg.env.kwargs["tools"] for s in spec.stages}
    assert tools == {
        "sft_tools": True,
        "rl_tools": True,
        "eval_rl_tools_on": True,
        "eval_rl_tools_off": False,
        "internalise": True,
        "eval_tools_off": False,
    }
    assert spec.stage("rl_tools").cfg.sft.enabled is False  # it starts from sft_tools
    res = run_pipeline(spec, quiet=True, say=lambda _: None)
    folder = tmp_path / "spatialcli"
    assert all(s.status == "ran" for s in res.stages)
    assert (folder / "sft_tools" / "policy" / "config.json").exists()
    assert (folder / "rl_tools" / "run" / "final_policy" / "config.json").exists()
    assert (folder / "internalise" / "policy" / "config.json").exists()

    def table(stage: str) -> dict[str, str]:
        rows = list(csv.reader((folder / stage / "table.csv").open()))
        assert rows[0] == ["quantity", "value"]
        return dict(rows[1:])

    # trajectories: 3 tasks x group 2, and the rl table counts them
    episodes = read_trajectories(folder / "rl_tools" / "trajectories.jsonl")
    assert len(episodes) == 6
    rl = table("rl_tools")
    assert rl["RL iterations"] == "1" and rl["trajectories written"] == "6"
    assert rl["successful trajectories"] == str(sum(e.success for e in episodes))
    final = json.loads((folder / "rl_tools" / "run" / "final_eval.json").read_text())
    assert float(rl["trained success rate"]) == pytest.approx(final["success_rate"], abs=1e-4)
    # internalise: every trajectory used (success_only=false), the lookups removed
    lookups = sum(s.action.strip() == "lookup" for e in episodes for s in e.steps)
    kept = sum(len(e.steps) for e in episodes) - lookups
    inner = table("internalise")
    assert inner["trajectories used"] == "6" and inner["tool calls removed"] == str(lookups)
    assert inner["SFT rows (steps kept)"] == str(kept) and inner["SFT steps"] == "3"
    rewritten = read_trajectories(folder / "internalise" / "internalised.jsonl")
    assert sum(len(e.steps) for e in rewritten) == kept
    assert not any(s.action.strip() == "lookup" for e in rewritten for s in e.steps)
    # the answers the lookups gave are stated by the agent on the step after them
    stated = [s.texts["note"] for e in rewritten for s in e.steps if "note" in s.texts]
    answered = sum(
        1
        for e in episodes
        for t, s in enumerate(e.steps[1:], 1)
        if s.action.strip() != "lookup" and e.steps[t - 1].action.strip() == "lookup"
    )
    assert inner["answers stated by the agent"] == str(len(stated)) == str(answered)
    assert all(n.startswith("lookup : ") and n.endswith("fits .") for n in stated)
    assert spec.stage("eval_tools_off").cfg.rollout.notes is True
    # every eval stage: its table and the summary agree with its eval.json
    summary = {r["stage"]: r for r in csv.DictReader((folder / "summary.csv").open())}
    assert list(summary) == [s.name for s in spec.stages]
    for stage in ("sft_tools", "eval_rl_tools_on", "eval_rl_tools_off", "eval_tools_off"):
        ev = json.loads((folder / stage / "eval.json").read_text())
        assert ev["episodes"] == 6
        assert float(table(stage)["held-out success rate"]) == pytest.approx(ev["success_rate"])
        assert float(summary[stage]["held-out success"]) == pytest.approx(ev["success_rate"])
        assert summary[stage]["episodes"] == "6" and summary[stage]["status"] == "ran"
    assert (folder / "summary.md").read_text().startswith("| stage | kind | reads | status |")
    # resume after a kill during the last stage: only that stage runs again
    (folder / "eval_tools_off" / "stage.json").unlink()
    again = run_pipeline(
        load_pipeline(SPATIALCLI, [*SMALL, f"runs_dir={tmp_path}"]),
        resume=True,
        quiet=True,
        say=lambda _: None,
    )
    assert [s.status for s in again.stages] == ["skipped"] * 5 + ["ran"]
    assert again.stage("eval_tools_off").summary["success_rate"] == pytest.approx(
        res.stage("eval_tools_off").summary["success_rate"]
    )
    # a kill during the RL stage's final evaluation: resuming continues its training run
    # (train's own resume: no iteration is redone) and marks it finished
    (folder / "rl_tools" / "stage.json").unlink()
    (folder / "rl_tools" / "run" / "final_eval.json").unlink()
    again = run_pipeline(spec, resume=True, quiet=True, say=lambda _: None)
    assert [s.status for s in again.stages] == ["skipped", "ran", *["skipped"] * 4]
    rl = table("rl_tools")
    assert rl["continued an unfinished run"] == "True" and rl["RL iterations"] == "1"
    assert len((folder / "rl_tools" / "run" / "metrics.jsonl").read_text().splitlines()) == 1
    assert (folder / "rl_tools" / "run" / "final_eval.json").exists()
