"""The ASGI app (FastAPI): ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``.

Errors use OpenAI's format (``{"error": {"message", "type", "param", "code"}}``), so the
``openai`` client raises its usual ``BadRequestError`` / ``AuthenticationError`` with the
server's one-line message. With an API key set, every ``/v1`` route needs
``Authorization: Bearer <key>``.

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
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from credo.serve.engine import ChoiceResult, CompletionResult, GenerationEngine
from credo.serve.protocol import ChatRequest, RequestError, parse_chat_request
from credo.serve.recorder import RecordedCall, RecordedChoice, SessionRecorder

__all__ = ["SESSION_HEADER", "STATE_HEADER", "create_app"]

#: Header naming the agent's session.
SESSION_HEADER = "x-credo-session"
#: Header carrying the agent's state key for this turn.
STATE_HEADER = "x-credo-state"
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
}


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
        recorder: SessionRecorder,
        call: RecordedCall | None,
        state: dict[str, bool],
    ) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._recorder, self._call, self._state = recorder, call, state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._state["finished"]:
                self._recorder.mark_undelivered(self._call)
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()


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
    recorder: SessionRecorder,
    *,
    api_key: str | None = None,
    model_name: str = "credo",
    request_timeout_s: float = 600.0,
    max_body_bytes: int = 32 * 2**20,
) -> FastAPI:
    """The app serving ``engine`` and recording into ``recorder``.

    Args:
        engine: a started :class:`~credo.serve.engine.GenerationEngine`.
        recorder: where sessions are recorded.
        api_key: when set, ``/v1`` routes need ``Authorization: Bearer <api_key>``.
        model_name: the id listed by ``/v1/models`` (requests may name any model).
        request_timeout_s: the longest a request waits for its generation (then 504).
        max_body_bytes: larger request bodies are refused with a 413 (default 32 MiB).
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
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError(f"the request body is not valid JSON: {exc}") from None
            req = parse_chat_request(body)
            fut = engine.submit(req)
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
        if session:
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
            if await request.is_disconnected():
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

    return app


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
