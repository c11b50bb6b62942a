"""Training an agent written against the OpenAI API (``credo train --agent``): the
``agent`` sampler (:mod:`credo.agent.sampler`).

It sits above :mod:`credo.serve` (whose policy server it starts, imported only when an
agent run starts) and below :mod:`credo.train`, whose run keeps the agent's session for
as long as it lives. Importing this package registers the ``agent`` sampler.
"""

from credo.agent.sampler import (
    AgentParams,
    AgentSession,
    agent_params,
    agent_problem,
    check_agent_spec,
)

__all__ = ["AgentParams", "AgentSession", "agent_params", "agent_problem", "check_agent_spec"]
