"""A cache of verified teacher contexts per task, kept across iterations (MT-SDPO).

When a group has no verified rollout this iteration, MT-SDPO falls back to an external
context: a verified (and sanitised) trajectory of the *same task* seen earlier — from the
student's own past iterations or from external teachers run offline. The cache keeps, per
task id, the ``max_per_task`` most recent distinct contexts (oldest dropped first), and
saves/loads as JSON, written atomically.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

__all__ = ["ContextCache"]


class ContextCache:
    """Verified teacher contexts per task id.

    Args:
        max_per_task: contexts kept per task (default 4; ≥ 1).
    """

    def __init__(self, max_per_task: int = 4) -> None:
        if max_per_task < 1:
            raise ValueError(f"context cache: max_per_task must be >= 1, got {max_per_task}")
        self.max_per_task = int(max_per_task)
        self._items: OrderedDict[str, list[str]] = OrderedDict()

    def add(self, task_id: str, context: str) -> None:
        """Record a verified context for ``task_id`` (a repeat moves to the newest end)."""
        if not context:
            return
        items = self._items.setdefault(task_id, [])
        if context in items:
            items.remove(context)
        items.append(context)
        del items[: max(0, len(items) - self.max_per_task)]

    def get(self, task_id: str) -> list[str]:
        """The task's contexts, oldest first (empty if none)."""
        return list(self._items.get(task_id, []))

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._items

    def __len__(self) -> int:
        return sum(len(v) for v in self._items.values())

    def tasks(self) -> list[str]:
        return list(self._items)

    def to_dict(self) -> dict[str, object]:
        return {"max_per_task": self.max_per_task, "tasks": dict(self._items)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ContextCache:
        cache = cls(int(data.get("max_per_task", 4)))  # type: ignore[arg-type]
        tasks = data.get("tasks", {})
        if not isinstance(tasks, dict):
            raise ValueError("context cache: 'tasks' must map task ids to lists of contexts")
        for task_id, contexts in tasks.items():
            for c in contexts:
                cache.add(str(task_id), str(c))
        return cache

    def save(self, path: str | Path) -> None:
        """Write the cache as JSON atomically (temp file + rename)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> ContextCache:
        """Read a cache written by :meth:`save`."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"context cache {str(path)!r}: cannot read it ({exc})") from None
        return cls.from_dict(data)
