"""Run logging: ``metrics.jsonl``, TensorBoard events, the live progress bar and plots."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from credo.utils.atomic import write_file_atomic, write_text_atomic

__all__ = ["MetricsLog", "curves_figure", "plot_curves", "read_metrics"]


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


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(env steps, value) of the records that have ``key``."""
    pts = [
        (r["rollout/env_steps_total"], float(r[key]))
        for r in records
        if key in r and "rollout/env_steps_total" in r
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_curves(
    runs: dict[str, list[dict[str, Any]]],
    path: Path,
    *,
    title: str = "",
    baselines: dict[str, float] | None = None,
    final: dict[str, float] | None = None,
) -> Path:
    """Success, return, invalid-action rate and entropy vs. env steps, one line per run
    (or per recipe), in four panels side by side, so that an instability (entropy
    collapsing, invalid actions rising) shows next to the success curve it explains.

    Lines at 0 (or 1) stay visible: the success and invalid-rate axes run slightly past
    [0, 1] and every line carries markers when it has few points. Each baseline is a
    labelled dotted line in the legend; each final held-out result is a labelled star at
    the run's last env step.

    Args:
        runs: label → metric records (``rollout/env_steps_total``,
            ``rollout/success_rate``, ``rollout/return_mean``, and when present
            ``eval/success_rate``, ``rollout/invalid_rate``, ``policy/entropy``).
        path: PNG to write.
        title: figure title.
        baselines: label → held-out success drawn as horizontal lines (e.g. the warm
            start, or the initial policy without one).
        final: label (a key of ``runs``) → the trained policy's final held-out success,
            marked at the end of that run's curve.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = curves_figure(runs, title=title, baselines=baselines, final=final)
    path = Path(path)
    try:  # by temp-and-rename: a kill never leaves a half-written picture
        write_file_atomic(
            path, lambda tmp: fig.savefig(tmp, dpi=110, format=path.suffix[1:] or "png")
        )
    finally:
        plt.close(fig)
    return path


def curves_figure(
    runs: dict[str, list[dict[str, Any]]],
    *,
    title: str = "",
    baselines: dict[str, float] | None = None,
    final: dict[str, float] | None = None,
) -> Any:
    """The figure :func:`plot_curves` saves (a matplotlib ``Figure``; same arguments but
    the path). The caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("rollout/success_rate", "success rate"),
        ("rollout/return_mean", "episode return"),
        ("rollout/invalid_rate", "invalid-action rate"),
        ("policy/entropy", "policy entropy (per token)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 4.2))
    for label, records in runs.items():
        xs, _ = _series(records, "rollout/success_rate")
        if not xs:
            continue
        window = max(1, len(xs) // 15)
        marker = "." if len(xs) <= 30 else None
        color = None
        for ax, (key, _name) in zip(axes, panels):
            kx, ky = _series(records, key)
            if not kx:
                continue
            name = f"{label} (train rollouts)" if key == "rollout/success_rate" else label
            (line,) = ax.plot(
                kx, _smooth(ky, window), label=name, color=color, marker=marker, clip_on=False
            )
            color = line.get_color()
        ex, ey = _series(records, "eval/success_rate")
        if ex:
            axes[0].plot(ex, ey, "o--", color=color, label=f"{label} (held-out)", clip_on=False)
        if final and label in final:
            axes[0].plot(
                [xs[-1]],
                [final[label]],
                marker="*",
                markersize=14,
                linestyle="none",
                color=color,
                markeredgecolor="black",
                label=f"{label}: final held-out {final[label]:.1%}",
                clip_on=False,
                zorder=5,
            )
    greys = ["grey", "black", "silver", "dimgrey"]
    for i, (label, value) in enumerate((baselines or {}).items()):
        axes[0].axhline(
            value,
            linestyle=":",
            color=greys[i % len(greys)],
            linewidth=1.5,
            label=f"{label}: {value:.1%}",
        )
    for ax, (key, name) in zip(axes, panels):
        ax.set_title(name)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        if key in ("rollout/success_rate", "rollout/invalid_rate"):
            ax.set_ylim(-0.03, 1.03)
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    axes[0].legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
