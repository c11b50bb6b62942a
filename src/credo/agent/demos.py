"""A warm start through the user's agent: demonstrations recorded by running the agent
with the env's oracle answering in the model's place.

credo's own warm start (:func:`credo.train.sft.collect_demonstrations`) renders its own
prompts; an agent that writes its own prompts and parses replies in its own format then
meets a model that was taught another layout, and RL has nothing to start from. With
``sft.agent_reply`` (e.g. ``"Action: {action}"``) the warm start instead runs the agent
itself against credo's server, where an :class:`OracleReplier` stands in for the model:

1. each agent episode plays a task; the replier keeps a *mirror* of that episode's env
   (the same env, built from the same task), and answers every request of the episode's
   session with the mirror's ``oracle_action()`` (with probability ε, for the noisy
   demonstrations, with ``sample_action``), written as ``sft.agent_reply`` says (a
   template such as ``"Action: {action}"``, or ``tool_call``: the action as a real tool
   call, for an agent that sends ``tools=`` and reads ``message.tool_calls``; the env
   turns its action into ``(name, arguments)`` with ``action_as_call``), then
   steps the mirror with that action: the agent, which parses the reply and plays it in
   its own env, stays in the mirror's state;
2. every request is recorded as ``(the exact prompt tokens the server rendered from the
   agent's messages, the reply's tokens + end of turn)``;
3. the warm start is SFT on those rows: the model learns to answer *this agent's*
   prompts in *this agent's* format, whatever its wording, history or system prompt.

Clean demonstrations keep the rows of the episodes the agent reported as solved (an
episode the agent failed although the oracle answered means its parser did not read
the reply: those rows would teach the wrong format); noisy ones keep every row. An agent
that solves none is one line naming the reply format.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.data import Episode, Step
from credo.envs.base import Task
from credo.policy.base import Generation, SamplingParams

__all__ = [
    "TOOL_CALL",
    "OracleReplier",
    "check_reply_format",
    "collect_agent_demonstrations",
    "tool_call_text",
    "tool_call_words",
]

#: ``sft.agent_reply`` for an agent that reads real tool calls (``tools=`` requests,
#: ``message.tool_calls``): each oracle action is written as a tool call
#: (:func:`tool_call_text`), which the server parses back into ``tool_calls``.
TOOL_CALL = "tool_call"


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the model writes it in credo's text format, spaced so that the
    built-in word-level tokenizer keeps it whole (valid JSON inside the block, which
    :func:`credo.serve.tools.parse_tool_calls` reads back)::

        <tool_call> { "name" : "refund" , "arguments" : { "order_id" : 3 } } </tool_call>
    """
    inner = " , ".join(f"{json.dumps(k)} : {json.dumps(v)}" for k, v in arguments.items())
    args = f"{{ {inner} }}" if inner else "{ }"
    return f'<tool_call> {{ "name" : {json.dumps(name)} , "arguments" : {args} }} </tool_call>'


def tool_call_words(names: Sequence[str]) -> list[str]:
    """The words a tool call adds to a vocabulary (the built-in model's): the block's
    tags, its keys and each tool's quoted name."""
    return ["<tool_call>", "</tool_call>", '"name"', '"arguments"', *map(json.dumps, names)]


def check_reply_format(reply: str) -> str | None:
    """Why ``reply`` cannot be a reply template (``None``: it can): it must hold
    ``{action}`` exactly once and no other ``{...}`` field, or be :data:`TOOL_CALL`."""
    if reply == TOOL_CALL:
        return None
    if not isinstance(reply, str) or reply.count("{action}") != 1:
        return f"sft.agent_reply must contain {{action}} exactly once, got {reply!r}"
    rest = reply.replace("{action}", "")
    if "{" in rest or "}" in rest:
        return f"sft.agent_reply may hold no field but {{action}} (write {{{{ for a brace), got {reply!r}"
    return None


@dataclass
class _Mirror:
    """The replier's copy of one agent episode's env."""

    env: Any
    done: bool = False
    calls: list[tuple[list[int], list[int]]] = field(default_factory=list)


class OracleReplier:
    """Stands in for the model behind credo's server (module docstring): answers each
    request of an agent episode with its env's oracle action in the agent's format.

    Args:
        policy: the policy the warm start trains (its tokenizer, end-of-turn token and
            context size are what the server uses).
        make_env: builds the env the agent plays.
        reply: the reply template, ``{action}`` replaced by the action.
        epsilon: probability of a random action (``env.sample_action``) instead.
        seed: the random actions' seed.
    """

    #: the server's engine passes each row's session to :meth:`generate`
    wants_sessions = True

    def __init__(
        self,
        policy: Any,
        make_env: Callable[[], Any],
        reply: str,
        *,
        epsilon: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.tokenizer = policy.tokenizer
        self.stop_ids = policy.stop_ids
        self.model = policy.model  # its config's context size bounds the prompts
        self.make_env = make_env
        self.reply = reply
        self.epsilon = epsilon
        self.rng = random.Random(seed)
        self.tasks: Sequence[Task] = []
        self.mirrors: dict[str, _Mirror] = {}
        self._lock = threading.Lock()
        stops = sorted(self.stop_ids)
        self._end = stops[:1]  # the end-of-turn token the model would write

    def _mirror(self, session: str | None) -> _Mirror:
        from credo.serve.agents import session_task_index

        if session is None:
            raise ValueError("the oracle replier needs the session of each request")
        if session not in self.mirrors:
            env = self.make_env()
            env.reset(self.tasks[session_task_index(session)])
            self.mirrors[session] = _Mirror(env)
        return self.mirrors[session]

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        sessions: Sequence[str | None] | None = None,
    ) -> list[Generation]:
        """One reply per prompt: its session's next oracle (or, with probability ε,
        random) action, as :attr:`reply` writes it; the mirror env takes the action."""
        out = []
        with self._lock:
            for prompt, session in zip(prompts, sessions or [None] * len(prompts), strict=True):
                m = self._mirror(session)
                explore = self.epsilon > 0 and self.rng.random() < self.epsilon
                if m.done:
                    action = ""
                elif explore and hasattr(m.env, "sample_action"):
                    action = str(m.env.sample_action(self.rng))
                else:
                    action = str(m.env.oracle_action())
                if not m.done:
                    m.done = bool(m.env.step(action).done)
                text = self._write(m.env, action)
                ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + self._end
                m.calls.append((list(prompt), ids))
                out.append(Generation(ids, torch.zeros(len(ids)), text, finished=True))
        return out

    def _write(self, env: Any, action: str) -> str:
        """The reply that carries ``action``: the template filled in, or, with
        :data:`TOOL_CALL`, the action as a tool call (an action that is no valid call,
        e.g. a noisy one, is written as plain text: the agent sees no call)."""
        if self.reply != TOOL_CALL:
            return self.reply.format(action=action)
        call = env.action_as_call(action) if action else None
        return tool_call_text(*call) if call is not None else action


def collect_agent_demonstrations(
    agent: Any,
    policy: Any,
    make_env: Callable[[], Any],
    *,
    reply: str,
    episodes: int,
    epsilon: float,
    seed: int = 0,
    first_task: int = 0,
    env_data: dict[str, Any] | None = None,
    timeout_s: float = 300.0,
    max_concurrency: int | None = None,
) -> tuple[list[Episode], float]:
    """Run ``agent`` once on each of training tasks ``first_task ..`` with an
    :class:`OracleReplier` serving it (module docstring).

    Args:
        agent: the agent function or its ``module:function`` spec.
        policy: the policy the warm start trains (tokenizer, end-of-turn token).
        make_env: builds the env the agent plays (the mirrors).
        reply: the reply template (:func:`check_reply_format`).
        episodes: tasks, one agent episode each.
        epsilon: probability of a random action per reply.
        seed: the random actions' seed.
        first_task: the first training task's index.
        env_data: put in every task's ``data`` (``{"env": ..., "env_kwargs": ...}``, as
            the agent sampler does).
        timeout_s, max_concurrency: per episode, and agents at once.

    Returns:
        The episodes (one step per request: ``prompt_ids``, ``response_ids``, the reply
        as ``action``; success as the agent reported it) and the share solved.
    """
    from credo.serve import AgentSampler

    if episodes <= 0:
        return [], 0.0
    replier = OracleReplier(policy, make_env, reply, epsilon=epsilon, seed=seed)
    tasks = [Task("train", Task.make("train", first_task + i).seed, dict(env_data or {}))
             for i in range(episodes)]  # fmt: skip
    replier.tasks = tasks
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4096)
    sampler = AgentSampler(
        agent, replier, sampling, timeout_s=timeout_s, max_concurrency=max_concurrency
    )
    try:
        result = sampler.sample(tasks, 1)
    finally:
        sampler.close()
    from credo.serve.agents import session_task_index

    by_task = {session_task_index(sid): m for sid, m in replier.mirrors.items()}
    out: list[Episode] = []
    for i, ep in enumerate(result.episodes):
        mirror = by_task.get(i)
        steps = [
            Step(observation="", action=replier.tokenizer.decode(r), prompt_ids=p, response_ids=r)
            for p, r in (mirror.calls if mirror is not None else [])
        ]
        out.append(Episode(group=i, steps=steps, task_id=tasks[i].id, success=ep.success))
    solved = sum(e.success for e in out) / max(1, len(out))
    return out, solved
