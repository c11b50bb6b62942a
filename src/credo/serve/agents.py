"""Training agents written against the OpenAI API: :func:`run_agent_episodes`.

The user's agent is an ordinary function, ``async def`` or plain ``def``::

    async def agent(task, client, session_id) -> float | dict:
        reply = await client.chat.completions.create(model="any", messages=[...])
        ...
        return reward            # or {"reward": r, "success": True, "choice": i}

``client`` is an ``openai.AsyncOpenAI`` (an ``openai.OpenAI`` for a plain ``def``
agent) pointed at the policy server; it already sends the episode's session id in the
``X-Credo-Session`` header, so the agent needs no credo code (``session_id`` is passed
for agents that make their own clients: send it as that header or as ``user``). Each task
is run ``group_size`` times concurrently (at most ``max_concurrency`` agents at once, by
default as many as the engine batches),
each run bounded by ``timeout_s``; every session becomes an :class:`~credo.data.Episode`
(:func:`~credo.serve.recorder.session_to_episode`) in group ``i`` for task ``i``, and the
result is the :class:`~credo.rollout.RolloutResult` the built-in samplers return.

A plain ``def`` agent runs in a thread of its own, so that a blocking call in it
(``time.sleep``, a synchronous HTTP tool) does not stall the other agents, which share
one event loop: the same loop for every call in the process (:func:`agents_loop`), so
async clients an agent keeps between episodes stay usable from one iteration to the
next. The threads are daemon threads rather than an executor's: a sync agent past its
timeout cannot be stopped, and an executor would make the iteration wait for it; it
runs on unobserved, and its session's later requests are no longer recorded.

An agent that raises, times out, returns something that is not a reward, or never gets
a reply from the model (it returned without calling it) fails its own episode
(``Episode.error`` says why, with the reward it returned); the others go on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from credo.data import Episode
from credo.rollout import RolloutResult, Trajectory, trajectories_to_forest
from credo.serve.recorder import SessionRecorder, session_to_episode
from credo.serve.server import PolicyServer
from credo.utils.imports import import_user_module

__all__ = [
    "AgentFn",
    "agent_choice",
    "agents_loop",
    "is_async_agent",
    "load_agent",
    "parse_agent_result",
    "run_agent_episodes",
    "session_id",
    "session_task_index",
]

#: ``agent(task, client, session_id)`` (``async def`` or ``def``) → reward or
#: ``{"reward": float, "success": bool, "choice": int}``.
AgentFn = Callable[[Any, Any, str], Any]

#: The keys an agent's result dict may have.
RESULT_KEYS = ("reward", "success", "choice")


def is_async_agent(fn: Any) -> bool:
    """``fn`` is an ``async def`` function (or an object with an ``async def __call__``):
    it runs on the agents' event loop; anything else callable runs in a thread."""
    return inspect.iscoroutinefunction(fn) or (
        not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
    )


def parse_agent_result(value: Any) -> tuple[float, bool]:
    """An agent's return value → ``(reward, success)``.

    Accepted: a finite number (success = reward > 0) or a dict with a finite number
    ``"reward"``, an optional bool ``"success"`` (default reward > 0) and an optional
    ``"choice"`` (:func:`agent_choice`). Raises ``ValueError`` naming what was wrong
    otherwise.
    """
    success: Any = None
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(RESULT_KEYS))
        if unknown or "reward" not in value:
            raise ValueError(
                f"the agent returned a dict with keys {sorted(value)}; accepted: 'reward' "
                "(required), 'success' and 'choice'"
            )
        success = value.get("success")
        if success is not None and not isinstance(success, bool):
            raise ValueError(f"the agent's 'success' must be true or false, got {success!r}")
        agent_choice(value)
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"the agent returned {value!r}; it must return a finite number (the reward) or "
            "{'reward': number, 'success': bool}"
        )
    return float(value), bool(value > 0) if success is None else success


def agent_choice(value: Any) -> int | None:
    """The ``"choice"`` an agent's result dict names: the index of the choice of its
    last request that it used, when it asked for several (``n`` > 1). No later request
    shows which one that was, so without it the last step's choice is unknown
    (:func:`~credo.serve.recorder.calls_to_steps`). ``None`` when not given; raises
    ``ValueError`` when it is not an integer ≥ 0."""
    if not isinstance(value, dict) or value.get("choice") is None:
        return None
    choice = value["choice"]
    if isinstance(choice, bool) or not isinstance(choice, int) or choice < 0:
        raise ValueError(f"the agent's 'choice' must be an integer ≥ 0, got {choice!r}")
    return choice


#: What one agent run came to: ``(reward, success, error, choice of the last request)``.
Outcome = tuple[float, bool, str | None, int | None]


def session_id(call: int, task: int, g: int) -> str:
    """The session id of episode ``g`` of task ``task`` in call ``call`` of
    :func:`run_agent_episodes`."""
    return f"credo-{call}-{task}-{g}"


def session_task_index(session: str) -> int:
    """The index, in its call's tasks, of the task a :func:`session_id` plays."""
    parts = session.split("-")
    if len(parts) != 4 or parts[0] != "credo" or not parts[2].isdigit():
        raise ValueError(f"{session!r} is not a session of credo's agent runs")
    return int(parts[2])


def _task_id(task: Any) -> str:
    return str(getattr(task, "id", task))


def _in_thread(fn: Callable[..., Any], *args: Any, name: str) -> asyncio.Future[Any]:
    """``fn(*args)`` on a daemon thread of its own, as a future of the running loop (the
    module docstring says why not an executor). A result that arrives after the future
    was cancelled (the agent timed out) or after the loop closed is dropped."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def target() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(*args))
        except Exception as exc:  # handed to the loop, which reports it as the agent's
            outcome = (False, exc)
        except BaseException as exc:  # sys.exit() in an agent ends its episode, not the run
            outcome = (False, RuntimeError(f"{type(exc).__name__}: {exc}"))
        # a closed loop (RuntimeError): nobody waits for this agent any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, name=name, daemon=True).start()
    return fut


async def _run_all(
    agent_fn: AgentFn,
    tasks: Sequence[Any],
    group_size: int,
    base_url: str,
    api_key: str,
    sessions: list[list[str]],
    timeout_s: float,
    max_concurrency: int,
) -> list[list[Outcome]]:
    import openai

    limit = asyncio.Semaphore(max_concurrency)
    run_async = is_async_agent(agent_fn)
    options = {"base_url": base_url, "api_key": api_key, "max_retries": 0, "timeout": timeout_s}
    client: Any = openai.AsyncOpenAI(**options) if run_async else openai.OpenAI(**options)

    async def call(task: Any, sid: str) -> Any:
        own = client.with_options(default_headers={"X-Credo-Session": sid})
        if run_async:
            return await agent_fn(task, own, sid)
        value = await _in_thread(agent_fn, task, own, sid, name=f"credo-agent-{sid}")
        if inspect.isawaitable(value):
            getattr(value, "close", lambda: None)()
            raise TypeError(
                "the agent returned an awaitable: make it an 'async def' function, or a "
                "plain 'def' that returns the reward"
            )
        return value

    async def one(task: Any, sid: str) -> Outcome:
        async with limit:
            try:
                value = await asyncio.wait_for(call(task, sid), timeout_s)
                reward, success = parse_agent_result(value)
                return reward, success, None, agent_choice(value)
            except asyncio.TimeoutError:
                return 0.0, False, f"agent: timed out after {timeout_s} s", None
            except Exception as exc:  # the agent's failure is its episode's, not the run's
                return 0.0, False, f"agent: {type(exc).__name__}: {exc}", None

    try:
        coros = [one(t, sid) for t, row in zip(tasks, sessions) for sid in row]
        flat = await asyncio.gather(*coros)
    finally:
        closed = client.close()
        if inspect.isawaitable(closed):
            await closed
    return [flat[i * group_size : (i + 1) * group_size] for i in range(len(tasks))]


#: The event loop all async agents of this process run on, and its thread (agents_loop).
_LOOP: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
_LOOP_LOCK = threading.Lock()


def agents_loop() -> asyncio.AbstractEventLoop:
    """The event loop every call of :func:`run_agent_episodes` in this process runs its
    agents on: started on first use on a daemon thread, kept for the process (a forked
    child starts its own).

    One loop for the process, not a new one per call (per training iteration): agent
    code keeps async clients made once and reused, and a client's pooled connections
    belong to the loop they were opened on. LangChain's ``ChatOpenAI`` caches its default
    HTTP client per ``base_url`` for the whole process, and users make a module-level
    ``AsyncOpenAI``; with a fresh loop per iteration, every request of the second
    iteration failed with ``RuntimeError: Event loop is closed``.
    """
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or not _LOOP[1].is_alive() or _LOOP[0].is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="credo-agents", daemon=True)
            thread.start()
            _LOOP = (loop, thread)
        return _LOOP[0]


def _run_coroutine(coro: Any, timeout_s: float) -> Any:
    """Run ``coro`` on :func:`agents_loop` and wait for it (at most ``timeout_s``; then,
    or when the wait is interrupted, the coroutine is cancelled)."""
    loop = agents_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError(
            "run_agent_episodes was called from an agent: it would wait for the loop it runs on"
        )
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout_s)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise TimeoutError(f"the agents did not finish within {timeout_s} s") from None
    except BaseException:  # KeyboardInterrupt while waiting: stop the agents too
        fut.cancel()
        raise


def run_agent_episodes(
    policy: Any,
    agent_fn: AgentFn,
    tasks: Sequence[Any],
    group_size: int,
    *,
    timeout_s: float = 300.0,
    max_concurrency: int | None = None,
    server: PolicyServer | tuple[str, SessionRecorder] | None = None,
    api_key: str | None = None,
    generator: torch.Generator | None = None,
    **serve_kwargs: Any,
) -> RolloutResult:
    """Run ``agent_fn`` ``group_size`` times per task against the served ``policy``.

    Args:
        policy: the policy to serve (ignored when ``server`` is given).
        agent_fn: ``agent(task, client, session_id)``, ``async def`` or ``def`` (see the
            module docstring).
        tasks: the tasks (any objects; ``task.id`` names them when present); task ``i``
            becomes group ``i``.
        group_size: G, runs per task.
        timeout_s: the longest one agent run may take (default 300 s).
        max_concurrency: most agents running at once (default: as many as the server's
            engine batches, ``EngineConfig.max_batch``; all of them with a
            ``(base_url, recorder)`` server).
        server: a running :class:`~credo.serve.server.PolicyServer` to reuse (then the
            call returns only once its engine is idle: requests of timed-out agents may
            still be generating, and the trainer is about to change the weights), or the
            ``(base_url, recorder)`` of :func:`serve_policy` (no such wait); default: a
            server is started for this call and stopped after it.
        api_key: the server's API key, if it has one.
        generator: the sampling RNG for this call's requests (a started server's engine
            uses it from now on; with a ``(base_url, recorder)`` server it is ignored).
        **serve_kwargs: passed to :class:`~credo.serve.server.PolicyServer` when a server
            is started here (e.g. ``engine=EngineConfig(temperature=1.0)`` to sample at the
            trainer's temperature).

    Returns:
        A :class:`~credo.rollout.RolloutResult`: one chain per session, the episodes in
        task-major order, ``stats`` with ``rollout/agent_errors`` (failed episodes),
        ``rollout/agent_timeouts``, ``rollout/agent_no_model_calls`` (episodes without a
        model reply: failed, their reward in the error), ``rollout/requests``,
        ``rollout/non_append_only`` (steps whose prompt does not extend the previous
        step's prompt + response: the agent edited its history) and
        ``rollout/choice_unknown`` (steps of a request with several choices where the
        choice the agent used could not be told; recorded as choice 0).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be ≥ 1, got {group_size}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if server is None:
        with PolicyServer(policy, api_key=api_key, **serve_kwargs) as running:
            return run_agent_episodes(
                policy,
                agent_fn,
                tasks,
                group_size,
                timeout_s=timeout_s,
                max_concurrency=max_concurrency,
                server=running,
                api_key=api_key,
                generator=generator,
            )
    if isinstance(server, PolicyServer):
        base_url, recorder, engine = server.base_url, server.recorder, server.engine
        if generator is not None:
            engine.generator = generator
    else:
        (base_url, recorder), engine = server, None
    start = time.perf_counter()
    run = uuid.uuid4().hex[:12]
    sessions = [[session_id(run, i, g) for g in range(group_size)] for i in range(len(tasks))]
    total = len(tasks) * group_size
    # by default as many agents as the engine batches at once: an episode's request then
    # waits for at most one batch before its own, and the timeout measures the agent, not
    # a queue of every episode's requests (500 at once on a CPU timed out 428 of 500)
    batch = engine.config.max_batch if engine is not None else total
    limit = max_concurrency or max(1, min(total, batch))
    waves = math.ceil(total / limit) if total else 0
    outcomes = _run_coroutine(
        _run_all(
            agent_fn,
            tasks,
            group_size,
            base_url,
            api_key or "credo-local",
            sessions,
            timeout_s,
            limit,
        ),
        timeout_s * max(1, waves) + 60.0,
    )
    if engine is not None and not engine.wait_idle(timeout_s):
        raise TimeoutError(f"the server still had requests running {timeout_s} s after the agents")
    episodes: list[Episode] = []
    requests = 0
    for i, task in enumerate(tasks):
        for sid, (reward, success, error, last_choice) in zip(sessions[i], outcomes[i]):
            partial = recorder.lost(sid)  # checked before pop: the calls may be dropped
            calls = recorder.pop(sid)
            requests += len(calls)
            if partial and error is None:  # never an episode from a partial recording
                error = (
                    f"the server's recorder dropped calls of this session (over its bound of "
                    f"{recorder.max_calls} calls, SessionRecorder(max_calls=...))"
                )
            episodes.append(
                session_to_episode(
                    calls,
                    reward=reward,
                    success=success,
                    group=i,
                    task_id=_task_id(task),
                    error=error,
                    last_choice=last_choice,
                )
            )
    trajectories = [Trajectory(e) for e in episodes]
    forest = trajectories_to_forest(trajectories)[0]
    errors = [e.error or "" for e in episodes]
    steps = [s for e in episodes for s in e.steps]
    return RolloutResult(
        forest=forest,
        episodes=episodes,
        env_steps=forest.num_rows,
        generated_tokens=sum(len(s.response_ids) for e in episodes for s in e.steps),
        seconds=time.perf_counter() - start,
        stats={
            "rollout/agent_errors": float(sum(bool(x) for x in errors)),
            "rollout/agent_timeouts": float(sum("timed out" in x for x in errors)),
            "rollout/agent_no_model_calls": float(sum(not e.steps for e in episodes)),
            "rollout/requests": float(requests),
            "rollout/non_append_only": float(
                sum(not s.info.get("append_only", True) for s in steps)
            ),
            "rollout/choice_unknown": float(
                sum(not s.info.get("choice_known", True) for s in steps)
            ),
        },
        trajectories=trajectories,
    )


def load_agent(spec: str) -> AgentFn:
    """The agent function named by ``spec``: ``package.module:function`` (found from the
    working folder too) or ``path/to/file.py:function`` (which may import the modules
    beside it), as ``credo train --agent`` takes; imported as ``--env`` imports
    (:func:`credo.utils.imports.import_user_module`).

    Raises:
        ValueError: ``spec`` is malformed, the module or file cannot be found or fails to
            import, or the name is not a function — one line saying which and what is
            accepted.
    """
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name.isidentifier():
        raise ValueError(
            f"--agent {spec!r}: expected 'package.module:function' or 'path/to/file.py:function'"
        )
    # fresh: each load reads the file anew, so an agent edited between runs of one
    # process is the edited one
    module = import_user_module(
        spec, module_name, flag="--agent", prefix="credo_agent_", fresh=True
    )
    fn = getattr(module, func_name, None)
    if fn is None:
        raise ValueError(f"--agent {spec!r}: {module_name} has no attribute {func_name!r}")
    if not callable(fn) or isinstance(fn, type):
        raise ValueError(
            f"--agent {spec!r}: {func_name} (of type {type(fn).__name__}) is not a function "
            "agent(task, client, session_id) returning a reward ('async def' or 'def')"
        )
    return fn
