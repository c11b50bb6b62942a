"""``eval.shifted``: the trained policy's held-out success on other settings of the env
(out of the training distribution), in ``final_eval.json``, the CLI and ``credo
compare``'s columns; bad entries are one line before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from credo.eval.evaluate import evaluate
from credo.policy.hf import HFPolicy
from credo.train.config import ConfigError, load_config
from credo.train.loop import train
from credo.train.run import build_run, env_factory
from small_run import SMALL

SHIFTED = "eval.shifted=[{label: fewer-turns, kwargs: {max_turns: 2}}, {label: same, kwargs: {}}]"


@pytest.mark.slow
def test_shifted_settings_are_evaluated_with_the_final_policy(tmp_path: Path) -> None:
    overrides = [*SMALL, "train.iterations=1", f"train.runs_dir={tmp_path}", "train.name=s"]
    res = train(load_config("grpo", [*overrides, SHIFTED]), quiet=True)
    final = json.loads((res.run_dir / "final_eval.json").read_text())
    shifted = final["shifted"]
    assert list(shifted) == ["fewer-turns", "same"]
    assert shifted["fewer-turns"]["env_kwargs"] == {"max_turns": 2}
    # "same" is the training env itself: exactly the held-out result
    assert shifted["same"]["success_rate"] == final["success_rate"]
    # the other equals an evaluation of the final policy on that env, by hand
    cfg = load_config("grpo", overrides)
    run = build_run(cfg, policy_path=str(res.run_dir / "final_policy"))
    try:
        assert isinstance(run.policy, HFPolicy)
        cfg2 = load_config("grpo", [*overrides, "env.kwargs={max_turns: 2}"])
        want = evaluate(
            run.policy, run.renderer, env_factory(cfg2), episodes=cfg.eval.episodes,
            sampling=run.sampling, max_turns=run.max_turns, seed=cfg.eval.seed,
        )  # fmt: skip
    finally:
        run.close()
    assert shifted["fewer-turns"]["success_rate"] == pytest.approx(want.success_rate)
    assert shifted["fewer-turns"]["episodes"] == 16
    # fewer turns to find the secret: no more successes than with four
    assert shifted["fewer-turns"]["success_rate"] <= final["success_rate"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{label: x}", "eval.shifted: expected a list"),
        ("[{label: x, kwarg: {}}]", "eval.shifted[0] must be a mapping with label and kwargs"),
        ("[{kwargs: {}}]", "eval.shifted[0].label must be a distinct name"),
        ("[{label: a}, {label: a}]", "eval.shifted[1].label must be a distinct name"),
        ("[{label: a, kwargs: [1]}]", "eval.shifted[0].kwargs must be a mapping"),
    ],
)
def test_bad_shifted_entries_are_one_line(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("grpo", [f"eval.shifted={value}"])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_agent_run_refuses_shifted_settings_in_one_line() -> None:
    with pytest.raises(ConfigError, match="the agent sampler's held-out evaluation runs"):
        load_config("grpo", ["rollout.agent=examples.openai_agent:run", SHIFTED])


def test_a_shifted_env_that_cannot_be_built_stops_before_compute() -> None:
    with pytest.raises(ValueError, match=r"eval\.shifted 'x': env .* rejected its options"):
        build_run(load_config("grpo", [*SMALL, "eval.shifted=[{label: x, kwargs: {colour: 1}}]"]))


def test_compare_adds_a_column_per_shifted_setting() -> None:
    from credo.commands.compare import RecipeSummary, summary_table_rows

    a = RecipeSummary("grpo", final=[0.5, 0.7], iteration_s=[1.0], update_s=[0.5],
                      shifted={"hard": [0.2, 0.4]})  # fmt: skip
    b = RecipeSummary("x", final=[0.1], iteration_s=[1.0], update_s=[0.5])
    cols, rows = summary_table_rows([a, b])
    assert cols[-1] == "held-out, shifted: hard (mean ± sd)"
    assert rows[0][-1] == "30.0% ± 14.1%" and rows[1][-1] == "—"
    assert not any("shifted" in c for c in summary_table_rows([b])[0])
