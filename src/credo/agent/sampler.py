"""Training an agent written against the OpenAI API: the ``agent`` sampler.

``credo train --agent module:function`` (config ``rollout.agent``) trains the user's
agent function unchanged: every iteration credo calls
``agent(task, client, session_id)`` ``rollout.group_size`` times per task, with an
``openai.AsyncOpenAI`` client (``openai.OpenAI`` for a plain ``def`` agent, which runs in
a thread of its own) pointed at the policy being trained (served by
:mod:`credo.serve` on 127.0.0.1), and turns what the server recorded into the same
:class:`~credo.rollout.RolloutResult` the built-in samplers return — so the steps go
through the same credit estimators, objectives and checkpoints. See ``docs/serve.md``.

- :class:`AgentParams`: the sampler's knobs (the spec, the per-episode timeout, the
  concurrency, the env the tasks name).
- :class:`AgentSession`: the sampler's state, one per run: it starts the server on first
  use and keeps it for the run (a new one only if the policy object changes), samples
  with the trainer's :class:`~credo.policy.base.SamplingParams` (swapped for the
  evaluation's between calls), stamps calls with a weights version
  (:meth:`AgentSession.weights_updated` after every update; saved in checkpoints) and is
  closed by the run (:meth:`AgentSession.close`, in a ``finally``).
- :func:`sample_agent`: the registered ``agent`` sampler.
- :meth:`AgentSession.evaluate`: the held-out evaluation of an agent run goes through the
  agent too (one episode per held-out task, success as the agent reports it).

Tasks: the agent gets credo's :class:`~credo.envs.base.Task` with ``data`` filled with
``{"env": env.name, "env_kwargs": env.kwargs}`` of the run's config, so an agent that
plays a credo env can build it from the task alone (``examples/openai_agent.py``).

State keys: the recorder keys each step by the ``X-Credo-State`` header the agent sent
with the request, else by the text new since the model's last reply (its observation);
steps with equal keys in a group share GiGPO-style step groups, and each task is one
episode group (group ``i`` for task ``i``).

Failures: an agent that raises, times out (``rollout.agent_timeout_s``), returns no
valid reward or never gets a reply from the model fails its own episode
(``Episode.error``, reward 0, its recorded steps kept), counted in
``rollout/agent_errors``, ``rollout/agent_timeouts`` and ``rollout/agent_no_model_calls``;
the run goes on (an iteration in which no episode has a step is skipped:
:mod:`credo.train.iteration`). Steps of an edited history (``rollout/non_append_only``)
and of requests with several choices whose used choice is unknown
(``rollout/choice_unknown``) are warned about once a run.

Reproducibility: every call samples from the iteration's seeded generator. Requests that
arrive together are batched, and which ones share a batch depends on timing, so runs are
bit-for-bit reproducible (``--resume`` included) with ``rollout.agent_concurrency: 1``
only; with more concurrency they are equal in distribution.

Needs the ``serve`` extra (``pip install 'credo[serve]'``); :mod:`credo.serve` is
imported only when an agent run starts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from credo.envs.base import Task, resolve_env
from credo.eval.evaluate import EvalResult, wilson_interval
from credo.policy.base import SamplingParams
from credo.rollout.sampler import SamplerContext, register_sampler

if TYPE_CHECKING:
    from credo.rollout.group import RolloutResult

__all__ = [
    "AgentParams",
    "AgentSession",
    "agent_params",
    "agent_problem",
    "check_agent_spec",
    "sample_agent",
]

_log = logging.getLogger(__name__)


#: The recording's warnings, said once a run (``%d``: the steps concerned); the metric
#: counts every later one.
_ONCE_WARNINGS = {
    "rollout/non_append_only": (
        "%d recorded steps have a prompt that does not extend the previous step's prompt + "
        "reply (the agent edited or trimmed its history, or the chat template rewrites "
        "earlier turns): each is trained on exactly the prompt the model saw, as its own "
        "row; counted in rollout/non_append_only from now on (docs/serve.md)"
    ),
    "rollout/choice_unknown": (
        "%d recorded steps asked for several choices (n > 1) and the choice the agent used "
        "could not be told, so choice 0 was recorded: return {'reward': r, 'choice': i} to "
        "name the choice of the last request, and pass the reply you used on in the next "
        "request's messages; counted in rollout/choice_unknown (docs/serve.md)"
    ),
}


@dataclass
class AgentParams:
    """Knobs of the ``agent`` sampler.

    Attributes:
        agent: ``package.module:function`` or ``path/to/file.py:function``, an
            ``agent(task, client, session_id)`` (``async def`` or ``def``) returning the
            reward or ``{"reward": r, "success": bool, "choice": i}``.
        timeout_s: the longest one agent episode may take, in seconds (default 300).
        max_concurrency: most agent episodes running at once (default ``None``: all of
            an iteration's; 1 makes sampling bit-for-bit reproducible).
        env: the env name put in every task's ``data["env"]`` (default ``""``: none).
        env_kwargs: the env options put in ``data["env_kwargs"]``.
    """

    agent: str = ""
    timeout_s: float = 300.0
    max_concurrency: int | None = None
    env: str = ""
    env_kwargs: dict[str, Any] = field(default_factory=dict)


def check_agent_spec(spec: str) -> None:
    """Fail with one line when ``spec`` cannot be trained: the ``serve`` extra is missing
    (``ImportError``) or the spec does not name a function
    (``ValueError``, from :func:`credo.serve.load_agent`)."""
    try:
        from credo.serve import load_agent
    except ImportError as exc:
        raise ImportError(f"--agent {spec!r}: {exc}") from None
    load_agent(spec)


class AgentSession:
    """The ``agent`` sampler's state: the agent function and its policy server for a run.

    Args:
        params: the sampler's knobs (:class:`AgentParams`); the spec is loaded now (a
            bad spec fails here, before any compute), the server on first use.
    """

    def __init__(self, params: AgentParams) -> None:
        from credo.serve import load_agent

        self.params = params
        self.agent_fn = load_agent(params.agent)
        self.weights_version = 0
        self._sampler: Any = None
        self._policy: Any = None
        self._warned: set[str] = set()  # what this run was already told (once a run each)

    # ------------------------------------------------------------------ the server
    def _server_for(self, policy: Any, sampling: SamplingParams) -> Any:
        """The running :class:`~credo.serve.AgentSampler` for ``policy``, sampling as
        ``sampling`` says from now on (the engine is idle between calls, so swapping its
        config is safe)."""
        from credo.serve import AgentSampler, EngineConfig

        if self._sampler is not None and self._policy is not policy:
            self.close()
        if self._sampler is None:
            self._sampler = AgentSampler(
                self.agent_fn,
                policy,
                sampling,
                timeout_s=self.params.timeout_s,
                max_concurrency=self.params.max_concurrency,
            )
            self._policy = policy
        self._sampler.server.recorder.weights_version = self.weights_version
        self._sampler.server.engine.config = EngineConfig.from_sampling(sampling)
        return self._sampler

    def _tasks(self, tasks: Sequence[Task]) -> list[Task]:
        """``tasks`` with ``data`` naming the run's env (see the module docstring)."""
        extra = {"env": self.params.env, "env_kwargs": dict(self.params.env_kwargs)}
        return [dataclasses.replace(t, data={**extra, **t.data}) for t in tasks]

    def sample(
        self,
        policy: Any,
        sampling: SamplingParams,
        tasks: Sequence[Task],
        group_size: int,
        generator: torch.Generator | None = None,
    ) -> RolloutResult:
        """``group_size`` agent episodes per task (task ``i`` → group ``i``) against the
        served ``policy``; see :func:`credo.serve.run_agent_episodes`."""
        server = self._server_for(policy, sampling)
        result = server.sample(self._tasks(tasks), group_size, generator=generator)
        failed = [e for e in result.episodes if e.error is not None]
        for e in failed[:3]:  # say why, without flooding the log
            _log.warning("agent episode on task %s failed: %s", e.task_id, e.error)
        if len(failed) > 3:
            _log.warning("... and %d more failed agent episodes", len(failed) - 3)
        self._warn_once(result.stats)
        return result

    def _warn_once(self, stats: dict[str, float]) -> None:
        """Say once a run what the recording could not do exactly as the agent ran: rows
        of an edited history (``rollout/non_append_only``) and steps whose choice is not
        known (``rollout/choice_unknown``); the metrics count every later one."""
        for metric, message in _ONCE_WARNINGS.items():
            count = int(stats.get(metric, 0))
            if count and metric not in self._warned:
                self._warned.add(metric)
                _log.warning(message, count)

    def evaluate(
        self, policy: Any, sampling: SamplingParams, *, episodes: int, seed: int
    ) -> EvalResult:
        """Held-out success of ``policy`` through the agent: one episode on each of the
        first ``episodes`` held-out tasks, sampled from a generator seeded with ``seed``.

        Success and return are what the agent reports; ``mean_turns`` counts model
        requests per episode; ``errors`` counts failed episodes (raised, timed out, no
        valid reward); ``invalid_rate`` is 0 (the agent, not credo, judges its actions).
        """
        tasks = [Task.make("test", i) for i in range(episodes)]
        res = self.sample(policy, sampling, tasks, 1, torch.Generator().manual_seed(seed))
        eps = res.episodes
        n = max(1, len(eps))
        wins = sum(e.success for e in eps)
        lo, hi = wilson_interval(wins, len(eps))
        steps = sum(len(e.steps) for e in eps)
        invalid = sum(not s.valid for e in eps for s in e.steps)
        return EvalResult(
            episodes=len(eps),
            success_rate=wins / n,
            ci_low=lo,
            ci_high=hi,
            mean_return=sum(e.ret for e in eps) / n,
            invalid_rate=invalid / max(1, steps),
            mean_turns=steps / n,
            errors=sum(e.error is not None for e in eps),
        )

    # ------------------------------------------------------------------ the run
    def weights_updated(self) -> None:
        """Call after each policy update: later calls are stamped with the next version."""
        self.weights_version += 1
        if self._sampler is not None:
            self._sampler.server.recorder.weights_version = self.weights_version

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the weights version."""
        return {"weights_version": self.weights_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.weights_version = int(state["weights_version"])

    def close(self) -> bool:
        """Stop the server if one runs (bounded waits); True when its threads ended."""
        ok = True
        if self._sampler is not None:
            ok = self._sampler.close()
        self._sampler, self._policy = None, None
        return ok


def _session_for(params: AgentParams | None) -> AgentSession | None:
    return AgentSession(params) if params is not None and params.agent else None


def agent_params(cfg: Any) -> AgentParams:
    """The ``agent`` sampler's knobs of a run config (``rollout.agent``,
    ``agent_timeout_s``, ``agent_concurrency``, and ``env`` for the tasks' data)."""
    r = cfg.rollout
    return AgentParams(
        agent=r.agent or "",
        timeout_s=r.agent_timeout_s,
        max_concurrency=r.agent_concurrency,
        env=cfg.env.name,
        env_kwargs=dict(cfg.env.kwargs),
    )


def agent_problem(cfg: Any) -> str | None:
    """Why ``cfg`` cannot train an agent, in one line (``None``: it can): the agent sampler's
    check at config load. ``rollout.agent`` names a loadable function (the ``serve``
    extra installed), the env loop's add-ons are off, and a warm start needs an env with
    an oracle."""
    r = cfg.rollout
    if r.agent is None:
        return "rollout.sampler=agent needs rollout.agent='module:function' (or --agent)"
    if r.sampler not in ("group", "agent"):
        return (
            f"rollout.agent runs the agent's own episodes (G per task): rollout.sampler must "
            f"stay group, got {r.sampler!r}"
        )
    if r.sampler_params:
        return (
            f"rollout.agent takes no rollout.sampler_params (got {sorted(r.sampler_params)}); "
            "its knobs are rollout.agent_timeout_s and rollout.agent_concurrency"
        )
    if r.oracle_horizon > 0:
        return (
            "rollout.agent: oracle continuations (rollout.oracle_horizon) need env "
            "snapshots, which an agent's episodes do not have; set rollout.oracle_horizon=0"
        )
    if r.agent_timeout_s <= 0:
        return f"rollout.agent_timeout_s must be > 0, got {r.agent_timeout_s}"
    if r.agent_concurrency is not None and r.agent_concurrency < 1:
        return f"rollout.agent_concurrency must be ≥ 1, got {r.agent_concurrency}"
    try:
        check_agent_spec(r.agent)
    except (ImportError, ValueError) as exc:
        return str(exc)
    if cfg.sft.enabled and not hasattr(resolve_env(cfg.env.name), "oracle_action"):
        return (
            f"rollout.agent: the warm start (sft.enabled) learns from the oracle "
            f"demonstrations of env.name={cfg.env.name!r}, which has no oracle_action; "
            "set sft.enabled=false (or name the env the agent plays)"
        )
    return None


@register_sampler(
    "agent",
    params=AgentParams,
    state=_session_for,
    check=agent_problem,
    configure=agent_params,
    run_state=True,
)
def sample_agent(
    ctx: SamplerContext,
    tasks: Sequence[Task],
    *,
    group_size: int,
    params: AgentParams | None = None,
    state: AgentSession | None = None,
) -> RolloutResult:
    """The ``agent`` sampler: ``group_size`` episodes of the agent per task, against
    ``ctx.policy`` sampled as ``ctx.sampling`` says from ``ctx.generator``; ``state`` is the
    run's :class:`AgentSession` (without one, a server is started for this call only).
    ``ctx.renderer``, ``ctx.make_env`` and ``ctx.max_turns`` are unused: the agent builds
    its own prompts, plays its own env and decides when it is done."""
    session = state
    if session is None:
        if params is None or not params.agent:
            raise ValueError("the agent sampler needs params.agent ('module:function')")
        session = AgentSession(params)
    try:
        return session.sample(ctx.policy, ctx.sampling, tasks, group_size, ctx.generator)
    finally:
        if state is None:
            session.close()
