"""An OpenAI-compatible server for a credo policy, with exact token recording.

- :func:`serve_policy` / :class:`PolicyServer`: chat completions (streaming and not,
  ``n``, temperature, max tokens, stop, tool calls) over FastAPI + uvicorn, loopback by
  default (:mod:`credo.serve.app`, :mod:`credo.serve.server`).
- :class:`SessionRecorder`: the prompt ids, response ids and sampling log-probs of every
  request of an agent session, turned into credo steps and episodes without
  re-tokenising (:mod:`credo.serve.recorder`).
- :func:`run_agent_episodes`: run an ``openai``-client agent G times per task and get a
  :class:`~credo.rollout.RolloutResult`, as the built-in samplers return
  (:mod:`credo.serve.agents`); :class:`AgentSampler` keeps one server for a training run
  (:mod:`credo.serve.sampler`).

Needs the ``serve`` extra: ``pip install 'credo[serve]'``.
"""

try:
    import fastapi  # noqa: F401
    import openai  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as _exc:  # pragma: no cover
    raise ImportError(
        f"credo.serve needs the 'serve' extra ({_exc.name} is missing): pip install 'credo[serve]'"
    ) from None

from credo.serve.agents import load_agent, parse_agent_result, run_agent_episodes
from credo.serve.chat import FALLBACK_CHAT_TEMPLATE, render_prompt
from credo.serve.engine import EngineConfig, GenerationEngine
from credo.serve.recorder import (
    RecordedCall,
    RecordedChoice,
    SessionRecorder,
    calls_to_steps,
    session_to_episode,
)
from credo.serve.sampler import AgentSampler
from credo.serve.server import PolicyServer, check_bind, serve_policy

__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "AgentSampler",
    "EngineConfig",
    "GenerationEngine",
    "PolicyServer",
    "RecordedCall",
    "RecordedChoice",
    "SessionRecorder",
    "calls_to_steps",
    "check_bind",
    "load_agent",
    "parse_agent_result",
    "render_prompt",
    "run_agent_episodes",
    "serve_policy",
    "session_to_episode",
]
