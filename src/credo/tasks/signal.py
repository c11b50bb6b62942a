"""The per-episode reward a task source learns from: a number in [0, 1]."""

from __future__ import annotations

from credo.data.episode import Episode

__all__ = ["SIGNALS", "episode_signal"]

#: The signals :func:`episode_signal` computes.
SIGNALS = ("progress", "success", "return")


def episode_signal(episode: Episode, kind: str = "progress") -> float:
    """The progress reward of one episode, in [0, 1].

    Args:
        episode: a finished episode (a root-to-leaf path for tree samplers).
        kind: ``"progress"``: the env's ``progress()`` after the episode's last step
            (recorded by :func:`credo.envs.base.step_env` as ``info["progress"]``),
            or its success (1/0) when the env reports no progress; ``"success"``:
            1/0; ``"return"``: the episode return clipped to [0, 1].

    An episode that failed because the env raised scores 0.
    """
    if kind not in SIGNALS:
        raise ValueError(f"unknown task signal {kind!r}; valid: {', '.join(SIGNALS)}")
    if episode.error is not None:
        return 0.0
    if kind == "success":
        return float(episode.success)
    if kind == "return":
        return min(1.0, max(0.0, episode.ret))
    for step in reversed(episode.steps):
        if "progress" in step.info:
            return min(1.0, max(0.0, float(step.info["progress"])))
    return float(episode.success)
