"""Tree vs. group sampling: generated tokens and wall time per informative group.

Same policy (the default run's warm start on ``shop``), same tasks, B = 8 leaves
(env-episodes) per task for every sampler, temperature 1. A group (a task's B leaves) is
*informative* when its outcomes are mixed (some leaf succeeded, some failed): only then
does a success-based group baseline give a non-zero learning signal. The tree sampler
generates each shared prefix once, so it should pay clearly less per informative group.

Samplers: ``group`` (GRPO's G = 8 independent episodes), ``tree/uniform`` (4 roots + 4
branches at random nodes) and ``tree/likelihood`` (split and nodes from the success
model; it is first fitted on ``--warmup`` batches of other tasks, as it would be after a
few training iterations). Each runs ``--batches`` batches of ``--tasks`` tasks, with
the same policy RNG seed per batch.

    python benchmarks/tree_vs_group.py [--tasks 32] [--batches 3] [--warmup 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import print_table, warm_policy

from credo.envs import Task
from credo.rollout import LikelihoodAllocator, TreeParams, sample_groups, sample_trees
from credo.train.config import load_config


def informative_groups(forest) -> int:  # type: ignore[no-untyped-def]
    """Groups whose leaves have mixed success."""
    ep = forest.episodes()
    groups = torch.unique(ep.group)
    mixed = 0
    for g in groups.tolist():
        s = ep.success[ep.group == g]
        mixed += int(bool(s.any()) and not bool(s.all()))
    return mixed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    cfg = load_config("grpo", [f"train.threads={args.threads}"])
    built, policy = warm_policy(cfg)
    b = args.budget

    allocator = LikelihoodAllocator()
    for w in range(args.warmup):  # fit the success model on other tasks first
        tasks = [Task.make("train", 90_000 + w * args.tasks + i) for i in range(args.tasks)]
        sample_trees(
            built.sampler_context(policy, generator=torch.Generator().manual_seed(10_000 + w)),
            tasks,
            params=TreeParams(allocator="likelihood"),
            state=allocator,
            group_size=b,
        )

    def run(name: str, batch: int, tasks: list[Task], gen: torch.Generator) -> object:
        if name == "group":
            return sample_groups(
                built.sampler_context(policy, generator=gen),
                tasks,
                group_size=b,
            )
        kind = name.split("/")[1]
        return sample_trees(
            built.sampler_context(policy, generator=gen, choice_seed=batch),
            tasks,
            params=TreeParams(allocator=kind),
            state=allocator if kind == "likelihood" else None,
            group_size=b,
        )

    names = ["group", "tree/uniform", "tree/likelihood"]
    totals = {n: {"tokens": 0, "seconds": 0.0, "informative": 0, "groups": 0, "leaves": 0,
                  "steps": 0, "success": 0.0} for n in names}  # fmt: skip
    for batch in range(args.batches):
        tasks = [Task.make("train", 70_000 + batch * args.tasks + i) for i in range(args.tasks)]
        for name in names:
            t = time.perf_counter()
            res = run(name, batch, tasks, torch.Generator().manual_seed(batch))
            sec = time.perf_counter() - t
            tot = totals[name]
            tot["tokens"] += res.generated_tokens
            tot["seconds"] += sec
            tot["informative"] += informative_groups(res.forest)
            tot["groups"] += len(tasks)
            ep = res.forest.episodes()
            tot["leaves"] += ep.num_episodes
            tot["steps"] += res.env_steps
            tot["success"] += float(ep.success.float().sum())
    rows = []
    for name in names:
        t = totals[name]
        inf = max(1, t["informative"])
        rows.append(
            [
                name,
                t["leaves"] // t["groups"],
                f"{t['informative']}/{t['groups']}",
                f"{t['success'] / t['leaves']:.2f}",
                t["tokens"],
                t["steps"],
                f"{t['seconds']:.1f}",
                f"{t['tokens'] / inf:.0f}",
                f"{t['seconds'] / inf:.3f}",
            ]
        )
    print_table(
        f"tree vs group on shop, warm-start policy, {args.batches} x {args.tasks} tasks, "
        f"B = {b} leaves/task, {args.threads} thread(s)",
        [
            "sampler",
            "leaves/task",
            "informative groups",
            "leaf success",
            "gen tokens",
            "env steps",
            "seconds",
            "tokens / informative group",
            "seconds / informative group",
        ],
        rows,
    )
    g, u = totals["group"], totals["tree/likelihood"]
    print(
        "tree/likelihood vs group, tokens per informative group: "
        f"{(u['tokens'] / max(1, u['informative'])) / (g['tokens'] / max(1, g['informative'])):.2f}x"
    )


if __name__ == "__main__":
    main()
