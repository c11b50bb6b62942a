"""``credo train --agent``: an ``openai``-client agent trained through the policy server.

The agents (tests/agent_fixtures.py) play ``examples.custom_env:GuessEnv`` through the
real server on 127.0.0.1 with the built-in tiny model; every run is a couple of
iterations on a few tasks, single-threaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from credo.cli import main as cli_main
from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.train.config import ConfigError, load_config
from credo.train.loop import train
from credo.train.run import build_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AGENTS = "tests/agent_fixtures.py"
VOLATILE = ("time/", "perf/")


def _tiny(tmp_path: Path, name: str, iterations: int, *extra: str) -> list[str]:
    return [
        "env.name=examples.custom_env:GuessEnv",
        "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
        "sft.enabled=false",
        "rollout.tasks_per_iter=2",
        "rollout.group_size=3",
        "rollout.max_new_tokens=4",
        "rollout.agent_timeout_s=60",
        "optim.lr=1e-3",
        "eval.episodes=4",
        "train.threads=1",
        "train.checkpoint_every=1",
        f"train.iterations={iterations}",
        f"train.runs_dir={tmp_path}",
        f"train.name={name}",
        *extra,
    ]


def _stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in records]


@pytest.mark.slow
def test_credo_train_agent_learns_from_the_agents_episodes(tmp_path: Path) -> None:
    """The CLI path end to end: the steps the agent's requests produced carry a learning
    signal (non-zero advantages, a non-zero gradient, changed weights), the run's
    evaluations go through the agent, and the server is gone afterwards."""
    args = _tiny(tmp_path, "cli", 2)
    assert cli_main(["train", "--agent", f"{AGENTS}:agent", "--quiet", *args]) == 0
    run = tmp_path / "cli"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    for r in records:
        assert r["rollout/agent_errors"] == 0.0
        assert r["rollout/requests"] == r["rollout/env_steps"] >= 6  # ≥ one request per episode
        assert r["credit/adv_abs_max"] > 0 and r["credit/zero_adv_frac"] < 1
        assert r["policy/grad_norm"] > 0
    cfg = load_config("grpo", [*args, f"rollout.agent={AGENTS}:agent"])
    assert cfg.rollout.agent == f"{AGENTS}:agent"
    initial = build_run(cfg).policy  # the built-in model as built from train.seed
    trained = HFPolicy.from_pretrained(run / "final_policy")
    before, after = initial.model.state_dict(), trained.model.state_dict()
    assert max(float((before[k] - after[k]).abs().max()) for k in before) > 1e-4
    final = json.loads((run / "final_eval.json").read_text())
    warm = json.loads((run / "warmstart.json").read_text())["eval"]
    for ev in (final, warm):
        assert ev["episodes"] == 4 and ev["errors"] == 0 and ev["invalid_rate"] == 0.0
        assert 1 <= ev["mean_turns"] <= 4  # model requests per episode (GuessEnv: ≤ 4 turns)
    saved = json.loads((run / "checkpoints" / "step_2" / "state.json").read_text())
    assert saved["sampler_state"] == {"weights_version": 2}


@pytest.mark.slow
def test_a_raising_agent_fails_only_its_episode(tmp_path: Path) -> None:
    res = train(
        load_config("grpo", _tiny(tmp_path, "flaky", 2, f"rollout.agent={AGENTS}:flaky_agent")),
        quiet=True,
    )
    assert res.iterations == 2 and not res.interrupted
    for r in res.metrics:  # episode g = 1 of each of the 2 tasks raised
        assert r["rollout/agent_errors"] == 2.0 and r["rollout/env_errors"] == 2
        assert r["rollout/agent_timeouts"] == 0.0
        assert r["policy/grad_norm"] > 0
    odd = sum(Task.make("test", i).seed % 2 for i in range(4))
    assert res.final is not None and res.final.errors == odd and res.final.episodes == 4


def test_iterations_where_no_agent_reaches_the_model_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Every agent raises before its first request or returns without one: the run does
    not die on a forest without tokens; each iteration is skipped (weights unchanged,
    ``rollout/skipped``), the run says so in one line once, and an episode that never
    reached the model is a failure, never a held-out success (its reward in its error)."""
    cfg = load_config("grpo", _tiny(tmp_path, "silent", 2, f"rollout.agent={AGENTS}:silent_agent"))
    res = train(cfg, quiet=True)
    assert res.iterations == 2 and not res.interrupted
    for r in res.metrics:  # 2 tasks x 3 episodes, none with a step
        assert r["rollout/skipped"] == 1.0
        assert r["rollout/agent_no_model_calls"] == 6.0 and r["rollout/agent_errors"] == 6.0
        assert r["rollout/success_rate"] == 0.0 and r["rollout/env_steps"] == 0
        assert "policy/grad_norm" not in r  # no update
    assert res.warm is not None and res.final is not None
    for ev in (res.warm, res.final):  # held-out: 4 failures, not 4 successes
        assert ev.episodes == 4 and ev.errors == 4
        assert ev.success_rate == 0.0 and ev.mean_turns == 0.0
    err = capsys.readouterr().err
    assert err.count("had no step to train on and was skipped") == 1
    said = "the agent never called the model: nothing the policy did to learn from, counted as "
    assert f"{said}failed (the agent returned reward 0.5, success True)" in caplog.text
    before = build_run(cfg).policy.model.state_dict()
    after = HFPolicy.from_pretrained(res.run_dir / "final_policy").model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_edited_histories_and_unknown_choices_are_warned_once_a_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent that drops its history between turns (each step's prompt does not extend
    the previous one) and asks for two choices without naming the one it used: the run
    says so once each, the metrics count every occurrence."""
    from credo.agent.sampler import AgentParams, AgentSession
    from credo.policy.base import SamplingParams
    from credo.policy.tiny import TinyModelConfig, create_tiny_policy

    f = tmp_path / "forgetful_agent.py"
    f.write_text(
        "async def run(task, client, session_id):\n"
        "    for text in ('red', 'blue'):\n"
        "        await client.chat.completions.create(\n"
        "            model='m', messages=[{'role': 'user', 'content': text}], n=2\n"
        "        )\n"
        "    return 1.0\n"
    )
    small = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    policy = create_tiny_policy(["red", "blue", "green", "one", "two"], small, seed=0)
    session = AgentSession(AgentParams(agent=f"{f}:run", timeout_s=60))
    try:
        stats = [
            session.sample(
                policy,
                SamplingParams(max_new_tokens=3),
                [Task.make("train", i) for i in range(2)],
                2,
                torch.Generator().manual_seed(i),
            ).stats
            for i in range(2)
        ]
    finally:
        assert session.close()
    assert [s["rollout/non_append_only"] for s in stats] == [4.0, 4.0]  # 2nd step of 4 eps
    assert all(s["rollout/choice_unknown"] > 0 for s in stats)
    assert caplog.text.count("does not extend the previous step's prompt") == 1
    assert caplog.text.count("the choice the agent used could not be told") == 1


@pytest.mark.slow
def test_resume_with_the_agent_sampler_continues_exactly(tmp_path: Path) -> None:
    """With one agent at a time the server's batches, hence the samples, do not depend
    on timing: a run stopped after iteration 1 and resumed equals the run in one go."""
    one = [
        "rollout.agent_concurrency=1",
        f"rollout.agent={AGENTS}:agent",
        "rollout.group_size=2",
        "eval.episodes=2",
    ]
    full = train(load_config("grpo", _tiny(tmp_path, "full", 2, *one)), quiet=True)
    part = train(load_config("grpo", _tiny(tmp_path, "part", 1, *one)), quiet=True)
    resumed = train(
        load_config("grpo", _tiny(tmp_path, "part", 2, *one)), resume=part.run_dir, quiet=True
    )
    assert _stable(resumed.metrics) == _stable(full.metrics)
    assert resumed.final is not None and full.final is not None
    assert resumed.final.to_dict() == full.final.to_dict()
    a = HFPolicy.from_pretrained(full.run_dir / "final_policy").model.state_dict()
    b = HFPolicy.from_pretrained(resumed.run_dir / "final_policy").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [f"rollout.agent={AGENTS}:NOT_CALLABLE"],
            r"NOT_CALLABLE \(of type int\) is not a function",
        ),
        (["rollout.agent=tests/no_such_file.py:agent"], "no such file"),
        (["rollout.agent=no_colon"], "expected 'package.module:function'"),
        ([f"rollout.agent={AGENTS}:agent", "rollout.sampler=tree"], "rollout.sampler must stay"),
        ([f"rollout.agent={AGENTS}:agent", "rollout.agent_timeout_s=0"], "agent_timeout_s"),
        ([f"rollout.agent={AGENTS}:agent", "rollout.agent_concurrency=0"], "agent_concurrency"),
        (["rollout.sampler=agent"], "needs rollout.agent"),
        (
            [
                f"rollout.agent={AGENTS}:agent",
                "rollout.sampler=agent",
                "rollout.sampler_params={timeout_s: 3}",
            ],
            "takes no rollout.sampler_params",
        ),
        (
            [f"rollout.agent={AGENTS}:agent", "rollout.oracle_horizon=2"],
            "rollout.oracle_horizon=0",
        ),
        (
            [f"rollout.agent={AGENTS}:agent", "env.name=tests.agent_fixtures:NoOracleEnv"],
            "has no oracle_action",
        ),
    ],
)
def test_bad_agent_configs_fail_in_one_line_before_compute(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config("grpo", overrides)
    assert "\n" not in str(err.value)


def test_the_serve_extra_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "credo.serve", None)  # `import credo.serve` fails
    with pytest.raises(ConfigError, match=r"--agent .*credo\.serve") as err:
        load_config("grpo", [f"rollout.agent={AGENTS}:agent"])
    assert "\n" not in str(err.value)


def test_credo_serve_subcommand_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["serve", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: credo serve")
