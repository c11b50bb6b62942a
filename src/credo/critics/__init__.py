"""CAST (critique-aware supervision): privileged step labels, a step-local critic, online
verification of actions, and critique-enriched SFT rows. See ``docs/cast.md``.

Modules: :mod:`~credo.critics.labels` (classes, label record), :mod:`~credo.critics.
shop_rules` and :mod:`~credo.critics.tools_rules` (label rules), :mod:`~credo.critics.
labeller` (replay and label), :mod:`~credo.critics.trajectories` (JSONL episodes),
:mod:`~credo.critics.critic` (the classifier), :mod:`~credo.critics.fit` (training and
held-out metrics), :mod:`~credo.critics.metrics`, :mod:`~credo.critics.verify` (online
guard), :mod:`~credo.critics.critique_sft` (SFT rows). The stages that tie them to a run
live in :mod:`credo.commands.cast`.
"""

from credo.critics.critic import Critic, critic_from_policy, load_critic, new_critic
from credo.critics.critique_sft import (
    BALANCE,
    CORRECTIONS_FROM,
    balance_rows,
    critique_examples,
    critique_rows,
)
from credo.critics.fit import class_weights, evaluate_critic, split_by_task, train_critic
from credo.critics.labeller import (
    LABEL_RULES,
    LABELLERS,
    LabelledStep,
    label_counts,
    label_episodes,
    load_labels,
    make_labeller,
    register_label_rule,
    save_labels,
)
from credo.critics.labels import CLASSES, CRITIQUES, StepLabel, critique_text
from credo.critics.metrics import critic_metrics
from credo.critics.trajectories import load_trajectories, save_trajectories
from credo.critics.verify import ON_FLAG, CriticGuard, GuardedPolicy

__all__ = [
    "BALANCE",
    "CLASSES",
    "CORRECTIONS_FROM",
    "CRITIQUES",
    "LABELLERS",
    "LABEL_RULES",
    "ON_FLAG",
    "Critic",
    "CriticGuard",
    "GuardedPolicy",
    "LabelledStep",
    "StepLabel",
    "balance_rows",
    "class_weights",
    "critic_from_policy",
    "critic_metrics",
    "critique_examples",
    "critique_rows",
    "critique_text",
    "evaluate_critic",
    "label_counts",
    "label_episodes",
    "load_critic",
    "load_labels",
    "load_trajectories",
    "make_labeller",
    "new_critic",
    "register_label_rule",
    "save_labels",
    "save_trajectories",
    "split_by_task",
    "train_critic",
]
