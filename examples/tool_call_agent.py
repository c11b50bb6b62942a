"""An agent that works the ``tools`` env's store API through real tool calls, trained by
credo unchanged.

It is written as agents for chat models are: it sends the API as OpenAI ``tools=``
function definitions, reads ``message.tool_calls`` from each reply, runs the call and
answers with a ``role: tool`` message; a reply without a tool call ends the episode as a
failure. It keeps the ticket and only its last two calls with their results (a short
context, as the store's own oracle needs no more). credo serves the policy behind the
OpenAI API; when the request carries ``tools``, the server renders them with the model's
chat template (or credo's text format) and parses the model's calls back into
``tool_calls``.

Train it, with a warm start through this agent that teaches the model the call format
(the env's oracle answers each request as a tool call; ``docs/serve.md``):

    credo train --agent examples/tool_call_agent.py:run --env tools \\
        "env.kwargs={difficulty: easy}" sft.agent_reply=tool_call

Run it against any OpenAI-compatible server instead (``credo serve``, vLLM, ...):

    python examples/tool_call_agent.py --base-url http://127.0.0.1:8000/v1 --tasks 20
"""

from __future__ import annotations

from typing import Any

from credo.envs import make_env

SYSTEM = (
    "You are the support desk of an online store. Serve every request of the customer's "
    "ticket with the store's tools, one call per reply, then close the ticket."
)
HISTORY = 2  # past calls (each with its result) kept in the context
MAX_TOKENS = 48  # one call with its arguments


async def run(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """One ticket of ``task`` with the model behind ``client`` (an ``openai.AsyncOpenAI``).

    Returns ``{"reward": float, "success": bool}``.
    """
    env = make_env(task.data.get("env", "tools"), **task.data.get("env_kwargs", {}))
    opened = env.reset(task)  # the desk's state ("ticket open : no calls yet")
    ticket = f"{env.instruction()}\n{opened}"  # the customer's request comes first
    tools = env.tool_schemas()
    past: list[list[dict[str, Any]]] = []  # [assistant call, tool result] per turn
    reward = 0.0
    for _ in range(env.max_turns):
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ticket},
            *[m for turn in past[-HISTORY:] for m in turn],
        ]
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=tools, max_tokens=MAX_TOKENS
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return {"reward": reward, "success": False}
        call = message.tool_calls[0]
        # the store's API: the tool's name, then its JSON arguments
        result = env.step(f"{call.function.name} {call.function.arguments}")
        reward += result.reward
        if result.done:
            return {"reward": reward, "success": bool(result.info.get("success", False))}
        past.append(
            [
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {
                                "name": call.function.name,
                                "arguments": call.function.arguments,
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call.id, "content": result.observation},
            ]
        )
    return {"reward": reward, "success": False}


if __name__ == "__main__":
    from against_a_server import main  # beside this file

    main(run, "run the tool-calling agent against an OpenAI API server", env="tools")
