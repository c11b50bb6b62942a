"""Task sources: where each iteration's training tasks come from (``tasks.source``).

``fixed`` draws uniformly from the training seeds (the default); ``rods`` keeps a buffer
that follows the policy's capability boundary (:mod:`credo.tasks.rods`). Registry and
protocol: :mod:`credo.tasks.registry`.
"""

from credo.tasks import fixed, rods  # noqa: F401  (register the built-in sources)
from credo.tasks.fixed import FixedSource
from credo.tasks.registry import (
    TASK_SOURCES,
    TaskSource,
    TaskSourceContext,
    make_task_source,
    register_task_source,
    task_source_check,
    task_source_names,
    task_source_params,
)
from credo.tasks.rods import Decision, RodsParams, RodsSource, TaskStats, decide, group_stats
from credo.tasks.signal import SIGNALS, episode_signal

__all__ = [
    "SIGNALS",
    "TASK_SOURCES",
    "Decision",
    "FixedSource",
    "RodsParams",
    "RodsSource",
    "TaskSource",
    "TaskSourceContext",
    "TaskStats",
    "decide",
    "episode_signal",
    "group_stats",
    "make_task_source",
    "register_task_source",
    "task_source_check",
    "task_source_names",
    "task_source_params",
]
