"""The task-source registry: where each iteration's training tasks come from.

A task source is an object with four methods::

    draw(iteration, seed) -> list[Task]                 the iteration's tasks (distinct)
    observe(tasks, episodes, seed) -> dict[str, float]  the iteration's results → metrics
    state_dict() -> dict                                JSON-able state ...
    load_state_dict(state) -> None                      ... restored exactly on resume

``draw`` gets the seed of the iteration's task stream and must be a pure function of it
and the source's state; ``observe`` gets the episodes the sampler produced for those
tasks (episode ``group`` = index into ``tasks``; a tree sampler gives several paths per
group) after the credit step, and the seed of a second stream for its own random choices
(RODS's variants). Sources are registered like samplers and estimators:

.. code-block:: python

    @register_task_source("name", params=NameParams)
    class NameSource:
        def __init__(self, ctx: TaskSourceContext, params: NameParams) -> None: ...

``tasks.source`` names it in the config and ``tasks.params`` fills ``NameParams`` (a
dataclass; unknown keys fail at config load). A source that needs more of the run
declares ``check=fn``: ``fn(params, ctx, env) -> message | None`` at config load, with
the run's :class:`TaskSourceContext` (no env factory) and its ``env.name``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from credo.data.episode import Episode
from credo.envs.base import Task
from credo.utils.registry import Registry, check_kwargs

__all__ = [
    "TASK_SOURCES",
    "TaskSource",
    "TaskSourceContext",
    "make_task_source",
    "register_task_source",
    "task_source_check",
    "task_source_names",
    "task_source_params",
]


@dataclass(frozen=True)
class TaskSourceContext:
    """What every task source may use.

    Attributes:
        train_tasks: size of the training seed pool: train seeds ``0..train_tasks-1``
            (``rollout.train_tasks``).
        tasks_per_iter: distinct tasks each ``draw`` returns (``rollout.tasks_per_iter``).
        make_env: creates a fresh env (RODS asks it for variants of a task); ``None``
            when the source needs no env.
    """

    train_tasks: int
    tasks_per_iter: int
    make_env: Callable[[], Any] | None = None


@runtime_checkable
class TaskSource(Protocol):
    """The task-source protocol (see the module docstring)."""

    def draw(self, iteration: int, seed: int) -> list[Task]: ...

    def observe(
        self, tasks: Sequence[Task], episodes: Sequence[Episode], seed: int
    ) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


TaskSourceFactory = Callable[[TaskSourceContext, Any], TaskSource]
TASK_SOURCES: Registry[TaskSourceFactory] = Registry("task source")


#: ``check(params, ctx, env) -> message | None`` (see the module docstring).
TaskSourceCheck = Callable[[Any, TaskSourceContext, str], "str | None"]


def register_task_source(
    name: str, *, params: type | None = None, check: TaskSourceCheck | None = None
) -> Callable[[TaskSourceFactory], TaskSourceFactory]:
    """Decorator: make a task source class available as ``tasks.source: <name>``.

    Args:
        name: the config name.
        params: the dataclass of its knobs (``tasks.params``), or ``None``.
        check: what it needs of the run and the env, checked at config load.
    """
    return TASK_SOURCES.register(name, params=params, check=check)


def task_source_check(name: str) -> TaskSourceCheck | None:
    """The ``check`` task source ``name`` registered, or ``None``."""
    return TASK_SOURCES.meta(name)["check"]


def task_source_names() -> list[str]:
    return TASK_SOURCES.names()


def task_source_params(name: str, params: Mapping[str, Any]) -> Any:
    """``tasks.params`` → the source's knobs object (``None`` for a source without
    knobs). Raises ``ValueError`` naming the bad key or value and the accepted keys."""
    cls = TASK_SOURCES.meta(name)["params"]
    if cls is None:
        if params:
            raise ValueError(f"task source {name!r} has no params; got {sorted(params)}")
        return None
    check_kwargs("task source", name, cls, params)
    return cls(**params)


def make_task_source(name: str, params: Mapping[str, Any], ctx: TaskSourceContext) -> TaskSource:
    """Build task source ``name`` with ``tasks.params`` ``params`` for ``ctx``."""
    return TASK_SOURCES.get(name)(ctx, task_source_params(name, params))
