"""The teacher folders a ``teacher`` section names, checked before any compute.

A teacher kind registered with ``needs_path`` (``run``, ``hf``) reads ``teacher.path``
(:func:`require_teacher_path`); a route registered with ``base`` (OPRD) also reads a base
model beside each teacher (:func:`oprd_base_path`, :func:`oprd_teacher_pairs`). Errors
are one-line ``ValueError``s; the config check turns them into ``ConfigError``s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from credo.teachers.registry import teacher_needs_path
from credo.teachers.routes import teacher_route

__all__ = ["oprd_base_path", "oprd_teacher_pairs", "require_teacher_path"]


def require_teacher_path(teacher: Any) -> None:
    """Raise ``ValueError`` when a teacher that reads a folder (registered with
    ``needs_path``: ``run``, ``hf``) has no ``teacher.path`` (called before a run starts:
    recipes leave it to the command line)."""
    if teacher_needs_path(teacher.kind) and not teacher.path:
        raise ValueError(
            f"teacher.kind={teacher.kind} needs teacher.path=FOLDER (a finished credo run, a "
            "checkpoint RUN/checkpoints/step_N, or a model folder), e.g. credo train "
            "--recipe opd teacher.path=runs/grpo-shop-..."
        )


def oprd_base_path(teacher: Any) -> str | None:
    """The base model folder of an OPRD teacher (``teacher.base_path``, default
    ``<path>/reference``: a run's saved warm start), or ``None`` on a route that reads no
    base teacher (``base`` of :func:`~credo.teachers.routes.register_route`).

    Raises:
        ValueError: the default base does not exist.
    """
    if not teacher_route(teacher.route).base or not teacher.path:
        return None
    if teacher.base_path:
        return str(teacher.base_path)
    ref = Path(str(teacher.path)).expanduser() / "reference"
    if not ref.is_dir():
        raise ValueError(
            f"teacher.route={teacher.route} needs the teacher's base model: {str(ref)!r} does not exist "
            "(a run keeps its warm start there when it has a KL to its reference); set "
            "teacher.base_path=FOLDER"
        )
    return str(ref)


def oprd_teacher_pairs(teacher: Any) -> list[tuple[str, str]]:
    """OPRD's teachers as ``(RL folder, base folder)`` pairs: ``teacher.path`` with its
    base (:func:`oprd_base_path`) first, then ``teacher.oprd.teachers`` (each base
    defaults to ``<path>/reference``); ``[]`` on a route that reads no base teacher.

    Raises:
        ValueError: an entry is not ``{path, base_path}`` or a default base is missing.
    """
    first = oprd_base_path(teacher)
    if first is None:
        return []
    pairs = [(str(teacher.path), first)]
    for i, entry in enumerate(teacher.oprd.teachers):
        where = f"teacher.oprd.teachers[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ValueError(f"{where} must be a mapping {{path: FOLDER, base_path: FOLDER}}")
        extra = sorted(set(entry) - {"path", "base_path"})
        if extra:
            raise ValueError(f"{where}: unknown key {extra[0]!r}; valid keys: path, base_path")
        base = entry.get("base_path") or str(Path(entry["path"]).expanduser() / "reference")
        if not entry.get("base_path") and not Path(base).is_dir():
            raise ValueError(
                f"{where}: the teacher's base model {base!r} does not exist; set its base_path"
            )
        pairs.append((entry["path"], str(base)))
    return pairs
