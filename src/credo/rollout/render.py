"""Prompt rendering: instruction + a window of the last k turns + the current observation.

Two formats:

- :class:`PlainRenderer` for the built-in word-level model::

      history : <a_{t-k}> ; ... ; <a_{t-1}> page : <observation> goal : <instruction> action :

  and the response is the action followed by ``<eos>``.
- :class:`ChatRenderer` for models with a chat template (real instruct models): a
  system message with the env's action rules, optional few-shot demonstration episodes,
  one user message (goal and observation) per observation and one assistant message per
  action for the last k turns, then the current observation; the response ends at the end
  of the assistant turn, and the action is found in the reply by the env's extractor
  (:meth:`ChatRenderer.extract_action`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_USER_PROMPT",
    "ChatRenderer",
    "PlainRenderer",
    "Renderer",
    "Turn",
    "make_renderer",
    "oracle_examples",
    "strip_think",
]

#: Words the plain format adds to an env's vocabulary.
PLAIN_WORDS = ("goal", ":", "history", ";", "page", "action", "none")


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
        history_turns: how many past actions to show (default 2).
    """

    def __init__(self, tokenizer: Any, history_turns: int = 2) -> None:
        self.tokenizer = tokenizer
        self.history_turns = history_turns
        self.eos_id = int(tokenizer.eos_token_id)

    def text(self, instruction: str, history: Sequence[Turn], observation: str) -> str:
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

    def extract_action(self, text: str, env: Any) -> str:
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
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatRenderer needs a tokenizer with a chat_template")
        if history_turns < 0:
            raise ValueError(f"history_turns must be ≥ 0, got {history_turns}")
        self.tokenizer = tokenizer
        self.history_turns = history_turns
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
        window = history[-self.history_turns :] if self.history_turns > 0 else []
        msgs.extend(self._turns(instruction, window))
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
    """
    if builtin or not getattr(tokenizer, "chat_template", None):
        return PlainRenderer(tokenizer, history_turns)
    rules = env.action_format() if hasattr(env, "action_format") else ""
    return ChatRenderer(
        tokenizer,
        history_turns,
        action_rules=rules,
        system_template=system_prompt,
        user_template=user_prompt,
        examples=examples,
    )
