"""Two shop agents written the way people write them, not in credo's prompt layout.

Both talk to the model only through the ``openai`` client credo gives them, build the
shop from the task (``task.data``), and parse the reply themselves:

- :func:`agent_a`: a plain loop with its own system prompt and wording, the whole history
  of pages, and a regex for ``Action: ...`` (a reply without it ends the episode);
- :func:`agent_c`: the same, but it keeps only the last two observations in its prompt.

credo's own warm start teaches the model credo's prompt layout (``history : … page : …``),
which neither agent sends: through them it scores 0 % (issue 45's trial). The warm start
through the agent (``sft.agent_reply``) runs the agent itself with the shop's oracle
answering in the model's place, written as ``Action: <the oracle's action>``, and trains
on the exact prompts the agent sent:

    credo train --agent examples/own_style_agents.py:agent_a "sft.agent_reply='Action: {action}'"
    credo train --agent examples/own_style_agents.py:agent_c "sft.agent_reply='Action: {action}'"

``studies/agents-own-style.yaml`` measures both, 3 seeds.
"""

from __future__ import annotations

import re
from typing import Any

from credo.envs import make_env

SYSTEM = (
    "You are a shopping assistant. Read the store page and reply with exactly one line "
    "of the form Action: <what to do>."
)
ACTION = re.compile(r"action\s*:\s*(.+)", re.IGNORECASE)
MAX_TOKENS = 16


async def _episode(task: Any, client: Any, keep: int | None) -> dict[str, Any]:
    """One episode; ``keep``: the observations shown (``None``: all of them)."""
    env = make_env(task.data.get("env", "shop"), **task.data.get("env_kwargs", {}))
    seen = [env.reset(task)]
    goal = env.instruction()
    reward = 0.0
    for _ in range(env.max_turns):
        shown = seen if keep is None else seen[-keep:]
        pages = "\n".join(f"- {page}" for page in shown)
        reply = await client.chat.completions.create(
            model="policy",
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"I want: {goal}\nWhat I saw:\n{pages}\nNext?"},
            ],
            max_tokens=MAX_TOKENS,
        )
        found = ACTION.search(reply.choices[0].message.content or "")
        if found is None:  # no action in the reply: the episode fails
            return {"reward": reward, "success": False}
        result = env.step(found.group(1).strip())
        seen.append(result.observation)
        reward += result.reward
        if result.done:
            return {"reward": reward, "success": bool(result.info.get("success", False))}
    return {"reward": reward, "success": False}


async def agent_a(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """Own system prompt and wording, every page so far, a regex for ``Action:``."""
    return await _episode(task, client, keep=None)


async def agent_c(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """As :func:`agent_a`, with only the last two observations in the prompt."""
    return await _episode(task, client, keep=2)
