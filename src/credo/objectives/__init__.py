"""Policy objectives: pure functions of token tensors (no models, no envs).

Importing this package registers every built-in loss and aggregation mode.
"""

from credo.objectives import hpo as _hpo  # noqa: F401  (registers "holder", "holder_token")
from credo.objectives import klpo as _klpo  # noqa: F401  (registers "klpo", "klpo_seq")
from credo.objectives import ppo as _ppo  # noqa: F401  (registers "ppo")
from credo.objectives import rapo as _rapo  # noqa: F401  (registers "ppo_rapo")
from credo.objectives.aggregation import (
    AGGREGATIONS,
    aggregate,
    aggregation_weights,
    register_aggregation,
    validate_aggregation,
)
from credo.objectives.entropy import entropy_bonus
from credo.objectives.inputs import LossInputs
from credo.objectives.kl import (
    KL_ESTIMATORS,
    kl_binary,
    kl_diagnostics,
    kl_estimate,
    kl_loss,
    kl_reward_penalty,
    kl_topk,
)
from credo.objectives.ratios import RATIO_LEVELS, log_ratio
from credo.objectives.registry import (
    LOSSES,
    get_loss,
    loss_names,
    loss_requirements,
    register_loss,
    validate_loss,
)
from credo.objectives.sero import (
    WEIGHT_MODES,
    action_logprobs,
    reachability_log_weights,
    sero_loss,
)

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOSSES",
    "RATIO_LEVELS",
    "WEIGHT_MODES",
    "LossInputs",
    "action_logprobs",
    "aggregate",
    "aggregation_weights",
    "entropy_bonus",
    "get_loss",
    "kl_binary",
    "kl_diagnostics",
    "kl_estimate",
    "kl_loss",
    "kl_reward_penalty",
    "kl_topk",
    "log_ratio",
    "loss_names",
    "loss_requirements",
    "reachability_log_weights",
    "register_aggregation",
    "register_loss",
    "sero_loss",
    "validate_aggregation",
    "validate_loss",
]
