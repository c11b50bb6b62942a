"""End to end: warm start, RL, checkpoints, exact resume, Ctrl-C, and learning."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from credo.train import iteration as iteration_module
from credo.train.config import load_config
from credo.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GUESS = [
    "env.name=examples.custom_env:GuessEnv",
    "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128}",
    "sft.episodes=1000",
    "sft.steps=300",
    "sft.noisy_episodes=500",
    "sft.noisy_steps=60",
    "sft.epsilon=0.5",
    "rollout.tasks_per_iter=8",
    "rollout.max_new_tokens=6",
    "optim.lr=5e-4",
]
VOLATILE = ("time/", "perf/")


def _stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in records]


@pytest.mark.slow
def test_rl_improves_held_out_success(tmp_path: Path) -> None:
    """The built-in model, warm-started on noisy demos, gets better with GRPO."""
    cfg = load_config(
        "grpo",
        [
            *GUESS,
            "eval.episodes=300",
            "train.iterations=20",
            f"train.runs_dir={tmp_path}",
            "train.name=learn",
        ],
    )
    res = train(cfg, quiet=True)
    assert res.warm is not None and res.final is not None
    # measured here: 63.0 % → 82.3 % (300 held-out episodes each)
    assert res.final.success_rate >= res.warm.success_rate + 0.10
    run = tmp_path / "learn"
    for name in ("config.yaml", "metrics.jsonl", "curves.png", "warmstart.json", "final_eval.json"):
        assert (run / name).exists(), name
    assert any((run / "tensorboard").iterdir())
    assert (run / "checkpoints" / "step_20" / "policy" / "model.safetensors").exists()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == list(range(20))
    assert records[-1]["rollout/env_steps_total"] == sum(r["rollout/env_steps"] for r in records)


def _small(tmp_path: Path, name: str, iterations: int) -> list[str]:
    return [
        *GUESS,
        "sft.steps=20",
        "sft.noisy_steps=5",
        "eval.episodes=16",
        "rollout.tasks_per_iter=3",
        "rollout.group_size=4",
        "train.checkpoint_every=2",
        f"train.iterations={iterations}",
        f"train.runs_dir={tmp_path}",
        f"train.name={name}",
    ]


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path: Path) -> None:
    full = train(load_config("grpo", _small(tmp_path, "full", 5)), quiet=True)
    part = train(load_config("grpo", _small(tmp_path, "part", 2)), quiet=True)
    assert part.iterations == 2
    resumed = train(
        load_config("grpo", _small(tmp_path, "part", 5)), resume=part.run_dir, quiet=True
    )
    assert _stable(resumed.metrics) == _stable(full.metrics)
    assert resumed.final.success_rate == full.final.success_rate


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_resume_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = train(load_config("grpo", _small(tmp_path, "full", 5)), quiet=True)
    real_update = iteration_module.policy_update

    def interrupting_update(ctx, batch, *, iteration, generator, oracle=None):  # type: ignore[no-untyped-def]
        if iteration == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C mid-iteration
        return real_update(ctx, batch, iteration=iteration, generator=generator, oracle=oracle)

    monkeypatch.setattr(iteration_module, "policy_update", interrupting_update)
    stopped = train(load_config("grpo", _small(tmp_path, "stopped", 5)), quiet=True)
    assert stopped.interrupted and stopped.final is None
    assert stopped.iterations == 3  # iteration 2 was finished, then a checkpoint written
    assert (stopped.run_dir / "checkpoints" / "step_3").exists()
    monkeypatch.setattr(iteration_module, "policy_update", real_update)
    resumed = train(
        load_config("grpo", _small(tmp_path, "stopped", 5)), resume=stopped.run_dir, quiet=True
    )
    assert _stable(resumed.metrics) == _stable(full.metrics)


def test_an_existing_run_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "metrics.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="--resume"):
        train(load_config("grpo", _small(tmp_path, "taken", 1)), quiet=True)


def test_kl_to_the_reference_as_loss_and_as_reward_penalty(tmp_path: Path) -> None:
    cfg = load_config(
        "grpo",
        [*_small(tmp_path, "kl", 2), "objective.kl_coef=0.1", "objective.kl_reward_coef=0.1"],
    )
    res = train(cfg, quiet=True)
    assert (res.run_dir / "reference" / "model.safetensors").exists()
    assert all("loss/kl" in r for r in res.metrics)
    assert res.metrics[0]["loss/kl"] == pytest.approx(0.0, abs=1e-6)  # π = π_ref at first
