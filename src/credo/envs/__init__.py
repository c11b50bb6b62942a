"""Environments: the protocol, the registry, built-in envs and demonstrations.

Importing this package registers the built-in envs (``shop``, ``tools``, ``recall``) and
the adapters of third-party envs (``textworld``, ``textarena``, ``gym``; each needs its
optional extra only when an env is built). Other envs are found by name when a module
registers them (``--env module:name``, ``$CREDO_ENV_MODULES``) or an installed package
declares them in the ``credo.envs`` entry-point group.
"""

from credo.envs import bfcl as _bfcl  # noqa: F401  (registers "bfcl")
from credo.envs import gym_env as _gym  # noqa: F401  (registers "gym" and gym:ENV_ID)
from credo.envs import mixture as _mixture  # noqa: F401  (registers "mixture")
from credo.envs import recall as _recall  # noqa: F401  (registers "recall")
from credo.envs import shop as _shop  # noqa: F401  (registers "shop")
from credo.envs import sokoban as _sokoban  # noqa: F401  (registers "sokoban")
from credo.envs import textarena_env as _textarena  # noqa: F401  ("textarena", textarena:ID)
from credo.envs import textworld_env as _textworld  # noqa: F401  (registers "textworld")
from credo.envs import tools as _tools  # noqa: F401  (registers "tools")
from credo.envs.base import (
    ENTRY_POINT_GROUP,
    ENV_MODULES_VAR,
    ENVS,
    HELDOUT_SEED_OFFSET,
    Env,
    RestoreDivergence,
    StepResult,
    Task,
    check_env_instance,
    check_replay,
    env_names,
    env_sources,
    make_env,
    register_env,
    resolve_env,
    restore_env,
    snapshot_env,
    step_env,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENVS",
    "ENV_MODULES_VAR",
    "HELDOUT_SEED_OFFSET",
    "Env",
    "RestoreDivergence",
    "StepResult",
    "Task",
    "check_env_instance",
    "check_replay",
    "env_names",
    "env_sources",
    "make_env",
    "register_env",
    "resolve_env",
    "restore_env",
    "snapshot_env",
    "step_env",
]
