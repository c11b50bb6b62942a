"""Tool calls in the model's text: how they are written and how they are read back.

Two formats, one parser:

- **Native**: the tokenizer's chat template renders tools itself (it mentions ``tools``,
  as Qwen2.5/3, Hermes, SmolLM3 and Llama 3.1 templates do). The tools and the earlier
  turns' tool calls are passed to the template (arguments as objects, the Hugging Face
  convention), and the model writes calls in the format its template taught it.
- **Text** (templates without tool support, and the built-in model's fallback template):
  credo adds one system message that lists the tools as JSON and asks for calls as
  :data:`TEXT_FORMAT` describes; earlier assistant tool calls are written back into the
  assistant message in that same format, and tool results become user messages
  ``<tool_response> {name} : {content} </tool_response>``.

Reading a reply (:func:`parse_tool_calls`) accepts the forms these templates produce:
``<tool_call> {json} </tool_call>`` blocks (Hermes/Qwen style, and credo's text format), or
a reply that is nothing but one JSON object (or list of objects) with ``name`` and
``arguments``/``parameters`` (Llama 3.1 style). JSON is read with :func:`json.loads` only;
model output is never evaluated.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "TEXT_FORMAT",
    "ToolCall",
    "format_tool_call",
    "parse_tool_calls",
    "template_supports_tools",
    "text_tools_message",
]

#: How credo's text format asks for a call (shown to the model in the system message).
TEXT_FORMAT = (
    'To call a tool, reply with <tool_call> {"name": <tool name>, "arguments": <JSON object>} '
    "</tool_call> (one block per call)."
)

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_OPEN = re.compile(r"<tool_call>(.*)\Z", re.S)

#: A parsed call: ``(name, arguments as a JSON string)``.
ToolCall = tuple[str, str]


def template_supports_tools(template: str | None) -> bool:
    """The chat template renders tool definitions itself (it reads a ``tools`` variable)."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


def text_tools_message(tools: list[dict[str, Any]]) -> str:
    """The system message of the text format: the tool list as JSON and :data:`TEXT_FORMAT`."""
    specs = [t["function"] for t in tools]
    return "You can call these tools: " + json.dumps(specs) + "\n" + TEXT_FORMAT


def format_tool_call(name: str, arguments: str) -> str:
    """One call in the text format (``arguments`` is a JSON string, written as an object
    when it parses, else as the string it is)."""
    try:
        args: Any = json.loads(arguments)
    except json.JSONDecodeError:
        args = arguments
    return "<tool_call> " + json.dumps({"name": name, "arguments": args}) + " </tool_call>"


def _as_call(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        return obj["name"], args
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """Split a reply into its plain content and its tool calls.

    Returns:
        ``(content, calls)``: ``content`` is the text outside the call blocks, stripped
        (``None`` when empty and there are calls); ``calls`` are ``(name, arguments JSON)``
        in order. A block whose JSON does not parse, or lacks a name, is not a call and
        stays in the content, so the agent sees what the model wrote. With no call found
        the content is the whole text.
    """
    calls: list[ToolCall] = []
    rest: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _as_call(_loads(m.group(1).strip()))
        if call is None:
            continue
        rest.append(text[pos : m.start()])
        calls.append(call)
        pos = m.end()
    tail = text[pos:]
    opened = _OPEN.search(tail)  # a last block left open (a stop string cut its end tag)
    if opened:
        call = _as_call(_loads(opened.group(1).strip()))
        if call is not None:
            calls.append(call)
            rest.append(tail[: opened.start()])
            tail = ""
    if calls:
        rest.append(tail)
        content = "".join(rest).strip()
        return (content or None), calls
    whole = _loads(text.strip())
    objs = whole if isinstance(whole, list) else [whole]
    found = [_as_call(o) for o in objs]
    if whole is not None and objs and all(c is not None for c in found):
        return None, [c for c in found if c is not None]
    return text, []
