"""An agent written with LangGraph (``langgraph`` + ``langchain-openai``), trained by credo
unchanged.

The agent is a LangGraph ``StateGraph`` of two nodes in a loop: ``decide`` asks a
LangChain ``ChatOpenAI`` model for the next action, ``act`` sends it to the world and
ends the graph when the episode is over. The model is pointed at an OpenAI-compatible
endpoint by its ``base_url``: during ``credo train --agent`` that is credo's server on
127.0.0.1, which records every request and trains on it; otherwise any server
(``credo serve``, vLLM, ...). It plays the built-in ``shop`` (or the run's env) through
its text interface.

Train it (the policy is served behind the OpenAI API on 127.0.0.1 for the run):

    pip install -e ".[serve,agents]"
    credo train --agent examples/langgraph_agent.py:run

Run it against any OpenAI-compatible server instead:

    credo serve runs/<run>/final_policy --port 8000 &
    python examples/langgraph_agent.py --base-url http://127.0.0.1:8000/v1 --tasks 20

What credo needs from a LangChain model is three arguments: ``base_url`` (the server),
``api_key`` (any string unless the server has a key) and the ``X-Credo-Session`` header
naming the episode, which ``ChatOpenAI`` sends as one of its ``default_headers`` (credo
passes the session id to the agent for clients it makes itself). The ``X-Credo-State``
header (optional) keys each step by the shop's page state for step-level estimators
(GiGPO); LangChain passes it per call as ``extra_headers``.

Why no LangChain tools here: the built-in model (a word model of about a hundred words)
cannot write a tool call. With a model that writes tool calls, ``bind_tools`` and
LangGraph's ``ToolNode`` work through credo as they do anywhere (docs/serve.md, "Agent
frameworks"). The prompt is one user message per turn in credo's compact layout, so that
credo's warm start is a sensible starting point, as in ``examples/openai_agent.py``.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from credo.envs import make_env

HISTORY = 2  # past actions shown in the prompt
MAX_TOKENS = 16  # one action is a few words


class Episode(TypedDict):
    """The graph's state: what the world showed last and what the agent did."""

    page: str
    history: list[str]
    action: str
    reward: float
    success: bool
    done: bool


def prompt(history: list[str], page: str, goal: str) -> str:
    """The user message of one turn."""
    past = " ; ".join(history[-HISTORY:]) or "none"
    return f"history : {past} page : {page} goal : {goal} action :"


def build_graph(model: ChatOpenAI, env: Any) -> Any:
    """The agent's graph over ``env`` (already reset): ``decide`` → ``act`` → ``decide`` …
    until ``act`` finds the episode over or ``env.max_turns`` actions were taken."""

    async def decide(state: Episode) -> dict[str, Any]:
        reply = await model.ainvoke(
            [HumanMessage(prompt(state["history"], state["page"], env.instruction()))],
            extra_headers={"X-Credo-State": env.state_key()},
        )
        return {"action": str(reply.content).strip()}

    def act(state: Episode) -> dict[str, Any]:
        step = env.step(state["action"])
        history = [*state["history"], state["action"]]
        done = step.done or len(history) >= env.max_turns
        return {
            "page": step.observation,
            "history": history,
            "reward": state["reward"] + step.reward,
            "success": bool(step.info.get("success", False)) if step.done else False,
            "done": done,
        }

    graph = StateGraph(Episode)
    graph.add_node("decide", decide)
    graph.add_node("act", act)
    graph.add_edge(START, "decide")
    graph.add_edge("decide", "act")
    graph.add_conditional_edges("act", lambda s: END if s["done"] else "decide")
    return graph.compile()


async def run(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """One episode of ``task``; ``client`` (an ``openai.AsyncOpenAI``) tells where the
    server is and with what key; ``session_id`` names the episode to it.

    Returns ``{"reward": float, "success": bool}``.
    """
    env = make_env(task.data.get("env", "shop"), **task.data.get("env_kwargs", {}))
    page = env.reset(task)
    model = ChatOpenAI(
        model="policy",
        base_url=str(client.base_url),
        api_key=client.api_key,
        default_headers={"X-Credo-Session": session_id},
        max_tokens=MAX_TOKENS,
        max_retries=0,
        timeout=client.timeout,
    )
    state = await build_graph(model, env).ainvoke(
        Episode(page=page, history=[], action="", reward=0.0, success=False, done=False),
        {"recursion_limit": 2 * env.max_turns + 2},  # two nodes per turn
    )
    return {"reward": state["reward"], "success": state["success"]}


if __name__ == "__main__":
    from against_a_server import main  # beside this file

    main(run, "run the LangGraph agent against an OpenAI API server")
