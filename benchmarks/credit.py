"""Benchmark the advantage estimators: vectorised vs. loop reference, and scaling.

Builds synthetic linear forests (groups of 8 episodes of 8–16 steps, ~12 on average;
states drawn from a small per-group alphabet so that states repeat within a group and
the trajectory graphs merge and have cycles; outcome reward 0/1 on the last step) and
prints one table: per estimator, the vectorised time and rows/s at each size, the loop
reference (``tests/credit_reference.py``) time at the first size, the speedup and the
time ratio between the last and the first size.

The forests are built directly from tensors (``RolloutForest(...)`` with empty token
lists), not with ``ForestBuilder``, which would take minutes at 4M rows.

A loop reference whose projected time exceeds ``--loop-budget`` seconds (default 120) is
timed on a prefix of whole groups and extrapolated linearly in rows; the table marks it.

    python benchmarks/credit.py [--rows 1000000 4000000] [--estimators grpo gigpo ...]

Adding an estimator: every registered estimator is called with its default parameters;
put parameters in :data:`PARAMS` if it needs others, and its loop reference in
``REFERENCES`` of ``tests/credit_reference.py``. A stateful estimator (ProAS) gets a fresh
state that has already seen the forest's successful episodes (so its shaping path runs),
built outside the timed call.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from credit_reference import REFERENCES
from credo.credit import compute_advantages, estimator_names, estimator_state_factory
from credo.data import RolloutForest

#: estimator name → parameters for the benchmark (default parameters when absent)
PARAMS: dict[str, dict] = {}
#: estimator name → rows to time its loop reference on before extrapolating (its
#: reference is quadratic in a group's rows: kept small, and the linear extrapolation then
#: *under*-states the loop's time, i.e. the speedup shown is a lower bound)
PROBE_ROWS: dict[str, int] = {"tsbpo": 2_000}

GROUP_SIZE = 8
MIN_LEN, MAX_LEN = 8, 16
NUM_STATES = 24


def synthetic_forest(rows: int, seed: int = 0) -> RolloutForest:
    """A linear forest of about ``rows`` rows (whole groups) built from tensors."""
    gen = torch.Generator().manual_seed(seed)
    mean_len = (MIN_LEN + MAX_LEN) / 2
    groups = max(1, round(rows / (GROUP_SIZE * mean_len)))
    e = groups * GROUP_SIZE
    length = torch.randint(MIN_LEN, MAX_LEN + 1, (e,), generator=gen)
    n = int(length.sum())
    ptr = torch.zeros(e + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(length, 0)
    episode = torch.repeat_interleave(torch.arange(e), length)
    idx = torch.arange(n)
    t = idx - ptr[episode]
    parent = torch.where(t > 0, idx - 1, torch.full_like(idx, -1))
    last = t == (length[episode] - 1)
    # state 0 is the task's start; later states repeat within the group (and revisit)
    state = torch.randint(1, NUM_STATES, (n,), generator=gen)
    state[t == 0] = 0
    success = torch.rand(e, generator=gen) < 0.5
    next_state = torch.empty_like(state)
    next_state[:-1] = state[1:]
    next_state[last] = 1000 + success.long()  # terminal states: 1000 failed, 1001 solved
    reward = torch.zeros(n, dtype=torch.float32)
    reward[last] = success.float()
    return RolloutForest(
        group=episode // GROUP_SIZE,
        parent=parent,
        t=t,
        state=state,
        next_state=next_state,
        reward=reward,
        terminal=last,
        source=torch.zeros(n, dtype=torch.int8),
        valid=torch.ones(n, dtype=torch.bool),
        success=last & (reward > 0),
    )


def fresh(forest: RolloutForest) -> RolloutForest:
    """The same columns without the cached episode index (so every timing builds it)."""
    return dataclasses.replace(forest, _episodes=None)


def prefix_groups(forest: RolloutForest, rows: int) -> RolloutForest:
    """The first whole groups of ``forest`` holding at least ``rows`` rows (rows are
    stored group by group)."""
    if rows >= forest.num_rows:
        return forest
    g = int(forest.group[rows - 1])
    end = int(torch.searchsorted(forest.group, torch.tensor(g), right=True))
    return forest.select(torch.arange(end))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def estimator_state(name: str, forest: RolloutForest) -> object | None:
    """A fresh state for a stateful estimator, seeded with ``forest``'s successes."""
    factory = estimator_state_factory(name)
    if factory is None:
        return None
    state = factory()
    state.add_episodes(fresh(forest))
    return state


def time_estimator(name: str, params: dict, forest: RolloutForest, repeat: int) -> float:
    """Best of ``repeat`` vectorised calls (episode index built inside each timing)."""
    best = float("inf")
    for _ in range(repeat):
        f, state = fresh(forest), estimator_state(name, forest)
        best = min(best, timed(lambda f=f, s=state: compute_advantages(name, f, params, s)))
    return best


def time_memory(rows: int, repeat: int) -> float:
    """Best of ``repeat`` runs of 10 allocating float64 passes over ``rows`` values plus
    one ``index_add_``: the machine's own scaling for memory-bound work of that size."""

    def passes() -> None:
        x = torch.ones(rows, dtype=torch.float64)
        for _ in range(10):
            x = x * 1.0001
        torch.zeros(rows, dtype=torch.float64).index_add_(0, torch.arange(rows), x)

    return min(timed(passes) for _ in range(repeat))


def time_loop(
    name: str, reference: Callable, forest: RolloutForest, budget: float, probe_rows: int
) -> tuple[float, bool]:
    """Seconds of the loop reference on ``forest``; (projected from a prefix?, flag)."""
    params = PARAMS.get(name, {})

    def run(f: RolloutForest) -> float:
        state = estimator_state(name, f)
        extra = {} if state is None else {"state": state}
        return timed(lambda: reference(f, **params, **extra))

    probe = prefix_groups(forest, PROBE_ROWS.get(name, probe_rows))
    secs = run(probe)
    projected = secs * forest.num_rows / probe.num_rows
    if probe.num_rows == forest.num_rows:
        return secs, False
    if projected > budget:
        return projected, True
    return run(forest), False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--estimators", nargs="+", default=None, help="default: all known")
    parser.add_argument("--loop-budget", type=float, default=120.0, help="seconds")
    parser.add_argument("--probe-rows", type=int, default=20_000)
    parser.add_argument("--no-loop", action="store_true", help="skip the loop references")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many timings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: shared machines)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    names = args.estimators or estimator_names()
    forests = {r: synthetic_forest(r, args.seed) for r in args.rows}
    first, last = args.rows[0], args.rows[-1]
    warm = synthetic_forest(2_000, args.seed + 1)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; forests: "
        + ", ".join(f"{r:,} → {f.num_rows:,} rows" for r, f in forests.items())
    )

    table = []
    for name in names:
        params = PARAMS.get(name, {})
        try:
            # warm-up, and "can we call it"
            compute_advantages(name, fresh(warm), params, estimator_state(name, warm))
        except Exception as err:  # an estimator that needs inputs this benchmark lacks
            print(f"skipping {name}: {type(err).__name__}: {err}")
            continue
        secs = {r: time_estimator(name, params, f, args.repeat) for r, f in forests.items()}
        loop, projected = None, False
        if not args.no_loop and name in REFERENCES:
            loop, projected = time_loop(
                name, REFERENCES[name], forests[first], args.loop_budget, args.probe_rows
            )
        table.append((name, secs, loop, projected))
        print(f"  {name}: done", flush=True)
    memory = {r: time_memory(f.num_rows, args.repeat) for r, f in forests.items()}
    table.append(("(memory-bound ref.) †", memory, None, False))

    def fmt_rate(r: int, s: float) -> str:
        return f"{forests[r].num_rows / s / 1e6:.2f}M"

    head = ["estimator"]
    for r in args.rows:
        head += [f"vec {r / 1e6:g}M s", "rows/s"]
    head += [f"loop {first / 1e6:g}M s", "speedup", f"{last / 1e6:g}M/{first / 1e6:g}M"]
    lines = [head]
    for name, secs, loop, projected in table:
        row = [name]
        for r in args.rows:
            row += [f"{secs[r]:.3f}", fmt_rate(r, secs[r])]
        if loop is None:
            row += ["—", "—"]
        else:
            row += [f"{loop:.1f}" + (" *" if projected else ""), f"{loop / secs[first]:.0f}×"]
        row.append(f"{secs[last] / secs[first]:.2f}")
        lines.append(row)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    print()
    for k, line in enumerate(lines):
        print(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths)))
        )
        if k == 0:
            print("  ".join("-" * w for w in widths))
    print(
        "\n† not an estimator: 10 allocating float64 passes + one index_add_ over N values, "
        "the machine's own time ratio for memory-bound work at these sizes"
    )
    if any(p for *_, p in table):
        print(
            f"\n* projected: timed on the first {args.probe_rows:,}+ rows (whole groups) and "
            f"extrapolated linearly, because the full run would exceed {args.loop_budget:g} s"
        )


if __name__ == "__main__":
    main()
