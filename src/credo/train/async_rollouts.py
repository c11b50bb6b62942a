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
``train.iterations``. The worker is a daemon (thread or process): Ctrl-C stops the run as before.

The worker (``rollout.async_worker``) is a thread (default) or a process. A thread
shares the trainer's interpreter: for a small model much of sampling and of the update
is Python holding the interpreter lock, so the two overlap only in part. A process (a
fork of the trainer, made when the first iteration is sampled ahead) has its own: it
receives each version's weights once (tensors in shared memory), samples with one
torch thread, and sends the rollouts back (pickled: the two processes are one run); the env errors it meets are added to the
run's log when its rollouts are taken, and its env calls are timed out
(``rollout.step_timeout``) as on the main thread. Both give the same rollouts.

Limits (one line at config load or start): one process (no accelerate/torchrun ranks),
the in-process Hugging Face engine, and samplers without state across iterations (the
tree sampler's allocator, the agent's session). With the thread worker, env step
timeouts (``rollout.step_timeout``) use a main-thread alarm, so they do not apply to the
episodes sampled in the worker; the process worker forks, so it needs a platform with
``fork`` (Linux, macOS).
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
import pickle
import queue
import signal
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.multiprocessing  # registers the shared-memory pickling of tensors

from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.policy.kvcache import DEFAULT_KV_CACHE_MB
from credo.rollout import RolloutResult
from credo.rollout.envguard import EnvErrorLog, env_guard, guard_settings

__all__ = ["AsyncRollouts", "InFlight", "snapshot_policy"]

#: The checkpoint subfolder with the in-flight record and weights.
FOLDER = "async"

#: ``rollout.async_worker`` values.
WORKERS = ("thread", "process")

#: Seconds between checks that the process worker is still alive while waiting for it.
_POLL_S = 1.0


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
        worker: ``thread`` (default) or ``process`` (see the module docstring).
    """

    staleness: int
    kv_reuse: tuple[bool, float] = (True, DEFAULT_KV_CACHE_MB)
    worker: str = "thread"
    flights: dict[int, InFlight] = field(default_factory=dict)
    _jobs: queue.SimpleQueue[tuple[InFlight, Any, contextvars.Context] | None] = field(
        default_factory=queue.SimpleQueue
    )
    _worker: threading.Thread | None = None
    _process: ProcessWorker | None = None

    def __post_init__(self) -> None:
        if self.worker not in WORKERS:
            raise ValueError(f"worker must be one of {', '.join(WORKERS)}, got {self.worker!r}")

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
        if self._process is not None:
            self._process.wait(flight)
        return flight.tasks, flight.future.result(), flight.version

    def _submit(
        self, flight: InFlight, sample: Callable[[HFPolicy, list[Task], int], RolloutResult]
    ) -> None:
        if flight.future is not None:
            return
        flight.future = Future()
        if self.worker == "process":
            if self._process is None:
                self._process = ProcessWorker(sample, flight.policy)
            self._process.submit(flight)
            return
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
        if self._process is not None:
            self._process.close()
            self._process = None

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


class ProcessWorker:
    """Samples the queued iterations in a child process (``rollout.async_worker:
    process``).

    The child is a fork of the trainer made now, so it holds the run's sampler, envs
    and ``template`` (a sampling copy of the weights) without rebuilding them. Each job
    sends an iteration's number, tasks and, when its version is new to the child, that
    version's weights (the parent's copy, moved to shared memory); the child loads them,
    samples with ``sample(policy, tasks, j)`` and sends back the rollouts and the env
    errors met, or the error that stopped it.

    Args:
        sample: ``sample(policy, tasks, j)``, as for :meth:`AsyncRollouts.take`.
        template: a sampling copy of the weights the child samples with.
    """

    def __init__(
        self, sample: Callable[[HFPolicy, list[Task], int], RolloutResult], template: HFPolicy
    ) -> None:
        ctx = torch.multiprocessing.get_context("fork")
        self._jobs, child_jobs = ctx.Pipe()
        self._results, child_results = ctx.Pipe()
        self._process = ctx.Process(
            target=_child,
            args=(child_jobs, child_results, sample, template, guard_settings()[0]),
            name="credo-rollouts",
            daemon=True,
        )
        self._process.start()
        child_jobs.close()
        child_results.close()
        self._sent_version: int | None = None
        self._pending: dict[int, InFlight] = {}

    def submit(self, flight: InFlight) -> None:
        """Queue ``flight`` (its future is resolved by :meth:`wait`)."""
        weights = None
        if flight.version != self._sent_version:
            weights = {k: v.detach() for k, v in flight.policy.model.state_dict().items()}
            self._sent_version = flight.version
        self._pending[flight.iteration] = flight
        self._jobs.send((flight.iteration, flight.version, flight.tasks, weights))

    def wait(self, flight: InFlight) -> None:
        """Receive results until ``flight``'s has come (the child answers in order); the
        env errors it met go into the run's log now."""
        assert flight.future is not None
        while not flight.future.done():
            if not self._results.poll(_POLL_S):
                if not self._process.is_alive():
                    self._died(flight)
                continue
            try:  # our own child's message (not a file from elsewhere): pickle
                message = self._results.recv_bytes()
            except EOFError:  # the child is gone
                self._process.join(timeout=10)
                self._died(flight)
            iteration, result, errors, failure = pickle.loads(message)
            done = self._pending.pop(iteration)
            assert done.future is not None
            log = guard_settings()[1]
            for record in errors:
                if log is not None:
                    log.add(record)
            if failure is not None:
                done.future.set_exception(RuntimeError(failure))
            else:
                done.future.set_result(result)

    def _died(self, flight: InFlight) -> NoReturn:
        raise RuntimeError(
            f"the rollout worker process exited (code {self._process.exitcode}) before "
            f"sampling iteration {flight.iteration}"
        )

    def close(self) -> None:
        """Stop the child after the job under way (killed after 10 s)."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self._jobs.send(None)
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)
        self._jobs.close()
        self._results.close()


class _TensorsAsArrays(pickle.Pickler):
    """Pickles CPU tensors as numpy arrays (protocol 5): an iteration's rollouts hold
    thousands of small tensors, which torch's own pickling writes one archive each
    (measured on a TextLights iteration, 4,003 tensors: 0.70 s to load, against 0.07 s
    as arrays)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            try:
                return torch.from_numpy, (obj.detach().numpy(),)
            except TypeError:  # a dtype numpy lacks (bfloat16): torch's own way
                return NotImplemented
        return NotImplemented


def _dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _TensorsAsArrays(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


def _child(
    jobs: Any,
    results: Any,
    sample: Callable[[HFPolicy, list[Task], int], RolloutResult],
    policy: HFPolicy,
    step_timeout: float,
) -> None:
    """The process worker's loop (see :class:`ProcessWorker`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    torch.set_num_threads(1)
    version: int | None = None
    while (job := jobs.recv()) is not None:
        iteration, v, tasks, weights = job
        errors = EnvErrorLog(None, say=lambda line: None, show=0)
        result, failure = None, None
        try:
            if weights is not None and v != version:
                policy.model.load_state_dict(weights)
                version = v
            del weights
            with env_guard(step_timeout=step_timeout, log=errors):
                result = sample(policy, tasks, iteration)
        except BaseException as exc:  # sent to the trainer, raised where it waits
            failure = "".join(traceback.format_exception_only(exc)).strip()
            failure = f"{failure} (in the rollout worker process, iteration {iteration})"
        try:  # by value: tensors in shared memory would cost a file descriptor each
            message = _dumps((iteration, result, errors.records, failure))
        except Exception as exc:  # an env put something unpicklable in its episodes
            message = pickle.dumps(
                (
                    iteration,
                    None,
                    errors.records,
                    f"the rollouts of iteration {iteration} "
                    f"cannot be sent from the worker process: {type(exc).__name__}: {exc}",
                )
            )
        results.send_bytes(message)
