"""Environments: the protocol, the registry, built-in envs and demonstrations.

Importing this package registers the built-in envs (``shop``, ``tools``).
"""

from credo.envs import shop as _shop  # noqa: F401  (registers "shop")
from credo.envs import tools as _tools  # noqa: F401  (registers "tools")
from credo.envs.base import (
    ENVS,
    HELDOUT_SEED_OFFSET,
    Env,
    RestoreDivergence,
    StepResult,
    Task,
    check_replay,
    env_names,
    make_env,
    register_env,
    resolve_env,
    restore_env,
    snapshot_env,
)

__all__ = [
    "ENVS",
    "HELDOUT_SEED_OFFSET",
    "Env",
    "RestoreDivergence",
    "StepResult",
    "Task",
    "check_replay",
    "env_names",
    "make_env",
    "register_env",
    "resolve_env",
    "restore_env",
    "snapshot_env",
]
