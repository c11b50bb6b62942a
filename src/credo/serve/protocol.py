"""The request side of the OpenAI chat-completions API, validated into a :class:`ChatRequest`.

Validation is by hand rather than by a schema library so that every rejection is one
line naming the field, what was wrong and what is accepted; the server answers it with a
400 in OpenAI's error format (``{"error": {"message", "type", "param", "code"}}``).

Accepted fields (https://platform.openai.com/docs/api-reference/chat/create):
``messages``, ``model`` (any name: the server has one model), ``n``, ``temperature``,
``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``stream``,
``stream_options.include_usage``, ``tools``, ``tool_choice`` (``"none"`` hides the tools;
``"auto"``, ``"required"`` and a named function are accepted and treated as ``"auto"``:
the server does not constrain decoding), ``parallel_tool_calls``, ``logprobs``,
``top_logprobs``, ``user`` (a session id), ``seed``, ``metadata``, ``store``. Penalties and
``logit_bias`` are accepted only at their neutral values (0 / empty): the sampler cannot
apply them, and a silently ignored penalty would make the recorded log-probs lie.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from credo.policy.base import MIN_TEMPERATURE

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_N",
    "ChatRequest",
    "RequestError",
    "decode_body",
    "parse_chat_request",
]

#: Largest ``n`` accepted (choices per request).
MAX_N = 64
#: Deepest nesting of objects and arrays accepted in a request body (tool schemas are a
#: few levels deep).
MAX_JSON_DEPTH = 64
#: Largest ``top_logprobs`` accepted (OpenAI's limit).
MAX_TOP_LOGPROBS = 20
_ROLES = ("system", "developer", "user", "assistant", "tool")
_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None}


class RequestError(ValueError):
    """A request the server rejects with a 4xx; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclass
class ChatRequest:
    """A validated chat-completions request.

    Attributes:
        messages: the conversation, OpenAI-style dicts (tool-call arguments still JSON
            strings, as the client sent them).
        n: choices to sample.
        temperature: sampling temperature (0 = greedy).
        top_p: nucleus mass.
        max_tokens: response cap in tokens (``None``: the server's default).
        stop: stop strings (at most 4).
        stream: answer as server-sent events.
        include_usage: with ``stream``, send a final chunk with token counts.
        tools: tool definitions (``[{"type": "function", "function": {...}}]``), empty
            when none or when ``tool_choice`` is ``"none"``.
        logprobs: return the sampled tokens' log-probs.
        top_logprobs: also the K most likely tokens at each position.
        user: the ``user`` field (a session id when no ``X-Credo-Session`` header).
        model: the model name the client asked for (echoed back).
    """

    messages: list[dict[str, Any]]
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    tools: list[dict[str, Any]] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    user: str | None = None
    model: str = ""


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise RequestError(f"{key} must be a number in [{lo}, {hi}], got {v!r}", key)
    return float(v)


def _temperature(body: dict[str, Any]) -> float:
    """``temperature``: 0 (greedy) or in [:data:`~credo.policy.base.MIN_TEMPERATURE`, 2]
    (smaller positive values overflow the scaled logits)."""
    t = _number(body, "temperature", 1.0, 0.0, 2.0)
    if 0 < t < MIN_TEMPERATURE:
        raise RequestError(
            f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, 2.0], got {t!r}: "
            "below that the logits divided by it overflow; send 0 for greedy",
            "temperature",
        )
    return t


def _int(body: dict[str, Any], key: str, lo: int, hi: int | None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        top = "" if hi is None else f" and ≤ {hi}"
        raise RequestError(f"{key} must be an integer ≥ {lo}{top}, got {v!r}", key)
    return v


def _message(i: int, m: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise RequestError(f"{where} must be an object with 'role' and 'content'", where)
    role = m.get("role")
    if role not in _ROLES:
        raise RequestError(f"{where}.role must be one of {', '.join(_ROLES)}; got {role!r}", where)
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text parts can reach a text model
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(
                    f"{where}.content[{j}] must be a text part ({{'type': 'text', 'text': ...}});"
                    " this server serves a text model",
                    where,
                )
            texts.append(str(part.get("text", "")))
        content = "".join(texts)
    calls = m.get("tool_calls")
    if content is None and not (role == "assistant" and calls):
        raise RequestError(
            f"{where} has no content (only an assistant tool call may omit it)", where
        )
    if content is not None and not isinstance(content, str):
        raise RequestError(f"{where}.content must be a string or a list of text parts", where)
    out: dict[str, Any] = {"role": role, "content": content}
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls must be a list on an assistant message", where)
        out["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(calls)]
    if role == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id", ""))
        if m.get("name") is not None:
            out["name"] = str(m["name"])
    elif m.get("name") is not None:
        out["name"] = str(m["name"])
    return out


def _tool_call(where: str, c: Any) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(
            f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", where
        )
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        args = json.dumps(args)
    return {
        "id": str(c.get("id", "")),
        "type": "function",
        "function": {"name": fn["name"], "arguments": args},
    }


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError(
            "tools must be a list of {'type': 'function', 'function': {...}}", "tools"
        )
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'parameters': ...}}}}",
                "tools",
            )
    choice = body.get("tool_choice")
    if choice == "none":
        return []
    if choice not in (None, "auto", "required") and not isinstance(choice, dict):
        raise RequestError(
            f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}",
            "tool_choice",
        )
    return tools


def decode_body(raw: bytes) -> Any:
    """The JSON value of a request body, or :class:`RequestError` (400) for anything that is
    not valid JSON in UTF-8 text: bad syntax or bytes, nesting deeper than
    :data:`MAX_JSON_DEPTH` (100,000 levels made the JSON decoder raise ``RecursionError``,
    a 500), integers too long to read, and strings with a lone surrogate (``"\\ud800"``
    decodes to a string no tokenizer can encode, also a 500 before)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise RequestError(
            f"the request body is nested more than {MAX_JSON_DEPTH} levels deep"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        why = str(exc).split("; use sys.set_int_max_str_digits")[0]  # not the client's knob
        raise RequestError(f"the request body is not valid JSON: {why}") from None
    _check_json(body)
    return body


def _check_json(body: Any) -> None:
    """Refuse nesting deeper than :data:`MAX_JSON_DEPTH` and strings (keys included) that
    are not valid Unicode text, naming where (walked with an explicit stack)."""
    stack: list[tuple[Any, str, int]] = [(body, "body", 1)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise RequestError(
                    f"the request body is nested more than {MAX_JSON_DEPTH} levels deep"
                )
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                if isinstance(k, str):
                    _check_text(k, f"a key of {'the request body' if where == 'body' else where}")
                stack.append(
                    (v, f"{where}.{k}" if isinstance(k, str) else f"{where}[{k}]", depth + 1)
                )
        elif isinstance(value, str):
            _check_text(value, where)


def _check_text(text: str, where: str) -> None:
    """``text`` encodes as UTF-8; else a 400 naming ``where`` (``body.messages[0].content``)
    and the top-level field as the error's ``param``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        field = where.split("body", 1)[1].lstrip(".").split(".")[0].split("[")[0]
        raise RequestError(
            f"{where.replace('body.', '', 1)} is not valid Unicode text: it holds a lone "
            f"surrogate ({text[exc.start]!r} at character {exc.start}); send UTF-8 text "
            "(surrogates only in pairs)",
            field or None,
        ) from None


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body; raises :class:`RequestError` on the first problem."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for key, neutral in _NEUTRAL.items():
        v = body.get(key)
        if v not in (None, neutral, {}):
            raise RequestError(
                f"{key}={v!r} is not supported (the sampler cannot apply it); leave it unset", key
            )
    if body.get("response_format") not in (None, {"type": "text"}):
        raise RequestError("response_format: only {'type': 'text'} is supported", "response_format")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {'role', 'content'}", "messages")
    msgs = [_message(i, m) for i, m in enumerate(messages)]
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise RequestError(f"stop must be a string or a list of strings, got {stop!r}", "stop")
    if len(stops) > 4 or any(not s for s in stops):
        raise RequestError("stop takes at most 4 non-empty strings", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError(f"user must be a string, got {user!r}", "user")
    max_tokens = _int(body, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1, None)
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise RequestError(f"logprobs must be true or false, got {logprobs!r}", "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top and not logprobs:
        raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
    return ChatRequest(
        messages=msgs,
        n=_int(body, "n", 1, MAX_N) or 1,
        temperature=_temperature(body),
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        max_tokens=max_tokens,
        stop=stops,
        stream=stream,
        include_usage=bool(opts.get("include_usage", False)),
        tools=_tools(body),
        logprobs=logprobs,
        top_logprobs=top,
        user=user,
        model=str(body.get("model") or ""),
    )
