"""Messages → the prompt token ids the model sees, through the tokenizer's chat template.

The prompt of every request is rendered from the messages the client sent, with the
tokenizer's own chat template (or :data:`FALLBACK_CHAT_TEMPLATE` when it has none, as the
built-in word-level model does), and tokenised once. These ids are what the server feeds
to the model and what the recorder keeps: nothing is re-tokenised later, so a template that
rewrites earlier turns (drops old reasoning, re-renders a system header) costs nothing in
exactness — each step keeps the ids the model actually saw.

Tool definitions and tool calls are rendered natively when the template knows tools, else
in credo's text format (:mod:`credo.serve.tools`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from credo.serve.protocol import RequestError
from credo.serve.tools import format_tool_call, template_supports_tools, text_tools_message

__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "RenderedPrompt",
    "chat_template_of",
    "render_prompt",
    "render_text",
]

#: The template used when the tokenizer has none: ``role : content <eos>`` per message,
#: then ``assistant :`` (the model's reply ends with its end-of-sequence token).
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m.role }} : {{ m.content }} {{ eos_token }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


@dataclass
class RenderedPrompt:
    """A rendered prompt.

    Attributes:
        text: the template's output (ends with the assistant's generation prompt).
        ids: its token ids (no special tokens added beyond what the template wrote).
        native_tools: the tools went through the template's own tool rendering.
    """

    text: str
    ids: list[int]
    native_tools: bool


def chat_template_of(tokenizer: Any, override: str | None = None) -> str:
    """The template to render with: ``override``, else the tokenizer's, else the fallback."""
    return override or getattr(tokenizer, "chat_template", None) or FALLBACK_CHAT_TEMPLATE


def _args_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _native(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        m = {**m, "role": "system" if m["role"] == "developer" else m["role"]}
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": _args_object(c["function"]["arguments"]),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def _text(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for m in messages:
        role = "system" if m["role"] == "developer" else m["role"]
        content = m.get("content") or ""
        if m.get("tool_calls"):
            calls = [
                format_tool_call(c["function"]["name"], c["function"]["arguments"])
                for c in m["tool_calls"]
            ]
            for c in m["tool_calls"]:
                names[c["id"]] = c["function"]["name"]
            content = " ".join([content, *calls]) if content else " ".join(calls)
        if role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id", ""), "tool")
            role, content = "user", f"<tool_response> {name} : {content} </tool_response>"
        out.append({"role": role, "content": content})
    if tools:
        intro = text_tools_message(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + intro}
        else:
            out.insert(0, {"role": "system", "content": intro})
    return out


def render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    chat_template: str | None = None,
) -> tuple[str, bool]:
    """The prompt text of ``messages`` (validated OpenAI messages) and ``tools``, and
    whether the tools went through the template natively, before any tokenising (the
    engine checks its length against the context first: :mod:`credo.serve.bounds`).

    Raises:
        RequestError: the template rejects the conversation (e.g. roles that must
            alternate), with the template's own message.
    """
    template = chat_template_of(tokenizer, chat_template)
    native = template_supports_tools(template)
    try:
        msgs = _native(messages) if native else _text(messages, tools or [])
        kwargs: dict[str, Any] = {"tools": tools} if native and tools else {}
        text = tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True, chat_template=template, **kwargs
        )
    except RecursionError:  # tools nested too deep for the template or JSON
        raise RequestError(
            "the tools or messages are nested too deeply to render", "tools"
        ) from None
    except Exception as exc:  # jinja's TemplateError and raise_exception() in templates
        raise RequestError(f"the chat template rejected the messages: {exc}", "messages") from None
    return text, native


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    chat_template: str | None = None,
) -> RenderedPrompt:
    """Render ``messages`` and ``tools`` (:func:`render_text`) and tokenise the text."""
    text, native = render_text(tokenizer, messages, tools, chat_template=chat_template)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return RenderedPrompt(text=text, ids=list(ids), native_tools=native)
