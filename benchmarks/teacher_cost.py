"""What a teacher costs: seconds per iteration spent scoring, and peak memory, per recipe.

Each recipe trains a few iterations with ``credo train`` in its own child process (so that
its peak memory, ``wait4``'s ``ru_maxrss``, is its own), from the same cached warm start,
on the same tasks. From each run's ``metrics.jsonl`` the table shows the mean seconds per
iteration, the teacher's share of them (``teacher/seconds``: scoring the student's rows
in the teacher's context, no graph), the tokens the teacher read per iteration
(``teacher/tokens``) and the process's peak resident memory, with GRPO as the yardstick.

``opd`` and ``oprd`` need a teacher run: ``--teacher RUN_DIR`` (OPRD's base:
``--teacher-base FOLDER``, e.g. the teacher's warm start). Without it the script first
trains one with GRPO for ``--teacher-iterations`` iterations and uses its warm start as
the base (its quality does not change the cost).

    PYTHONPATH=src python benchmarks/teacher_cost.py --iterations 5
    PYTHONPATH=src python benchmarks/teacher_cost.py --teacher runs/teachers-multi/strong \\
        --teacher-base runs/teachers-multi/strong-base --iterations 10

Timings on a shared machine move from run to run; compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _common  # puts the repository root on sys.path

from credo.utils.cache import cache_dir

#: The env and budget of every run (``shop/multi``, as the README's comparison).
COMMON = ["env.kwargs.difficulty=multi", "train.threads=1", "eval.episodes=20"]
RECIPES = "grpo,opd,oprd,mt_sdpo,renyi_opsd"


def train(recipe: str, overrides: list[str], folder: Path) -> tuple[list[dict], float]:
    """Train ``recipe`` in a child process into ``folder``; return its per-iteration
    metrics and its peak RSS in GiB."""
    argv = [
        sys.executable,
        "-m",
        "credo",
        "train",
        "--recipe",
        recipe,
        *overrides,
        f"train.runs_dir={folder.parent}",
        f"train.name={folder.name}",
    ]
    log = folder.parent / f"{folder.name}.log"
    with log.open("w") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        tail = log.read_text().strip().splitlines()[-1:]
        raise SystemExit(f"{recipe} failed: {' '.join(argv)}: {' '.join(tail)}")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/iteration_s" in r], usage.ru_maxrss / 2**20


def mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(float(r.get(key, 0.0)) for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", default=RECIPES, help=f"comma-separated (default {RECIPES})")
    ap.add_argument("--iterations", type=int, default=5, help="RL iterations per recipe")
    ap.add_argument("--teacher", help="teacher run folder for opd and oprd")
    ap.add_argument("--teacher-base", help="OPRD: the teacher's base model folder")
    ap.add_argument(
        "--teacher-iterations",
        type=int,
        default=3,
        help="GRPO iterations of the teacher trained when --teacher is not given",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = ap.parse_args()
    common = [*COMMON, f"train.seed={args.seed}", *args.overrides]
    with tempfile.TemporaryDirectory(prefix="credo-teacher-cost-") as tmp:
        teacher, base = args.teacher, args.teacher_base
        if teacher is None:
            folder = Path(tmp) / "teacher"
            train("grpo", [*common, f"train.iterations={args.teacher_iterations}"], folder)
            key = json.loads((folder / "warmstart.json").read_text())["key"]
            teacher, base = str(folder), str(cache_dir() / "warmstart" / key / "policy")
        results = {}
        for recipe in args.recipes.split(","):
            extra = {
                "opd": [f"teacher.path={teacher}"],
                "oprd": [f"teacher.path={teacher}", f"teacher.base_path={base}"],
            }.get(recipe, [])
            overrides = [*common, f"train.iterations={args.iterations}", *extra]
            print(f"{recipe} …", flush=True)
            results[recipe] = train(recipe, overrides, Path(tmp) / recipe)
    ref_it = mean(results["grpo"][0], "time/iteration_s") if "grpo" in results else None
    ref_peak = results["grpo"][1] if "grpo" in results else None
    table = []
    for recipe, (rows, peak) in results.items():
        it, teach = mean(rows, "time/iteration_s"), mean(rows, "teacher/seconds")
        table.append(
            [
                recipe,
                f"{it:.2f}",
                f"{it / ref_it:.2f}×" if ref_it else "—",
                f"{teach:.2f}",
                f"{teach / it:.0%}",
                f"{mean(rows, 'teacher/tokens'):,.0f}",
                f"{peak:.2f}",
                f"{peak / ref_peak:.2f}×" if ref_peak else "—",
            ]
        )
    _common.print_table(
        f"teacher cost: {args.iterations} iterations, {' '.join(common)}",
        [
            "recipe",
            "s/iteration",
            "× grpo",
            "teacher s/iteration",
            "teacher share",
            "teacher tokens/iteration",
            "peak RSS GiB",
            "× grpo",
        ],
        table,
        width=160,
    )


if __name__ == "__main__":
    main()
