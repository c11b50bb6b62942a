"""Teachers and judges: models that score the student's own rollouts.

Teachers score the student's tokens in their own context, for on-policy distillation
(``opd``), OPRD, MT-SDPO and Rényi OPSD (:mod:`credo.objectives`): the run's teachers
(:mod:`~credo.teachers.teaching`) score each iteration's rows once, and a registered
route (:mod:`~credo.teachers.routes`) turns the scores into rewards, advantages or a
loss input. Judges score whole responses against yes/no rubric questions from their
verdict probabilities (SERPO, :mod:`credo.teachers.judge`, :mod:`credo.teachers.rubric`;
a run's judging: :mod:`credo.teachers.judging`). RAPO's reference, scored with and
without the task's profile, is a teacher of the same kind (:mod:`credo.teachers.profiles`).

Depends on :mod:`credo.data`, :mod:`credo.objectives`, :mod:`credo.policy`,
:mod:`credo.rollout` (prompt rendering) and :mod:`credo.utils`, never on the trainer.
"""

from credo.teachers.anchors import anchor_sets
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
    teacher_needs_path,
    teacher_settings,
    validate_teacher,
)
from credo.teachers.routes import (
    ROUTES,
    RouteInputs,
    TeacherRoute,
    register_route,
    route_names,
    teacher_route,
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
    "ROUTES",
    "SANITISERS",
    "TEACHERS",
    "ContextCache",
    "EMATeacher",
    "Judge",
    "JudgeCost",
    "JudgeExample",
    "PolicyTeacher",
    "ResponsePools",
    "RouteInputs",
    "Rubric",
    "RubricChange",
    "RubricEvolver",
    "RubricItem",
    "SelfTeacher",
    "Teacher",
    "TeacherCost",
    "TeacherRoute",
    "TeacherRows",
    "TeacherScores",
    "anchor_sets",
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
    "register_route",
    "register_sanitiser",
    "register_teacher",
    "resolve_policy_folder",
    "route_names",
    "sanitise",
    "score_with_policy",
    "teacher_extra_ids",
    "teacher_loss_extras",
    "teacher_names",
    "teacher_needs_path",
    "teacher_route",
    "teacher_settings",
    "validate_teacher",
    "verdict_ids",
    "verdict_loss",
    "verdict_margins",
    "verdict_scores",
]
