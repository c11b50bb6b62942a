"""Helpers shared by the benchmark scripts (not part of the library)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def print_table(
    title: str, columns: list[str], rows: list[list[Any]], *, width: int | None = None
) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[str(x) for x in r])
    Console(width=width).print(table)


def warm_policy(cfg: Any, path: str | None = None) -> tuple[Any, Any]:
    """``(run, policy)`` for ``cfg``: the run's parts and the default run's warm-start
    policy (trained once, then from the cache), or with ``path`` a saved policy folder
    (a run's ``final_policy``, a cached warm start)."""
    from credo.train.run import build_run
    from credo.train.warmstart import warm_start

    if path is not None:
        run = build_run(cfg, policy_path=path)
        return run, run.policy
    run = build_run(cfg)
    policy, _ = warm_start(run)
    return run, policy


def sample_first_iteration(run: Any, state: Any, seed: int) -> tuple[Any, Any]:
    """``(rollout, forest)``: iteration 0's tasks of ``state`` sampled with ``state``'s
    policy and sampler state under ``seed``, as the trainer would; ``forest`` without
    the oracle-continuation rows (SERO's), the forest credit assignment sees."""
    import torch

    from credo.train.iteration import split_oracle

    rollout = run.rollouts(
        state.policy,
        state.tasks.draw(0, seed),
        generator=torch.Generator().manual_seed(seed),
        choice_seed=seed,
        state=state.sampler_state,
    )
    forest, _ = split_oracle(rollout.forest)
    return rollout, forest
