"""Agents that block: wall time of one round of ``--agents`` agents, each doing ``--turns``
turns of a blocking wait of ``--sleep`` seconds (a synchronous HTTP tool, ``time.sleep``)
followed by one model request, through :func:`credo.serve.run_agent_episodes`.

- ``async def`` + ``time.sleep``: the agent written as ``async def`` but calling something
  blocking. All agents share one event loop, so each wait stalls all the others: about
  ``agents x turns x sleep`` seconds (how every blocking agent ran before plain ``def``
  agents were accepted).
- ``def`` + ``time.sleep``: the same agent as a plain ``def`` (with the synchronous
  ``openai`` client): it runs in a thread of its own, so the waits overlap: about
  ``turns x sleep`` seconds plus the requests.
- ``async def`` + ``await asyncio.sleep``: the non-blocking form, for reference.

    python benchmarks/sync_agents.py [--agents 8] [--turns 3] [--sleep 0.5] [--reps 3]

The policy is the built-in model as a run builds it for ``shop``, untrained, sampling at
most ``--tokens`` tokens per request; the table shows the median of ``--reps`` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import torch
from _common import print_table

from credo.policy.base import SamplingParams
from credo.serve import EngineConfig, PolicyServer, run_agent_episodes
from credo.train.config import load_config
from credo.train.run import build_run

MESSAGES = [{"role": "user", "content": "page : home : search goal : buy a red shirt action :"}]


def _agents(turns: int, sleep_s: float) -> dict[str, Any]:
    """The three forms of the same agent (module docstring), by name."""

    async def async_blocking(task: Any, client: Any, session_id: str) -> float:
        for _ in range(turns):
            time.sleep(sleep_s)
            await client.chat.completions.create(model="m", messages=MESSAGES)
        return 1.0

    def sync_blocking(task: Any, client: Any, session_id: str) -> float:
        for _ in range(turns):
            time.sleep(sleep_s)
            client.chat.completions.create(model="m", messages=MESSAGES)
        return 1.0

    async def async_awaiting(task: Any, client: Any, session_id: str) -> float:
        for _ in range(turns):
            await asyncio.sleep(sleep_s)
            await client.chat.completions.create(model="m", messages=MESSAGES)
        return 1.0

    return {
        "async def + time.sleep (one event loop)": async_blocking,
        "def + time.sleep (a thread each)": sync_blocking,
        "async def + await asyncio.sleep": async_awaiting,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=0.5)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy = build_run(load_config("grpo", ["train.threads=1", "sft.enabled=false"])).policy
    engine = EngineConfig.from_sampling(SamplingParams(max_new_tokens=args.tokens))
    rows = []
    with PolicyServer(policy, engine=engine) as server:
        for name, agent in _agents(args.turns, args.sleep).items():
            times = []
            for _ in range(args.reps):
                t = time.perf_counter()
                res = run_agent_episodes(
                    policy, agent, ["t"], args.agents, timeout_s=300, server=server
                )
                times.append(time.perf_counter() - t)
                assert not any(e.error for e in res.episodes), [e.error for e in res.episodes]
            rows.append([name, f"{statistics.median(times):.2f}"])
    print_table(
        f"{args.agents} agents x {args.turns} turns, each a blocking {args.sleep} s wait then a "
        f"model request (median of {args.reps} rounds; waits alone: "
        f"{args.turns * args.sleep:.1f} s overlapped, "
        f"{args.agents * args.turns * args.sleep:.1f} s in turn)",
        ["agent", "wall time (s)"],
        rows,
    )


if __name__ == "__main__":
    main()
