"""An ordinary agent written against the OpenAI API, trained by credo unchanged.

The agent below talks to a model only through the ``openai`` client it is given; its loop
has no credo code. It solves the built-in ``shop`` tasks through their text interface:
read the page, ask the model for one action, send the reply's text to the shop, repeat.

Train it (the policy is served behind the OpenAI API on 127.0.0.1 for the run):

    credo train --agent examples/openai_agent.py:run
    credo train --agent examples/openai_agent.py:run sft.enabled=false   # no warm start

Run it against any OpenAI-compatible server instead (``credo serve``, vLLM, ...):

    credo serve runs/<run>/final_policy --port 8000 &
    python examples/openai_agent.py --base-url http://127.0.0.1:8000/v1 --tasks 20

The task: credo passes its :class:`credo.envs.Task` (``task.split``, ``task.seed``) with
``task.data = {"env": <the run's env.name>, "env_kwargs": {...}}``; the agent builds that
env from the task once, before its loop (the only credo call, the world it acts in). It
returns the shop's reward and success; credo turns the requests it made into training
steps (exact token ids, no re-tokenising). The ``X-Credo-State`` header it sends is
optional: it keys each step by the shop's page state, so that step-level estimators
(GiGPO) group equal states; without it credo keys steps by the agent's observation text.

The prompt is one user message per turn in the compact layout credo's own rollouts use
for the built-in model (``history : … page : … goal : … action :``), so that credo's warm
start (SFT on the shop's oracle demonstrations) is a sensible starting point; an agent for
a chat model would write any prompt it likes.
"""

from __future__ import annotations

from typing import Any

from credo.envs import make_env

HISTORY = 2  # past actions shown in the prompt
MAX_TOKENS = 16  # one action is a few words


def prompt(history: list[str], page: str, goal: str) -> str:
    """The user message of one turn."""
    past = " ; ".join(history[-HISTORY:]) or "none"
    return f"history : {past} page : {page} goal : {goal} action :"


async def run(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """One episode of ``task`` with the model behind ``client`` (an ``openai.AsyncOpenAI``).

    Returns ``{"reward": float, "success": bool}``.
    """
    env = make_env(task.data.get("env", "shop"), **task.data.get("env_kwargs", {}))
    page = env.reset(task)
    history: list[str] = []
    reward, success = 0.0, False
    for _ in range(env.max_turns):
        reply = await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": prompt(history, page, env.instruction())}],
            max_tokens=MAX_TOKENS,
            extra_headers={"X-Credo-State": env.state_key()},
        )
        action = (reply.choices[0].message.content or "").strip()
        result = env.step(action)
        history.append(action)
        page, reward = result.observation, reward + result.reward
        if result.done:
            success = bool(result.info.get("success", False))
            break
    return {"reward": reward, "success": success}


if __name__ == "__main__":
    from against_a_server import main  # beside this file

    main(run, "run the example agent against an OpenAI API server")
