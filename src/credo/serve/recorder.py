"""Exact token recording: what the model saw and sampled, per agent session.

For every chat-completions request that names a session (header ``X-Credo-Session`` or the
``user`` field) the server records a :class:`RecordedCall`: the messages, the prompt ids
the model was given, and for each choice the response ids kept and their sampling
log-probs. A finished session becomes credo steps without re-tokenising any text
(:func:`calls_to_steps`, :func:`session_to_episode`; forests via
:func:`credo.rollout.episodes_to_forest`):

- one step per delivered call, in the order the requests arrived;
- the step's ``prompt_ids`` are the call's recorded prompt ids — when the chat template
  rewrites earlier turns (not append-only), the step keeps what the model actually saw,
  and ``info["append_only"]`` says whether the previous step's prompt + response was a
  prefix of this prompt;
- with ``n`` > 1 the step takes the choice the agent used: the choice whose reply is the
  newest assistant message of the session's next request that this request did not
  already hold (right after this call's messages for an agent that appends; anywhere for
  one that trims its history); for the last request, the ``choice`` the agent returned
  (``{"reward": r, "choice": i}``), as no later request shows it. Choices with equal
  replies are one. When none of that tells, the step is choice 0 with
  ``info["choice_known"] = False`` (counted in ``rollout/choice_unknown``); the other
  choices are not steps (they have no continuation or reward);
- a call whose reply could not be written in full (the client disconnected mid-stream) is
  kept in the record with ``delivered=False`` but is not a step;
- the reward is given to the last step; ``state`` is the ``X-Credo-State`` header the
  agent sent with the request when it sent one, else the text of the messages that are
  new since the model's last reply (the agent's observation), and ``next_state`` the next
  step's state (``"<end>"`` after the last).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from credo.data import Episode, Step

__all__ = [
    "RecordedCall",
    "RecordedChoice",
    "SessionRecorder",
    "calls_to_steps",
    "session_to_episode",
]


@dataclass
class RecordedChoice:
    """One choice of a recorded call.

    Attributes:
        response_ids: the tokens kept (see :class:`~credo.serve.engine.ChoiceResult`).
        logprobs: their sampling log-probs.
        text: the decoded reply.
        content: the reply without tool calls.
        tool_calls: OpenAI tool calls returned to the client.
        finish_reason: ``"stop"``, ``"length"`` or ``"tool_calls"``.
        token_data: per-token tensors for the trainer (KLPO's auxiliary draws and top-K
            head), becoming ``Step.token_data``.
    """

    response_ids: list[int]
    logprobs: list[float]
    text: str
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    token_data: dict[str, Any] = field(default_factory=dict)


@dataclass
class RecordedCall:
    """One request of a session.

    Attributes:
        session_id: the session it belongs to.
        seq: arrival order among all recorded requests (the step order).
        messages: the validated request messages.
        prompt_ids: the exact ids the model was given.
        choices: one per ``n``.
        temperature: the sampling temperature used.
        top_p: the nucleus mass used.
        state: the agent's ``X-Credo-State`` header, or ``None``.
        weights_version: :attr:`SessionRecorder.weights_version` when the call was served.
        delivered: the whole reply reached the client.
    """

    session_id: str
    seq: int
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    choices: list[RecordedChoice]
    temperature: float
    top_p: float
    state: str | None = None
    weights_version: int = 0
    delivered: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class SessionRecorder:
    """Thread-safe store of recorded calls by session id, bounded.

    A server left running must not grow without bound, whoever calls it: beyond
    ``max_sessions`` sessions or ``max_calls`` calls in all, the least recently used
    sessions are dropped whole (a single session over ``max_calls`` loses its oldest
    calls). A session that lost calls is remembered (:meth:`lost`), so that a trainer
    never turns a partial recording into an episode.

    Args:
        max_sessions: sessions kept at most (default 100 000).
        max_calls: calls kept at most, over all sessions (default 20 000: a trainer pops
            each iteration's sessions, so this bounds one iteration's requests; each call
            holds its prompt and response ids).

    Attributes:
        weights_version: stamped on every call; a trainer bumps it after each update so
            that off-policy calls can be told apart.
        dropped: calls dropped by the bounds so far.
    """

    def __init__(self, max_sessions: int = 100_000, max_calls: int = 20_000) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be ≥ 1, got {max_sessions}")
        if max_calls < 1:
            raise ValueError(f"max_calls must be ≥ 1, got {max_calls}")
        self.max_sessions = max_sessions
        self.max_calls = max_calls
        self.weights_version = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, list[RecordedCall]] = OrderedDict()
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._lost: OrderedDict[str, None] = OrderedDict()
        self._calls = 0
        self._seq = 0

    def record(
        self,
        session_id: str,
        *,
        messages: list[dict[str, Any]],
        prompt_ids: list[int],
        choices: list[RecordedChoice],
        temperature: float,
        top_p: float,
        state: str | None = None,
    ) -> RecordedCall | None:
        """Add a call to ``session_id``; ``None`` (nothing kept) if the session was closed
        by :meth:`pop` (a late reply to an agent that already timed out)."""
        with self._lock:
            if session_id in self._closed:
                return None
            call = RecordedCall(
                session_id=session_id,
                seq=self._seq,
                messages=messages,
                prompt_ids=list(prompt_ids),
                choices=choices,
                temperature=temperature,
                top_p=top_p,
                state=state,
                weights_version=self.weights_version,
            )
            self._seq += 1
            self._sessions.setdefault(session_id, []).append(call)
            self._sessions.move_to_end(session_id)
            self._calls += 1
            self._evict(session_id)
            return call

    def _evict(self, current: str) -> None:
        """Drop least recently used sessions (then ``current``'s oldest calls) until the
        bounds hold; the lock is held."""
        while len(self._sessions) > self.max_sessions or (
            self._calls > self.max_calls and len(self._sessions) > 1
        ):
            sid, calls = self._sessions.popitem(last=False)
            self._forget(sid, len(calls))
        own = self._sessions.get(current, [])
        while self._calls > self.max_calls and own:
            own.pop(0)
            self._forget(current, 1)

    def _forget(self, session_id: str, calls: int) -> None:
        self._calls -= calls
        self.dropped += calls
        self._lost[session_id] = None
        self._lost.move_to_end(session_id)
        while len(self._lost) > self.max_sessions:
            self._lost.popitem(last=False)

    def lost(self, session_id: str) -> bool:
        """Whether ``session_id`` lost calls to the bounds (its recording is partial)."""
        with self._lock:
            return session_id in self._lost

    def mark_undelivered(self, call: RecordedCall | None) -> None:
        """The reply of ``call`` did not fully reach the client."""
        if call is not None:
            with self._lock:
                call.delivered = False

    def sessions(self) -> list[str]:
        """Ids of the sessions with recorded calls, oldest first."""
        with self._lock:
            return list(self._sessions)

    def calls(self, session_id: str) -> list[RecordedCall]:
        """The calls of ``session_id`` in arrival order (empty if none)."""
        with self._lock:
            return list(self._sessions.get(session_id, []))

    def pop(self, session_id: str, *, close: bool = True) -> list[RecordedCall]:
        """Remove and return the calls of ``session_id``; with ``close`` (default), later
        calls of that session are not recorded."""
        with self._lock:
            calls = self._sessions.pop(session_id, [])
            self._calls -= len(calls)
            if close:
                self._closed[session_id] = None
                while len(self._closed) > self.max_sessions:
                    self._closed.popitem(last=False)
            return calls

    def clear(self) -> None:
        """Forget every session (closed ones too)."""
        with self._lock:
            self._sessions.clear()
            self._closed.clear()
            self._lost.clear()
            self._calls = 0

    def to_episode(self, session_id: str, **kwargs: Any) -> Episode:
        """:func:`session_to_episode` of the session's calls (which stay recorded)."""
        return session_to_episode(self.calls(session_id), **kwargs)


def _normal_args(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _reply_key(content: str | None, calls: list[dict[str, Any]] | None) -> tuple[Any, ...]:
    c = tuple(
        (
            x["function"]["name"],
            json.dumps(_normal_args(x["function"]["arguments"]), sort_keys=True),
        )
        for x in calls or []
    )
    return ((content or "").strip(), c)


def _chosen(
    call: RecordedCall, nxt: RecordedCall | None, last_choice: int | None
) -> tuple[int, bool]:
    """``(index, known)``: the choice of ``call`` the agent used (module docstring);
    ``(0, False)`` when it cannot be told. ``last_choice``: the choice the agent named
    for its last request (used when there is no next request)."""
    if len(call.choices) == 1:
        return 0, True
    if nxt is None and last_choice is not None and 0 <= last_choice < len(call.choices):
        return last_choice, True
    keys = [_reply_key(ch.content, ch.tool_calls) for ch in call.choices]
    if len(set(keys)) == 1:  # equal replies: the agent got the same whichever it took
        return 0, True
    if nxt is None:
        return 0, False
    k = len(call.messages)
    if len(nxt.messages) > k and nxt.messages[k]["role"] == "assistant":  # appended
        key = _reply_key(nxt.messages[k].get("content"), nxt.messages[k].get("tool_calls"))
        if key in keys:
            return keys.index(key), True
    # a history edited between turns: the newest assistant reply that this request did
    # not already hold (counted, so that a reply repeating an earlier one still counts)
    replies = [
        _reply_key(m.get("content"), m.get("tool_calls"))
        for m in nxt.messages
        if m["role"] == "assistant"
    ]
    new = Counter(replies) - Counter(
        _reply_key(m.get("content"), m.get("tool_calls"))
        for m in call.messages
        if m["role"] == "assistant"
    )
    for key in reversed(replies):
        if new[key] > 0 and key in keys:
            return keys.index(key), True
    return 0, False


def _observation(messages: list[dict[str, Any]]) -> str:
    """The messages after the last assistant message, as ``role: content`` lines."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    return "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in messages[last + 1 :])


def calls_to_steps(
    calls: list[RecordedCall], reward: float = 0.0, *, last_choice: int | None = None
) -> list[Step]:
    """Steps of a session's calls (see the module docstring); ``reward`` on the last;
    ``last_choice``: the choice of the last request the agent says it used."""
    live = sorted((c for c in calls if c.delivered), key=lambda c: c.seq)
    steps: list[Step] = []
    prev_seq: list[int] | None = None
    for k, call in enumerate(live):
        nxt = live[k + 1] if k + 1 < len(live) else None
        ci, known = _chosen(call, nxt, last_choice)
        ch = call.choices[ci]
        observation = _observation(call.messages)
        state = call.state if call.state is not None else observation
        append_only = prev_seq is None or call.prompt_ids[: len(prev_seq)] == prev_seq
        steps.append(
            Step(
                observation=observation,
                action=ch.text,
                reward=0.0,
                terminal=False,
                valid=True,
                state=state,
                next_state="<end>",
                source="policy",
                prompt_ids=list(call.prompt_ids),
                response_ids=list(ch.response_ids),
                logprobs=list(ch.logprobs),
                token_data=dict(ch.token_data),
                info={
                    "session": call.session_id,
                    "call": call.seq,
                    "choice": ci,
                    "choice_known": known,
                    "finish_reason": ch.finish_reason,
                    "append_only": append_only,
                    "temperature": call.temperature,
                    "weights_version": call.weights_version,
                    "tool_calls": [c["function"]["name"] for c in ch.tool_calls],
                },
            )
        )
        prev_seq = list(call.prompt_ids) + list(ch.response_ids)
    for a, b in itertools.pairwise(steps):
        a.next_state = b.state
    if steps:
        steps[-1].reward = float(reward)
        steps[-1].terminal = True
    return steps


def session_to_episode(
    calls: list[RecordedCall],
    *,
    reward: float = 0.0,
    success: bool = False,
    group: int = 0,
    task_id: str = "",
    error: str | None = None,
    last_choice: int | None = None,
) -> Episode:
    """An :class:`~credo.data.Episode` of a session's calls (:func:`calls_to_steps`).

    A session without a delivered call (the agent returned without calling the model,
    or no reply reached it) is a failed episode: no step holds anything the policy did,
    so neither a success nor a return can be credited to it. Its ``error`` says so and
    keeps the reward and success the agent returned, for the user to see.

    Args:
        calls: the session's recorded calls.
        reward: the episode's reward (given to its last step).
        success: the task was solved.
        group: the episode's group (the task's index in the batch).
        task_id: the task's id.
        error: why the episode failed (then ``success`` is forced to False).
        last_choice: the choice of its last request the agent says it used.
    """
    steps = calls_to_steps(calls, reward, last_choice=last_choice)
    if not steps and error is None:
        what = (
            "the agent never called the model"
            if not calls
            else "no reply of the model reached the agent (every call undelivered)"
        )
        error = (
            f"{what}: nothing the policy did to learn from, counted as failed (the agent "
            f"returned reward {reward:g}, success {bool(success)})"
        )
    return Episode(
        group=group,
        steps=steps,
        task_id=task_id,
        success=bool(success) and error is None,
        error=error,
    )
