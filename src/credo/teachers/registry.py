"""Registry of teacher kinds: ``teacher.kind: <name>`` in configs.

A teacher factory is ``fn(student, *, knob=default, ...) -> Teacher``; every factory
accepts ``micro_batch`` and ``temperature``. Built-in kinds:

- ``run``: a saved credo run (its ``final_policy/``), a checkpoint folder
  (``checkpoints/step_N``) or any model folder; needs ``path``.
- ``hf``: a Hugging Face model (or LoRA adapter) folder given directly; needs ``path``.
- ``self``: the student itself with privileged context (:class:`SelfTeacher`).
- ``ema``: an EMA copy of the student (:class:`EMATeacher`, ``ema_decay``).
- ``frozen``: the run's frozen reference (the warm start) reading privileged context: a
  self-teacher that does not move with the student (Rényi OPSD's fix for a self-teacher
  that forgets its reading, ``docs/studies/renyi-opsd-lights.md``).

Path-based teachers are checked against the student (vocabulary size, tokenizer) before
their weights load (:mod:`credo.teachers.loading`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from credo.policy import HFPolicy
from credo.teachers.base import Teacher
from credo.teachers.ema import EMATeacher
from credo.teachers.loading import load_teacher_policy, resolve_policy_folder
from credo.teachers.policy_teacher import PolicyTeacher, SelfTeacher
from credo.utils.registry import Registry, check_kwargs

__all__ = [
    "TEACHERS",
    "make_teacher",
    "register_teacher",
    "teacher_names",
    "teacher_needs_path",
    "teacher_settings",
    "teacher_uses_reference",
    "validate_teacher",
]

TeacherFactory = Callable[..., Teacher]
TEACHERS: Registry[TeacherFactory] = Registry("teacher")


def register_teacher(
    name: str,
    *,
    needs_path: bool = False,
    student: bool = False,
    privileged: bool = False,
    reference: bool = False,
) -> Callable[[TeacherFactory], TeacherFactory]:
    """Decorator: make ``fn(student, **knobs) -> Teacher`` available as ``teacher.kind``.

    The factory's keyword parameters besides ``micro_batch`` and ``temperature`` are the
    ``teacher`` section's fields it reads (:func:`teacher_settings`: ``path``,
    ``ema_decay``).

    Args:
        name: the config name.
        needs_path: it loads ``teacher.path`` (checked before any compute).
        student: it is made from the student itself (no folder: ``teacher.path`` and
            ``teacher.base_path`` are refused).
        privileged: it differs from the student only by the privileged context it reads
            (``teacher.privileged`` is required).
        reference: it is made from the run's frozen reference (the warm start), which
            the factory gets in place of the student: the run keeps one (and restores
            it on resume).
    """
    return TEACHERS.register(
        name, needs_path=needs_path, student=student, privileged=privileged, reference=reference
    )


def teacher_names() -> list[str]:
    return TEACHERS.names()


def teacher_needs_path(kind: str) -> bool:
    """Whether teacher ``kind`` loads ``teacher.path`` (registered ``needs_path``)."""
    return bool(TEACHERS.meta(kind)["needs_path"])


def teacher_uses_reference(kind: str | None) -> bool:
    """Whether teacher ``kind`` is made from the run's frozen reference (registered
    ``reference``)."""
    return kind is not None and bool(TEACHERS.meta(kind)["reference"])


def teacher_settings(kind: str) -> tuple[str, ...]:
    """The ``teacher`` section's fields the factory of ``kind`` takes besides
    ``micro_batch`` and ``temperature`` (its own keyword parameters)."""
    params = inspect.signature(TEACHERS.get(kind)).parameters.values()
    own = (p.name for p in params if p.kind is p.KEYWORD_ONLY)
    return tuple(n for n in own if n not in ("micro_batch", "temperature"))


def validate_teacher(kind: str, params: Mapping[str, Any]) -> None:
    """Raise ``KeyError``/``ValueError`` for an unknown kind or a knob it does not take."""
    check_kwargs("teacher", kind, TEACHERS.get(kind), params, reserved=("student",))


def make_teacher(kind: str, student: HFPolicy, **params: Any) -> Teacher:
    """Build a teacher of ``kind`` for ``student`` (params as the factory accepts)."""
    validate_teacher(kind, params)
    return TEACHERS.get(kind)(student, **params)


def _need_path(kind: str, path: str | None) -> str:
    if not path:
        raise ValueError(f"teacher kind {kind!r} needs teacher.path (a folder)")
    return path


@register_teacher("run", needs_path=True)
def run_teacher(
    student: HFPolicy,
    *,
    path: str | None = None,
    micro_batch: int = 16,
    temperature: float = 1.0,
) -> Teacher:
    """A saved credo run, checkpoint or model folder (see :mod:`credo.teachers.loading`)."""
    folder = resolve_policy_folder(_need_path("run", path))
    policy = load_teacher_policy(folder, student)
    return PolicyTeacher(
        policy, name=f"run:{folder}", micro_batch=micro_batch, temperature=temperature
    )


@register_teacher("hf", needs_path=True)
def hf_teacher(
    student: HFPolicy,
    *,
    path: str | None = None,
    micro_batch: int = 16,
    temperature: float = 1.0,
) -> Teacher:
    """A Hugging Face model folder (``config.json``) or LoRA adapter folder."""
    p = Path(_need_path("hf", path)).expanduser()
    if p.is_dir() and not ((p / "config.json").is_file() or (p / "adapter_config.json").is_file()):
        raise ValueError(
            f"teacher path {str(p)!r} is not a Hugging Face model folder (no config.json); "
            "for a credo run or checkpoint folder use teacher.kind=run"
        )
    policy = load_teacher_policy(p, student)
    return PolicyTeacher(policy, name=f"hf:{p}", micro_batch=micro_batch, temperature=temperature)


@register_teacher("self", student=True, privileged=True)
def self_teacher(student: HFPolicy, *, micro_batch: int = 16, temperature: float = 1.0) -> Teacher:
    """The student with privileged context (shares its weights)."""
    return SelfTeacher(student, micro_batch=micro_batch, temperature=temperature)


@register_teacher("frozen", student=True, privileged=True, reference=True)
def frozen_teacher(
    reference: HFPolicy, *, micro_batch: int = 16, temperature: float = 1.0
) -> Teacher:
    """The run's frozen reference (the warm start; under LoRA the base model) reading
    privileged context: the self-teacher as it was when RL began, which keeps its
    reading while the student moves."""
    return PolicyTeacher(reference, name="frozen", micro_batch=micro_batch, temperature=temperature)


@register_teacher("ema", student=True)
def ema_teacher(
    student: HFPolicy,
    *,
    ema_decay: float = 0.99,
    micro_batch: int = 16,
    temperature: float = 1.0,
) -> Teacher:
    """An EMA copy of the student; call ``update(student)`` after each optimiser step."""
    return EMATeacher(student, decay=ema_decay, micro_batch=micro_batch, temperature=temperature)
