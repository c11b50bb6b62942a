"""Prompt rendering: instruction + a window of the last k turns + the current observation.

Two formats:

- :class:`PlainRenderer` for the built-in word-level model::

      history : <a_{t-k}> ; ... ; <a_{t-1}> page : <observation> goal : <instruction> action :

  and the response is the action followed by ``<eos>``; with ``notes`` it may carry a
  note before the action, ``<note> action : <action>`` (the action is what follows the
  last ``action :``: SpatialCLI's internalised policy states the tool's answer there
  itself). With a history budget
  (``history_tokens`` > 0) the past turns carry their observations too::

      history : [truncated ;] page : <o_i> action : <a_i> ; ... ; page : <o_{t-1}> action : <a_{t-1}> page : <observation> goal : <instruction> action :
- :class:`ChatRenderer` for models with a chat template (real instruct models): a
  system message with the env's action rules, optional few-shot demonstration episodes,
  one user message (goal and observation) per observation and one assistant message per
  action for the last k turns, then the current observation; the response ends at the end
  of the assistant turn, and the action is found in the reply by the env's extractor
  (:meth:`ChatRenderer.extract_action`).

History budget (``rollout.history_tokens``; 0 keeps the count window of
``history_turns``): the past turns, observation and action each, are chosen **most recent
first** while their tokens fit the budget (:func:`history_window`), then shown oldest
first, so the latest turn sits next to the current observation. When older turns were
left out the history starts with a mark (``truncated`` in the plain format, a line in the
first user message of the chat format), so the model can tell "nothing happened" from
"something happened that is not shown". A turn that does not fit whole is left out whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CHAT_TRUNCATED",
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_USER_PROMPT",
    "ChatRenderer",
    "PlainRenderer",
    "Renderer",
    "Turn",
    "history_window",
    "make_renderer",
    "oracle_examples",
    "plain_words",
    "strip_think",
]

#: Words the plain format adds to an env's vocabulary.
PLAIN_WORDS = ("goal", ":", "history", ";", "page", "action", "none")
#: Words the plain format's history budget adds (only when ``history_tokens`` > 0, so the
#: vocabulary, and the model, of runs without it stay as they were).
HISTORY_WORDS = ("truncated",)
#: The chat format's mark of left-out turns (the first user message of the window).
CHAT_TRUNCATED = "(earlier turns not shown: {count})"


def plain_words(history_tokens: int = 0) -> tuple[str, ...]:
    """The words the plain format needs: :data:`PLAIN_WORDS`, plus
    :data:`HISTORY_WORDS` with a history budget."""
    return (*PLAIN_WORDS, *HISTORY_WORDS) if history_tokens > 0 else PLAIN_WORDS


def history_window(costs: Sequence[int], budget: int) -> int:
    """How many of the most recent turns fit in ``budget`` tokens.

    Args:
        costs: ``[T]`` tokens each past turn takes, oldest first.
        budget: the most tokens the shown turns may take in all (≥ 0).

    Returns:
        ``k``: the last ``k`` turns are shown (``sum(costs[-k:]) ≤ budget``, and adding
        turn ``T−k−1`` would exceed it); turns are taken whole, newest first, and taking
        stops at the first one that does not fit (no older turn jumps the gap).
    """
    used, k = 0, 0
    for cost in reversed(costs):
        if used + cost > budget:
            break
        used, k = used + cost, k + 1
    return k


@dataclass(frozen=True)
class Turn:
    """A past turn: the observation shown and the action taken on it."""

    observation: str
    action: str


class Renderer(Protocol):
    def prompt_ids(
        self, instruction: str, history: Sequence[Turn], observation: str
    ) -> list[int]: ...

    def response_ids(self, action: str) -> list[int]: ...

    def extract_action(self, text: str, env: Any) -> str: ...


class PlainRenderer:
    """The compact format of the built-in model (see the module docstring).

    Args:
        tokenizer: a tokenizer with ``encode`` and an ``eos_token_id``.
        history_turns: how many past actions to show (default 2; unused with a
            ``history_tokens`` budget).
        history_tokens: token budget of the past turns with their observations (default
            0: the ``history_turns`` actions only, as before). See the module docstring.
        notes: a response may carry a note before its action, ``<note> action :
            <action>`` (default false: the whole response is the action).
    """

    #: What separates a note from the action in a response (``notes``).
    NOTE_MARK = "action :"

    def __init__(
        self, tokenizer: Any, history_turns: int = 2, history_tokens: int = 0, notes: bool = False
    ) -> None:
        if history_tokens < 0:
            raise ValueError(f"history_tokens must be ≥ 0, got {history_tokens}")
        self.tokenizer = tokenizer
        self.history_turns = history_turns
        self.history_tokens = history_tokens
        self.notes = notes
        self.eos_id = int(tokenizer.eos_token_id)

    def _turn_text(self, turn: Turn) -> str:
        return f"page : {turn.observation} action : {turn.action}"

    def _budget_history(self, history: Sequence[Turn]) -> str:
        """The past turns within ``history_tokens`` (module docstring)."""
        texts = [self._turn_text(t) for t in history]
        # each turn's tokens, with the " ;" that separates it from the next one
        costs = [len(self.tokenizer.encode(x, add_special_tokens=False)) + 1 for x in texts]
        k = history_window(costs, self.history_tokens)
        shown = texts[len(texts) - k :]
        if k < len(texts):
            shown = ["truncated", *shown]
        return " ; ".join(shown) or "none"

    def text(self, instruction: str, history: Sequence[Turn], observation: str) -> str:
        if self.history_tokens > 0:
            past = self._budget_history(history)
        else:
            window = history[-self.history_turns :] if self.history_turns > 0 else []
            past = " ; ".join(t.action for t in window) or "none"
        # The goal sits right before the action: words the action copies from it (a search
        # query) are then at a fixed distance from the generation point, which a small
        # model with rotary positions learns much faster than a content-based lookup.
        return f"history : {past} page : {observation} goal : {instruction} action :"

    def prompt_ids(self, instruction: str, history: Sequence[Turn], observation: str) -> list[int]:
        return self.tokenizer.encode(
            self.text(instruction, history, observation), add_special_tokens=False
        )

    def response_ids(self, action: str) -> list[int]:
        return [*self.tokenizer.encode(action, add_special_tokens=False), self.eos_id]

    def note_response_ids(self, note: str, action: str) -> list[int]:
        """The response that states ``note`` before ``action`` (read back by
        :meth:`extract_action` with ``notes``)."""
        return self.response_ids(f"{note} {self.NOTE_MARK} {action}")

    def extract_action(self, text: str, env: Any) -> str:
        if self.notes and self.NOTE_MARK in text:
            return text.rsplit(self.NOTE_MARK, 1)[1].strip()
        return text.strip()


class ChatRenderer:
    """Chat-template format for instruct models (see the module docstring).

    The conversation is::

        system     system_template(instruction, action_format)
        user       user_template(demo goal, demo o_1)   ┐ few-shot demonstration
        assistant  demo a_1                             ┘ episodes, if any
        ...
        user       user_template(goal, o_{t-k})  ┐ the last k = history_turns turns
        assistant  a_{t-k}                       ┘ (the action the env received)
        ...
        user       user_template(goal, o_t)
        assistant  ← generation starts here and stops at the end of the turn

    Args:
        tokenizer: a tokenizer with a ``chat_template``.
        history_turns: how many past (observation, action) turns to include (default 2;
            0 shows the current observation only). Older turns drop out of the window
            (the default user template repeats the goal in every user message).
        action_rules: the env's action format (``env.action_format()``), shown in the
            system message (default empty).
        system_template: the system message; ``{instruction}`` and ``{action_format}``
            are filled in (default :data:`DEFAULT_SYSTEM_PROMPT`).
        user_template: a user message; ``{observation}`` and ``{instruction}`` are filled
            in (default :data:`DEFAULT_USER_PROMPT`: the goal and the observation, so the
            goal stays in view whatever the history window).
        max_action_chars: past assistant messages longer than this are cut (default 200):
            a rambling unparseable reply is shown back, but not at any length.
        examples: demonstration episodes ``(instruction, turns)`` shown as an earlier
            conversation between the system message and the episode (few-shot; default
            none). :func:`oracle_examples` makes them from an env's oracle.
        history_tokens: token budget of the past turns (default 0: the last
            ``history_turns`` turns). A turn costs the tokens of its user message and of
            its (cut) action; the template's own tokens are not counted. Left-out turns
            are marked with :data:`CHAT_TRUNCATED` at the start of the first user message
            shown.
    """

    def __init__(
        self,
        tokenizer: Any,
        history_turns: int = 2,
        action_rules: str = "",
        *,
        system_template: str | None = None,
        user_template: str | None = None,
        max_action_chars: int = 200,
        examples: Sequence[tuple[str, Sequence[Turn]]] = (),
        history_tokens: int = 0,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatRenderer needs a tokenizer with a chat_template")
        if history_turns < 0:
            raise ValueError(f"history_turns must be ≥ 0, got {history_turns}")
        if history_tokens < 0:
            raise ValueError(f"history_tokens must be ≥ 0, got {history_tokens}")
        self.tokenizer = tokenizer
        self.history_turns = history_turns
        self.history_tokens = history_tokens
        self.action_rules = action_rules
        self.system_template = system_template or DEFAULT_SYSTEM_PROMPT
        self.user_template = user_template or DEFAULT_USER_PROMPT
        self.max_action_chars = max_action_chars
        self.examples = [(instr, list(turns)) for instr, turns in examples]
        for name, template, keys in (
            ("system", self.system_template, {"instruction", "action_format"}),
            ("user", self.user_template, {"instruction", "observation"}),
        ):
            try:
                template.format(**dict.fromkeys(keys, ""))
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"bad chat {name} template {template!r}: {exc!r}; it may use "
                    + ", ".join("{" + k + "}" for k in sorted(keys))
                ) from None

    def messages(
        self, instruction: str, history: Sequence[Turn], observation: str
    ) -> list[dict[str, str]]:
        """The conversation as ``[{"role": ..., "content": ...}]`` messages."""
        system = self.system_template.format(
            instruction=instruction, action_format=self.action_rules
        ).strip()
        msgs = [{"role": "system", "content": system}]
        for demo_instruction, turns in self.examples:
            msgs.extend(self._turns(demo_instruction, turns))
        if self.history_tokens > 0:
            turns = self._turns(instruction, history)
            costs = [
                sum(
                    len(self.tokenizer.encode(m["content"], add_special_tokens=False)) for m in pair
                )
                for pair in zip(turns[::2], turns[1::2])
            ]
            k = history_window(costs, self.history_tokens)
            window = turns[len(turns) - 2 * k :]
            if k < len(history):  # mark the left-out turns where the history starts
                mark = CHAT_TRUNCATED.format(count=len(history) - k)
                if window:
                    window[0] = {"role": "user", "content": f"{mark}\n{window[0]['content']}"}
                else:
                    observation = f"{mark}\n{observation}"
            msgs.extend(window)
        else:
            window_turns = history[-self.history_turns :] if self.history_turns > 0 else []
            msgs.extend(self._turns(instruction, window_turns))
        msgs.append({"role": "user", "content": self._user(instruction, observation)})
        return msgs

    def _turns(self, instruction: str, turns: Sequence[Turn]) -> list[dict[str, str]]:
        out = []
        for t in turns:
            action = t.action
            if len(action) > self.max_action_chars:
                action = action[: self.max_action_chars] + " ..."
            out.append({"role": "user", "content": self._user(instruction, t.observation)})
            out.append({"role": "assistant", "content": action})
        return out

    def _user(self, instruction: str, observation: str) -> str:
        return self.user_template.format(instruction=instruction, observation=observation)

    def text(self, instruction: str, history: Sequence[Turn], observation: str) -> str:
        """The prompt as text: the chat template applied, ending with the assistant's
        generation prompt."""
        return self.tokenizer.apply_chat_template(
            self.messages(instruction, history, observation),
            tokenize=False,
            add_generation_prompt=True,
        )

    def prompt_ids(self, instruction: str, history: Sequence[Turn], observation: str) -> list[int]:
        return self.tokenizer.encode(
            self.text(instruction, history, observation), add_special_tokens=False
        )

    def response_ids(self, action: str) -> list[int]:
        """Tokens of ``action`` as a complete assistant turn (its end token included)."""
        msgs = [{"role": "user", "content": "x"}]
        prompt = self.tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True
        )
        full = self.tokenizer.apply_chat_template(
            [*msgs, {"role": "assistant", "content": action}], tokenize=False
        )
        if not full.startswith(prompt):
            raise ValueError("the chat template does not extend the generation prompt")
        completion = full[len(prompt) :].rstrip("\n")
        return self.tokenizer.encode(completion, add_special_tokens=False)

    def note_response_ids(self, note: str, action: str) -> list[int]:
        """The reply that states ``note`` on a line before ``action`` (the env's
        extractor finds the action in it)."""
        return self.response_ids(f"{note}\n{action}")

    def extract_action(self, text: str, env: Any) -> str:
        """The action in a free-form reply.

        Think blocks are dropped first (``<think>...</think>``, and everything after an
        unclosed ``<think>``: a reply cut off mid-thought has no action). Then the env's
        own ``extract_action`` finds the action in the remaining text (tolerant of
        surrounding words); the env still parses it with its strict grammar. When the env
        finds none (or has no extractor), the text itself goes to the env, which answers
        with its invalid-action message, shown to the model in the next user turn.
        """
        text = strip_think(text)
        if hasattr(env, "extract_action"):
            found = env.extract_action(text)
            if found is not None:
                return found
        return text


#: The default chat system message (``rollout.system_prompt`` replaces it).
DEFAULT_SYSTEM_PROMPT = "You are an agent in a text environment.\n{action_format}"
#: The default chat user message (``rollout.user_prompt`` replaces it).
DEFAULT_USER_PROMPT = "Goal: {instruction}\nObservation: {observation}"

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_OPEN_THINK = re.compile(r"<think>.*\Z", re.S | re.I)


def strip_think(text: str) -> str:
    """``text`` without reasoning blocks: closed ``<think>...</think>`` blocks and an
    unclosed ``<think>`` with everything after it."""
    return _OPEN_THINK.sub("", _THINK.sub("", text)).strip()


def oracle_examples(
    make_env: Callable[[], Any], count: int, *, max_turns: int = 64
) -> list[tuple[str, list[Turn]]]:
    """``count`` demonstration episodes of the env's oracle, for a few-shot chat prompt.

    The oracle plays training tasks ``train/0, train/1, ...`` (never held-out tasks);
    each episode is ``(instruction, [Turn(observation, action), ...])``. A task on which
    the env raises is skipped (a flaky env costs a demonstration, not the run), trying
    at most ``4 · count`` tasks.

    Raises:
        ValueError: the env has no ``oracle_action``, or it raised on every task tried
            (the message starts with the env's own error).
    """
    from credo.envs.base import Task

    out: list[tuple[str, list[Turn]]] = []
    first_error = None
    for i in range(4 * count):
        if len(out) == count:
            break
        env = make_env()
        if not hasattr(env, "oracle_action"):
            raise ValueError(
                f"{type(env).__name__} has no oracle_action(): cannot make few-shot examples "
                "(set rollout.chat_examples=0)"
            )
        try:
            out.append(_oracle_episode(env, Task.make("train", i), max_turns))
        except Exception as exc:  # the env raised: skip this task
            first_error = first_error or f"{type(exc).__name__}: {exc}"
    if count and not out and first_error is not None:
        raise ValueError(
            f"{first_error} (the env raised on every few-shot demonstration it was asked "
            "for; fix the env or set rollout.chat_examples=0)"
        )
    return out


def _oracle_episode(env: Any, task: Any, max_turns: int) -> tuple[str, list[Turn]]:
    """One oracle episode of ``env`` on ``task``: ``(instruction, turns)``."""
    obs = env.reset(task, 0)
    instruction = env.instruction() if hasattr(env, "instruction") else obs
    turns = []
    for _ in range(max_turns):
        action = env.oracle_action()
        res = env.step(action)
        turns.append(Turn(obs, action))
        obs = res.observation
        if res.done:
            break
    return instruction, turns


def make_renderer(
    tokenizer: Any,
    *,
    builtin: bool,
    history_turns: int,
    env: Any,
    system_prompt: str | None = None,
    user_prompt: str | None = None,
    examples: Sequence[tuple[str, Sequence[Turn]]] = (),
    history_tokens: int = 0,
    notes: bool = False,
) -> Renderer:
    """Plain format for the built-in model, chat format for models with a chat template.

    Args:
        tokenizer: the policy's tokenizer.
        builtin: the built-in word-level model (always the plain format).
        history_turns: past turns in the prompt.
        env: an env instance (its ``action_format()`` goes into the system message).
        system_prompt: chat system template (``None``: :data:`DEFAULT_SYSTEM_PROMPT`).
        user_prompt: chat user template (``None``: :data:`DEFAULT_USER_PROMPT`).
        examples: few-shot demonstration episodes for the chat format (see
            :func:`oracle_examples`).
        history_tokens: token budget of the past turns (0: ``history_turns`` by count).
        notes: the plain format reads a note before the action (:class:`PlainRenderer`;
            a chat reply is read by the env's extractor, notes or not).
    """
    if builtin or not getattr(tokenizer, "chat_template", None):
        return PlainRenderer(tokenizer, history_turns, history_tokens, notes)
    rules = env.action_format() if hasattr(env, "action_format") else ""
    return ChatRenderer(
        tokenizer,
        history_turns,
        action_rules=rules,
        system_template=system_prompt,
        user_template=user_prompt,
        examples=examples,
        history_tokens=history_tokens,
    )
