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


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[str(x) for x in r])
    Console().print(table)


def warm_policy(cfg: Any, path: str | None = None) -> tuple[Any, Any, Any, Any]:
    """``(policy, renderer, make_env, env)`` for ``cfg``: the default run's warm-start
    policy (trained once, then from the cache), or with ``path`` a saved built-in policy
    folder (a run's ``final_policy``, a cached warm start)."""
    from credo.policy.hf import HFPolicy
    from credo.train.setup import (
        build_env_factory,
        build_policy,
        configure_runtime,
        make_run_renderer,
        warm_start,
    )

    configure_runtime(cfg)
    make_env = build_env_factory(cfg)
    env = make_env()
    if path is not None:
        policy = HFPolicy.from_pretrained(path)
        return policy, make_run_renderer(cfg, policy, True, env), make_env, env
    policy, builtin = build_policy(cfg, env, make_env)
    renderer = make_run_renderer(cfg, policy, builtin, env)
    policy, _ = warm_start(cfg, policy, renderer, make_env)
    return policy, renderer, make_env, env
