"""An agent written with the OpenAI Agents SDK (``openai-agents``), trained by credo unchanged.

The agent is an ordinary Agents SDK ``Agent`` run by the SDK's ``Runner``; its model is
the SDK's ``OpenAIChatCompletionsModel`` over the ``openai`` client credo hands it, so
every request goes to the policy being trained (``credo train --agent``) or to any
OpenAI-compatible server (``credo serve``, vLLM, ...). Its loop has no credo code beyond
building the world it acts in. It plays the built-in ``shop`` (or the run's env) through
its text interface: each turn, one ``Runner.run`` over the page, whose final output is
the action sent to the shop.

Train it (the policy is served behind the OpenAI API on 127.0.0.1 for the run):

    pip install -e ".[serve,agents]"
    credo train --agent examples/agents_sdk_agent.py:run

Run it against any OpenAI-compatible server instead:

    credo serve runs/<run>/final_policy --port 8000 &
    python examples/agents_sdk_agent.py --base-url http://127.0.0.1:8000/v1 --tasks 20

Why a plain chat agent rather than the SDK's function tools: the built-in model (a word
model of about a hundred words) cannot write a tool call, so an agent whose only way to
act is a tool would never act. With a model that writes tool calls (a chat template that
renders ``tools``), ``Agent(tools=[...])`` works through credo as it does anywhere: credo
renders the tools with the model's template and parses its calls back into
``tool_calls`` (docs/serve.md, "Agent frameworks").

Why ``RunConfig(tracing_disabled=True)``: the SDK otherwise exports a trace of every run
to OpenAI's servers with the ``OPENAI_API_KEY`` of the environment, which a local policy
has no use for. The ``X-Credo-State`` header (optional) keys each step by the shop's page
state for step-level estimators (GiGPO); the SDK sends it through ``ModelSettings``.

Why ``ModelBehaviorError`` is caught: the SDK raises it for a reply it cannot use, such as
one cut at ``max_tokens`` before any visible text (an untrained model that samples only
special tokens). That reply is the policy's move, so the agent sends the env an empty
action, which the env scores (here as an invalid one), and the episode goes on: the
policy learns from it. Left uncaught, the episode would fail and teach nothing.

The prompt is one user message per turn (the agent has no ``instructions``, so no
system message) in the compact layout credo's own rollouts use for the built-in model, so
that credo's warm start is a sensible starting point, as in ``examples/openai_agent.py``.
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    ModelBehaviorError,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
)

from credo.envs import make_env

HISTORY = 2  # past actions shown in the prompt
MAX_TOKENS = 16  # one action is a few words


def prompt(history: list[str], page: str, goal: str) -> str:
    """The user message of one turn."""
    past = " ; ".join(history[-HISTORY:]) or "none"
    return f"history : {past} page : {page} goal : {goal} action :"


def make_agent(client: Any) -> Agent[Any]:
    """The SDK agent over ``client`` (an ``openai.AsyncOpenAI``): chat completions, no
    tools, a short reply."""
    return Agent(
        name="shopper",
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        model_settings=ModelSettings(max_tokens=MAX_TOKENS),
    )


async def run(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """One episode of ``task`` with the model behind ``client`` (an ``openai.AsyncOpenAI``
    that already sends the episode's session header).

    Returns ``{"reward": float, "success": bool}``.
    """
    env = make_env(task.data.get("env", "shop"), **task.data.get("env_kwargs", {}))
    page = env.reset(task)
    agent = make_agent(client)
    history: list[str] = []
    reward, success = 0.0, False
    for _ in range(env.max_turns):
        try:
            result = await Runner.run(
                agent,
                prompt(history, page, env.instruction()),
                max_turns=1,  # one model call: the action
                run_config=RunConfig(
                    tracing_disabled=True,
                    model_settings=ModelSettings(extra_headers={"X-Credo-State": env.state_key()}),
                ),
            )
            action = str(result.final_output or "").strip()
        except ModelBehaviorError:
            action = ""  # a reply the SDK rejects is the policy's move: an empty action
        step = env.step(action)
        history.append(action)
        page, reward = step.observation, reward + step.reward
        if step.done:
            success = bool(step.info.get("success", False))
            break
    return {"reward": reward, "success": success}


if __name__ == "__main__":
    from against_a_server import main  # beside this file

    main(run, "run the Agents SDK agent against an OpenAI API server")
