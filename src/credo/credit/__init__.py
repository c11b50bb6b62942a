"""Advantage estimators: pure functions of a :class:`~credo.data.RolloutForest`.

Importing this package registers every built-in estimator.
"""

from credo.credit import axpo as _axpo  # noqa: F401  (registers axpo)
from credo.credit import gigpo as _gigpo  # noqa: F401  (registers gigpo)
from credo.credit import graph as _graph  # noqa: F401  (registers graph)
from credo.credit import graphpo as _graphpo  # noqa: F401  (registers graphpo)
from credo.credit import grpo as _grpo  # noqa: F401  (registers grpo, dr_grpo, rloo)
from credo.credit import proas as _proas  # noqa: F401  (registers proas)
from credo.credit import returns as _returns  # noqa: F401  (registers return)
from credo.credit import tsbpo as _tsbpo  # noqa: F401  (registers tsbpo)
from credo.credit.registry import (
    ESTIMATORS,
    compute_advantages,
    estimator_names,
    estimator_needs,
    estimator_state_factory,
    get_estimator,
    register_estimator,
    validate_estimator,
)
from credo.credit.stats import advantage_stats

__all__ = [
    "ESTIMATORS",
    "advantage_stats",
    "compute_advantages",
    "estimator_names",
    "estimator_needs",
    "estimator_state_factory",
    "get_estimator",
    "register_estimator",
    "validate_estimator",
]
