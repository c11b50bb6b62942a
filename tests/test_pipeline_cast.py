"""``pipelines/cast.yaml`` end to end on the built-in model: label → critic → RL with the
critic verifying every action → critique SFT → pass^k, each stage's numbers in its
table and the summary."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from credo.pipeline import load_pipeline, run_pipeline
from test_pipeline import TINY_STAGES

ROOT = Path(__file__).resolve().parents[1]
CAST = ROOT / "pipelines" / "cast.yaml"

#: cast.yaml shrunk to a test: a small model and warm start, one RL iteration.
SMALL = [
    *TINY_STAGES,
    "stages.label.params.tasks=6",
    "stages.critic.params.steps=5",
    "stages.critic.params.batch_size=8",
    "stages.critique_sft.params.steps=3",
    "stages.critique_sft.params.episodes=4",
    "stages.eval_rl.params.episodes=3",
    "stages.eval.params.episodes=3",
    "stages.eval_verified.params.episodes=3",
]


def _table(folder: Path) -> dict[str, str]:
    rows = list(csv.reader((folder / "table.csv").open()))
    assert rows[0] == ["quantity", "value"]
    return dict(rows[1:])


@pytest.mark.slow
def test_cast_pipeline_end_to_end(tmp_path: Path) -> None:
    spec = load_pipeline(CAST, [*SMALL, f"runs_dir={tmp_path}"])
    assert [(s.name, s.kind) for s in spec.stages] == [
        ("sft", "sft"),
        ("label", "label"),
        ("critic", "critic"),
        ("rl", "rl"),
        ("critique_sft", "critique_sft"),
        ("eval_rl", "eval"),
        ("eval", "eval"),
        ("eval_verified", "eval"),
    ]
    assert spec.stage("rl").refs == {"policy": "sft", "critic": "critic"}
    assert spec.stage("eval_verified").refs == {"policy": "critique_sft", "critic": "critic"}
    res = run_pipeline(spec, quiet=True, say=lambda _: None)
    assert all(s.status == "ran" for s in res.stages)
    folder = tmp_path / "cast"
    # label: 6 tasks × 2 episodes, every step labelled once
    labels = [json.loads(x) for x in (folder / "label" / "labels.jsonl").read_text().splitlines()]
    trajectories = (folder / "label" / "trajectories.jsonl").read_text().splitlines()
    assert len(trajectories) == 12
    label = _table(folder / "label")
    assert float(label["label/steps"]) == len(labels)
    # critic: saved, measured before and after on held-out steps
    assert (folder / "critic" / "critic" / "critic.json").exists()
    critic = _table(folder / "critic")
    assert float(critic["critic/false_alarm_before"]) >= 0.0
    # rl: trained with the critic's folder as critic.path and its flags counted
    run = folder / "rl" / "run"
    assert (run / "final_policy" / "config.json").exists()
    cfg = (run / "config.yaml").read_text()
    assert str(folder / "critic" / "critic") in cfg and "resample" in cfg
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "critic/flags" in metrics[0]
    # critique_sft: a new policy; eval: pass^k for k = 1, 2, 4 from 4 trials per task
    assert (folder / "critique_sft" / "policy" / "config.json").exists()
    ev = json.loads((folder / "eval" / "eval.json").read_text())
    assert ev["trials"] == 4 and set(ev["pass_hat_k"]) == {"1", "2", "4"}
    assert ev["pass_hat_k"]["4"] <= ev["pass_hat_k"]["2"] <= ev["pass_hat_k"]["1"]
    # eval_verified: the same policy acting under the critic, its flags counted
    verified = _table(folder / "eval_verified")
    assert int(verified["critic flags"]) >= int(verified["critic resamples"]) >= 0
    assert json.loads((folder / "eval_verified" / "eval.json").read_text())["trials"] == 4
    summary = (folder / "summary.md").read_text()
    assert all(name in summary for name in ("label", "critic", "critique_sft", "eval_rl"))


def test_cast_controls_is_cast_plus_its_controls(tmp_path: Path) -> None:
    """``pipelines/cast_controls.yaml`` (the file docs/cast.md's table ran) has every stage
    of cast.yaml, with the same digests, and the controls reading the same inputs."""
    cast = load_pipeline(CAST, [f"runs_dir={tmp_path}"])
    controls = load_pipeline(CAST.with_name("cast_controls.yaml"), [f"runs_dir={tmp_path}"])
    assert [s.digest for s in controls.stages[: len(cast.stages)]] == [
        s.digest for s in cast.stages
    ]
    extra = {s.name: s for s in controls.stages[len(cast.stages) :]}
    assert extra["eval_rl_verified"].refs == {"policy": "rl", "critic": "critic"}
    assert extra["fixes_sft"].params.critique_text is False
    assert extra["rft_sft"].params.corrections_from == "none"
    assert extra["fixes_sft"].refs == extra["rft_sft"].refs == {"labels": "label", "policy": "rl"}
    # critique SFT from the RL policy's own rollouts labelled, at the same budget
    assert extra["label_rl"].refs == {"policy": "rl"}
    assert extra["critique_sft_rl_labels"].refs == {"labels": "label_rl", "policy": "rl"}
    main = {s.name: s for s in cast.stages}
    assert extra["critique_sft_rl_labels"].params == main["critique_sft"].params
    assert extra["eval_rl_labels"].refs == {"policy": "critique_sft_rl_labels"}
