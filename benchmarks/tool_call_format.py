"""Does a warm start through a tool-calling agent teach a chat model its calls?

``examples/tool_call_agent.py`` sends the ``tools`` env's store API as OpenAI ``tools=``
definitions and acts on ``message.tool_calls``. This script serves a model behind credo's
OpenAI endpoint, runs that agent unchanged on held-out tickets and reads every reply the
agent received, in two phases:

- **as it comes**: the model with no SFT (a chat model zero-shot);
- **warm start through the agent**: ``sft.agent_reply=tool_call`` (the env's oracle
  answers each of the agent's requests as a tool call; SFT on exactly the tokens the
  agent's requests render to; ``docs/serve.md``). The warm start is cached under the same
  key as ``credo train --agent examples/tool_call_agent.py:run ... sft.agent_reply=
  tool_call`` with the same settings, so RL can start from it.

Per phase it prints, over every request the agent sent: the share of replies that carry
a tool call, a valid store call (right tool, arguments and ids the store knows), and
exactly the oracle's call; the same for the first request of each ticket; and the
held-out success through the agent with its 95 % Wilson interval.

    python benchmarks/tool_call_format.py --sft-batch 8 --sft-lr 1e-4   # SmolLM2-135M, tools easy
    python benchmarks/tool_call_format.py --model null --sft-steps 600 \
        "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128}"

Extra ``key=value`` arguments are credo overrides for both phases.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _common import ROOT, print_table

AGENT = "examples/tool_call_agent.py:run"
#: where :func:`recording_agent` appends one JSON line per request (set by :func:`main`)
LOG_VAR = "CREDO_TOOL_CALL_LOG"


class _Recording:
    """An ``openai.AsyncOpenAI`` stand-in for the agent: every request goes to the real
    client; each reply is compared with the oracle of a mirror of the agent's env, which
    is then stepped with the agent's call (as the agent steps its own)."""

    def __init__(self, client: Any, env: Any, log: Path) -> None:
        self._client, self._env, self._log, self._turn = client, env, log, 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **kwargs: Any) -> Any:
        reply = await self._client.chat.completions.create(**kwargs)
        calls = reply.choices[0].message.tool_calls or []
        row = {"turn": self._turn, "call": bool(calls), "valid": False, "oracle": False}
        if calls:
            name, arguments = calls[0].function.name, calls[0].function.arguments
            want = self._env.action_as_call(self._env.oracle_action())
            try:
                args = json.loads(arguments)
            except ValueError:
                args = None
            row["oracle"] = want is not None and (name, args) == want
            result = self._env.step(f"{name} {arguments}")  # as the agent plays it
            row["valid"] = bool(result.info.get("valid", True))
        with self._log.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self._turn += 1
        return reply


@functools.cache
def _agent() -> Any:
    """The tool-calling agent's function (read once per load of this module)."""
    from credo.serve.agents import load_agent

    return load_agent(str(ROOT / AGENT))


async def recording_agent(task: Any, client: Any, session_id: str) -> dict[str, Any]:
    """The tool-calling agent, unchanged, with its replies recorded (:class:`_Recording`)."""
    from credo.envs import make_env

    agent = _agent()
    mirror = make_env(task.data.get("env", "tools"), **task.data.get("env_kwargs", {}))
    mirror.reset(task)
    return await agent(task, _Recording(client, mirror, Path(os.environ[LOG_VAR])), session_id)


def _shares(rows: list[dict[str, Any]]) -> list[str]:
    n = max(1, len(rows))
    return [f"{100 * sum(r[k] for r in rows) / n:.1f} %" for k in ("call", "valid", "oracle")]


def _phase(name: str, cfg: Any, episodes: int, seed: int) -> tuple[list[Any], dict[str, Any]]:
    """Evaluate ``cfg``'s policy (after its warm start, if enabled) through the recording
    agent; the table row and the raw numbers."""
    from dataclasses import replace

    from credo.agent import AgentSession, agent_params
    from credo.train.run import build_run
    from credo.train.warmstart import warm_start

    run = build_run(cfg)
    t0 = time.time()
    policy, _ = warm_start(run) if cfg.sft.enabled else (run.policy, None)
    sft_min = (time.time() - t0) / 60
    rec_cfg = replace(cfg, rollout=replace(cfg.rollout, agent=f"{__file__}:recording_agent"))
    session = AgentSession(agent_params(rec_cfg))
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "replies.jsonl"
        log.touch()
        os.environ[LOG_VAR] = str(log)
        try:
            t0 = time.time()
            res = session.evaluate(policy, run.sampling, episodes=episodes, seed=seed)
            eval_min = (time.time() - t0) / 60
        finally:
            session.close()
            run.close()
        rows = [json.loads(line) for line in log.read_text().splitlines()]
    first = [r for r in rows if r["turn"] == 0]
    row = [
        name,
        len(rows),
        *_shares(rows),
        *_shares(first),
        f"{100 * res.success_rate:.1f} % [{100 * res.ci_low:.1f}, {100 * res.ci_high:.1f}]",
        f"{res.mean_turns:.2f}",
        res.errors,
        f"{sft_min:.1f} / {eval_min:.1f}",
    ]
    raw = {
        "phase": name,
        "requests": len(rows),
        "all": _shares(rows),
        "first": _shares(first),
        "success": res.success_rate,
        "ci": [res.ci_low, res.ci_high],
        "mean_turns": res.mean_turns,
        "errors": res.errors,
        "sft_minutes": sft_min,
        "eval_minutes": eval_min,
    }
    return row, raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default="smollm2-135m",
        help="model.name (smollm2-135m; null: the built-in model)",
    )
    ap.add_argument("--difficulty", default="easy", help="tools difficulty (easy)")
    numbers: list[tuple[str, type, Any, str]] = [
        ("--sft-episodes", int, 200, "agent episodes of the warm start (200)"),
        ("--sft-steps", int, 80, "SFT steps (80)"),
        ("--sft-batch", int, None, "SFT rows per step (default: the config's)"),
        ("--sft-lr", float, None, "SFT learning rate (default: the config's)"),
        ("--episodes", int, 200, "held-out tickets (200)"),
        ("--threads", int, 2, "torch CPU threads (2)"),
        # the measured rows ran 16 at once; the default bound is the engine's batch (64)
        ("--concurrency", int, 16, "agent episodes at once (16)"),
    ]
    for flag, kind, default, text in numbers:
        ap.add_argument(flag, type=kind, default=default, help=text)
    ap.add_argument("--seed", type=int, default=0, help="SFT and evaluation seed (0)")
    ap.add_argument("--skip-zero-shot", action="store_true", help="only the warm start")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("overrides", nargs="*", help="credo overrides for both phases")
    args = ap.parse_args(argv)
    if bad := [o for o in args.overrides if "=" not in o]:
        ap.error(f"overrides are key=value, got {bad[0]!r}")

    from credo.train.config import ConfigError, load_config

    base = [
        f"model.name={args.model}",
        "env.name=tools",
        f"env.kwargs={{difficulty: {args.difficulty}}}",
        f"rollout.agent={AGENT}",
        f"rollout.agent_concurrency={args.concurrency}",
        "rollout.agent_timeout_s=1800",
        "rollout.max_new_tokens=48",
        f"train.threads={args.threads}",
        f"train.seed={args.seed}",
        "sft.agent_reply=tool_call",
        f"sft.episodes={args.sft_episodes}",
        "sft.noisy_episodes=0",
        "sft.noisy_steps=0",
        f"sft.steps={args.sft_steps}",
        *([f"sft.batch_size={args.sft_batch}"] if args.sft_batch is not None else []),
        *([f"sft.lr={args.sft_lr}"] if args.sft_lr is not None else []),
        f"sft.seed={args.seed}",
    ]
    phases = [] if args.skip_zero_shot else [("as it comes", ["sft.enabled=false"])]
    phases.append(("warm start through the agent", []))
    try:
        cfgs = [(n, load_config("grpo", [*base, *o, *args.overrides])) for n, o in phases]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, raws = [], []
    for name, cfg in cfgs:
        row, raw = _phase(name, cfg, args.episodes, args.seed)
        rows.append(row)
        raws.append(raw)
        if args.out is not None:
            args.out.write_text(json.dumps(raws, indent=1))
    print_table(
        f"{args.model} through {AGENT} on tools {args.difficulty}, {args.episodes} held-out "
        "tickets",
        [
            "phase",
            "requests",
            "call",
            "valid call",
            "oracle's call",
            "1st: call",
            "1st: valid",
            "1st: oracle's",
            "success [95 % CI]",
            "requests / ticket",
            "errors",
            "SFT / eval min",
        ],
        rows,
        width=220,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
