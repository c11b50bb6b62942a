"""Teacher routes: how one iteration's teacher scores reach the update.

Every iteration the teacher scores the student's rows once
(:meth:`credo.teachers.teaching.Teaching.lesson`); the route ``teacher.route`` names turns
the scores into a training signal. A route is a function ``route(lesson, x)`` that fills
the :class:`~credo.teachers.teaching.Lesson` from :class:`RouteInputs` ``x``:

- ``lesson.row_reward`` ``[B]``: a per-step reward, added to the forest's rewards before
  credit assignment;
- ``lesson.token_reward`` ``[B, L]``: a per-token reward, added to the token batch's
  advantages after credit assignment;
- ``lesson.ref_head`` ``[B, L, K]`` and ``lesson.metrics``.

It registers what it reads and where its signal goes::

    @register_route("name", to_loss=False, base=False)
    def name(lesson: Lesson, x: RouteInputs) -> None: ...

- ``to_loss``: the scores themselves ride in the token batch to a distillation loss (one
  that registers ``teacher=``, :func:`credo.objectives.needs_teacher`); the teacher then
  also scores its top-K head or whole distribution when ``teacher.topk`` / ``teacher.full``
  ask for it;
- ``base``: the route reads a base teacher beside the teacher (OPRD's
  ``teacher.base_path``, default ``<path>/reference``, and ``teacher.oprd.teachers``),
  which takes a teacher with a folder.

The built-in routes (docs/algorithms.md#on-policy-distillation):

- ``loss``: the distillation loss reads the scores (``opd``, ``mt_sdpo``, ``renyi_opsd``);
  Rényi OPSD also gets the frozen reference's log-probs of the teacher's head ids;
- ``row_reward``: ``−coef·(log π_θ(y_t) − log π_T(y_t))`` reduced per step, before credit;
- ``token_advantage``: the same per token, added to the advantages after credit;
- ``oprd``: OPRD's ``α·Δ_t`` per step on the rows the verifier accepts, before credit
  (several teachers combined per sample);
- ``oprd_token``: the same ``α·Δ_t`` per token, added to the advantages after credit.

A new route is one function with its registration; ``teacher.route: name`` selects it
(checked at config load).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from credo.data import RolloutForest, TokenBatch
from credo.objectives import (
    combine_teachers,
    distill_row_reward,
    distill_token_reward,
    oprd_delta,
    oprd_row_reward,
    oprd_token_reward,
    verifier_agreement,
    verifier_mask,
)
from credo.teachers.base import TeacherCost, TeacherRows
from credo.utils.registry import Registry

if TYPE_CHECKING:
    from credo.teachers.teaching import Lesson, Teaching

__all__ = [
    "ROUTES",
    "RouteInputs",
    "TeacherRoute",
    "register_route",
    "route_names",
    "teacher_route",
]


@dataclass
class RouteInputs:
    """What a route reads besides the lesson's scores (``B`` rows × ``L`` positions).

    Attributes:
        settings: the ``teacher`` section (the route's knobs: ``reward_coef``,
            ``reward_clip``, ``reward_reduce``, ``oprd``).
        forest: the iteration's policy rows (oracle rows split off).
        batch: ``forest.to_batch(0)``: the student's sampled log-probs in ``old_logprobs``.
        rows: the rows as the teacher scored them (its prompts).
        row_mask: ``[B]`` bool, rows with a teacher signal.
        tokens: ``[B, L]`` bool, the response tokens of those rows.
        teaching: the run's teachers (OPRD's base and further pairs, Rényi's reference).
        cost: the iteration's teacher cost, to which a route adds its own scoring.
    """

    settings: Any
    forest: RolloutForest
    batch: TokenBatch
    rows: TeacherRows
    row_mask: torch.Tensor
    tokens: torch.Tensor
    teaching: Teaching
    cost: TeacherCost


Route = Callable[["Lesson", RouteInputs], None]


@dataclass(frozen=True)
class TeacherRoute:
    """A registered route: its function and what it declared (module docstring)."""

    name: str
    fn: Route
    to_loss: bool = False
    base: bool = False


ROUTES: Registry[TeacherRoute] = Registry("teacher route")


def register_route(
    name: str, *, to_loss: bool = False, base: bool = False
) -> Callable[[Route], Route]:
    """Decorator: make ``fn(lesson, x)`` available as ``teacher.route: <name>``.

    Args:
        name: the config name.
        to_loss: the scores ride to a distillation loss (module docstring).
        base: the route reads a base teacher beside the teacher (OPRD).
    """

    def deco(fn: Route) -> Route:
        ROUTES.register(name)(TeacherRoute(name, fn, to_loss=to_loss, base=base))
        return fn

    return deco


def teacher_route(name: str) -> TeacherRoute:
    """The route registered as ``name`` (a ``KeyError`` naming the valid ones otherwise)."""
    return ROUTES.get(name)


def route_names() -> list[str]:
    return ROUTES.names()


@register_route("loss", to_loss=True)
def loss(lesson: Lesson, x: RouteInputs) -> None:
    """The scores ride to the distillation loss (:meth:`Lesson.attach`); with a reference
    (Rényi OPSD's ``z_ref``), the reference's log-probs of the teacher's head ids in the
    student's own context."""
    if x.teaching.reference is not None and lesson.scores.topk_ids is not None:
        lesson.ref_head = x.teaching.reference_head(x.batch, lesson.scores.topk_ids, x.cost)


@register_route("row_reward")
def row_reward(lesson: Lesson, x: RouteInputs) -> None:
    """``−coef·(log π_θ(y_t) − log π_T(y_t))`` summed (or averaged) over each step's
    tokens, added to the step's reward before credit assignment."""
    t = x.settings
    lesson.row_reward = distill_row_reward(
        x.batch.old_logprobs, lesson.scores.logprobs, x.tokens,
        coef=t.reward_coef, clip=t.reward_clip, reduce=t.reward_reduce,
    )  # fmt: skip


@register_route("token_advantage")
def token_advantage(lesson: Lesson, x: RouteInputs) -> None:
    """The same dense reward per token, added to the advantages after credit assignment."""
    t = x.settings
    lesson.token_reward = distill_token_reward(
        x.batch.old_logprobs,
        lesson.scores.logprobs,
        x.tokens,
        coef=t.reward_coef,
        clip=t.reward_clip,
    )


@dataclass
class _OPRDShift:
    """What both OPRD routes read: the teachers' log-probs and how they teach each row."""

    rl_lp: torch.Tensor
    base_lp: torch.Tensor
    accepted: torch.Tensor
    teacher_ok: torch.Tensor | None
    combine: str
    choice: torch.Tensor | None


def _oprd_shift(lesson: Lesson, x: RouteInputs) -> _OPRDShift:
    """Score the base teachers (and further pairs), choose per row the rows the verifier
    accepts and the teachers that teach them, and record ``teacher/shift``,
    ``teacher/agree_frac`` and ``teacher/accepted_frac``."""
    teaching, tb, forest = x.teaching, x.batch, x.forest
    assert teaching.base is not None
    o = x.settings.oprd
    scored = [teaching.base.score(x.rows)]
    for more_rl, more_base in teaching.more:
        scored += [more_rl.score(x.rows), more_base.score(x.rows)]
    for s in scored:
        x.cost.add(s.cost)
    rl_lp = torch.stack([lesson.scores.logprobs, *(s.logprobs for s in scored[1::2])])
    base_lp = torch.stack([scored[0].logprobs, *(s.logprobs for s in scored[2::2])])
    mask = tb.response_mask
    success = forest.episodes().success[forest.row_episode()]
    accepted = verifier_mask(success, forest.valid, on=o.accept) & x.row_mask
    delta_all = oprd_delta(rl_lp, base_lp, mask, clip=o.clip)
    agree = verifier_agreement(delta_all, mask, success)
    # which teachers teach each row: those agreeing with the verifier (``accept: agree``
    # or ``combine: verifier``), the one most likely to have produced it (``likelihood``)
    filtered = o.accept == "agree" or o.combine == "verifier"
    teacher_ok = agree if filtered else None
    combine = "verifier" if filtered else o.combine
    choice = None
    if combine == "likelihood" and teaching.more:
        choice = torch.where(mask[None], rl_lp, 0.0).sum(2).argmax(0)
    delta, _ = combine_teachers(delta_all, combine=combine, teacher_ok=teacher_ok, choice=choice)
    lesson.metrics["teacher/shift"] = float(delta.sum() / mask.sum().clamp(min=1))
    rows = x.row_mask & mask.any(1)
    lesson.metrics["teacher/agree_frac"] = (
        float(agree[:, rows].float().mean()) if rows.any() else 0.0
    )
    lesson.metrics["teacher/accepted_frac"] = float(accepted.float().mean()) if len(tb) else 0.0
    return _OPRDShift(rl_lp, base_lp, accepted, teacher_ok, combine, choice)


@register_route("oprd", base=True)
def oprd(lesson: Lesson, x: RouteInputs) -> None:
    """OPRD's per-step reward ``α·Σ_t Δ_t`` (or the mean) on accepted rows, with several
    teachers combined per sample (``teacher.oprd.combine``), divided by the episode's
    step count under ``teacher.oprd.episode_reduce: mean``; added to the step rewards
    before credit assignment."""
    o, forest = x.settings.oprd, x.forest
    sh = _oprd_shift(lesson, x)
    reward = oprd_row_reward(
        sh.rl_lp, sh.base_lp, x.batch.response_mask, sh.accepted,
        reduce=o.reduce, alpha=o.alpha, clip=o.clip, combine=sh.combine, choice=sh.choice,
        teacher_ok=sh.teacher_ok,
    )  # fmt: skip
    if o.episode_reduce == "mean":  # a row shared by several episodes: their mean length
        steps = forest.episode_values_to_rows(forest.episodes().length.to(torch.float64))
        reward = reward / steps.clamp(min=1).to(reward.dtype)
    lesson.row_reward = reward


@register_route("oprd_token", base=True)
def oprd_token(lesson: Lesson, x: RouteInputs) -> None:
    """OPRD's ``α·Δ_t`` per token, on the rows and with the teachers of the ``oprd`` route,
    added to the advantages *after* credit assignment (as ``token_advantage`` adds a
    distillation reward): the teacher's shift is a dense per-token term beside the
    verifier's group-normalised advantage, so it is never rescaled by a group's standard
    deviation (in a group whose episodes all succeed, GRPO's advantage is 0 and this
    route's is α·Δ_t alone)."""
    o = x.settings.oprd
    sh = _oprd_shift(lesson, x)
    lesson.token_reward = oprd_token_reward(
        sh.rl_lp, sh.base_lp, x.batch.response_mask, sh.accepted,
        alpha=o.alpha, clip=o.clip, combine=sh.combine, choice=sh.choice,
        teacher_ok=sh.teacher_ok,
    )  # fmt: skip
