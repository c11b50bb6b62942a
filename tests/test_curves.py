"""curves.png (credo.train.logging.plot_curves): labelled baselines, a visible 0-success
line, the final held-out result marked, invalid rate and entropy beside success."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from credo.train.logging import curves_figure, plot_curves


def _records(n: int, success: float) -> list[dict]:
    return [
        {
            "rollout/env_steps_total": 100 * (i + 1),
            "rollout/success_rate": success,
            "rollout/return_mean": success,
            "rollout/invalid_rate": 1.0 - 0.1 * i,
            "policy/entropy": 2.0 - 0.5 * i,
        }
        for i in range(n)
    ]


def test_curves_are_labelled_and_zero_lines_visible(tmp_path: Path) -> None:
    fig = curves_figure(
        {"grpo": _records(3, 0.0)},
        title="t",
        baselines={"initial policy (no warm start), held-out": 0.0},
        final={"grpo": 0.25},
    )
    try:
        axes = fig.axes
        assert [a.get_title() for a in axes] == [
            "success rate",
            "episode return",
            "invalid-action rate",
            "policy entropy (per token)",
        ]
        labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
        assert "grpo (train rollouts)" in labels
        assert "initial policy (no warm start), held-out: 0.0%" in labels
        assert "grpo: final held-out 25.0%" in labels
        low, high = axes[0].get_ylim()
        assert low < 0.0 and high > 1.0  # a line at 0 (or 1) is not hidden by the frame
        star = next(ln for ln in axes[0].lines if ln.get_label().startswith("grpo: final"))
        assert list(star.get_xdata()) == [300] and list(star.get_ydata()) == [0.25]
        ent = axes[3].lines[0]
        assert list(ent.get_ydata()) == [2.0, 1.5, 1.0]
    finally:
        plt.close(fig)
    out = plot_curves({"grpo": _records(2, 0.5)}, tmp_path / "c.png", final={"grpo": 0.5})
    assert out.stat().st_size > 1000
