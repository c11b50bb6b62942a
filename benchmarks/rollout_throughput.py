"""Rollout throughput: the batched group sampler vs. running episodes one at a time.

Same policy (the default run's warm start), same tasks, greedy decoding so that both
ways produce the very same episodes; prints env steps/s and generated tokens/s.

    python benchmarks/rollout_throughput.py [--tasks 16] [--group 8] [--policy DIR]

``--policy`` takes any saved policy folder (a run's ``final_policy``, a cached warm start)
instead of the default run's warm start (trained first if it is not cached).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from _common import print_table, warm_policy

from credo.envs import Task
from credo.rollout import sample_groups
from credo.train.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--policy", default=None, help="a saved policy folder (default: warm start)")
    args = ap.parse_args()
    cfg = load_config("grpo", [f"train.threads={args.threads}"])
    run, policy = warm_policy(cfg, args.policy)
    greedy = dataclasses.replace(run.sampling, temperature=0.0)
    tasks = [Task.make("train", 50_000 + i) for i in range(args.tasks)]

    t = time.perf_counter()
    batched = sample_groups(
        run.sampler_context(policy, sampling=greedy),
        tasks,
        group_size=args.group,
    )
    t_batched = time.perf_counter() - t

    t = time.perf_counter()
    single_steps = single_tokens = 0
    single_actions = []
    for task in tasks:
        for _ in range(args.group):
            one = sample_groups(
                run.sampler_context(policy, sampling=greedy),
                [task],
                group_size=1,
            )
            single_steps += one.env_steps
            single_tokens += one.generated_tokens
            single_actions.append([s.action for s in one.episodes[0].steps])
    t_single = time.perf_counter() - t

    same = single_actions == [[s.action for s in e.steps] for e in batched.episodes]
    rows = [
        [
            "batched (all live episodes per generate call)",
            batched.env_steps,
            f"{batched.env_steps / t_batched:.1f}",
            f"{batched.generated_tokens / t_batched:.0f}",
            f"{t_batched:.2f}",
        ],
        [
            "one episode at a time",
            single_steps,
            f"{single_steps / t_single:.1f}",
            f"{single_tokens / t_single:.0f}",
            f"{t_single:.2f}",
        ],
    ]
    print_table(
        f"rollout throughput, {args.tasks} tasks x {args.group} episodes (greedy)",
        ["sampler", "env steps", "env steps/s", "tokens/s", "seconds"],
        rows,
    )
    print(f"identical episodes both ways: {same}")
    print(
        f"speed-up (env steps/s): {(batched.env_steps / t_batched) / (single_steps / t_single):.1f}x"
    )


if __name__ == "__main__":
    main()
