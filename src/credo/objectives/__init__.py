"""Policy objectives: pure functions of token tensors (no models, no envs).

Importing this package registers every built-in loss and aggregation mode.
"""

from credo.objectives import hpo as _hpo  # noqa: F401  (registers "holder", "holder_token")
from credo.objectives import klpo as _klpo  # noqa: F401  (registers "klpo", "klpo_seq")
from credo.objectives import mt_sdpo as _mt_sdpo  # noqa: F401  (registers "mt_sdpo")
from credo.objectives import opd as _opd  # noqa: F401  (registers "opd")
from credo.objectives import ppo as _ppo  # noqa: F401  (registers "ppo")
from credo.objectives import rapo as _rapo  # noqa: F401  (registers "ppo_rapo")
from credo.objectives import renyi_opsd as _renyi  # noqa: F401  (registers "renyi_opsd")
from credo.objectives.aggregation import (
    AGGREGATIONS,
    aggregate,
    aggregation_weights,
    register_aggregation,
    validate_aggregation,
)
from credo.objectives.entropy import entropy_bonus
from credo.objectives.extras import EXTRAS, extra_token_ids, loss_extras, register_extras
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
from credo.objectives.mt_sdpo import (
    ContextChoice,
    candidate_contexts,
    mixture_logprobs,
    select_contexts,
)
from credo.objectives.opd import (
    DISTILL_ESTIMATORS,
    distill_row_reward,
    distill_token_reward,
    reverse_kl_sampled,
    reverse_kl_topk,
)
from credo.objectives.oprd import (
    combine_teachers,
    oprd_delta,
    oprd_row_reward,
    oprd_token_reward,
    verifier_agreement,
    verifier_mask,
)
from credo.objectives.ratios import RATIO_LEVELS, log_ratio
from credo.objectives.registry import (
    LOSSES,
    get_loss,
    loss_env_features,
    loss_is_advantage_weighted,
    loss_names,
    loss_needs,
    loss_ratio_level,
    loss_requirements,
    loss_teacher_requirements,
    needs_teacher,
    register_loss,
    validate_loss,
)
from credo.objectives.renyi_opsd import mixed_target, renyi_divergence
from credo.objectives.sero import (
    WEIGHT_MODES,
    action_logprobs,
    reachability_log_weights,
    sero_loss,
)

__all__ = [
    "AGGREGATIONS",
    "DISTILL_ESTIMATORS",
    "EXTRAS",
    "KL_ESTIMATORS",
    "LOSSES",
    "RATIO_LEVELS",
    "WEIGHT_MODES",
    "ContextChoice",
    "LossInputs",
    "action_logprobs",
    "aggregate",
    "aggregation_weights",
    "candidate_contexts",
    "combine_teachers",
    "distill_row_reward",
    "distill_token_reward",
    "entropy_bonus",
    "extra_token_ids",
    "get_loss",
    "kl_binary",
    "kl_diagnostics",
    "kl_estimate",
    "kl_loss",
    "kl_reward_penalty",
    "kl_topk",
    "log_ratio",
    "loss_env_features",
    "loss_extras",
    "loss_is_advantage_weighted",
    "loss_names",
    "loss_needs",
    "loss_ratio_level",
    "loss_requirements",
    "loss_teacher_requirements",
    "mixed_target",
    "mixture_logprobs",
    "needs_teacher",
    "oprd_delta",
    "oprd_row_reward",
    "oprd_token_reward",
    "reachability_log_weights",
    "register_aggregation",
    "register_extras",
    "register_loss",
    "renyi_divergence",
    "reverse_kl_sampled",
    "reverse_kl_topk",
    "select_contexts",
    "sero_loss",
    "validate_aggregation",
    "validate_loss",
    "verifier_agreement",
    "verifier_mask",
]
