"""``mixture``: several envs in one run, one policy (issue 41; verl-agent and ROLL train one
agent on several tasks the same way).

::

    credo train --env mixture "env.kwargs={envs: [{name: shop, kwargs: {difficulty: multi}},
        {name: 'gym:credo/TextLights-v0', weight: 2, label: lights}]}"

Each entry of ``envs`` is ``{name, kwargs, weight, label}``: an env name as ``--env``
takes it (built-in, ``module:Class``, ``gym:ID``, ...), its keyword arguments (default
none), its share of the tasks (``weight``, default 1) and the name it is reported under
(``label``, default the env name; labels must differ). A weight of 0 keeps an env's
words and rules in the mixture but gives it no task: a domain teacher for MT-SDPO
(``teacher.pool``) trained on one env of the mixture then shares the mixture's
vocabulary with the student.

**Which env a task belongs to** is a pure function of the task: ``task.data["env"]`` when
set (a task that names its env, e.g. a variant from :meth:`similar_task`), else a draw
weighted by ``weight`` from a generator seeded with the task's split and seed. The same
task always goes to the same env, in training, in the held-out evaluation, after a
``--resume`` and in every process, and the sub-env receives the task unchanged, so its
own train/held-out seed split holds. Over many tasks each env's share approaches its
weight's share.

**What credo sees** is one env: ``reset``/``step``/``state_key``/``snapshot``/``restore``
act on the current task's env (its state keys prefixed with the label, so that two envs
never share a state); ``task_env()`` names it (held-out success per env and the weakest
env in ``credo train``/``eval``/``compare``, and ``rollout/success/<label>`` per
iteration); ``task_difficulty()`` is ``label`` or ``label/<its difficulty>``. Optional
methods are offered when *every* env has them (``oracle_action``, ``sample_action``,
``instruction``, ``vocabulary``: the union of the envs' words) or when *any* has them
(``privileged_context``, ``abstract_state_key``, ``progress``, ``is_tool_call``,
``extract_action``: ``None``/the default for an env without). The system message lists
each env's ``action_format()`` under its label; each prompt starts with the current
task's instruction, so the policy knows which env it is in. The envs run in the training
process (``rollout.env_workers`` ≥ 2 is refused in one line).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Any

from credo.envs.base import StepResult, Task, make_env, register_env, restore_env, snapshot_env

__all__ = ["MixtureEnv", "mixture_entries"]

#: Methods offered when every env of the mixture has them.
ALL_METHODS = ("oracle_action", "sample_action", "instruction", "vocabulary")
#: Methods offered when any env has them (an env without gives ``None``).
ANY_METHODS = ("privileged_context", "abstract_state_key", "progress", "task_difficulty")
#: Methods about an action, offered when any env has them (an env without: the default).
ACTION_METHODS = ("is_tool_call", "extract_action")


@dataclass(frozen=True)
class Entry:
    """One env of a mixture: its ``--env`` name, keyword arguments, weight and label."""

    name: str
    kwargs: dict[str, Any]
    weight: float
    label: str


def mixture_entries(envs: Any) -> list[Entry]:
    """The ``envs`` list of a mixture, checked: each a mapping with ``name`` and optional
    ``kwargs``, ``weight`` (≥ 0, one at least > 0) and ``label`` (distinct). One-line ``ValueError``s."""
    if not isinstance(envs, list) or len(envs) < 1:
        raise ValueError(
            "mixture: env.kwargs.envs must be a list of {name, kwargs, weight, label}, e.g. "
            "envs=[{name: shop}, {name: 'gym:credo/TextLights-v0', weight: 2}]"
        )
    out: list[Entry] = []
    for i, e in enumerate(envs):
        where = f"mixture: envs[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"]:
            raise ValueError(f"{where} must be a mapping with an env name: {{name: shop}}")
        extra = sorted(set(e) - {"name", "kwargs", "weight", "label"})
        if extra:
            raise ValueError(
                f"{where}: unknown key {extra[0]!r}; valid: name, kwargs, weight, label"
            )
        if e["name"] == "mixture":
            raise ValueError(f"{where}: a mixture cannot hold a mixture")
        kwargs = e.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ValueError(f"{where}.kwargs must be a mapping, got {type(kwargs).__name__}")
        weight = e.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise ValueError(f"{where}.weight must be a number >= 0, got {weight!r}")
        label = e.get("label", e["name"])
        if not isinstance(label, str) or not label or "|" in label:
            raise ValueError(f"{where}.label must be a non-empty name without '|', got {label!r}")
        if label in {x.label for x in out}:
            raise ValueError(f"{where}: label {label!r} is taken; give each env its own label")
        out.append(Entry(e["name"], dict(kwargs), float(weight), label))
    if not any(e.weight > 0 for e in out):
        raise ValueError("mixture: every env has weight 0; give at least one a weight > 0")
    return out


@register_env("mixture")
class MixtureEnv:
    """Several envs as one: each task goes to one of them (module docstring).

    Args:
        envs: ``[{name, kwargs, weight, label}, ...]`` (:func:`mixture_entries`).
    """

    #: Ray env workers answer some methods from a local instance, which would parse with
    #: the wrong env's rules: a mixture's envs stay in the training process.
    in_process_only = "its extract_action, oracle and vocabulary follow the current task's env"

    def __init__(self, envs: Any = None) -> None:
        self.entries = mixture_entries(envs)
        self.envs = [make_env(e.name, **e.kwargs) for e in self.entries]
        self.labels = [e.label for e in self.entries]
        total = sum(e.weight for e in self.entries)
        self._cum = []
        acc = 0.0
        for e in self.entries:
            acc += e.weight / total
            self._cum.append(acc)
        self._i = 0
        turns = [getattr(env, "max_turns", None) for env in self.envs]
        if all(isinstance(t, int) for t in turns):
            self.max_turns = max(turns)  # type: ignore[type-var]
        for name in ALL_METHODS:
            if all(callable(getattr(env, name, None)) for env in self.envs):
                setattr(self, name, getattr(self, f"_{name}"))
        for name in (*ANY_METHODS, *ACTION_METHODS):
            if any(callable(getattr(env, name, None)) for env in self.envs):
                setattr(self, name, getattr(self, f"_{name}"))

    # ------------------------------------------------------------------ routing
    def index_of(self, task: Task) -> int:
        """The env of ``task``: ``task.data["env"]`` (a label) when set, else a draw by
        weight seeded with the task's split and seed (the same in every process)."""
        named = task.data.get("env") if task.data else None
        if named is not None:
            if named not in self.labels:
                raise ValueError(
                    f"mixture: task {task.id} names env {named!r}; this mixture has "
                    f"{', '.join(self.labels)}"
                )
            return self.labels.index(named)
        u = random.Random(zlib.crc32(f"{task.split}/{task.seed}".encode())).random()
        for i, c in enumerate(self._cum):
            if u < c and self.entries[i].weight > 0:
                return i
        return max(i for i, e in enumerate(self.entries) if e.weight > 0)

    @property
    def current(self) -> Any:
        """The env of the current task."""
        return self.envs[self._i]

    def task_env(self) -> str:
        """The label of the current task's env."""
        return self.labels[self._i]

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Task, seed: int = 0) -> str:
        self._i = self.index_of(task)
        return self.current.reset(task, seed)

    def step(self, action: str) -> StepResult:
        """The current env's step, its info marked ``env: <label>`` (the trainer's
        ``rollout/success/<label>`` reads it)."""
        res = self.current.step(action)
        return StepResult(
            res.observation, res.reward, res.done, {**res.info, "env": self.task_env()}
        )

    def state_key(self) -> str:
        return f"{self.task_env()}|{self.current.state_key()}"

    def snapshot(self) -> tuple[int, Any]:
        return (self._i, snapshot_env(self.current))

    def restore(self, snap: tuple[int, Any]) -> None:
        self._i, inner = snap
        restore_env(self.current, inner)

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        """A variant from the task's own env, labelled so that it stays in that env."""
        i = self.index_of(task)
        fn = getattr(self.envs[i], "similar_task", None)
        if fn is None:
            raise ValueError(f"mixture: env {self.labels[i]!r} has no similar_task()")
        t = fn(task, rng)
        return Task(t.split, t.seed, {**t.data, "env": self.labels[i]})

    def action_format(self) -> str:
        """Every env's rules under its label (one system message for the run)."""
        parts = []
        for label, env in zip(self.labels, self.envs):
            fn = getattr(env, "action_format", None)
            if callable(fn):
                parts.append(f"{label}: {fn()}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ optional methods
    def _oracle_action(self) -> str:
        return self.current.oracle_action()

    def _sample_action(self, rng: random.Random) -> str:
        return self.current.sample_action(rng)

    def _instruction(self) -> str:
        return self.current.instruction()

    def _vocabulary(self) -> list[str]:
        words: dict[str, None] = {}
        for env in self.envs:
            words.update(dict.fromkeys(env.vocabulary()))
        words.update(dict.fromkeys(w for label in self.labels for w in label.split()))
        return list(words)

    def _call(self, name: str, *args: Any) -> Any:
        fn = getattr(self.current, name, None)
        return fn(*args) if callable(fn) else None

    def _privileged_context(self, kind: str) -> str | None:
        return self._call("privileged_context", kind)

    def _abstract_state_key(self) -> str | None:
        key = self._call("abstract_state_key")
        return None if key is None else f"{self.task_env()}|{key}"

    def _progress(self) -> float | None:
        return self._call("progress")

    def _task_difficulty(self) -> str:
        sub = self._call("task_difficulty")
        return self.task_env() if sub is None else f"{self.task_env()}/{sub}"

    def _is_tool_call(self, action: str) -> bool:
        return bool(self._call("is_tool_call", action))

    def _extract_action(self, text: str) -> str | None:
        return self._call("extract_action", text)
