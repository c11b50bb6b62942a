""":class:`AgentSampler`: an ``openai``-client agent as the trainer's sampler.

What ``credo train --agent module:function`` needs, in one object that lives for the run::

    sampler = AgentSampler("examples/openai_agent.py:run", policy, sampling, timeout_s=120)
    try:
        for it in range(iterations):
            rollout = sampler.sample(tasks, group_size, generator=gen)  # a RolloutResult
            ...                                                         # credit, update
            sampler.weights_updated()
    finally:
        sampler.close()

The server is started once (127.0.0.1, ephemeral port) and samples every request as the
trainer's ``sampling`` says (temperature, top-p, token cap, KLPO's auxiliary draws and top-K
head), whatever the agent asks for, so that the recorded log-probs are those the trainer's
objective compares against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from credo.policy.base import SamplingParams
from credo.rollout import RolloutResult
from credo.serve.agents import AgentFn, load_agent, run_agent_episodes
from credo.serve.engine import EngineConfig
from credo.serve.server import PolicyServer

__all__ = ["AgentSampler"]


class AgentSampler:
    """Runs an agent function against a policy server kept for the whole run.

    Args:
        agent: the agent function, or its ``module:function`` / ``file.py:function`` spec
            (:func:`~credo.serve.agents.load_agent`).
        policy: the policy being trained (served with its current weights).
        sampling: the trainer's sampling parameters (forced on every request).
        timeout_s: the longest one agent run may take (default 300 s).
        max_concurrency: most agents at once (default: all of an iteration's).
        **server_kwargs: more :class:`~credo.serve.server.PolicyServer` arguments.
    """

    def __init__(
        self,
        agent: str | AgentFn,
        policy: Any,
        sampling: SamplingParams,
        *,
        timeout_s: float = 300.0,
        max_concurrency: int | None = None,
        **server_kwargs: Any,
    ) -> None:
        self.agent_fn = load_agent(agent) if isinstance(agent, str) else agent
        self.policy = policy
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.server = PolicyServer(
            policy, engine=EngineConfig.from_sampling(sampling), **server_kwargs
        ).start()

    @property
    def base_url(self) -> str:
        """Where the policy is served."""
        return self.server.base_url

    def sample(
        self,
        tasks: Sequence[Any],
        group_size: int,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutResult:
        """``group_size`` agent runs per task (task ``i`` → group ``i``); see
        :func:`~credo.serve.agents.run_agent_episodes`."""
        return run_agent_episodes(
            self.policy,
            self.agent_fn,
            tasks,
            group_size,
            timeout_s=self.timeout_s,
            max_concurrency=self.max_concurrency,
            server=self.server,
            api_key=self.server.api_key,
            generator=generator,
        )

    def weights_updated(self) -> None:
        """Call after each update: later calls are stamped with the new weights version."""
        self.server.recorder.weights_version += 1

    def close(self) -> bool:
        """Stop the server (bounded waits); True when its threads ended."""
        return self.server.stop()

    def __enter__(self) -> AgentSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
