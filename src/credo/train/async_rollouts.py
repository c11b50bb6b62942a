"""Asynchronous rollouts (``rollout.staleness`` = k ≥ 1): the next iterations' episodes
are generated while the trainer updates on this one's.

Iteration ``j``'s rollouts are sampled by the weights of version ``max(0, j − k)`` (the
policy after that many updates; version 0 is the warm start). At the start of iteration
``it`` the queue takes iteration ``it + k`` in hand: it draws its tasks from the task
source and copies the current weights (version ``it``), and a worker thread samples it
once the earlier iterations in its queue are sampled. The trainer then waits only for
iteration ``it``'s rollouts (sampled meanwhile by version ``it − k``), so generation of
the next batch overlaps credit, the update and the evaluation (AReaL, verl's one-step
off-policy mode; on a CPU one core generates while the other updates). ``k`` bounds the
queue and the staleness; ``0`` is the synchronous loop, untouched.

The gap between the sampling weights and the trainer's is what the off-policy
corrections are for: the batch's log-probs are the sampler's, recorded at generation
(``objective.tis_cap``: truncated importance sampling against them; KLPO's
sampler-anchored KL uses them too), while the PPO ratio's old log-probs are the
trainer's recomputation at the weights it starts the update from
(``optim.recompute_old_logprobs``, the decoupled objective of AReaL).

Everything is deterministic: the tasks of ``j`` are drawn in the main thread in the
same order whatever ``train.iterations`` is, its sampling streams come from ``(seed, j)``
and its weights are a fixed version, so a run gives the same metrics however the threads
interleave. A checkpoint records what is in flight (each iteration's tasks and its
weights' version, and the weights of every version still needed) and ``--resume``
samples it again: the resumed run continues exactly, also past a larger
``train.iterations``. The worker is a daemon thread: Ctrl-C stops the run as before.

Limits (one line at config load or start): one process (no accelerate/torchrun ranks),
the in-process Hugging Face engine, and samplers without state across iterations (the
tree sampler's allocator, the agent's session). Env step timeouts
(``rollout.step_timeout``) use a main-thread alarm, so they do not apply to the episodes
sampled in the worker.
"""

from __future__ import annotations

import contextvars
import json
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.policy.kvcache import DEFAULT_KV_CACHE_MB
from credo.rollout import RolloutResult

__all__ = ["AsyncRollouts", "InFlight", "snapshot_policy"]

#: The checkpoint subfolder with the in-flight record and weights.
FOLDER = "async"


def snapshot_policy(policy: HFPolicy, kv_reuse: tuple[bool, float]) -> HFPolicy:
    """A frozen copy of ``policy``'s weights for sampling (own KV caches)."""
    snap = policy.frozen_copy()
    snap.configure_kv_reuse(*kv_reuse)
    return snap


@dataclass
class InFlight:
    """An iteration taken in hand: its tasks, its weights' version and copy, and the
    future of its rollouts (``None`` until the worker is asked to sample it)."""

    iteration: int
    version: int
    tasks: list[Task]
    policy: HFPolicy
    future: Future[RolloutResult] | None = None


@dataclass
class AsyncRollouts:
    """The queue of iterations in flight (see the module docstring).

    Args:
        staleness: k ≥ 1.
        kv_reuse: the run's KV-reuse setting (``rollout.kv_reuse``, ``kv_cache_mb``) for
            the weight copies.
    """

    staleness: int
    kv_reuse: tuple[bool, float] = (True, DEFAULT_KV_CACHE_MB)
    flights: dict[int, InFlight] = field(default_factory=dict)
    _jobs: queue.SimpleQueue[tuple[InFlight, Any, contextvars.Context] | None] = field(
        default_factory=queue.SimpleQueue
    )
    _worker: threading.Thread | None = None

    def take(
        self,
        it: int,
        policy: HFPolicy,
        total: int,
        *,
        draw: Callable[[int], list[Task]],
        sample: Callable[[HFPolicy, list[Task], int], RolloutResult],
    ) -> tuple[list[Task], RolloutResult, int]:
        """Iteration ``it``'s tasks, rollouts and weights' version.

        Args:
            it: the iteration starting.
            policy: the current policy (version ``it``): iterations up to ``it + k`` not
                yet in hand are taken with a copy of its weights.
            total: ``train.iterations``: iterations from here on are taken in hand (their
                tasks drawn) but not sampled.
            draw: ``draw(j)``: iteration ``j``'s tasks from the task source.
            sample: ``sample(policy, tasks, j)``: iteration ``j``'s rollouts of ``tasks``
                by ``policy`` (the run's sampler with ``j``'s random streams).
        """
        for done in [j for j in self.flights if j < it]:  # finished iterations
            del self.flights[done]
        copy_now: HFPolicy | None = None  # one copy of version it for all taken now
        for j in range(it, it + self.staleness + 1):
            if j not in self.flights:
                copy_now = copy_now or snapshot_policy(policy, self.kv_reuse)
                self.flights[j] = InFlight(j, it, draw(j), copy_now)
            if j < total:
                self._submit(self.flights[j], sample)
        flight = self.flights[it]
        assert flight.future is not None
        return flight.tasks, flight.future.result(), flight.version

    def _submit(
        self, flight: InFlight, sample: Callable[[HFPolicy, list[Task], int], RolloutResult]
    ) -> None:
        if flight.future is not None:
            return
        flight.future = Future()
        # the worker records env errors in this run's log, like the main thread
        self._jobs.put((flight, sample, contextvars.copy_context()))
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="credo-rollouts", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            flight, sample, context = job
            assert flight.future is not None
            try:
                result = context.run(sample, flight.policy, flight.tasks, flight.iteration)
            except BaseException as exc:  # raised in the trainer's thread by take()
                flight.future.set_exception(exc)
            else:
                flight.future.set_result(result)

    def close(self) -> None:
        """Stop the worker after the job under way (the run is over)."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker = None

    # ------------------------------------------------------------ checkpoints
    def state_dict(self, iteration: int) -> dict[str, Any]:
        """What is in flight after ``iteration`` iterations: per iteration its tasks and
        version (the weights are written by :meth:`write`)."""
        return {
            "staleness": self.staleness,
            "flights": [
                {
                    "iteration": f.iteration,
                    "version": f.version,
                    "tasks": [[t.split, t.seed, t.data] for t in f.tasks],
                }
                for f in sorted(self.flights.values(), key=lambda f: f.iteration)
                if f.iteration >= iteration
            ],
        }

    def write(self, folder: Path, iteration: int) -> None:
        """The weights of every version still in flight into ``folder/async``, with the
        record (:meth:`state_dict`) as ``flights.json``."""
        state = self.state_dict(iteration)
        root = Path(folder) / FOLDER
        root.mkdir()
        written: set[int] = set()
        for f in self.flights.values():
            if f.iteration >= iteration and f.version not in written:
                f.policy.save(root / f"version_{f.version}")
                written.add(f.version)
        (root / "flights.json").write_text(json.dumps(state))

    def load(self, checkpoint: Path, policy: HFPolicy) -> None:
        """Restore the in-flight iterations of ``checkpoint`` (each sampled again)."""
        root = Path(checkpoint) / FOLDER
        if not (root / "flights.json").exists():
            raise ValueError(
                f"{checkpoint} was saved without rollout.staleness: it cannot be resumed "
                "with asynchronous rollouts (resume with rollout.staleness=0)"
            )
        state = json.loads((root / "flights.json").read_text())
        if state["staleness"] != self.staleness:
            raise ValueError(
                f"{checkpoint} was saved with rollout.staleness={state['staleness']}; resume "
                f"with the same (got {self.staleness})"
            )
        copies: dict[int, HFPolicy] = {}
        for rec in state["flights"]:
            v = int(rec["version"])
            if v not in copies:
                copies[v] = snapshot_policy(policy, self.kv_reuse)
                copies[v].load_weights(root / f"version_{v}")
            tasks = [Task(str(s), int(seed), dict(d)) for s, seed, d in rec["tasks"]]
            self.flights[int(rec["iteration"])] = InFlight(
                int(rec["iteration"]), v, tasks, copies[v]
            )
