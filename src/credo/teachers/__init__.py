"""Teachers and judges: models that score the student's own rollouts.

Teachers score the student's tokens in their own context, for on-policy distillation
(``opd``), OPRD, MT-SDPO and Rényi OPSD (:mod:`credo.objectives`). Judges score whole
responses against yes/no rubric questions from their verdict probabilities (SERPO,
:mod:`credo.teachers.judge`, :mod:`credo.teachers.rubric`). Depends on
:mod:`credo.data`, :mod:`credo.policy` and :mod:`credo.utils` only.
"""

from credo.teachers.anchors import anchor_texts
from credo.teachers.base import Teacher, TeacherCost, TeacherRows, TeacherScores
from credo.teachers.context_cache import ContextCache
from credo.teachers.ema import EMATeacher
from credo.teachers.extras import attach_teacher_scores, teacher_extra_ids, teacher_loss_extras
from credo.teachers.judge import Judge, JudgeCost, verdict_ids, verdict_margins, verdict_scores
from credo.teachers.judge_fit import JudgeExample, fit_judge, verdict_loss
from credo.teachers.loading import (
    check_teacher_folder,
    check_tokenizers,
    load_teacher_policy,
    resolve_policy_folder,
)
from credo.teachers.policy_teacher import PolicyTeacher, SelfTeacher
from credo.teachers.privileged import PLACEMENTS, privileged_prompt_ids, privileged_prompts
from credo.teachers.registry import (
    TEACHERS,
    make_teacher,
    register_teacher,
    teacher_names,
    validate_teacher,
)
from credo.teachers.rubric import (
    PROPOSERS,
    ResponsePools,
    Rubric,
    RubricChange,
    RubricEvolver,
    RubricItem,
    combine_rewards,
    register_proposer,
)
from credo.teachers.sanitise import SANITISERS, register_sanitiser, sanitise
from credo.teachers.scoring import FULL_MAX_VOCAB, score_with_policy

__all__ = [
    "FULL_MAX_VOCAB",
    "PLACEMENTS",
    "PROPOSERS",
    "SANITISERS",
    "TEACHERS",
    "ContextCache",
    "EMATeacher",
    "Judge",
    "JudgeCost",
    "JudgeExample",
    "PolicyTeacher",
    "ResponsePools",
    "Rubric",
    "RubricChange",
    "RubricEvolver",
    "RubricItem",
    "SelfTeacher",
    "Teacher",
    "TeacherCost",
    "TeacherRows",
    "TeacherScores",
    "anchor_texts",
    "attach_teacher_scores",
    "check_teacher_folder",
    "check_tokenizers",
    "combine_rewards",
    "fit_judge",
    "load_teacher_policy",
    "make_teacher",
    "privileged_prompt_ids",
    "privileged_prompts",
    "register_proposer",
    "register_sanitiser",
    "register_teacher",
    "resolve_policy_folder",
    "sanitise",
    "score_with_policy",
    "teacher_extra_ids",
    "teacher_loss_extras",
    "teacher_names",
    "validate_teacher",
    "verdict_ids",
    "verdict_loss",
    "verdict_margins",
    "verdict_scores",
]
