"""The run configuration, in three parts:

- :mod:`~credo.train.config.schema`: the typed sections (every field documented with its
  default) and the checked conversion of a mapping into them;
- :mod:`~credo.train.config.recipes`: named YAML recipes, inheritance, ``key.sub=value``
  overrides and the config hash;
- :mod:`~credo.train.config.validate`: the checks that run at load time, one small
  function per section, before any compute.
"""

from credo.train.config.errors import ConfigError
from credo.train.config.recipes import (
    RECIPES_DIR,
    apply_overrides,
    config_hash,
    load_config,
    recipe_names,
)
from credo.train.config.schema import (
    Config,
    CreditConfig,
    EnvConfig,
    EvalConfig,
    JudgeConfig,
    ModelConfig,
    ObjectiveConfig,
    OPRDConfig,
    OptimConfig,
    RolloutConfig,
    SFTConfig,
    TeacherConfig,
    TrainConfig,
)
from credo.train.config.validate import skip_zero_advantage_problems, validate

__all__ = [
    "RECIPES_DIR",
    "Config",
    "ConfigError",
    "CreditConfig",
    "EnvConfig",
    "EvalConfig",
    "JudgeConfig",
    "ModelConfig",
    "OPRDConfig",
    "ObjectiveConfig",
    "OptimConfig",
    "RolloutConfig",
    "SFTConfig",
    "TeacherConfig",
    "TrainConfig",
    "apply_overrides",
    "config_hash",
    "load_config",
    "recipe_names",
    "skip_zero_advantage_problems",
    "validate",
]
