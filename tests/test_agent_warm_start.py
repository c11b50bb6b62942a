"""A warm start through the user's agent (``sft.agent_reply``): the agent runs with the
env's oracle answering in the model's place, and SFT trains on the exact prompts it
sent; an agent with its own prompts and reply format then acts where credo's own warm
start leaves it unable to (tests/agent_fixtures.py:styled_agent, real server on
127.0.0.1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from credo.agent import AgentSession, agent_params
from credo.agent.demos import (
    TOOL_CALL,
    check_reply_format,
    collect_agent_demonstrations,
    tool_call_text,
)
from credo.envs import Task
from credo.serve.tools import parse_tool_calls
from credo.train.config import ConfigError, load_config
from credo.train.run import build_run
from credo.train.warmstart import warm_start, warm_start_key

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AGENT = "tests/agent_fixtures.py:styled_agent"
BASE = [
    "env.name=examples.custom_env:GuessEnv",
    "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128}",
    f"rollout.agent={AGENT}",
    "rollout.agent_timeout_s=60",
    "rollout.max_new_tokens=8",
    "sft.episodes=300",
    "sft.steps=150",
    "sft.noisy_episodes=50",
    "sft.noisy_steps=10",
    "train.threads=1",
]


def test_the_oracle_answers_each_episode_in_the_agents_format(tmp_path: Path) -> None:
    cfg = load_config("grpo", [*BASE, "sft.agent_reply='MOVE: {action}'"])
    run = build_run(cfg)
    try:
        a = agent_params(cfg)
        episodes, solved = collect_agent_demonstrations(
            AGENT, run.policy, run.make_env, reply="MOVE: {action}", episodes=6, epsilon=0.0,
            env_data={"env": a.env, "env_kwargs": a.env_kwargs},
        )  # fmt: skip
        tok = run.policy.tokenizer
        assert solved == 1.0 and len(episodes) == 6  # binary search finds 1..8 in 3 turns
        for ep in episodes:
            env = run.make_env()
            env.reset(Task.make("train", ep.group))
            for step in ep.steps:
                # the reply: the oracle's action in the agent's format, then end of turn
                want = env.oracle_action()
                assert tok.decode(step.response_ids, skip_special_tokens=True).strip() == (
                    tok.decode(tok.encode(f"MOVE: {want}", add_special_tokens=False))
                )
                assert step.response_ids[-1] in run.policy.stop_ids
                # the prompt: the agent's own system prompt and layout, as the server
                # rendered them (words outside the built-in vocabulary are <unk>)
                prompt = tok.decode(step.prompt_ids)
                assert "move : guess [ n ]" in prompt and ". <unk> : the secret is" in prompt
                env.step(want)
    finally:
        run.close()


def test_an_agent_that_cannot_read_the_replies_is_one_line(tmp_path: Path) -> None:
    cfg = load_config(
        "grpo", [*BASE, "sft.agent_reply='ACT {action}'", "sft.episodes=4", "sft.cache=false"]
    )
    run = build_run(cfg)
    try:
        with pytest.raises(ValueError, match="solved none of 4 tasks with the env's oracle"):
            warm_start(run)
    finally:
        run.close()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sft.agent_reply=MOVE"], r"must contain \{action\} exactly once"),
        (["sft.agent_reply='{action} {other}'"], r"may hold no field but \{action\}"),
        (["rollout.agent=null", "sft.agent_reply='MOVE: {action}'"], "it needs rollout.agent"),
    ],
)
def test_bad_reply_formats_are_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("grpo", [*BASE, *overrides])
    assert check_reply_format("Action: {action}") is None


def test_the_warm_start_key_holds_the_agents_code_and_reply(tmp_path: Path) -> None:
    a = load_config("grpo", [*BASE, "sft.agent_reply='MOVE: {action}'"])
    b = load_config("grpo", [*BASE, "sft.agent_reply='move : {action}'"])
    plain = load_config("grpo", BASE)
    assert len({warm_start_key(a), warm_start_key(b), warm_start_key(plain)}) == 3


def test_a_cached_clean_phase_runs_no_clean_agent_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the clean phase loaded from the cache (a warm start differing only in its
    noisy phase), the agent is not run on the clean tasks again: only the noisy
    episodes are collected. It ran both before, and trained on the noisy ones alone."""
    import credo.agent.demos as demos

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    calls: list[float] = []  # the epsilon of each collection
    real = demos.collect_agent_demonstrations

    def counted(*args: object, **kw: object) -> object:
        calls.append(kw["epsilon"])  # type: ignore[arg-type]
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(demos, "collect_agent_demonstrations", counted)
    small = [*BASE, "sft.episodes=12", "sft.steps=4", "sft.noisy_episodes=6", "sft.noisy_steps=2"]
    for extra in ([], ["sft.noisy_lr=3e-4"]):
        run = build_run(load_config("grpo", [*small, "sft.agent_reply='MOVE: {action}'", *extra]))
        try:
            _, ws = warm_start(run)
        finally:
            run.close()
        assert not ws.cached
    assert calls == [0.0, 0.3, 0.3]  # clean and noisy, then the noisy ones only


def _success_through_the_agent(overrides: list[str], episodes: int = 48) -> float:
    cfg = load_config("grpo", [*BASE, *overrides])
    run = build_run(cfg)
    session = AgentSession(agent_params(cfg))
    try:
        policy, _ = warm_start(run)
        return session.evaluate(policy, run.sampling, episodes=episodes, seed=0).success_rate
    finally:
        session.close()
        run.close()


@pytest.mark.slow
def test_the_agents_warm_start_teaches_its_format_where_credos_does_not() -> None:
    """Held-out success through the agent: credo's own warm start writes ``guess [ k ]``,
    which the agent's ``MOVE:`` parser never reads (0 %); the warm start through the agent
    writes ``move : guess [ k ]`` and solves most tasks. With 300 clean SFT steps it solved
    56-85 % of 48 held-out tasks over ``sft.seed`` 0-3 (AVX2 CPU); with 150 it solved
    10-35 % here and 18.8 % on another CI machine, below the 0.2 this test then asserted."""
    longer = "sft.steps=300"
    assert _success_through_the_agent([longer]) == 0.0
    assert _success_through_the_agent([longer, "sft.agent_reply='MOVE: {action}'"]) > 0.3


# ------------------------------------------------------------- real tool calls
TOOL_AGENT = "examples/tool_call_agent.py:run"
TOOLS_BASE = [
    "env.name=tools",
    "env.kwargs={difficulty: easy}",
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
    f"rollout.agent={TOOL_AGENT}",
    "rollout.agent_timeout_s=60",
    "sft.agent_reply=tool_call",
    "train.threads=1",
]


def test_the_oracle_answers_a_tool_calling_agent_with_tool_calls() -> None:
    """``sft.agent_reply=tool_call``: each oracle action goes back to the agent as a tool
    call that the server parsed from the reply's text (``message.tool_calls``); the agent
    runs it, so every ticket is solved, and each recorded reply is the call's text."""
    cfg = load_config("grpo", TOOLS_BASE)
    run = build_run(cfg)
    try:
        a = agent_params(cfg)
        episodes, solved = collect_agent_demonstrations(
            TOOL_AGENT, run.policy, run.make_env, reply=TOOL_CALL, episodes=4, epsilon=0.0,
            env_data={"env": a.env, "env_kwargs": a.env_kwargs},
        )  # fmt: skip
        tok = run.policy.tokenizer
        assert solved == 1.0 and len(episodes) == 4
        for ep in episodes:
            env = run.make_env()
            env.reset(Task.make("train", ep.group))
            # the customer's ticket is in every request (it was missing: the agent sent
            # only the desk's state, so no call's ids could be read from the prompt)
            ticket = tok.decode(tok.encode(env.instruction(), add_special_tokens=False))
            for step in ep.steps:
                assert ticket in tok.decode(step.prompt_ids)
                want = env.oracle_action()
                name, args = env.action_as_call(want)
                text = tok.decode(step.response_ids, skip_special_tokens=True).strip()
                # the built-in tokenizer keeps the spaced call whole: it parses back
                assert text == tool_call_text(name, args)
                assert parse_tool_calls(text) == (None, [(name, json.dumps(args))])
                assert "<unk>" not in text
                env.step(want)
    finally:
        run.close()


def test_tool_call_text_by_hand() -> None:
    assert tool_call_text("refund", {"order_id": 3, "amount": 30}) == (
        '<tool_call> { "name" : "refund" , "arguments" : { "order_id" : 3 , "amount" : 30 } }'
        " </tool_call>"
    )
    assert (
        tool_call_text("done", {})
        == '<tool_call> { "name" : "done" , "arguments" : { } } </tool_call>'
    )
    assert parse_tool_calls(tool_call_text("done", {})) == (None, [("done", "{}")])


def test_tool_call_replies_need_an_env_that_turns_actions_into_calls() -> None:
    with pytest.raises(ConfigError, match="has no action_as_call"):
        load_config("grpo", [*BASE, "sft.agent_reply=tool_call"])  # GuessEnv
    assert load_config("grpo", TOOLS_BASE).sft.agent_reply == "tool_call"
