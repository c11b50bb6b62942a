"""The run's parts are built once and shared: every command scores a policy the same way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from credo.commands.evaluate import evaluate_target
from credo.commands.sft import run_sft
from credo.train import state as state_module
from credo.train.config import load_config
from credo.train.loop import train
from credo.train.run import build_run
from small_run import WARM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GUESS = [*WARM, "eval.episodes=24"]


@pytest.mark.slow
def test_train_sft_and_eval_report_the_same_numbers_on_a_klpo_config(tmp_path: Path) -> None:
    """KLPO draws auxiliary tokens while sampling; the held-out evaluation must not, in
    any command, or the same policy scores differently in each (it did in `sft` and
    `eval`, which sampled with the draws and so from another random stream)."""
    overrides = [
        *GUESS,
        "rollout.tasks_per_iter=16",
        "train.iterations=1",
        f"train.runs_dir={tmp_path}",
        "train.name=klpo",
    ]
    res = train(load_config("klpo", overrides), quiet=True)
    assert res.warm is not None and res.final is not None
    sft = run_sft(load_config("klpo", overrides), quiet=True)["eval"]
    assert sft.to_dict() == res.warm.to_dict()
    ev = evaluate_target(run_dir=res.run_dir, model=None, env=None, episodes=24)["eval"]
    assert ev.to_dict() == res.final.to_dict()


def test_the_run_evaluator_samples_without_klpo_draws() -> None:
    run = build_run(load_config("klpo", [*GUESS, "sft.enabled=false", "rollout.topk_logprobs=4"]))
    assert run.sampling.aux_samples == 16 and run.sampling.topk_logprobs == 4
    calls = []

    def spy(prompts, sampling, generator=None, **kw):  # type: ignore[no-untyped-def]
        calls.append(sampling)
        return real(prompts, sampling, generator, **kw)

    real = run.policy.generate
    run.policy.generate = spy  # type: ignore[method-assign]
    run.evaluate(episodes=2)
    run.evaluate(episodes=2, greedy=True)
    assert calls and all(s.aux_samples == 0 and s.topk_logprobs == 0 for s in calls)
    assert {s.temperature for s in calls} == {1.0, 0.0}


def test_a_teacher_seeds_the_progress_graph_with_its_own_response_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ProAS's graph seeded by a teacher samples with the teacher's cap: 16 tokens for a
    built-in model, 48 for a Hugging Face model (it used the student's 16 for both)."""
    student = build_run(load_config("proas", [*GUESS[:2], "sft.enabled=false"]))
    tiny_dir, hf_dir = tmp_path / "tiny", tmp_path / "hf"
    student.policy.save(tiny_dir)
    del student.policy.model.config.credo_tiny  # the same weights, as a plain HF model
    student.policy.save(hf_dir)
    caps = []

    def record(ctx, tasks, *, group_size):  # type: ignore[no-untyped-def]
        caps.append(ctx.sampling.max_new_tokens)
        return real(ctx, tasks[:2], group_size=group_size)

    real = state_module.sample_groups
    monkeypatch.setattr(state_module, "sample_groups", record)
    for folder in (tiny_dir, hf_dir):
        cfg = load_config(
            "proas",
            [
                *GUESS[:2],
                "sft.enabled=false",
                "credit.seed_graph=teacher",
                f"credit.teacher={folder}",
            ],
        )
        run = build_run(cfg)
        graph = state_module.estimator_state_factory("proas")()
        state_module.seed_estimator_state(run, graph)
    assert caps == [16, 48]
