"""MT-SDPO's pool of domain teachers and their eligible sets per task. [recon]

MT-SDPO distils from a *pool* of teachers, each good at its own domain (an env, a
difficulty). For every training task the verifier marks which teachers solve it: the
task's **eligible set**. When no rollout of the student's group is verified, the EMA
teacher reads the eligible teachers' verified trajectories of that task (sanitised) as
its context c*, and with ``teacher.aggregate: all`` the mean of its distributions over
all of them is the target (:func:`credo.objectives.mixture_logprobs`).

A pool member is a finished run (``teacher.pool``: run, checkpoint or model folders, the
student's tokenizer and vocabulary). Each member plays each task once, greedily, from the
run's env with the student's renderer, the first time a group of that task has no
verified rollout; the result (solved or not, and the sanitised actions) is kept per task
and checkpointed with the run, so that the eligible sets are computed once per task
(the paper computes them offline, before training: the same sets, since a greedy member
on a fixed task plays the same episode) and ``--resume`` reads the same ones.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from credo.envs.base import Task
from credo.policy.base import SamplingParams
from credo.policy.hf import HFPolicy
from credo.rollout.envguard import env_phase
from credo.rollout.group import sample_groups
from credo.rollout.render import Renderer
from credo.rollout.sampler import SamplerContext
from credo.teachers.sanitise import sanitise

__all__ = ["PoolPlay", "TeacherPool", "greedy_play", "pool_labels"]

#: ``(member policy, tasks) → per task (solved, actions)``: how a member plays tasks.
PoolPlay = Callable[[HFPolicy, Sequence[Task]], list[tuple[bool, list[str]]]]


def greedy_play(
    renderer: Renderer,
    make_env: Callable[[], Any],
    sampling: SamplingParams,
    max_turns: int,
) -> PoolPlay:
    """How a pool member plays: one greedy episode per task (temperature 0, the run's
    renderer, env and turn cap), as the held-out evaluation samples; an env that fails
    fails its episode (not solved)."""
    greedy = dataclasses.replace(sampling, temperature=0.0, aux_samples=0, topk_logprobs=0)

    def play(policy: HFPolicy, tasks: Sequence[Task]) -> list[tuple[bool, list[str]]]:
        ctx = SamplerContext(
            policy, renderer, make_env, greedy, max_turns, torch.Generator().manual_seed(0)
        )
        with env_phase("teacher pool"):
            res = sample_groups(ctx, list(tasks), group_size=1)
        out: list[tuple[bool, list[str]]] = [(False, []) for _ in tasks]
        for e in res.episodes:
            out[e.group] = (bool(e.success) and e.error is None, [s.action for s in e.steps])
        return out

    return play


def pool_labels(paths: Sequence[str]) -> list[str]:
    """A short unique label per pool folder: its last path component (a run's name),
    numbered where two share one."""
    names = [Path(str(p)).name or str(p) for p in paths]
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


@dataclass
class TeacherPool:
    """The pool's members and the eligible set of every task seen so far.

    Attributes:
        members: ``(label, policy)`` of each teacher, frozen.
        play: how a member plays a list of tasks (:data:`PoolPlay`).
        sanitiser: the sanitiser applied to a member's verified actions
            (``teacher.sanitiser``), with ``sanitiser_params``.
        results: per task id, per member label, the sanitised context of a solved task
            or ``None`` (not solved): the eligible set is the labels with a context.
        seconds: time spent playing, in total.
    """

    members: list[tuple[str, HFPolicy]]
    play: PoolPlay
    sanitiser: str = "none"
    sanitiser_params: dict[str, Any] = field(default_factory=dict)
    results: dict[str, dict[str, str | None]] = field(default_factory=dict)
    seconds: float = 0.0

    def ensure(self, tasks: Sequence[Task]) -> int:
        """Play every member on the tasks whose eligible set is not known yet; returns
        how many tasks were played."""
        todo: list[Task] = []
        seen: set[str] = set()
        for task in tasks:
            if task.id not in self.results and task.id not in seen:
                todo.append(task)
                seen.add(task.id)
        if not todo:
            return 0
        start = time.perf_counter()
        rows: dict[str, dict[str, str | None]] = {t.id: {} for t in todo}
        for label, policy in self.members:
            played = self.play(policy, todo)
            if len(played) != len(todo):
                raise ValueError(
                    f"teacher pool: member {label!r} returned {len(played)} episodes for "
                    f"{len(todo)} tasks"
                )
            for task, (solved, actions) in zip(todo, played):
                text = sanitise(self.sanitiser, actions, **self.sanitiser_params)
                rows[task.id][label] = (text or None) if solved else None
        self.results.update(rows)
        self.seconds += time.perf_counter() - start
        return len(todo)

    def eligible(self, task_id: str) -> list[str]:
        """The labels of the members that solved ``task_id`` (pool order)."""
        got = self.results.get(task_id, {})
        return [label for label, _ in self.members if got.get(label) is not None]

    def contexts(self, task_id: str) -> list[str]:
        """The eligible members' sanitised contexts of ``task_id`` (pool order; empty
        when the task was not played or no member solved it)."""
        got = self.results.get(task_id, {})
        return [c for label, _ in self.members if (c := got.get(label)) is not None]

    def metrics(self) -> dict[str, float]:
        """``teacher/pool_tasks`` (tasks played so far), ``teacher/pool_eligible`` (mean
        eligible-set size over them), ``teacher/pool_solved/<label>`` (each member's
        share of them solved) and ``teacher/pool_seconds``."""
        n = len(self.results)
        out = {"teacher/pool_tasks": float(n), "teacher/pool_seconds": self.seconds}
        out["teacher/pool_eligible"] = (
            sum(len(self.eligible(t)) for t in self.results) / n if n else 0.0
        )
        for label, _ in self.members:
            solved = sum(r.get(label) is not None for r in self.results.values())
            out[f"teacher/pool_solved/{label}"] = solved / n if n else 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        """The eligible sets (JSON), for the run's checkpoint."""
        return {"members": [label for label, _ in self.members], "results": self.results}

    def load(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (a checkpoint of the same pool)."""
        if not state:
            return
        labels = [label for label, _ in self.members]
        if list(state.get("members", [])) != labels:
            raise ValueError(
                f"checkpoint's teacher pool {state.get('members')} is not this run's {labels}; "
                "resume with the run's own config"
            )
        self.results = {
            str(t): {str(k): (None if v is None else str(v)) for k, v in r.items()}
            for t, r in dict(state.get("results", {})).items()
        }
