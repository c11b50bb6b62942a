"""Why a run learned or stalled: its health metrics in blocks of iterations, side by side,
and how its trained policy's held-out episodes end.

    python benchmarks/run_health.py RUN [RUN ...] [--block 10] [--episodes 500]

For each run folder: the mean of each health metric (``docs/metrics.md``) over blocks of
``--block`` iterations — training success, return, episode length, invalid actions,
entropy, advantage tails (|A| median and p99, share > 3), KL to the sampler at the last
optimizer step, gradient norm — then, with ``--episodes`` > 0, the trained policy
(``final_policy``) on the held-out tasks the run's final evaluation used (same seed), its
episodes grouped by how they ended: the episode's final score (the env's ``info["score"]``
when it reports one, e.g. ``shop``'s requirement score; 0.5 on a two-item list is one
item bought right), and whether the episode ended by its own action or at the turn limit.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import print_table as _print_table

#: (metric, column) of the blocks table
HEALTH = [
    ("rollout/success_rate", "success"),
    ("rollout/return_mean", "return"),
    ("rollout/episode_len", "length"),
    ("rollout/invalid_rate", "invalid"),
    ("policy/entropy", "entropy"),
    ("credit/adv_abs_p50", "|A| p50"),
    ("credit/adv_abs_p99", "|A| p99"),
    ("credit/adv_abs_gt3_frac", "|A|>3"),
    ("policy/kl_sampler_last", "KL last step"),
    ("policy/grad_norm", "grad norm"),
]


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    _print_table(title, columns, rows, width=180)


def blocks(run: Path, size: int) -> list[list[str]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out = []
    for lo in range(0, len(rows), size):
        part = rows[lo : lo + size]
        cells = [f"{lo}-{lo + len(part) - 1}"]
        for key, _ in HEALTH:
            vals = [r[key] for r in part if key in r]
            cells.append(f"{statistics.fmean(vals):.3f}" if vals else "—")
        out.append(cells)
    return out


def endings(run: Path, episodes: int) -> list[list[str]]:
    """The trained policy on the held-out tasks: episodes by final score and ending."""
    import yaml

    from credo.envs.base import Task
    from credo.rollout import SamplerContext, sample_groups
    from credo.train.config import Config
    from credo.train.run import build_run

    cfg = Config.from_dict(yaml.safe_load((run / "config.yaml").read_text()))
    parts = build_run(cfg, policy_path=run / "final_policy")
    import torch

    ctx = SamplerContext(
        parts.policy,
        parts.renderer,
        parts.make_env,
        parts.sampling,
        parts.max_turns,
        torch.Generator().manual_seed(cfg.eval.seed),
    )
    eps = []
    for start in range(0, episodes, 256):  # as the run's held-out evaluation samples them
        tasks = [Task.make("test", i) for i in range(start, min(episodes, start + 256))]
        eps += sample_groups(ctx, tasks, group_size=1).episodes
    limit = getattr(parts.make_env(), "max_turns", parts.max_turns)
    count: Counter[tuple[str, str]] = Counter()
    for e in eps:
        info = e.steps[-1].info if e.steps else {}
        score = info.get("score")
        bucket = "success" if e.success else ("—" if score is None else f"score {score:.2f}")
        ended = "turn limit" if len(e) >= limit and not e.success else "own action"
        count[(bucket, ended)] += 1
    return [
        [bucket, ended, str(n), f"{n / len(eps):.1%}"]
        for (bucket, ended), n in sorted(count.items(), key=lambda kv: -kv[1])
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders")
    ap.add_argument("--block", type=int, default=10, help="iterations per block (10)")
    ap.add_argument("--episodes", type=int, default=500, help="held-out episodes (0: none)")
    args = ap.parse_args()
    for run in args.runs:
        print_table(
            f"{run}: health per block",
            ["iterations", *(c for _, c in HEALTH)],
            blocks(run, args.block),
        )
        if args.episodes > 0:
            print_table(
                f"{run}: {args.episodes} held-out episodes of final_policy",
                ["final", "ended by", "episodes", "share"],
                endings(run, args.episodes),
            )


if __name__ == "__main__":
    main()
