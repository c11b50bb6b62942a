"""The ASGI app (FastAPI): ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``.

Errors use OpenAI's format (``{"error": {"message", "type", "param", "code"}}``), so the
``openai`` client raises its usual ``BadRequestError`` / ``AuthenticationError`` with the
server's one-line message. With an API key set, every ``/v1`` route needs
``Authorization: Bearer <key>``.

Without an API key (which only a loopback server may lack), the server answers only
requests that come from this machine's own programs, not from a web page a browser shows
(which could otherwise reach a loopback server: a page of another site posting to it
(CSRF), or a site whose name is made to resolve to 127.0.0.1 (DNS rebinding)): the
``Host`` header must name a loopback address (``localhost``, ``127.0.0.1``, ``[::1]``) or
one of ``allowed_hosts``, an ``Origin`` header (browsers send one with every cross-site
request) must name one too, else 403; and a POST body must be sent as
``application/json``, which a page cannot send to another site without the CORS
permission this server never gives (else 415).

Session ids come from the ``X-Credo-Session`` header, else the ``user`` field; requests
without one are served but not recorded. ``X-Credo-State`` (optional) is the agent's state
key for the turn (see :mod:`credo.serve.recorder`).

Streaming sends ``data: {chunk}`` server-sent events: the role, the content token by token
(sampling happens in batches, so the deltas follow once a choice is sampled), tool calls
in one delta, the finish reason, an optional usage chunk, then ``data: [DONE]``. When the
client goes away before ``[DONE]`` has been written, the call is recorded as not delivered
(a client that hangs up after the server wrote everything cannot be told apart from one
that read it all).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from credo.serve.engine import ChoiceResult, CompletionResult, GenerationEngine
from credo.serve.protocol import ChatRequest, RequestError, decode_body, parse_chat_request
from credo.serve.recorder import RecordedCall, RecordedChoice, SessionRecorder

__all__ = ["SESSION_HEADER", "STATE_HEADER", "create_app"]

#: Header naming the agent's session.
SESSION_HEADER = "x-credo-session"
#: Header carrying the agent's state key for this turn.
STATE_HEADER = "x-credo-state"
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
}
#: Host names that always mean this machine.
LOOPBACK_NAMES = frozenset({"localhost"})


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={
            "error": {
                "message": message,
                "type": _ERROR_TYPES.get(status, "server_error"),
                "param": param,
                "code": None,
            }
        },
    )


class _TrackedStream(StreamingResponse):
    """A streaming response that marks its call undelivered unless the stream ran to its
    end (the client disconnected, or sending failed)."""

    def __init__(
        self,
        content: AsyncIterator[str],
        recorder: SessionRecorder | None,
        call: RecordedCall | None,
        state: dict[str, bool],
    ) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._recorder, self._call, self._state = recorder, call, state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._state["finished"] and self._recorder is not None:
                self._recorder.mark_undelivered(self._call)
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()


def _host_name(value: str) -> str:
    """The host of a ``Host`` header (``127.0.0.1:8000``, ``[::1]:8000``, ``localhost``),
    lower-case, without its port, brackets or trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.rsplit(":", 1)[0]
    return value.rstrip(".")


def _origin_host(origin: str) -> str | None:
    """The host of an ``Origin`` header (``None`` for ``null`` or a malformed one)."""
    try:
        return urlsplit(origin.strip()).hostname
    except ValueError:
        return None


def _is_local(host: str | None, allowed: frozenset[str]) -> bool:
    if not host:
        return False
    if host in LOOPBACK_NAMES or host in allowed:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _SameMachine:
    """ASGI middleware: without an API key, refuse requests a browser page could send
    (module docstring); every POST must carry a JSON body. A refused request never reaches
    the app (nothing is read, generated or recorded)."""

    def __init__(self, app: Any, *, keyed: bool, allowed_hosts: frozenset[str]) -> None:
        self.app, self.keyed, self.allowed = app, keyed, allowed_hosts

    def _refusal(self, scope: dict[str, Any]) -> JSONResponse | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if not self.keyed:
            host = headers.get("host")
            if host is not None and not _is_local(_host_name(host), self.allowed):
                return _error(
                    403,
                    f"Host {host!r} is not this server: without an API key it answers only "
                    "requests to localhost, 127.0.0.1 or [::1] (or to --allow-host names)",
                )
            origin = headers.get("origin")
            if origin is not None and not _is_local(_origin_host(origin), self.allowed):
                return _error(
                    403,
                    f"Origin {origin!r} is another site: without an API key this server "
                    "answers only its own machine's programs, not web pages",
                )
        if scope["method"] == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return _error(
                    415,
                    f"the request body must be sent as Content-Type: application/json, got "
                    f"{media or 'none'!r}",
                )
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) beyond ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(f"the request body is larger than {limit} bytes", status=413)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise RequestError(f"the request body is larger than {limit} bytes", status=413)
        parts.append(part)
    return b"".join(parts)


def _logprobs(ch: ChoiceResult) -> dict[str, Any]:
    content = []
    for i, (text, lp) in enumerate(zip(ch.token_texts, ch.logprobs)):
        entry: dict[str, Any] = {"token": text, "logprob": lp, "bytes": list(text.encode())}
        entry["top_logprobs"] = [
            {"token": t, "logprob": v, "bytes": list(t.encode())}
            for t, v in (ch.top[i] if ch.top else [])
        ]
        content.append(entry)
    return {"content": content, "refusal": None}


def _message(ch: ChoiceResult) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": ch.content, "refusal": None}
    if ch.tool_calls:
        msg["tool_calls"] = ch.tool_calls
    return msg


def _usage(res: CompletionResult) -> dict[str, int]:
    completion = sum(len(c.response_ids) for c in res.choices)
    return {
        "prompt_tokens": len(res.prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(res.prompt_ids) + completion,
    }


def create_app(
    engine: GenerationEngine,
    recorder: SessionRecorder | None,
    *,
    api_key: str | None = None,
    model_name: str = "credo",
    request_timeout_s: float = 600.0,
    max_body_bytes: int = 32 * 2**20,
    allowed_hosts: frozenset[str] | set[str] = frozenset(),
) -> Any:
    """The app serving ``engine`` and recording into ``recorder`` (an ASGI app: FastAPI's,
    behind the same-machine guard of the module docstring).

    Args:
        engine: a started :class:`~credo.serve.engine.GenerationEngine`.
        recorder: where sessions are recorded; ``None``: nothing is recorded.
        api_key: when set, ``/v1`` routes need ``Authorization: Bearer <api_key>``;
            without one, only requests from this machine's programs are answered.
        model_name: the id listed by ``/v1/models`` (requests may name any model).
        request_timeout_s: the longest a request waits for its generation (then 504).
        max_body_bytes: larger request bodies are refused with a 413 (default 32 MiB).
        allowed_hosts: more host names that mean this server (``Host`` and ``Origin``
            checks without an API key), e.g. a name in ``/etc/hosts``.
    """
    app = FastAPI(title="credo policy server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    def _authorised(request: Request) -> JSONResponse | None:
        if api_key is None:
            return None
        got = request.headers.get("authorization", "")
        if not got.startswith("Bearer ") or not hmac.compare_digest(
            got[len("Bearer ") :].encode(), api_key.encode()
        ):
            return _error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")
        return None

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        denied = _authorised(request)
        if denied is not None:
            return denied
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "credo"}],
            }
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        denied = _authorised(request)
        if denied is not None:
            return denied
        try:
            raw = await _read_body(request, max_body_bytes)
            req = parse_chat_request(decode_body(raw))
            fut = engine.submit(req, request.headers.get(SESSION_HEADER) or req.user)
            try:
                res: CompletionResult = await asyncio.wait_for(
                    asyncio.wrap_future(fut), request_timeout_s
                )
            except asyncio.TimeoutError:
                fut.cancel()
                raise RequestError(
                    f"generation did not finish within {request_timeout_s} s", status=504
                ) from None
        except RequestError as exc:
            return _error(exc.status, exc.message, exc.param)
        except Exception as exc:  # the model failed (e.g. out of memory): say so, keep serving
            return _error(500, f"generation failed: {type(exc).__name__}: {exc}")
        session = request.headers.get(SESSION_HEADER) or req.user
        call = None
        if session and recorder is not None:
            call = recorder.record(
                session,
                messages=req.messages,
                prompt_ids=res.prompt_ids,
                choices=[
                    RecordedChoice(
                        response_ids=c.response_ids,
                        logprobs=c.logprobs,
                        text=c.text,
                        content=c.content,
                        tool_calls=c.tool_calls,
                        finish_reason=c.finish_reason,
                        token_data=c.token_data,
                    )
                    for c in res.choices
                ],
                temperature=res.sampling.temperature,
                top_p=res.sampling.top_p,
                state=request.headers.get(STATE_HEADER),
            )
        rid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        model = req.model or model_name
        if not req.stream:
            if await request.is_disconnected() and recorder is not None:
                recorder.mark_undelivered(call)
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": c.index,
                            "message": _message(c),
                            "logprobs": _logprobs(c) if req.logprobs else None,
                            "finish_reason": c.finish_reason,
                        }
                        for c in res.choices
                    ],
                    "usage": _usage(res),
                }
            )
        state = {"finished": False}
        return _TrackedStream(_events(rid, created, model, req, res, state), recorder, call, state)

    allowed = frozenset(_host_name(h) for h in allowed_hosts)
    return _SameMachine(app, keyed=api_key is not None, allowed_hosts=allowed)


async def _events(
    rid: str,
    created: int,
    model: str,
    req: ChatRequest,
    res: CompletionResult,
    state: dict[str, bool],
) -> AsyncIterator[str]:
    def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return "data: " + json.dumps(body) + "\n\n"

    for ch in res.choices:
        yield chunk(
            [
                {
                    "index": ch.index,
                    "delta": {"role": "assistant", "content": ""},
                    "finish_reason": None,
                }
            ]
        )
        for k, piece in enumerate(ch.pieces):
            delta = {"index": ch.index, "delta": {"content": piece}, "finish_reason": None}
            if req.logprobs and k == 0:
                delta["logprobs"] = _logprobs(ch)
            yield chunk([delta])
            await asyncio.sleep(0)
        if ch.tool_calls:
            calls = [{"index": i, **c} for i, c in enumerate(ch.tool_calls)]
            yield chunk(
                [{"index": ch.index, "delta": {"tool_calls": calls}, "finish_reason": None}]
            )
        yield chunk([{"index": ch.index, "delta": {}, "finish_reason": ch.finish_reason}])
    if req.include_usage:
        yield chunk([], _usage(res))
    yield "data: [DONE]\n\n"
    state["finished"] = True
