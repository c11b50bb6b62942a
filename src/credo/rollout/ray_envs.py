"""Env instances in Ray actors: the policy batches generation in this process while the
env calls of a batch (``reset``, ``step``) run in parallel across ``rollout.env_workers``
actors (``docs/engines/ray.md``).

:class:`EnvPool` owns N actors (:class:`~credo.envs.ray_host.EnvHost`, each holding any number of env
instances). :meth:`EnvPool.make` is a drop-in env factory: it returns a
:class:`RemoteEnv`, an object with the env protocol (``reset``, ``step``, ``state_key``,
``snapshot``/``restore`` and whatever optional methods the env class has) whose calls go
to the env's actor. Every call that changes the env brings back, in the same round
trip, what credo reads right after it (``state_key``, ``abstract_state_key``,
``progress``, ``instruction``), so that :func:`credo.envs.base.step_env` costs one round
trip. Methods that read no state (``extract_action``, ``action_format``, ``vocabulary``,
``is_tool_call``) and plain attributes (``max_turns``) are answered by a local instance.

Parallel steps: the samplers call :func:`prefetch` with the calls of a whole batch (one
per live episode) before they take the steps one by one; the pool sends them all at
once, and each :class:`RemoteEnv` then answers its own call from what came back. Calls on
one actor run in order; calls on different actors run at the same time.

Faults. Each :class:`RemoteEnv` keeps the log of its episode (``reset(task, seed)`` and
every later call; a ``restore`` truncates it to ``reset`` + ``restore``). An actor that
dies, or whose running call takes longer than ``timeout_s``, is killed and replaced by a
fresh one; every env that lived on it is rebuilt there by replaying its log: the same
task, seed and already-chosen actions, so the env is in the state it was in and the
episode goes on as if nothing had happened (the policy's samples are untouched: metrics
equal a run without the fault). The replay checks the rebuilt env's ``state_key``
against the recorded one. A call is tried at most ``1 + retries`` times (only the call
that was running when its actor failed is charged; calls queued behind it on the same
actor are re-sent for free); after that it raises :class:`EnvWorkerError`, which the env
guard (:mod:`credo.rollout.envguard`) turns into a failed episode written to
``env_errors.jsonl``, and the run goes on.

An exception raised by the env itself is not a fault of the worker: it is re-raised
here as it was raised there (its episode fails through the guard, as in process).

Ray is imported only when a pool is built; without it :func:`require_ray` raises one line
naming the extra to install.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from credo.envs.base import StepResult
from credo.envs.ray_host import CACHED_METHODS, EnvHost

__all__ = [
    "CACHED_METHODS",
    "DEFAULT_ENV_RETRIES",
    "DEFAULT_ENV_TIMEOUT_S",
    "LOCAL_METHODS",
    "START_TIMEOUT_S",
    "EnvPool",
    "EnvWorkerError",
    "RemoteEnv",
    "prefetch",
    "require_ray",
]

#: Seconds one env call may run on its actor before the actor counts as hung
#: (``rollout.env_timeout_s``).
DEFAULT_ENV_TIMEOUT_S = 30.0
#: Replacements of a failed call's actor before its episode fails (``rollout.env_retries``).
DEFAULT_ENV_RETRIES = 2
#: Seconds a new actor may take to start (a cold Ray worker process).
START_TIMEOUT_S = 120.0
#: Seconds :meth:`EnvPool.close` waits for actors to go.
CLOSE_TIMEOUT_S = 10.0

#: Optional env methods that read no state: answered by a local instance of the env.
LOCAL_METHODS = ("extract_action", "action_format", "vocabulary", "is_tool_call")


class EnvWorkerError(RuntimeError):
    """An env call's actor died or hung past ``rollout.env_timeout_s`` on every try."""


def require_ray(what: str = "rollout.env_workers > 1") -> Any:
    """The ``ray`` module, or a one-line :class:`ImportError` naming the extra."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            f"{what} needs Ray, which is not installed: pip install 'credo[ray]' "
            "(or set rollout.env_workers=0 to keep the envs in this process)"
        ) from None
    return ray


# --------------------------------------------------------------------------------------
# The driver side


@dataclass
class _Call:
    """One call of a batch and how it ended (``outcome`` = the actor's tuple, or
    ``(False, EnvWorkerError, None, {}, None)`` after the last try)."""

    env: RemoteEnv
    op: str
    args: tuple
    snapshot_first: bool = False
    tries: int = 0
    outcome: tuple | None = None
    ref: Any = None
    replaying: bool = False


@dataclass
class _Host:
    actor: Any
    gen: int = 0
    envs: int = 0
    dropped: list[int] = field(default_factory=list)


class EnvPool:
    """``workers`` Ray actors holding env instances (see the module docstring).

    Args:
        factory: makes a fresh env (a zero-argument callable, pickled to the actors:
            its module must be importable there).
        workers: number of actors, N ≥ 1.
        address: Ray cluster address (``None``: a local Ray, started here unless one is
            already running in this process).
        timeout_s: seconds one call may run on its actor before the actor counts as hung.
        retries: replacements of a failed call's actor before its episode fails.
        cpus_per_worker: the CPUs each actor reserves in Ray's scheduler (default 0: env
            actors mostly wait; more than the cluster has would leave them pending).
        ray_init: extra ``ray.init`` keywords when this pool starts Ray.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        workers: int,
        *,
        address: str | None = None,
        timeout_s: float = DEFAULT_ENV_TIMEOUT_S,
        retries: int = DEFAULT_ENV_RETRIES,
        cpus_per_worker: float = 0.0,
        ray_init: dict[str, Any] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"EnvPool: workers must be ≥ 1, got {workers}")
        probe = factory()
        reason = getattr(probe, "in_process_only", None)
        if reason:  # an env whose every method reads the current task's state
            raise ValueError(
                f"rollout.env_workers={workers}: {type(probe).__name__} runs in this process "
                f"only ({reason}); set rollout.env_workers=0"
            )
        ray = require_ray()
        self.ray = ray
        self.factory = factory
        self.timeout_s, self.retries = float(timeout_s), int(retries)
        self.started_ray = False
        if not ray.is_initialized():
            ray.init(
                address=address,
                include_dashboard=False,
                logging_level="warning",
                **(ray_init or {}),
            )
            self.started_ray = True
        self.template = probe
        cls = type(self.template)
        self.methods = {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}
        self._actor_cls = ray.remote(num_cpus=cpus_per_worker, max_restarts=0)(EnvHost)
        self._ids = itertools.count()
        self.replacements = 0
        self.hosts: list[_Host] = []
        self.spare: Any = None
        try:
            self.hosts = [_Host(self._new_actor(wait=False)) for _ in range(workers)]
            self.spare = self._new_actor(wait=False)
            self._wait_started([h.actor for h in self.hosts] + [self.spare])
        except BaseException:
            self.close()
            raise

    # -- actors

    def _new_actor(self, *, wait: bool = True) -> Any:
        actor = self._actor_cls.options(scheduling_strategy="SPREAD").remote(self.factory)
        if wait:
            self._wait_started([actor])
        return actor

    def _wait_started(self, actors: list[Any]) -> None:
        refs = [a.ping.remote() for a in actors]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=START_TIMEOUT_S)
        if len(ready) < len(refs):
            raise EnvWorkerError(
                f"{len(refs) - len(ready)} of {len(refs)} env workers did not start within "
                f"{START_TIMEOUT_S:g} s (is the Ray cluster out of resources?)"
            )
        self.ray.get(ready, timeout=START_TIMEOUT_S)

    def _replace(self, index: int) -> None:
        """Kill actor ``index`` (dead or hung) and put the spare actor (started ahead, its
        imports done) in its place, then start the next spare without waiting for it; the
        envs that lived there are rebuilt by replay at their next call."""
        host = self.hosts[index]
        with contextlib.suppress(Exception):  # already gone
            self.ray.kill(host.actor, no_restart=True)
        spare, self.spare = self.spare, None
        try:
            if spare is None:
                raise EnvWorkerError("no spare")
            self._wait_started([spare])
        except Exception:  # the spare failed too: a fresh one, waited for
            with contextlib.suppress(Exception):
                if spare is not None:
                    self.ray.kill(spare, no_restart=True)
            spare = self._new_actor()
        host.actor = spare
        self.spare = self._new_actor(wait=False)
        host.gen += 1
        host.dropped.clear()
        self.replacements += 1

    def actor(self, index: int) -> Any:
        """The Ray handle of actor ``index`` (tests kill it to simulate a lost node)."""
        return self.hosts[index].actor

    def close(self) -> None:
        """Kill the actors, and shut Ray down if this pool started it."""
        for actor in [h.actor for h in self.hosts] + [self.spare]:
            with contextlib.suppress(Exception):
                if actor is not None:
                    self.ray.kill(actor, no_restart=True)
        self.hosts, self.spare = [], None
        if self.started_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self.started_ray = False

    # -- envs

    def make(self) -> RemoteEnv:
        """A fresh env on the least loaded actor (an env factory for the samplers)."""
        index = min(range(len(self.hosts)), key=lambda i: self.hosts[i].envs)
        env = RemoteEnv(self, next(self._ids), index)
        self.hosts[index].envs += 1
        weakref.finalize(env, self._forget, index, env._id)
        return env

    def _forget(self, index: int, env_id: int) -> None:
        # runs from the garbage collector: no Ray calls here, just a note for the next batch
        if index < len(self.hosts):
            self.hosts[index].envs -= 1
            self.hosts[index].dropped.append(env_id)

    # -- calls

    def execute(self, calls: list[_Call]) -> None:
        """Run ``calls`` (at most one per env) on their actors at once; each gets its
        ``outcome``. Dead and hung actors are replaced and their calls re-sent (see the
        module docstring); this never raises for an env's or a worker's fault."""
        for host in self.hosts:
            if host.dropped:
                ids, host.dropped = list(host.dropped), []
                host.actor.drop.remote(ids)
        pending: dict[int, list[_Call]] = {}  # actor index -> its calls, in sending order
        for c in calls:
            pending.setdefault(c.env._host, []).append(c)
        for index, queue in pending.items():
            for c in queue:
                self._send(index, c)
        started = {index: time.monotonic() for index in pending}  # the head call's start
        while pending:
            refs = [q[0].ref for q in pending.values()]
            now = time.monotonic()
            wait = max(0.0, min(started[i] + self.timeout_s for i in pending) - now)
            self.ray.wait(refs, num_returns=1, timeout=wait)
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
            done = set(ready)
            for index in list(pending):
                queue = pending[index]
                head = queue[0]
                if head.ref in done:
                    try:
                        head.outcome = self.ray.get(head.ref, timeout=self.timeout_s)
                    except Exception as exc:  # the actor died (or its result is lost)
                        self._fail(index, queue, f"its worker died ({type(exc).__name__})")
                        started[index] = time.monotonic()
                    else:
                        head.env._landed(head)
                        queue.pop(0)
                        started[index] = time.monotonic()
                elif time.monotonic() - started[index] >= self.timeout_s:
                    self._fail(
                        index,
                        queue,
                        f"it ran longer than rollout.env_timeout_s={self.timeout_s:g} s",
                    )
                    started[index] = time.monotonic()
                if not queue:
                    del pending[index]

    def _send(self, index: int, c: _Call) -> None:
        env, host = c.env, self.hosts[index]
        replay = None
        if env._gen != host.gen:  # its actor was replaced since its last call
            replay = list(env._log)
        c.replaying = replay is not None
        c.ref = host.actor.run.remote(env._id, replay, c.op, c.args, c.snapshot_first)

    def _fail(self, index: int, queue: list[_Call], why: str) -> None:
        """Actor ``index`` failed while running ``queue[0]``: charge that call one try,
        replace the actor, re-send what is left (the head too if tries remain)."""
        head = queue[0]
        head.tries += 1
        self._replace(index)
        if head.tries > self.retries:
            head.outcome = (
                False,
                EnvWorkerError(
                    f"{head.op}() failed {head.tries} times: {why}; its worker was replaced "
                    f"{head.tries} times (rollout.env_retries={self.retries})"
                ),
                None,
                {},
                None,
            )
            head.env._gen = -1  # rebuilt by replay if it is called again
            queue.pop(0)
        for c in queue:
            self._send(index, c)

    def call(self, env: RemoteEnv, op: str, args: tuple, snapshot_first: bool = False) -> Any:
        """One call, at once (not batched)."""
        c = _Call(env, op, args, snapshot_first)
        self.execute([c])
        return env._result(c)


class RemoteEnv:
    """An env living in an :class:`EnvPool` actor, with the env protocol (see the module
    docstring). Made by :meth:`EnvPool.make`."""

    def __init__(self, pool: EnvPool, env_id: int, host: int) -> None:
        self._pool, self._id, self._host = pool, env_id, host
        self._gen = pool.hosts[host].gen
        self._log: list[tuple[str, tuple]] = []
        self._view: dict[str, tuple[bool, Any]] = {}
        self._pending: _Call | None = None

    # -- results

    def _landed(self, c: _Call) -> None:
        """``c`` came back from the actor: the actor's env is now where the log says."""
        ok, _, _, _, replayed = c.outcome  # type: ignore[misc]
        if c.replaying:
            recorded = self._view.get("state_key")
            if replayed is not None and recorded is not None and replayed != recorded:
                c.outcome = (
                    False,
                    EnvWorkerError(
                        f"rebuilding the env on a fresh worker by replaying its episode gave "
                        f"state_key {replayed[1]!r}, not the recorded {recorded[1]!r}: the env "
                        "is not deterministic given task, seed and actions"
                    ),
                    None,
                    {},
                    None,
                )
                self._gen = -1
                return
            # a replay that raised left a half-built env: rebuild it again if called again
            self._gen = self._pool.hosts[self._host].gen if ok else -1
        if not ok:
            return
        if c.op == "reset":
            self._log = [(c.op, c.args)]
        elif c.op == "restore":
            self._log = [*self._log[:1], (c.op, c.args)]
        elif c.op != "snapshot":
            self._log.append((c.op, c.args))

    def _result(self, c: _Call) -> Any:
        """The value of ``c`` (its view becomes this env's), or its exception raised."""
        ok, value, _, view, _ = c.outcome  # type: ignore[misc]
        if not ok:
            raise value
        if c.op != "snapshot":
            self._view = view
        return value

    def _do(self, op: str, args: tuple, snapshot_first: bool = False) -> Any:
        p = self._pending
        if p is not None:
            if p.op != op or p.args != args:
                raise RuntimeError(
                    f"RemoteEnv: {op}{args!r} called while the prefetched {p.op}{p.args!r} "
                    "was not taken"
                )
            self._pending = None
            return self._result(p)
        return self._pool.call(self, op, args, snapshot_first)

    def _cached(self, name: str) -> Any:
        ok, value = self._view.get(name, (True, None))
        if not ok:
            raise value
        return value

    # -- the env protocol

    def reset(self, task: Any, seed: int = 0) -> str:
        return self._do("reset", (task, seed))

    def step(self, action: str) -> StepResult:
        return self._do("step", (action,))

    def state_key(self) -> Any:
        return self._cached("state_key")

    def snapshot(self) -> Any:
        p = self._pending
        if p is not None and p.op == "step" and p.snapshot_first:
            ok, value, snap, _, _ = p.outcome  # type: ignore[misc]
            if not ok:
                self._pending = None
                raise value
            return snap
        return self._do("snapshot", ())

    def restore(self, snap: Any) -> None:
        self._do("restore", (snap,))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        pool = self.__dict__.get("_pool")
        if pool is None:  # not initialised (a copy being built)
            raise AttributeError(name)
        if name in CACHED_METHODS and name in pool.methods:
            return lambda: self._cached(name)
        if name in LOCAL_METHODS or (name not in pool.methods and hasattr(pool.template, name)):
            return getattr(pool.template, name)
        if name in pool.methods:
            return lambda *args: self._do("call", (name, args))
        raise AttributeError(f"{type(pool.template).__name__} has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"RemoteEnv({type(self._pool.template).__name__}, worker {self._host})"


def prefetch(calls: Sequence[tuple[Any, str, tuple, bool]]) -> None:
    """Send a batch of env calls at once: ``(env, op, args, snapshot_first)`` with ``op``
    ``"reset"`` (args ``(task, seed)``) or ``"step"`` (args ``(action,)``;
    ``snapshot_first``: a snapshot is taken before the step, answered by the env's next
    ``snapshot()``). Envs that are not :class:`RemoteEnv` are left alone (their calls
    run when the sampler makes them); each :class:`RemoteEnv` answers its next matching
    call from what came back."""
    by_pool: dict[int, tuple[EnvPool, list[_Call]]] = {}
    for env, op, args, snapshot_first in calls:
        if isinstance(env, RemoteEnv):
            c = _Call(env, op, tuple(args), bool(snapshot_first))
            by_pool.setdefault(id(env._pool), (env._pool, []))[1].append(c)
    for pool, batch in by_pool.values():
        pool.execute(batch)
        for c in batch:
            c.env._pending = c
