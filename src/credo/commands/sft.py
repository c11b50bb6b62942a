"""``credo sft``: the warm start alone (trained, or loaded from the cache), and its
held-out evaluation.

It builds the run with :func:`~credo.train.run.build_run` and warm-starts as ``credo
train`` does (:func:`~credo.train.warmstart.warm_start`), so the number it prints is the
warm-start row of ``credo train``'s table.
"""

from __future__ import annotations

from typing import Any

from credo.train.config import Config
from credo.train.progress import Progress
from credo.train.run import build_run
from credo.train.warmstart import warm_start

__all__ = ["run_sft"]


def run_sft(cfg: Config, *, episodes: int | None = None, quiet: bool = False) -> dict[str, Any]:
    """Warm-start (or load it from the cache) and evaluate it on held-out tasks."""
    progress = Progress(enabled=not quiet)
    run = build_run(cfg)
    try:
        with progress.phase("warm start (SFT)") as tick:
            policy, ws = warm_start(
                run, on_step=lambda ph, s, n, loss: tick(s, n, f"{ph} loss {loss:.3f}")
            )
        with progress.phase("held-out eval"):
            ev = run.evaluate(policy, episodes=episodes)
    finally:
        run.close()
    return {"eval": ev, "path": ws.path, "cached": ws.cached}
