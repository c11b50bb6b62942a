"""RODS's task synthesiser: Planner, Executor, Rewrite and Critique.

Fang et al. 2026, "RODS: Reward-Driven Online Data Synthesis for Multi-Turn Tool-Use
Agents", <https://arxiv.org/abs/2606.19047>, Section 3 (the roles; their rules here are
credo's, for envs that generate tasks from a seed: ``docs/algorithms.md#rods``).

A boundary task (its group disagrees, :func:`credo.tasks.rods.decide`) is the parent of
*isomorphic variants*: the same dependency topology with new entities and new wording,
verified before they enter the buffer. Four roles, each a method of a synthesiser:

* **Planner** (:meth:`RuleSynthesiser.plan`) reads the parent's structure: the env's
  ``task_structure()`` (for ``tools`` the family, each request and the store action that
  serves it; for ``shop`` the list's length, attributes and categories) and the
  *skeleton* of its oracle solution, the verb of every oracle action in order
  (``find_customer list_orders check_policy refund done``, the call graph walked).
* **Executor** (:meth:`RuleSynthesiser.execute`) instantiates the plan with new
  entities through the env's generator: it draws variant seeds
  (:func:`~credo.envs.base.find_variant_seed`'s range) until one generates a task of the
  planned structure whose oracle walks the planned skeleton, at most ``tries`` draws
  (an env without ``task_structure()`` is matched on the skeleton alone).
* **Rewrite** (:meth:`RuleSynthesiser.rewrite`) words the variant's instruction afresh
  within the env's vocabulary through the env's ``reword(task, rng)`` (``tools``:
  another draw of its ticket templates); an env without it keeps the executor's wording.
* **Critique** (:meth:`RuleSynthesiser.critique`) executes the env's oracle on the
  variant and rejects it as ``unsolvable`` (the oracle fails within the turn cap),
  ``off_plan`` (its skeleton is not the plan's), ``trivial`` (the oracle needs fewer than
  ``min_steps`` actions) or ``duplicate`` (the buffer has seen a task with its
  instruction and its oracle's actions, the entities included: :func:`task_key`);
  an env that raises rejects it as ``env_error``. ``no_match``: the executor found no
  seed of the plan.

:func:`synthesise` runs the four roles for one parent and returns a :class:`Proposal`;
:class:`~credo.tasks.rods.RodsSource` counts accepted and rejected proposals (the
validity rate, ``tasks/valid_rate``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from credo.envs.base import HELDOUT_SEED_OFFSET, VARIANT_SEED_OFFSET, Task

__all__ = [
    "REJECTIONS",
    "Plan",
    "Proposal",
    "RuleSynthesiser",
    "action_verb",
    "synthesise",
    "task_key",
]

#: Why the critique (or the executor) turns a variant down.
REJECTIONS = ("no_match", "unsolvable", "off_plan", "trivial", "duplicate", "env_error")

_VERB = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)")


def action_verb(action: str) -> str:
    """The verb of an action: its first identifier, lower-cased (``refund { ... }`` →
    ``refund``, ``click[2]`` → ``click``), or the whole stripped action if it has none
    (``"3"`` → ``"3"``)."""
    m = _VERB.match(action)
    return m.group(1).lower() if m else action.strip()


def task_key(instruction: str, actions: tuple[str, ...]) -> str:
    """What tells two tasks apart for the critique's duplicate check: the instruction and
    the oracle's actions (ids, amounts, the secret...), one per line. The instruction
    alone would not do: an env may word every task alike (``examples/custom_env.py``)."""
    return "\n".join((instruction, *actions))


@dataclass(frozen=True)
class Plan:
    """What the planner read off a parent task.

    Attributes:
        parent: the parent's id (``train/12``).
        structure: the env's ``task_structure()`` on the parent (``None``: the env has
            none, and the executor matches ``skeleton``).
        skeleton: the verbs of the oracle's actions on the parent, in order.
        key: the parent's :func:`task_key` (a variant must differ from it).
    """

    parent: str
    structure: Any
    skeleton: tuple[str, ...]
    key: str


@dataclass(frozen=True)
class Proposal:
    """One run of the four roles: ``task`` is the accepted variant (``None`` if
    rejected), ``reason`` the rejection (one of :data:`REJECTIONS`, ``None`` if
    accepted), ``key`` the variant's :func:`task_key` (empty when none was made; the
    error for ``env_error``)."""

    task: Task | None
    reason: str | None
    key: str = ""


@dataclass(frozen=True)
class _Solution:
    """The oracle's run on a task: did it succeed, its actions, the instruction."""

    success: bool
    actions: tuple[str, ...]
    instruction: str

    @property
    def skeleton(self) -> tuple[str, ...]:
        return tuple(action_verb(a) for a in self.actions)

    @property
    def key(self) -> str:
        return task_key(self.instruction, self.actions)


class RuleSynthesiser:
    """The rule-based synthesiser for envs that generate a task from its seed (see the
    module docstring).

    Args:
        make_env: creates a fresh env; it must have ``oracle_action()`` (the critique
            runs it).
        max_turns: the oracle's turn cap (``None``: the env's ``max_turns`` attribute,
            else 100).
        tries: variant seeds the executor draws for one plan at most (default 2000).
        min_steps: a variant the oracle solves in fewer actions is ``trivial``
            (default 2).
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        *,
        max_turns: int | None = None,
        tries: int = 2000,
        min_steps: int = 2,
    ) -> None:
        self.env = make_env()
        if not hasattr(self.env, "oracle_action"):
            raise ValueError(
                f"{type(self.env).__name__} has no oracle_action(): RODS's critique runs the "
                "oracle on every variant; add it, or set tasks.params.synthesiser=similar "
                "(the env's similar_task) or tasks.params.spawn=0"
            )
        self.max_turns = max_turns or int(getattr(self.env, "max_turns", 0) or 100)
        self.tries = tries
        self.min_steps = min_steps
        self.has_structure = callable(getattr(self.env, "task_structure", None))
        self.has_reword = callable(getattr(self.env, "reword", None))

    # ------------------------------------------------------------------ roles
    def plan(self, task: Task) -> Plan:
        """Planner: the parent's structure and its oracle skeleton."""
        solution = self._solve(task)
        structure = self._structure(task) if self.has_structure else None
        return Plan(task.id, structure, solution.skeleton, solution.key)

    def execute(self, plan: Plan, rng: random.Random) -> Task | None:
        """Executor: a fresh variant seed whose task has the plan's structure (when the
        env has ``task_structure()``) and whose oracle walks the plan's skeleton;
        ``None`` after ``tries`` draws."""
        for _ in range(self.tries):
            task = Task("train", rng.randrange(VARIANT_SEED_OFFSET, HELDOUT_SEED_OFFSET))
            if self.has_structure and self._structure(task) != plan.structure:
                continue  # cheap: a reset; the oracle's walk only for candidates
            if self._solve(task).skeleton == plan.skeleton:
                return task
        return None

    def rewrite(self, task: Task, rng: random.Random) -> Task:
        """Rewrite: the env's ``reword(task, rng)`` when it has one, else ``task``."""
        if not self.has_reword:
            return task
        out = self.env.reword(task, rng)
        if not isinstance(out, Task):
            raise ValueError(
                f"{type(self.env).__name__}.reword must return a Task, got {type(out).__name__}"
            )
        return out

    def critique(self, task: Task, plan: Plan, seen: set[str]) -> tuple[str | None, str]:
        """Critique: ``(reason, key)``; ``reason`` is ``None`` when the oracle solves
        ``task`` along the plan's skeleton, in at least ``min_steps`` actions, and its
        :func:`task_key` is neither the parent's nor in ``seen``."""
        solution = self._solve(task)
        key = solution.key
        if not solution.success:
            return "unsolvable", key
        if solution.skeleton != plan.skeleton:
            return "off_plan", key
        if len(solution.actions) < self.min_steps:
            return "trivial", key
        if key == plan.key or key in seen:
            return "duplicate", key
        return None, key

    def forget(self, parent: str) -> None:
        """Drop what the synthesiser keeps of a retired parent (the rules keep nothing)."""

    # ---------------------------------------------------------------- helpers
    def _structure(self, task: Task) -> Any:
        self.env.reset(task, 0)
        return self.env.task_structure()

    def _solve(self, task: Task) -> _Solution:
        """Run the oracle on ``task`` to its end (or the turn cap)."""
        env = self.env
        obs = env.reset(task, 0)
        instruction = env.instruction() if hasattr(env, "instruction") else obs
        actions: list[str] = []
        success = False
        for _ in range(self.max_turns):
            action = env.oracle_action()
            res = env.step(action)
            actions.append(action)
            if res.done:
                success = bool(res.info.get("success", False))
                break
        return _Solution(success, tuple(actions), str(instruction))


def synthesise(synth: RuleSynthesiser, plan: Plan, rng: random.Random, seen: set[str]) -> Proposal:
    """One variant of ``plan``'s parent through the executor, the rewrite and the
    critique. An exception the env raises rejects the variant as ``env_error``, with the
    error as its ``key``: a failing env fails its variant, not the run."""
    try:
        task = synth.execute(plan, rng)
        if task is None:
            return Proposal(None, "no_match")
        task = synth.rewrite(task, rng)
        reason, key = synth.critique(task, plan, seen)
    except Exception as exc:  # the env's own code raised: this variant is lost
        return Proposal(None, "env_error", f"{type(exc).__name__}: {exc}")
    return Proposal(None if reason else task, reason, key)
