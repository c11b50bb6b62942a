"""Run an example agent against any OpenAI-compatible server, outside training:
``python examples/<agent>.py --base-url http://127.0.0.1:8000/v1`` (e.g. ``credo serve``
or vLLM) plays ``--tasks`` held-out tasks of ``--env`` and prints how many were solved.

Every example agent ends with ``main(run, description)``; the agent itself is the same
function ``credo train --agent examples/<agent>.py:run`` trains.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from credo.envs.base import Task

Agent = Callable[[Task, Any, str], Awaitable[dict[str, Any]]]


async def _play(run: Agent, base_url: str, api_key: str, tasks: int, env: str) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=120, max_retries=0)
    try:
        results = await asyncio.gather(
            *(
                run(Task("test", Task.make("test", i).seed, {"env": env}), client, f"demo-{i}")
                for i in range(tasks)
            )
        )
    finally:
        await client.close()
    wins = sum(r["success"] for r in results)
    print(
        f"{wins}/{tasks} tasks solved, mean reward {sum(r['reward'] for r in results) / tasks:.3f}"
    )


def main(run: Agent, description: str, env: str = "shop") -> None:
    """The command line of an example agent (see the module docstring); ``env`` is the
    default of ``--env``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--env", default=env)
    a = p.parse_args()
    asyncio.run(_play(run, a.base_url, a.api_key, a.tasks, a.env))
