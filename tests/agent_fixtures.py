"""Agents for tests/test_train_agent.py: ordinary ``openai``-client agents that play the
env their task names (``examples.custom_env:GuessEnv``) through its text interface.

``agent`` returns the env's return minus a small brevity cost (0.01 per word the model
wrote), so that even an untrained model's episodes get different rewards and the
advantages are not all zero. ``flaky_agent`` is the same agent, except that the second
episode of every training task raises after its first request, and held-out tasks with
an odd seed raise before any request. ``silent_agent`` never reaches the model: it raises
before its first request in the first episode of each training task and otherwise
returns a success without asking the model anything.
"""

from __future__ import annotations

import re
from typing import Any

from credo.envs import make_env


async def agent(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """One episode of ``task``; returns ``{"reward", "success"}``."""
    env = make_env(task.data["env"], **task.data["env_kwargs"])
    page = env.reset(task)
    reward, success, words = 0.0, False, 0
    for _ in range(env.max_turns):
        reply = await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": f"{page} goal : {env.instruction()}"}],
            extra_headers={"X-Credo-State": env.state_key()},
        )
        text = reply.choices[0].message.content or ""
        words += len(text.split())
        result = env.step(text)
        page, reward = result.observation, reward + result.reward
        if result.done:
            success = bool(result.info.get("success", False))
            break
    return {"reward": reward - 0.01 * words, "success": success}


async def flaky_agent(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """:func:`agent`, failing as the module docstring says."""
    if task.split == "test" and task.seed % 2 == 1:
        raise RuntimeError("odd held-out task")
    if task.split == "train" and session_id.endswith("-1"):
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "the secret"}]
        )
        raise RuntimeError("the agent's own bug")
    return await agent(task, client, session_id)


async def silent_agent(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """Never calls the model (module docstring)."""
    if task.split == "train" and session_id.endswith("-0"):
        raise RuntimeError("failed before the first request")
    return {"reward": 0.5, "success": True}


#: The system prompt of :func:`styled_agent`: its own words, its own reply format.
STYLE = "You play a number game. Answer with one line: MOVE: guess[n]"


async def styled_agent(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """An agent as a user writes one: its own system prompt and wording, only the last
    two observations kept, and a regex for ``MOVE: ...`` (case and spaces tolerated, as
    the built-in tokenizer writes lower case and spaces out punctuation); a reply without
    a move ends the episode as a failure."""
    env = make_env(task.data["env"], **task.data["env_kwargs"])
    seen = [env.reset(task)]
    for _ in range(env.max_turns):
        recent = " | ".join(seen[-2:])
        reply = await client.chat.completions.create(
            model="policy",
            messages=[
                {"role": "system", "content": STYLE},
                {
                    "role": "user",
                    "content": f"Game: {env.instruction()}. Recent: {recent}. Your move?",
                },
            ],
            max_tokens=12,
        )
        found = re.search(r"move\s*:\s*(.+)", reply.choices[0].message.content or "", re.I)
        if found is None:
            return {"reward": 0.0, "success": False}
        result = env.step(found.group(1).strip())
        seen.append(result.observation)
        if result.done:
            success = bool(result.info.get("success", False))
            return {"reward": float(success), "success": success}
    return {"reward": 0.0, "success": False}


#: Not a function: refused by ``--agent``.
NOT_CALLABLE = 3


class NoOracleEnv:
    """An env without ``oracle_action``: nothing to warm-start an agent run from."""

    max_turns = 1

    def reset(self, task: Any, seed: int = 0) -> str:
        return "say done"

    def step(self, action: str) -> Any:
        from credo.envs import StepResult

        ok = action.strip() == "done"
        return StepResult("over", float(ok), True, {"valid": True, "success": ok})

    def state_key(self) -> str:
        return "start"

    def snapshot(self) -> int:
        return 0

    def restore(self, snap: int) -> None:
        pass
