"""What a loss needs from the env, checked at config load (``env_features`` of
:func:`credo.objectives.register_loss`). [recon]

Only ``"profiles"`` is known: tasks that carry a profile (RAPO, :mod:`credo.teachers.profiles`).
"""

from __future__ import annotations

from typing import Any

from credo.envs.base import make_env
from credo.objectives import loss_env_features

__all__ = ["env_feature_problem"]


def env_feature_problem(cfg: Any, loss: str) -> str | None:
    """One line saying why the configured env cannot serve ``loss`` (``None``: it can).

    Only ``"profiles"`` is known: the env, built from ``env.name`` and ``env.kwargs``,
    must say ``provides_profiles()``.
    """
    if "profiles" not in loss_env_features(loss):
        return None
    name, kwargs = cfg.env.name, dict(cfg.env.kwargs)
    try:
        env = make_env(name, **kwargs)
    except Exception as exc:
        return f"objective.loss={loss}: env {name!r} could not be built to check it: {exc}"
    check = getattr(env, "provides_profiles", None)
    if check is None or not check():
        return (
            f"objective.loss={loss} needs tasks that carry a profile, and env {name!r} "
            f"with kwargs {kwargs} offers none: use env.name=tools with "
            "env.kwargs.profiles=true (or an env with provides_profiles() and profile()), "
            "or another loss such as ppo"
        )
    return None
