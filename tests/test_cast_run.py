"""CAST end to end on the built-in model and ``shop``: the label stage on warm-start
rollouts, the critic stage, RL iterations with online verification (``critic.path``), and
the critique-enriched SFT stage; and penalise vs log on the same rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from credo.commands.cast import critic_stage, critique_sft_stage, label_stage
from credo.critics import CLASSES, load_labels
from credo.train.config import load_config
from credo.train.loop import train

torch.set_num_threads(1)

SHOP = [
    "env.kwargs={difficulty: easy}",
    "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128}",
    "sft.episodes=200",
    "sft.steps=40",
    "sft.noisy_episodes=100",
    "sft.noisy_steps=10",
    "rollout.max_new_tokens=8",
    "rollout.tasks_per_iter=2",
    "rollout.group_size=2",
    "eval.episodes=4",
    "train.threads=1",
]


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("cast")
    cfg = load_config("grpo", SHOP)
    lab = label_stage(cfg, root / "label", tasks=8, seed=0)
    crit = critic_stage(
        cfg, root / "critic", labels=root / "label" / "labels.jsonl", steps=20, holdout=0.25
    )
    return {"root": root, "label": lab, "critic": crit}


@pytest.mark.slow
def test_label_and_critic_stages(stages: dict) -> None:
    root, lab, crit = stages["root"], stages["label"], stages["critic"]
    labels = load_labels(root / "label" / "labels.jsonl")
    assert lab["label/steps"] == len(labels) > 0
    assert sum(lab[f"label/n_{c}"] for c in CLASSES) == len(labels)
    assert lab["label/errors"] == sum(not x.ok for x in labels)
    assert json.loads((root / "label" / "label_metrics.json").read_text()) == lab
    for k in ("precision", "recall", "false_alarm", "accuracy"):
        assert 0.0 <= crit[f"critic/{k}"] <= 1.0 and 0.0 <= crit[f"critic/{k}_before"] <= 1.0
    assert crit["critic/train_steps"] + crit["critic/heldout_steps"] == len(labels)
    assert (root / "critic" / "critic" / "critic.safetensors").is_file()


@pytest.mark.slow
def test_rl_with_the_critic_and_critique_sft(stages: dict, tmp_path: Path) -> None:
    critic = stages["root"] / "critic" / "critic"
    over = [
        *SHOP,
        f"critic.path={critic}",
        "critic.on_flag=resample",
        "critic.threshold=0.0",  # every draw is flagged: each action is re-drawn twice
        "train.iterations=1",
        f"train.runs_dir={tmp_path}",
        "train.name=cast",
    ]
    res = train(load_config("grpo", over), quiet=True)
    (m,) = res.metrics
    steps = m["rollout/env_steps"]
    assert m["critic/flagged_steps"] == steps and m["critic/flag_rate"] == 1.0
    assert m["critic/resamples"] == 2 * steps and m["critic/flags"] == 3 * steps
    policy = res.run_dir / "final_policy"
    out = critique_sft_stage(
        load_config("grpo", SHOP),
        tmp_path / "sft",
        labels=stages["root"] / "label" / "labels.jsonl",
        policy=policy,
        steps=5,
        eval_episodes=2,
        trials=2,
        ks=(2,),
    )
    assert out["sft/rows"] == out["sft/behaviour_rows"] + out["sft/correction_rows"] > 0
    assert 0.0 <= out["eval/pass^2"] <= out["eval/success_rate"] + 1e-9  # pass^k ≤ pass^1
    assert (tmp_path / "sft" / "policy" / "config.json").is_file()


@pytest.mark.slow
def test_penalise_costs_exactly_the_penalty(stages: dict, tmp_path: Path) -> None:
    critic = stages["root"] / "critic" / "critic"
    runs = {}
    for mode in ("log", "penalise"):
        over = [
            *SHOP,
            f"critic.path={critic}",
            f"critic.on_flag={mode}",
            "critic.threshold=0.0",
            "critic.penalty=0.25",
            "train.iterations=1",
            f"train.runs_dir={tmp_path}",
            f"train.name={mode}",
        ]
        (runs[mode],) = train(load_config("grpo", over), quiet=True).metrics
    log, pen = runs["log"], runs["penalise"]
    assert log["rollout/env_steps"] == pen["rollout/env_steps"]  # the same rollouts
    # every step is flagged, so each episode loses 0.25 per step
    drop = 0.25 * log["rollout/episode_len"]
    assert log["rollout/return_mean"] - pen["rollout/return_mean"] == pytest.approx(drop)
