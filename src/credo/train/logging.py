"""Run logging: ``metrics.jsonl``, TensorBoard events, the live progress bar and plots."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from credo.utils.atomic import write_text_atomic

__all__ = ["MetricsLog", "plot_curves", "read_metrics"]


class MetricsLog:
    """Appends one JSON line per iteration and mirrors scalars to TensorBoard.

    Each record is appended with one ``write`` system call, so a kill leaves at most a
    torn last line (which :func:`read_metrics` skips and the next resume drops).

    Args:
        run_dir: the run folder.
        resume_from: keep only the lines with ``iteration < resume_from`` (rewritten
            atomically), so that the log of a resumed run equals that of an
            uninterrupted one; 0 (a fresh run, or a resume before the first checkpoint)
            starts an empty log; ``None`` keeps the file as it is. Iterations missing
            below ``resume_from`` (a file cut short) are listed in :attr:`missing`.
        purge_step: TensorBoard events at this x value and later, written before, are
            discarded by TensorBoard (``SummaryWriter(purge_step=...)``). The scalars are
            logged against ``rollout/env_steps_total``, so a resume from a checkpoint
            taken at ``E`` env steps passes ``E + 1``; ``None`` purges nothing.
        tensorboard: also write TensorBoard events (default true).

    Attributes:
        missing: iterations below ``resume_from`` that the file lacked.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        resume_from: int | None = None,
        purge_step: int | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.missing: list[int] = []
        if resume_from is not None and (resume_from == 0 or self.path.exists()):
            kept = [r for r in read_metrics(self.path) if r.get("iteration", -1) < resume_from]
            seen = {r.get("iteration") for r in kept}
            self.missing = [i for i in range(resume_from) if i not in seen]
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=purge_step)
            except ImportError:  # tensorboard is optional at run time
                self._tb = None

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        if self._tb is not None:
            step = int(record.get("rollout/env_steps_total", record.get("iteration", 0)))
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (a torn last line is ignored)."""
    out = []
    path = Path(path)
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def plot_curves(
    runs: dict[str, list[dict[str, Any]]],
    path: Path,
    *,
    title: str = "",
    baselines: dict[str, float] | None = None,
) -> Path:
    """Success rate and return vs. env steps, one line per run (or per recipe).

    Args:
        runs: label → metric records (``rollout/env_steps_total``,
            ``rollout/success_rate``, ``rollout/return_mean`` and optional
            ``eval/success_rate``).
        path: PNG to write.
        title: figure title.
        baselines: label → held-out success drawn as horizontal lines (e.g. the warm
            start).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, records in runs.items():
        xs = [r["rollout/env_steps_total"] for r in records if "rollout/success_rate" in r]
        if not xs:
            continue
        window = max(1, len(xs) // 15)
        sr = _smooth(
            [r["rollout/success_rate"] for r in records if "rollout/success_rate" in r], window
        )
        ret = _smooth(
            [r["rollout/return_mean"] for r in records if "rollout/success_rate" in r], window
        )
        (line,) = axes[0].plot(xs, sr, label=f"{label} (train rollouts)")
        axes[1].plot(xs, ret, label=label, color=line.get_color())
        ev = [
            (r["rollout/env_steps_total"], r["eval/success_rate"])
            for r in records
            if "eval/success_rate" in r
        ]
        if ev:
            axes[0].plot(*zip(*ev), "o--", color=line.get_color(), label=f"{label} (held-out)")
    for label, value in (baselines or {}).items():
        axes[0].axhline(value, linestyle=":", color="grey")
        axes[0].annotate(label, (0, value), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes[0].set_title("success rate")
    axes[1].set_title("episode return")
    for ax in axes:
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(0, 1)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
