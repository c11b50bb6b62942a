"""Agents written with the OpenAI Agents SDK and with LangGraph, trained unchanged through
credo's policy server (``credo train --agent``).

The agents are the examples themselves (``examples/agents_sdk_agent.py``,
``examples/langgraph_agent.py``), imported by ``--agent`` as a user's file would be, and
run against the real server on 127.0.0.1 with the built-in tiny model. They play
:class:`framework_fixtures.SayEnv`, whose graded reward gives an untrained model's
episodes different returns, so a two-iteration run has a learning signal. The built-in
model cannot write a tool call; the frameworks' tool mechanisms are checked with the
tiny model tests/test_serve.py teaches to call a tool.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from credo.agent.sampler import AgentParams, AgentSession
from credo.envs.base import Task
from credo.policy.base import SamplingParams
from credo.policy.hf import HFPolicy
from credo.rollout import RolloutResult
from credo.train.config import load_config
from credo.train.loop import train

# the tiny model of tests/test_serve.py taught to call ``add`` twice, then answer
from test_serve import QUESTION, TURNS, tool_policy  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = "tests.framework_fixtures:SayEnv"
#: example file → the module it needs (the framework), with the package that brings it
FRAMEWORKS = {
    "agents_sdk": ("agents", "openai-agents"),
    "langgraph": ("langgraph", "langgraph"),
}


def _need(framework: str) -> None:
    module, package = FRAMEWORKS[framework]
    pytest.importorskip(module, reason=f"{package} is not installed (pip install -e '.[agents]')")
    if framework == "langgraph":
        pytest.importorskip(
            "langchain_openai",
            reason="langchain-openai is not installed (pip install -e '.[agents]')",
        )


def _overrides(tmp_path: Path, framework: str) -> list[str]:
    return [
        f"rollout.agent=examples/{framework}_agent.py:run",
        f"env.name={ENV}",
        "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
        "sft.enabled=false",
        "rollout.tasks_per_iter=4",
        "rollout.group_size=3",
        "rollout.max_new_tokens=4",
        "rollout.agent_timeout_s=60",
        "optim.lr=1e-3",
        "eval.episodes=2",
        "train.threads=1",
        "train.iterations=2",
        f"train.runs_dir={tmp_path}",
        f"train.name={framework}",
    ]


def _one_group(policy: HFPolicy, framework: str) -> RolloutResult:
    """Two episodes of SayEnv's task 0 by ``examples/<framework>_agent.py`` against
    ``policy`` served on 127.0.0.1, replies of at most 4 tokens: the sampler's output."""
    session = AgentSession(
        AgentParams(agent=f"examples/{framework}_agent.py:run", timeout_s=60, env=ENV)
    )
    try:
        return session.sample(
            policy,
            SamplingParams(max_new_tokens=4),
            [Task.make("train", 0)],
            2,
            torch.Generator().manual_seed(0),
        )
    finally:
        assert session.close()


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_framework_agent_is_trained_through_the_server(tmp_path: Path, framework: str) -> None:
    """Two iterations of ``credo train --agent examples/<framework>_agent.py:run``: every
    episode's requests (two per episode, sent by the framework) reached the model and
    were recorded as token rows; the trainer's log-probs of those rows equal the recorded
    ones (KL to the sampler 0 before the first step); mixed returns give non-zero
    advantages and a gradient (in at least one iteration: concurrent agents' requests
    reach the sampler in arrival order, so on a busy machine an iteration's draws, and
    whether its groups mix, vary); the evaluations go through the agent. Then the trained
    policy is served again and one group's recorded rows are scored directly: the prompt
    the model saw is the example's own prompt, and the recorded log-probs are the
    trainer's (difference < 1e-4, as docs/serve.md says)."""
    _need(framework)
    cfg = load_config("grpo", _overrides(tmp_path, framework))
    res = train(cfg, quiet=True)
    assert res.iterations == 2 and not res.interrupted
    for r in res.metrics:
        assert r["rollout/agent_errors"] == 0.0 and r["rollout/agent_no_model_calls"] == 0.0
        assert r["rollout/requests"] == r["rollout/env_steps"] == 24  # 4 tasks × 3 × 2 turns
        assert r["rollout/non_append_only"] == 12  # 2nd turn: a fresh one-message prompt
        if r["credit/adv_abs_max"] > 0:
            assert r["credit/zero_adv_frac"] < 1 and r["policy/grad_norm"] > 0
        assert r["policy/kl_sampler_first"] < 1e-8  # recorded = re-scored log-probs
    assert any(r["credit/adv_abs_max"] > 0 for r in res.metrics)
    for ev in (res.warm, res.final):
        assert ev is not None and ev.episodes == 2 and ev.errors == 0 and ev.mean_turns == 2
    records = (res.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in records] == [0, 1]

    policy = HFPolicy.from_pretrained(res.run_dir / "final_policy")
    out = _one_group(policy, framework)
    assert [len(e.steps) for e in out.episodes] == [2, 2] and out.forest.num_rows == 4
    first = policy.tokenizer.decode(out.episodes[0].steps[0].prompt_ids)
    assert "history : none page : say yes goal : say yes action :" in first
    batch = out.forest.to_batch(torch.zeros(out.forest.num_rows), pad_id=policy.pad_id)
    with torch.no_grad():
        lp = policy.score(batch.input_ids, batch.attention_mask, temperature=1.0).logprobs
    assert int(batch.response_mask.sum()) > 0
    assert float((lp - batch.old_logprobs)[batch.response_mask].abs().max()) < 1e-4


def test_an_sdk_reply_with_no_text_is_an_empty_action_not_a_failed_episode() -> None:
    """A model that samples only ``<pad>`` fills ``max_tokens`` with text that decodes to
    nothing: the SDK raises ``ModelBehaviorError`` (finish_reason 'length', no assistant
    text). The example agent sends the env an empty action instead, so both turns are
    played and recorded and the episode is scored (0), not failed. Before the agent caught
    the error, an untrained model's rare all-special reply failed its episode (CI, stop 69)."""
    _need("agents_sdk")
    from credo.policy.tiny import TinyModelConfig, create_tiny_policy

    small = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    policy = create_tiny_policy(["say", "yes", "no"], small, seed=0)
    model = policy.model
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-30.0)
        head.bias[policy.pad_id] = 30.0
    model.lm_head = head
    out = _one_group(policy, "agents_sdk")
    assert [e.error for e in out.episodes] == [None, None]
    assert [len(e.steps) for e in out.episodes] == [2, 2] and out.forest.num_rows == 4
    assert [e.ret for e in out.episodes] == [0.0, 0.0]
    batch = out.forest.to_batch(torch.zeros(out.forest.num_rows), pad_id=policy.pad_id)
    replies = batch.input_ids[batch.response_mask]
    assert replies.numel() == 16 and bool((replies == policy.pad_id).all())


def test_an_async_client_kept_for_the_process_works_in_every_iteration() -> None:
    """An agent that makes one ``openai.AsyncOpenAI`` on first use and keeps it (as
    LangChain's ``ChatOpenAI`` keeps its default HTTP client for the process): its pooled
    connections belong to the loop they were opened on, so every call of
    ``run_agent_episodes`` (a training iteration) runs its agents on the same loop. With a
    new loop per call, the second call's requests failed with 'Event loop is closed'."""
    import openai

    from credo.policy.tiny import TinyModelConfig, create_tiny_policy
    from credo.serve import PolicyServer, run_agent_episodes
    from credo.serve.agents import agents_loop

    kept: dict[str, openai.AsyncOpenAI] = {}

    async def agent(task: str, client: openai.AsyncOpenAI, session_id: str) -> float:
        if "client" not in kept:
            kept["client"] = openai.AsyncOpenAI(
                base_url=str(client.base_url), api_key=client.api_key, timeout=60, max_retries=0
            )
        await kept["client"].chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": task}],
            extra_headers={"X-Credo-Session": session_id},
        )
        return 1.0

    small = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    policy = create_tiny_policy(["say", "yes", "no"], small, seed=0)
    with PolicyServer(policy, stop_timeout_s=5) as srv:
        for _ in range(2):
            res = run_agent_episodes(
                policy, agent, ["say yes", "say no"], 2, timeout_s=60, server=srv
            )
            assert [e.error for e in res.episodes] == [None] * 4 and res.forest.num_rows == 4
    loop = agents_loop()
    assert loop.is_running()
    asyncio.run_coroutine_threadsafe(kept["client"].close(), loop).result(10)


async def _sdk_tool_loop(base_url: str) -> tuple[str, list[tuple[int, int]]]:
    """An Agents SDK agent with one function tool, as its users write it."""
    import openai
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        function_tool,
    )

    used: list[tuple[int, int]] = []

    @function_tool
    def add(a: int, b: int) -> int:
        """a + b"""
        used.append((a, b))
        return a + b

    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key="unused",
        timeout=60,
        max_retries=0,
        default_headers={"X-Credo-Session": "tools"},
    )
    try:
        agent = Agent(
            name="adder",
            model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
            model_settings=ModelSettings(temperature=0.0),
            tools=[add],
        )
        result = await Runner.run(
            agent, QUESTION, max_turns=5, run_config=RunConfig(tracing_disabled=True)
        )
    finally:
        await client.close()
    return str(result.final_output), used


async def _langgraph_tool_loop(base_url: str) -> tuple[str, list[tuple[int, int]]]:
    """A LangGraph graph with LangChain tools (``bind_tools``, ``ToolNode``), as its
    users write it."""
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    used: list[tuple[int, int]] = []

    @tool
    def add(a: int, b: int) -> int:
        """a + b"""
        used.append((a, b))
        return a + b

    model = ChatOpenAI(
        model="policy",
        base_url=base_url,
        api_key="unused",
        temperature=0,
        max_retries=0,
        timeout=60,
        default_headers={"X-Credo-Session": "tools"},
    ).bind_tools([add])

    async def call_model(state: MessagesState) -> dict[str, list]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([add]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    out = await graph.compile().ainvoke(
        {"messages": [HumanMessage(QUESTION)]}, {"recursion_limit": 10}
    )
    return str(out["messages"][-1].content), used


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_framework_agents_tools_are_called_through_the_server(
    tool_policy,  # type: ignore[no-untyped-def]  # noqa: F811
    framework: str,
) -> None:
    """With a model that writes tool calls, the framework's own tool mechanism (the SDK's
    ``function_tool``, LangChain's ``bind_tools`` and LangGraph's ``ToolNode``) works
    through credo: the tools reach the model through its template, its calls come back as
    ``tool_calls`` that the framework runs, the results go back to the model, and the
    three requests are recorded as one session of three rows, the first two ending in a
    tool call."""
    _need(framework)
    from credo.rollout import episodes_to_forest
    from credo.serve import serve_policy, session_to_episode

    loop = _sdk_tool_loop if framework == "agents_sdk" else _langgraph_tool_loop
    with serve_policy(tool_policy, stop_timeout_s=5) as (url, rec):
        answer, used = asyncio.run(loop(url))
        calls = rec.calls("tools")
    assert answer == "the answer is 9"
    assert used == [(args["a"], args["b"]) for _, args in TURNS if args is not None]
    assert [c.choices[0].finish_reason for c in calls] == ["tool_calls", "tool_calls", "stop"]
    assert [m["role"] for m in calls[2].messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    forest = episodes_to_forest([session_to_episode(calls, reward=1.0, success=True)])
    assert forest.num_rows == 3 and forest.parent.tolist() == [-1, 0, 1]
