"""The default `credo train`, measured: time, warm-start vs trained held-out success.

For each seed, runs the default command (`credo train --seed S`) in a fresh cache (so the
warm start is trained), then once more for the first seed with the warm start cached.
Prints one table and the median over seeds. Targets (issue 2): ≤ 15 min including the
warm start, ≤ 10 min cached; warm start in [10 %, 60 %]; trained ≥ warm + 20 points
(median of 3 seeds).

    python benchmarks/default_run.py [key=value overrides ...] [--seeds 0 1 2]

(overrides before ``--seeds``: after it, they would be read as seeds)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, print_table


def run(seed: int, cache: Path, runs: Path, name: str, extra: list[str]) -> dict:
    env = dict(os.environ, CREDO_CACHE=str(cache))
    cmd = [
        sys.executable,
        "-m",
        "credo.cli",
        "train",
        "--seed",
        str(seed),
        "--name",
        name,
        "--quiet",
        f"train.runs_dir={runs}",
        *extra,
    ]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    minutes = (time.perf_counter() - t) / 60
    run_dir = runs / name
    warm = json.loads((run_dir / "warmstart.json").read_text())
    final = json.loads((run_dir / "final_eval.json").read_text())
    return {
        "minutes": minutes,
        "warm": warm["eval"]["success_rate"],
        "final": final["success_rate"],
        "cached": warm["cached"],
        "episodes": final["episodes"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("extra", nargs="*", help="config overrides passed to every run")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="credo-bench-"))
    rows, results = [], []
    for seed in args.seeds:
        cache = work / f"cache{seed}"
        r = run(seed, cache, work / "runs", f"seed{seed}", args.extra)
        results.append(r)
        rows.append(
            [
                seed,
                "no",
                f"{r['minutes']:.1f}",
                f"{r['warm']:.1%}",
                f"{r['final']:.1%}",
                f"{r['final'] - r['warm']:+.1%}",
            ]
        )
        if seed == args.seeds[0]:
            c = run(seed, cache, work / "runs", f"seed{seed}-cached", args.extra)
            rows.append(
                [
                    seed,
                    "yes",
                    f"{c['minutes']:.1f}",
                    f"{c['warm']:.1%}",
                    f"{c['final']:.1%}",
                    f"{c['final'] - c['warm']:+.1%}",
                ]
            )
    med = lambda k: statistics.median(r[k] for r in results)  # noqa: E731
    rows.append(
        [
            "median",
            "no",
            f"{med('minutes'):.1f}",
            f"{med('warm'):.1%}",
            f"{med('final'):.1%}",
            f"{statistics.median(r['final'] - r['warm'] for r in results):+.1%}",
        ]
    )
    print_table(
        f"default `credo train` on {os.cpu_count()} CPU cores, held-out success on "
        f"{results[0]['episodes']} tasks",
        ["seed", "warm start cached", "minutes", "warm start", "trained", "change"],
        rows,
    )
    print(f"runs kept in {work}")


if __name__ == "__main__":
    main()
