"""Registry of policy losses.

A policy loss is a pure function ``fn(inputs: LossInputs, *, knob=default, ...) ->
(loss, metrics)``: ``loss`` a scalar tensor, ``metrics`` a dict of scalar tensors named
``loss/...`` or ``policy/...``. Both must be *additive over micro-batches*: computed as
``Σ w·x`` with the aggregation weights in ``inputs.weights``, so the trainer can sum
them over the micro-batches of one mini-batch.

A loss that needs something from the sampler (KLPO's auxiliary draws) declares it when it
registers, as ``requires(params, rollout) -> str | None``: given the loss's params and
the run's rollout settings, the message that says what is missing and how to set it, or
``None``. The config check calls it at load time, before any compute.

Every registered loss first checks that its inputs are finite on unmasked tokens
(:func:`~credo.objectives.inputs.check_finite_inputs`).

A loss that reads a teacher's scores (the distillation losses) declares
``teacher=needs_teacher(...)``: ``check(params, teacher) -> str | None`` given the run's
``teacher`` settings (kind, route, top-K head, privileged context). Losses without it
take no teacher scores, so a ``teacher.route: loss`` beside them is refused.

A loss that needs something from the env declares it as ``env_features`` (e.g. RAPO's
``("profiles",)``: tasks that carry a profile); the trainer's config check asks the
configured env for each (objectives never build envs).

A loss whose every term is multiplied by the advantage (PPO-clip, Hölder, RAPO's
reweighted PPO) declares ``advantage_weighted=True``: a row whose advantages are all 0
then adds exactly nothing to its gradient, so the trainer may leave such rows out of the
forward and backward passes (``optim.skip_zero_advantage``). Losses with a term of their
own (a KL to the sampler, a distillation term) do not.

A loss that needs the trainer to prepare something declares it in ``needs``; the trainer
asks the registry (:func:`loss_needs`), never the loss's name. Known needs:

- ``"reference"``: the frozen reference policy (the warm start) is kept;
- ``"reference_head"``: the reference's log-probs of the teacher's head ids, in the
  student's context (``ref_topk_logprobs``; Rényi OPSD's ``z_ref``);
- ``"profile_reference"``: the reference's log-probs with and without the task's profile
  in the prompt (``ref_logprobs_profile`` / ``ref_logprobs_plain``; RAPO).

The importance ratio's level of a loss (``token``, ``turn`` or ``sequence``, for the
update's ratio statistics) is its ``ratio_level`` knob when it has one (its signature's
default otherwise), else ``token`` (:func:`loss_ratio_level`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from credo.objectives.inputs import LossInputs, check_finite_inputs
from credo.utils.registry import Registry, check_kwargs

__all__ = [
    "LOSSES",
    "PolicyLoss",
    "Requirement",
    "get_loss",
    "loss_env_features",
    "loss_is_advantage_weighted",
    "loss_names",
    "loss_needs",
    "loss_ratio_level",
    "loss_requirements",
    "loss_teacher_requirements",
    "needs_teacher",
    "register_loss",
    "validate_loss",
]

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
#: ``requires(params, rollout) -> message | None`` (see the module docstring).
Requirement = Callable[[Mapping[str, Any], Any], "str | None"]
LOSSES: Registry[PolicyLoss] = Registry("loss")


def _nothing_required(params: Mapping[str, Any], rollout: Any) -> None:
    return None


def needs_teacher(
    name: str,
    *,
    head: Callable[[Mapping[str, Any]], bool] | bool = True,
    privileged: tuple[str, ...] = (),
) -> Requirement:
    """What a distillation loss needs from the run's ``teacher`` settings.

    Args:
        name: the loss's config name (for the messages).
        head: whether it needs the teacher's top-K head or full distribution (``teacher.
            topk`` > 0 or ``teacher.full``), or a function of the loss's params saying so.
        privileged: the ``teacher.privileged`` values it accepts (default: any).

    Returns:
        ``check(params, teacher) -> message | None``.
    """

    def check(params: Mapping[str, Any], teacher: Any) -> str | None:
        if teacher is None or getattr(teacher, "kind", None) is None:
            return (
                f"objective.loss={name} distils from a teacher: set teacher.kind (run, hf, "
                f"self, ema) and its settings, or start from recipe {name}"
            )
        if teacher.route != "loss":
            return (
                f"objective.loss={name} reads the teacher's scores in the loss: set "
                f"teacher.route=loss (got {teacher.route!r})"
            )
        if (head(params) if callable(head) else head) and not (teacher.topk > 0 or teacher.full):
            return (
                f"objective.loss={name} needs the teacher's distribution: set teacher.topk=K "
                "(its top-K head) or teacher.full=true (vocabularies up to 4096 tokens)"
            )
        if privileged and teacher.privileged not in privileged:
            return (
                f"objective.loss={name} needs teacher.privileged in {', '.join(privileged)}, "
                f"got {teacher.privileged!r}"
            )
        return None

    return check


def register_loss(
    name: str,
    *,
    requires: Requirement | None = None,
    teacher: Requirement | None = None,
    env_features: tuple[str, ...] = (),
    advantage_weighted: bool = False,
    needs: frozenset[str] | set[str] = frozenset(),
) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make ``fn`` available as ``objective.loss: <name>`` in configs.

    The registered (and returned) function is ``fn`` behind
    :func:`~credo.objectives.inputs.check_finite_inputs`: every registered loss, called
    through the registry or directly, raises a ``ValueError`` naming the input that is
    NaN/±inf on an unmasked token instead of returning a NaN loss. The wrapper keeps
    ``fn``'s name, docstring and signature (``__wrapped__``).

    Args:
        name: the config name.
        requires: what the loss needs from the run's settings (see the module
            docstring); ``None``: nothing.
        teacher: what it needs from the run's teacher settings (:func:`needs_teacher`);
            ``None``: the loss reads no teacher scores.
        env_features: what it needs the env to offer (``"profiles"``: tasks with a
            profile, ``env.provides_profiles()``); default none.
        advantage_weighted: every term of the loss is the advantage times something, so
            rows with all-zero advantages have a zero gradient (default false).
        needs: what the trainer must prepare for it (see the module docstring); default
            nothing.
    """

    def deco(fn: PolicyLoss) -> PolicyLoss:
        @functools.wraps(fn)
        def checked(inputs: LossInputs, *args: Any, **kwargs: Any) -> Any:
            check_finite_inputs(inputs, name)
            return fn(inputs, *args, **kwargs)

        return LOSSES.register(
            name,
            requires=requires or _nothing_required,
            teacher=teacher,
            env_features=tuple(env_features),
            advantage_weighted=advantage_weighted,
            needs=frozenset(needs),
        )(checked)

    return deco


def loss_requirements(name: str) -> Requirement:
    """The ``requires`` check loss ``name`` registered (a no-op if none)."""
    return LOSSES.meta(name)["requires"]


def loss_env_features(name: str) -> tuple[str, ...]:
    """The env features loss ``name`` registered (``()`` if none)."""
    return tuple(LOSSES.meta(name).get("env_features", ()))


def loss_teacher_requirements(name: str) -> Requirement | None:
    """The ``teacher`` check loss ``name`` registered, or ``None`` when it reads no
    teacher scores."""
    return LOSSES.meta(name).get("teacher")


def loss_is_advantage_weighted(name: str) -> bool:
    """Whether loss ``name`` registered ``advantage_weighted=True`` (a row whose
    advantages are all 0 adds nothing to its gradient)."""
    return bool(LOSSES.meta(name).get("advantage_weighted", False))


def loss_needs(name: str) -> frozenset[str]:
    """What loss ``name`` registered in ``needs`` (empty if nothing)."""
    return frozenset(LOSSES.meta(name).get("needs", frozenset()))


def loss_ratio_level(name: str, params: Mapping[str, Any]) -> str:
    """The level of loss ``name``'s importance ratios with ``params``: its ``ratio_level``
    knob (the signature's default when unset), or ``token`` for a loss without one."""
    knob = inspect.signature(get_loss(name)).parameters.get("ratio_level")
    if knob is None:
        return "token"
    return str(params.get("ratio_level", knob.default))


def get_loss(name: str) -> PolicyLoss:
    return LOSSES.get(name)


def loss_names() -> list[str]:
    return LOSSES.names()


def validate_loss(name: str, params: Mapping[str, Any]) -> None:
    check_kwargs("loss", name, get_loss(name), params, reserved=("inputs",))
