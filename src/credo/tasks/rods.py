"""``rods``: a task buffer that follows the policy's capability boundary (RODS).

Fang et al. 2026, "RODS: Reward-Driven Online Data Synthesis for Multi-Turn Tool-Use
Agents", <https://arxiv.org/abs/2606.19047> (thresholds reconstructed; formula in
``docs/algorithms.md#rods``).

The buffer starts with ``seed_pool`` training seeds. Each iteration draws
``tasks_per_iter`` distinct tasks from it (a task whose latest group was on the boundary,
or that was never drawn, weighs ``boundary_weight``; the rest 1). After the update the
group of each task gives a progress reward per episode (:func:`~credo.tasks.signal.
episode_signal`) in [0, 1], its mean μ and population variance σ² (at most 1/4), and
three decisions (:func:`decide`):

* **boundary** iff σ²/(1/4) ≥ τ_v and 0 < μ < 1: the group disagrees, so the task sits
  at the edge of what the policy can do; it is the parent of ``spawn`` proposed
  isomorphic variants while the buffer is below ``max_pool``. The synthesiser
  (``synthesiser: rules``, :mod:`credo.tasks.synthesis`) plans from the parent's
  structure, instantiates new entities through the env's generator, rewords the
  instruction and has the env's oracle verify each variant; only verified ones enter the
  buffer (``synthesiser: llm`` has a chat model write the variant from the env's
  ``task_spec()``, :mod:`credo.tasks.llm_synthesis`, verified the same way;
  ``synthesiser: similar`` takes the env's ``similar_task(task, rng)`` unverified, the
  former behaviour);
* **mastered** iff μ ≥ τ_hi; **dead** iff σ² = 0 and μ ≤ ``dead_eps`` (μ ≈ 0);
* **retire** after ``retire_after`` consecutive rounds mastered (or dead): the task
  leaves the buffer.

Retired tasks are replaced by fresh training seeds, so the buffer never holds fewer than
``seed_pool`` tasks. The whole buffer (tasks, per-task statistics, counters) is the
source's state: :meth:`RodsSource.state_dict` is JSON-able and a resumed run continues
exactly, since every random choice derives from the seeds the trainer passes per
iteration.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from credo.data.episode import Episode
from credo.envs.base import Task, resolve_env
from credo.tasks.registry import TaskSourceContext, register_task_source
from credo.tasks.signal import SIGNALS, episode_signal
from credo.tasks.synthesis import REJECTIONS, Plan, RuleSynthesiser, synthesise

__all__ = [
    "SYNTHESISERS",
    "Decision",
    "RodsParams",
    "RodsSource",
    "TaskStats",
    "decide",
    "group_stats",
]

#: The largest variance of a reward in [0, 1] (half zeros, half ones).
MAX_VARIANCE = 0.25
#: Variances at or below this count as zero (floating-point sums of equal rewards).
ZERO_VARIANCE = 1e-12
#: How variants are made (:attr:`RodsParams.synthesiser`).
SYNTHESISERS = ("rules", "llm", "similar")


@dataclass
class RodsParams:
    """RODS's knobs (``tasks.params``).

    Attributes:
        seed_pool: training seeds the buffer starts with, and the fewest tasks it holds
            (retired tasks are replaced by fresh seeds); at least ``tasks_per_iter``
            (default 64).
        max_pool: cap on the active buffer; variants are spawned only below it (default
            256).
        tau_v: τ_v, the boundary threshold on the normalised variance σ²/(1/4), in
            (0, 1] (default 0.5: e.g. a group of 8 with 2 of 8 solved has 0.75).
        tau_hi: τ_hi, a task with mean progress reward ≥ τ_hi is mastered, in (0, 1]
            (default 0.9).
        dead_eps: a task whose group all scored ≤ ``dead_eps`` (σ² = 0) is dead
            (default 1e-6, i.e. μ ≈ 0).
        retire_after: k, consecutive rounds mastered (or dead) before a task retires
            (default 2).
        spawn: variants spawned per boundary task per round (default 1; 0 turns
            spawning off, for envs without ``similar_task``).
        boundary_weight: draw weight of a task last seen on the boundary or never drawn,
            relative to 1 for the rest (default 2.0; 1.0 draws uniformly from the buffer).
        signal: the per-episode progress reward: ``progress`` (the env's progress() at
            the end when it reports one, else success; default), ``success`` or
            ``return`` (clipped to [0, 1]). ``tools``' progress is goal-relative (0 after
            a wrong store action), but ``shop``'s reaches 1 once the cart is full, right
            items or not: on ``shop`` every finished episode looks mastered, so use
            ``success`` (or ``return``) there.
        synthesiser: how variants are made: ``rules`` (default, the paper's planner,
            executor, rewrite and critique, :mod:`credo.tasks.synthesis`; needs the env's
            ``oracle_action()``), ``llm`` (the same roles with a chat model as the
            executor, for user envs that describe a task with ``task_spec()`` and rebuild
            it from ``task.data["spec"]``, :mod:`credo.tasks.llm_synthesis`) or
            ``similar`` (the env's ``similar_task(task, rng)``, unverified).
        tries: variant seeds the executor draws for one proposal at most (default
            2000; ``rules`` only).
        min_steps: the critique rejects a variant its oracle solves in fewer actions as
            trivial (default 2; ``rules`` and ``llm``).
        llm: the ``llm`` synthesiser's chat model: an alias (default ``smollm2-135m``),
            an HF folder or name, or an OpenAI-compatible server's ``http(s)://`` base URL.
        llm_model: the served model's name (default ``None``: the first the server lists).
        llm_tries: replies the ``llm`` executor asks for one proposal at most (default 8).
    """

    seed_pool: int = 64
    max_pool: int = 256
    tau_v: float = 0.5
    tau_hi: float = 0.9
    dead_eps: float = 1e-6
    retire_after: int = 2
    spawn: int = 1
    boundary_weight: float = 2.0
    signal: str = "progress"
    synthesiser: str = "rules"
    tries: int = 2000
    min_steps: int = 2
    llm: str = "smollm2-135m"
    llm_model: str | None = None
    llm_tries: int = 8

    def __post_init__(self) -> None:
        names = (
            "seed_pool",
            "max_pool",
            "retire_after",
            "spawn",
            "tries",
            "min_steps",
            "llm_tries",
        )
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("tau_v", "tau_hi", "dead_eps", "boundary_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if self.seed_pool < 1 or self.retire_after < 1 or self.spawn < 0:
            raise ValueError(
                "seed_pool and retire_after must be ≥ 1 and spawn ≥ 0, got "
                f"seed_pool={self.seed_pool}, retire_after={self.retire_after}, "
                f"spawn={self.spawn}"
            )
        if self.max_pool < self.seed_pool:
            raise ValueError(f"max_pool={self.max_pool} must be ≥ seed_pool={self.seed_pool}")
        if not (0 < self.tau_v <= 1 and 0 < self.tau_hi <= 1):
            raise ValueError(
                f"tau_v and tau_hi must be in (0, 1], got tau_v={self.tau_v}, tau_hi={self.tau_hi}"
            )
        if not 0 <= self.dead_eps < 1 or self.boundary_weight <= 0:
            raise ValueError(
                f"dead_eps must be in [0, 1) and boundary_weight > 0, got dead_eps="
                f"{self.dead_eps}, boundary_weight={self.boundary_weight}"
            )
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        if self.synthesiser not in SYNTHESISERS:
            raise ValueError(
                f"synthesiser must be one of {', '.join(SYNTHESISERS)}, got {self.synthesiser!r}"
            )
        if not isinstance(self.llm, str) or not self.llm:
            raise ValueError(f"llm must be a model name, folder or server URL, got {self.llm!r}")
        if self.llm_tries < 1:
            raise ValueError(f"llm_tries must be ≥ 1, got {self.llm_tries}")
        if self.tries < 1 or self.min_steps < 0:
            raise ValueError(
                f"tries must be ≥ 1 and min_steps ≥ 0, got tries={self.tries}, "
                f"min_steps={self.min_steps}"
            )


@dataclass(frozen=True)
class Decision:
    """What one round of a task's group decides (see :func:`decide`)."""

    boundary: bool
    mastered: bool
    dead: bool


def group_stats(values: Sequence[float]) -> tuple[float, float]:
    """Mean μ and population variance σ² of a group's progress rewards ``values`` [G]."""
    if not values:
        raise ValueError("group_stats needs at least one reward")
    arr = np.asarray(values, dtype=np.float64)
    mean = float(arr.mean())
    return mean, float(((arr - mean) ** 2).mean())


def decide(mean: float, var: float, params: RodsParams) -> Decision:
    """The round's decisions for a group with progress-reward mean ``mean`` and variance
    ``var``: boundary iff σ²/(1/4) ≥ τ_v and 0 < μ < 1; mastered iff μ ≥ τ_hi; dead
    iff σ² = 0 and μ ≤ ``dead_eps``."""
    zero_var = var <= ZERO_VARIANCE
    return Decision(
        boundary=var / MAX_VARIANCE >= params.tau_v and 0.0 < mean < 1.0 and not zero_var,
        mastered=mean >= params.tau_hi,
        dead=zero_var and mean <= params.dead_eps,
    )


@dataclass
class TaskStats:
    """One buffered task and its statistics across the rounds it was drawn.

    Attributes:
        split, seed, data: the task (:class:`~credo.envs.base.Task`).
        parent: the id of the boundary task it was spawned from (``None``: a seed).
        rounds: rounds (iterations) it was drawn in.
        mean_sum: the sum of its per-round means (``mean_sum / rounds``: the average).
        last_mean, last_var: μ and σ² of its latest group.
        boundary: its latest group was on the boundary.
        mastered_streak, dead_streak: consecutive latest rounds mastered / dead.
    """

    split: str
    seed: int
    data: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None
    rounds: int = 0
    mean_sum: float = 0.0
    last_mean: float = 0.0
    last_var: float = 0.0
    boundary: bool = False
    mastered_streak: int = 0
    dead_streak: int = 0

    @property
    def task(self) -> Task:
        return Task(self.split, self.seed, dict(self.data))

    @property
    def id(self) -> str:
        return self.task.id


def _check(params: RodsParams, ctx: TaskSourceContext, env: str) -> str | None:
    """The seed pool fits the run's task counts; spawning needs ``similar_task`` of the
    env named ``env``."""
    if params.seed_pool < ctx.tasks_per_iter or params.seed_pool > ctx.train_tasks:
        return (
            f"tasks.params.seed_pool={params.seed_pool} must be between rollout.tasks_per_iter"
            f"={ctx.tasks_per_iter} (the distinct tasks of an iteration) and rollout.train_tasks"
            f"={ctx.train_tasks}"
        )
    if params.spawn == 0:
        return None
    cls = resolve_env(env)
    if params.synthesiser == "similar" and not hasattr(cls, "similar_task"):
        return (
            f"tasks.params.synthesiser=similar spawns variants with the env's "
            f"similar_task(task, rng), which env {env!r} lacks; implement it, use "
            "synthesiser=rules or set tasks.params.spawn=0"
        )
    if params.synthesiser == "rules" and not hasattr(cls, "oracle_action"):
        return (
            f"tasks.params.synthesiser=rules verifies each variant with the env's "
            f"oracle_action(), which env {env!r} lacks; implement it, use synthesiser=similar "
            "or set tasks.params.spawn=0"
        )
    return None


@register_task_source("rods", params=RodsParams, check=_check)
class RodsSource:
    """The RODS task buffer (see the module docstring).

    Args:
        ctx: the training seed pool, the tasks per iteration and the env factory.
        params: :class:`RodsParams`.
    """

    def __init__(self, ctx: TaskSourceContext, params: RodsParams | None = None) -> None:
        self.params = params if params is not None else RodsParams()
        self.train_tasks = ctx.train_tasks
        self.tasks_per_iter = ctx.tasks_per_iter
        if self.params.seed_pool < ctx.tasks_per_iter:
            raise ValueError(
                f"rods seed_pool={self.params.seed_pool} must be ≥ tasks_per_iter="
                f"{ctx.tasks_per_iter}: each iteration draws that many distinct tasks"
            )
        if self.params.seed_pool > ctx.train_tasks:
            raise ValueError(
                f"rods seed_pool={self.params.seed_pool} exceeds the training seeds "
                f"({ctx.train_tasks})"
            )
        self._make_env = ctx.make_env
        self._env: Any = None
        self._synth: RuleSynthesiser | None = None
        self._plans: dict[str, Plan] = {}  # the planner's reading of each parent
        if self.params.spawn > 0:  # fail now, not at the first boundary task
            self._synthesiser() if self.params.synthesiser != "similar" else self._similar()
        self.pool: list[TaskStats] = []
        self.used_seeds: set[int] = set()  # seeds put in the buffer since the last reuse
        self.seeds_seen: set[int] = set()  # training seeds ever put in the buffer
        self.spawned_total = 0
        self.retired_total = 0
        self.proposed_total = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECTIONS, 0)
        self.seen: set[str] = set()  # task keys of the parents and accepted variants
        self._warned = False

    # ----------------------------------------------------------------- protocol
    def draw(self, iteration: int, seed: int) -> list[Task]:
        """Top the buffer up to ``seed_pool`` with fresh training seeds, then draw
        ``tasks_per_iter`` distinct tasks, weighted as the module docstring says."""
        rng = np.random.default_rng(seed)
        self._refill(rng)
        w = np.array(
            [
                self.params.boundary_weight if (e.boundary or e.rounds == 0) else 1.0
                for e in self.pool
            ]
        )
        idx = rng.choice(len(self.pool), size=self.tasks_per_iter, replace=False, p=w / w.sum())
        return [self.pool[int(i)].task for i in idx]

    def observe(
        self, tasks: Sequence[Task], episodes: Sequence[Episode], seed: int
    ) -> dict[str, float]:
        """Update the statistics of ``tasks`` from their groups in ``episodes``,
        retire, spawn; return this round's ``tasks/pool_size``, ``tasks/boundary_frac``,
        ``tasks/proposed`` (variants proposed), ``tasks/spawned`` (accepted) and
        ``tasks/retired``, and the run's ``tasks/valid_rate`` (accepted / proposed so
        far, once one was proposed) and ``tasks/distinct`` (training seeds and accepted
        variants ever in the buffer: the run's data)."""
        groups: dict[int, list[float]] = {}
        for ep in episodes:
            groups.setdefault(ep.group, []).append(episode_signal(ep, self.params.signal))
        by_id = {e.id: e for e in self.pool}
        seen, boundary, retire = 0, [], set()
        for i, task in enumerate(tasks):
            entry = by_id.get(task.id)
            if entry is None or i not in groups:
                continue
            seen += 1
            mean, var = group_stats(groups[i])
            d = decide(mean, var, self.params)
            entry.rounds += 1
            entry.mean_sum += mean
            entry.last_mean, entry.last_var, entry.boundary = mean, var, d.boundary
            entry.mastered_streak = entry.mastered_streak + 1 if d.mastered else 0
            entry.dead_streak = entry.dead_streak + 1 if d.dead else 0
            k = self.params.retire_after
            if entry.mastered_streak >= k or entry.dead_streak >= k:
                retire.add(entry.id)
            elif d.boundary:
                boundary.append(entry)
        self.pool = [e for e in self.pool if e.id not in retire]
        for task_id in retire:  # a retired parent is planned no more
            self._plans.pop(task_id, None)
            if self._synth is not None:
                self._synth.forget(task_id)
        proposed_before = self.proposed_total
        spawned = self._spawn(boundary, random.Random(seed)) if self.params.spawn else 0
        self.retired_total += len(retire)
        out = {
            "tasks/pool_size": float(len(self.pool)),
            "tasks/boundary_frac": len(boundary) / max(1, seen),
            "tasks/proposed": float(self.proposed_total - proposed_before),
            "tasks/spawned": float(spawned),
            "tasks/retired": float(len(retire)),
            "tasks/distinct": float(len(self.seeds_seen) + self.spawned_total),
        }
        if self.proposed_total:
            out["tasks/valid_rate"] = self.spawned_total / self.proposed_total
        return out

    def state_dict(self) -> dict[str, Any]:
        """The buffer, the seeds used and the counters (JSON-able)."""
        return {
            "pool": [asdict(e) for e in self.pool],
            "used_seeds": sorted(self.used_seeds),
            "seeds_seen": sorted(self.seeds_seen),
            "spawned_total": self.spawned_total,
            "retired_total": self.retired_total,
            "proposed_total": self.proposed_total,
            "rejected": dict(self.rejected),
            "seen": sorted(self.seen),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.pool = [TaskStats(**e) for e in state["pool"]]
        self.used_seeds = {int(s) for s in state["used_seeds"]}
        self.seeds_seen = {int(s) for s in state.get("seeds_seen", self.used_seeds)}
        self.spawned_total = int(state["spawned_total"])
        self.retired_total = int(state["retired_total"])
        # checkpoints of runs before the synthesiser hold none of these
        self.proposed_total = int(state.get("proposed_total", self.spawned_total))
        self.rejected = {**dict.fromkeys(REJECTIONS, 0), **state.get("rejected", {})}
        self.seen = set(state.get("seen", ()))

    # ----------------------------------------------------------------- helpers
    def _refill(self, rng: np.random.Generator) -> None:
        """Add fresh training seeds until the buffer holds ``seed_pool`` tasks."""
        active = {e.seed for e in self.pool if e.split == "train" and e.parent is None}
        if len(self.used_seeds) + self.params.seed_pool > self.train_tasks:
            self.used_seeds = set(active)  # every seed was used: start reusing them
        while len(self.pool) < self.params.seed_pool:
            s = int(rng.integers(self.train_tasks))
            if s not in self.used_seeds:
                self.used_seeds.add(s)
                self.seeds_seen.add(s)
                self.pool.append(TaskStats("train", s))

    def _factory(self) -> Callable[[], Any]:
        if self._make_env is None:
            raise ValueError("rods spawns variants through the env: it needs make_env")
        return self._make_env

    def _environment(self) -> Any:
        if self._env is None:
            self._env = self._factory()()
        return self._env

    def _similar(self) -> Callable[[Task, random.Random], Task]:
        fn = getattr(self._environment(), "similar_task", None)
        if fn is None:
            raise ValueError(
                f"env {type(self._env).__name__} has no similar_task(task, rng) to spawn "
                "variants of boundary tasks; implement it, use tasks.params.synthesiser=rules "
                "or set tasks.params.spawn=0"
            )
        return fn

    def _synthesiser(self) -> RuleSynthesiser:
        if self._synth is None:
            p = self.params
            if p.synthesiser == "llm":
                from credo.tasks.llm_synthesis import LLMSynthesiser, make_chat

                self._synth = LLMSynthesiser(
                    self._factory(),
                    make_chat(p.llm, model=p.llm_model),
                    tries=p.llm_tries,
                    min_steps=p.min_steps,
                )
            else:
                self._synth = RuleSynthesiser(self._factory(), tries=p.tries, min_steps=p.min_steps)
        return self._synth

    def _spawn(self, boundary: list[TaskStats], rng: random.Random) -> int:
        """Add up to ``spawn`` variants of each boundary task while below ``max_pool``."""
        ids = {e.id for e in self.pool}
        added = 0
        for parent in boundary:
            for _ in range(self.params.spawn):
                if len(self.pool) >= self.params.max_pool:
                    break
                self.proposed_total += 1
                if self.params.synthesiser != "similar":
                    task = self._propose(parent, rng)
                else:
                    task = self._similar_variant(parent, rng)
                if task is None:
                    continue
                if task.id in ids or task.split != "train":
                    self.rejected["duplicate"] += 1
                    continue
                ids.add(task.id)
                self.pool.append(TaskStats(task.split, task.seed, dict(task.data), parent.id))
                added += 1
        self.spawned_total += added
        return added

    def _similar_variant(self, parent: TaskStats, rng: random.Random) -> Task:
        task = self._similar()(parent.task, rng)
        if not isinstance(task, Task):
            raise TypeError(
                f"{type(self._env).__name__}.similar_task must return a Task, got "
                f"{type(task).__name__}"
            )
        return task

    def _propose(self, parent: TaskStats, rng: random.Random) -> Task | None:
        """One variant of ``parent`` through the synthesiser's four roles, or ``None``
        (the rejection is counted; the env's first error is shown once)."""
        synth = self._synthesiser()
        plan = self._plans.get(parent.id)
        try:
            if plan is None:
                plan = self._plans[parent.id] = synth.plan(parent.task)
                self.seen.add(plan.key)
        except Exception as exc:  # the env raised on the parent: no variant of it
            self._rejected("env_error", f"{type(exc).__name__}: {exc}")
            return None
        proposal = synthesise(synth, plan, rng, self.seen)
        if proposal.task is None:
            assert proposal.reason is not None
            self._rejected(proposal.reason, proposal.key)
            return None
        self.seen.add(proposal.key)
        return proposal.task

    def _rejected(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        if reason == "env_error" and not self._warned:
            self._warned = True
            warnings.warn(f"rods: the env raised while making a variant: {detail}", stacklevel=2)
