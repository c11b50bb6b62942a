"""Prompt rendering: instruction + a window of the last k turns + the current observation.

Two formats:

- :class:`PlainRenderer` for the built-in word-level model::

      history : <a_{t-k}> ; ... ; <a_{t-1}> page : <observation> goal : <instruction> action :

  and the response is the action followed by ``<eos>``.
- :class:`ChatRenderer` for models with a chat template: a system message with the
  instruction and the env's action rules, one user message per observation and one
  assistant message per action for the last k turns, then the current observation;
  the response ends at the end of the assistant turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ChatRenderer", "PlainRenderer", "Renderer", "Turn", "make_renderer"]

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

    Args:
        tokenizer: a tokenizer with a ``chat_template``.
        history_turns: how many past (observation, action) turns to include (default 2).
    """

    def __init__(self, tokenizer: Any, history_turns: int = 2, action_rules: str = "") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatRenderer needs a tokenizer with a chat_template")
        self.tokenizer = tokenizer
        self.history_turns = history_turns
        self.action_rules = action_rules

    def messages(self, instruction: str, history: Sequence[Turn], observation: str) -> list[dict]:
        system = f"You are an agent. Your task: {instruction}"
        if self.action_rules:
            system += f"\n{self.action_rules}"
        msgs = [{"role": "system", "content": system}]
        window = history[-self.history_turns :] if self.history_turns > 0 else []
        for t in window:
            msgs.append({"role": "user", "content": t.observation})
            msgs.append({"role": "assistant", "content": t.action})
        msgs.append({"role": "user", "content": observation})
        return msgs

    def prompt_ids(self, instruction: str, history: Sequence[Turn], observation: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            self.messages(instruction, history, observation),
            tokenize=False,
            add_generation_prompt=True,
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

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
        """The env's own extractor when it has one, else the text without think blocks."""
        text = re.sub(r"<think>.*?</think>", "", text, flags=re.S).strip()
        if hasattr(env, "extract_action"):
            found = env.extract_action(text)
            if found is not None:
                return found
        return text


def make_renderer(tokenizer: Any, *, builtin: bool, history_turns: int, env: Any) -> Renderer:
    """Plain format for the built-in model, chat format for models with a chat template."""
    if builtin or not getattr(tokenizer, "chat_template", None):
        return PlainRenderer(tokenizer, history_turns)
    rules = env.action_format() if hasattr(env, "action_format") else ""
    return ChatRenderer(tokenizer, history_turns, action_rules=rules)
