"""Policy objectives: pure functions of token tensors (no models, no envs).

Importing this package registers every built-in loss and aggregation mode.
"""

from credo.objectives import ppo as _ppo  # noqa: F401  (registers "ppo")
from credo.objectives.aggregation import (
    AGGREGATIONS,
    aggregate,
    aggregation_weights,
    register_aggregation,
)
from credo.objectives.inputs import LossInputs
from credo.objectives.kl import KL_ESTIMATORS, kl_estimate
from credo.objectives.registry import LOSSES, get_loss, loss_names, register_loss, validate_loss

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOSSES",
    "LossInputs",
    "aggregate",
    "aggregation_weights",
    "get_loss",
    "kl_estimate",
    "loss_names",
    "register_aggregation",
    "register_loss",
    "validate_loss",
]
