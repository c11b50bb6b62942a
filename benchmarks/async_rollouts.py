"""Asynchronous rollouts: wall time per iteration, synchronous vs ``rollout.staleness``
k = 1, 2 (the next iterations sampled by a worker thread while the trainer updates).

Each setting trains the same run (TextLights 6-9 lamps, the studies' 64-wide built-in
model and warm start, ``train.threads=1``: one core samples while the other updates)
for ``--iterations`` iterations; the table has the mean wall time per iteration after
the first (``time/iteration_s``), the time the trainer waited for rollouts
(``time/rollout_s``) and for the update, env steps per second, and the training
success of the last iterations. Ratios are only meaningful measured in one run on cores
nothing else uses.

The worker that samples ahead is a thread of the trainer's process or, with
``--workers process``, a forked process with its own interpreter
(``rollout.async_worker``); each k ≥ 1 runs once per worker named.

    python benchmarks/async_rollouts.py [--iterations 12] [--staleness 0 1 2]
        [--workers thread process] [--model smollm2-135m] [--engine vllm]
        [--tasks 4 --group 4]

``--engine vllm`` (from the vLLM venv, ``make vllm-check``) samples with vLLM on CPU
(the thread worker syncs it with each version's weights); the built-in model then has
2 heads of 32 (vLLM's CPU attention has no 16-wide kernel).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from _common import print_table

from credo.train.config import load_config
from credo.train.loop import train

LIGHTS = [
    "env.name=gym:credo/TextLights-v0",
    "env.kwargs={make_kwargs: {min_lamps: 6, max_lamps: 9, max_episode_steps: 11}}",
    "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128}",
    "sft.episodes=600",
    "sft.noisy_episodes=200",
    "sft.noisy_steps=20",
    "sft.epsilon=0.5",
    "sft.steps=150",
    "rollout.max_new_tokens=6",
    "train.threads=1",
    "eval.episodes=8",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workers", nargs="+", default=["thread"], choices=["thread", "process"])
    ap.add_argument("--model", default=None, help="a Hugging Face model (default: built-in)")
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="rollout.engine")
    ap.add_argument("--tasks", type=int, default=None, help="rollout.tasks_per_iter")
    ap.add_argument("--group", type=int, default=None, help="rollout.group_size")
    args = ap.parse_args()
    base = list(LIGHTS)
    if args.model is not None:
        base = [b for b in base if not b.startswith(("model.tiny", "sft."))]
        # the table reads training metrics only: the evaluations are kept minimal
        base += [f"model.name={args.model}", "sft.enabled=false", "eval.episodes=1"]
    if args.engine == "vllm":  # vLLM's CPU attention runs 32-wide heads, not 16
        base = [b.replace("num_heads: 4", "num_heads: 2") for b in base]
        base += [
            "rollout.engine=vllm",
            "rollout.engine_params={dtype: float32, enforce_eager: true}",
            "objective.tis_cap=2",
        ]
    if args.tasks is not None:
        base.append(f"rollout.tasks_per_iter={args.tasks}")
    if args.group is not None:
        base.append(f"rollout.group_size={args.group}")
    rows = []
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        settings = [(k, w) for k in args.staleness for w in (args.workers if k else ["-"])]
        for k, worker in settings:
            cfg = load_config(
                "grpo",
                [
                    *base,
                    f"rollout.staleness={k}",
                    f"rollout.async_worker={'thread' if worker == '-' else worker}",
                    f"train.iterations={args.iterations}",
                    f"train.runs_dir={tmp}",
                    f"train.name=k{k}-{worker}",
                ],
            )
            res = train(cfg, quiet=True)
            recs = res.metrics[1:]  # the first iteration has nothing to overlap with
            if not recs:  # stopped (SIGTERM, Ctrl-C) before a second iteration
                print(
                    f"k = {k} ({worker}) stopped after {len(res.metrics)} iteration(s): "
                    "not measured; the table holds the settings before it"
                )
                break
            per_it = statistics.fmean(r["time/iteration_s"] for r in recs)
            reference = reference or per_it
            rows.append(
                [
                    f"k = {k}" + (" (synchronous)" if k == 0 else ""),
                    worker,
                    f"{per_it:.2f}",
                    f"{reference / per_it:.2f}x",
                    f"{statistics.fmean(r['time/rollout_s'] for r in recs):.2f}",
                    f"{statistics.fmean(r['time/update_s'] for r in recs):.2f}",
                    f"{sum(r['rollout/env_steps'] for r in recs) / (per_it * len(recs)):.0f}",
                    f"{statistics.fmean(r['rollout/success_rate'] for r in res.metrics[-4:]):.3f}",
                ]
            )
            print(f"measured k = {k} ({worker}): {per_it:.2f} s / iteration", flush=True)
    print_table(
        f"asynchronous rollouts, {args.iterations} iterations of GRPO "
        f"({'built-in model' if args.model is None else args.model}, "
        f"rollout.engine={args.engine}, TextLights)",
        [
            "staleness",
            "worker",
            "s / iteration",
            "speed-up",
            "waiting for rollouts (s)",
            "update (s)",
            "env steps per wall second",
            "training success, last 4",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
