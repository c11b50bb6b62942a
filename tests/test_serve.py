"""credo.serve: the OpenAI-compatible server, exact token recording and agent rollouts.

Every server test goes through the real ``openai`` client to a real uvicorn server on
127.0.0.1 (ephemeral port, started and stopped by a fixture with bounded waits), serving
the built-in tiny model. The tool-calling tests use a tiny model fine-tuned in the fixture
(a few seconds) until greedy decoding reproduces a three-turn tool conversation exactly,
under a Qwen3-like template that drops the reasoning of earlier assistant turns (so the
conversation is not append-only at the token level).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import urllib.error
import urllib.request

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from credo.data import Episode, Step  # noqa: E402
from credo.policy.tiny import TinyModelConfig, create_tiny_policy  # noqa: E402
from credo.policy.tokenizer import split_words  # noqa: E402
from credo.rollout import episodes_to_forest  # noqa: E402
from credo.serve import (  # noqa: E402
    EngineConfig,
    PolicyServer,
    RecordedCall,
    RecordedChoice,
    SessionRecorder,
    calls_to_steps,
    check_bind,
    parse_agent_result,
    render_prompt,
    run_agent_episodes,
    serve_policy,
    session_to_episode,
)
from credo.serve.app import create_app  # noqa: E402
from credo.serve.engine import GenerationEngine  # noqa: E402
from credo.serve.protocol import RequestError, parse_chat_request  # noqa: E402
from credo.serve.tools import parse_tool_calls  # noqa: E402

TIMEOUT = 30.0  # every client call and server wait is bounded by this
WORDS = [
    "hello",
    "world",
    "user",
    "assistant",
    "system",
    "tool",
    ":",
    "the",
    "a",
    "b",
    "c",
    "is",
    "answer",
    "red",
    "blue",
    "green",
    "one",
    "two",
]
SMALL = TinyModelConfig(
    hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=256
)


def _client(url: str, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=url, api_key=kw.pop("api_key", "unused"), timeout=TIMEOUT, max_retries=0, **kw
    )


def _score(
    policy, prompt: list[int], response: list[int], temperature: float = 1.0
) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The trainer's log-probs of ``response`` after ``prompt`` (HFPolicy.score)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        lp = policy.score(ids, torch.ones_like(ids), temperature=temperature).logprobs
    return lp[0, len(prompt) :]


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    return create_tiny_policy(WORDS, SMALL, seed=3)


@pytest.fixture(scope="module")
def server(policy):  # type: ignore[no-untyped-def]
    srv = PolicyServer(policy, seed=0, start_timeout_s=TIMEOUT, stop_timeout_s=5).start()
    yield srv
    assert srv.stop(), "the server did not stop within its bounded waits"


@pytest.fixture
def client(server):  # type: ignore[no-untyped-def]
    c = _client(server.base_url)
    yield c
    c.close()


# ------------------------------------------------------------------ plain chat
def test_plain_chat_records_exactly_what_the_model_saw(server, client, policy) -> None:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": "hello world"}]
    r = client.chat.completions.create(
        model="anything", messages=messages, max_tokens=8, user="plain"
    )
    assert r.object == "chat.completion" and r.model == "anything" and len(r.choices) == 1
    (call,) = server.recorder.calls("plain")
    expected = render_prompt(policy.tokenizer, messages).ids
    # the fallback template: "user : hello world <eos> assistant :"
    assert policy.tokenizer.convert_ids_to_tokens(expected) == [
        "user",
        ":",
        "hello",
        "world",
        "<eos>",
        "assistant",
        ":",
    ]
    assert call.prompt_ids == expected
    ch = call.choices[0]
    assert r.choices[0].message.content == ch.content == ch.text
    assert r.usage.prompt_tokens == 7 and r.usage.completion_tokens == len(ch.response_ids) <= 8
    eos = policy.tokenizer.eos_token_id
    assert r.choices[0].finish_reason == ("stop" if ch.response_ids[-1] == eos else "length")
    assert len(ch.logprobs) == len(ch.response_ids)


def test_requests_without_a_session_are_served_but_not_recorded(server, client) -> None:  # type: ignore[no-untyped-def]
    before = server.recorder.sessions()
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "a"}], max_tokens=2
    )
    assert len(r.choices) == 1
    assert server.recorder.sessions() == before


def test_greedy_is_deterministic_and_is_the_argmax(client, policy) -> None:  # type: ignore[no-untyped-def]
    msgs = [{"role": "user", "content": "red blue"}]
    a = client.chat.completions.create(
        model="m", messages=msgs, temperature=0, max_tokens=1, logprobs=True
    )
    b = client.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=1)
    assert a.choices[0].message.content == b.choices[0].message.content
    prompt = render_prompt(policy.tokenizer, msgs).ids
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prompt])).logits[0, -1]
    best = int(logits.argmax())
    assert a.choices[0].logprobs.content[0].token == policy.tokenizer.decode([best])
    want = float(torch.log_softmax(logits.float(), -1)[best])
    assert a.choices[0].logprobs.content[0].logprob == pytest.approx(want, abs=1e-5)


def test_streaming_deltas_concatenate_to_the_recorded_reply(server, client) -> None:  # type: ignore[no-untyped-def]
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "blue green"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Credo-Session": "streamed"},
    )
    text, finish, usage, roles = "", None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            roles.append(c.delta.role)
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    (call,) = server.recorder.calls("streamed")
    assert call.delivered
    assert roles[0] == "assistant"
    assert text == call.choices[0].content
    assert finish == call.choices[0].finish_reason
    assert usage.completion_tokens == len(call.choices[0].response_ids)
    assert usage.prompt_tokens == len(call.prompt_ids)


def test_n_choices_share_the_prompt_and_return_their_logprobs(server, client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "one two"}],
        n=4,
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        user="many",
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    (call,) = server.recorder.calls("many")
    assert len(call.choices) == 4
    for c, rec in zip(r.choices, call.choices):
        assert [t.logprob for t in c.logprobs.content] == pytest.approx(rec.logprobs, abs=0)
        for t in c.logprobs.content:
            tops = [x.logprob for x in t.top_logprobs]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True)
            assert t.logprob <= tops[0] + 1e-6


def test_max_tokens_and_stop_strings(server, client, policy) -> None:  # type: ignore[no-untyped-def]
    msgs = [{"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=1, user="cap")
    (call,) = server.recorder.calls("cap")
    assert len(call.choices[0].response_ids) == 1
    eos = policy.tokenizer.eos_token_id
    assert r.choices[0].finish_reason == (
        "stop" if call.choices[0].response_ids == [eos] else "length"
    )
    # greedy text, then the same request stopped at its third word
    full = client.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=10)
    words = full.choices[0].message.content.split()
    assert len(words) >= 4, "the seed-3 model's greedy reply should have ≥ 4 words"
    stop = words[2]
    cut = client.chat.completions.create(
        model="m", messages=msgs, temperature=0, max_tokens=10, stop=[stop], user="stopped"
    )
    first = words.index(stop)  # the stop string's first occurrence
    assert cut.choices[0].message.content == " ".join(words[:first])
    assert cut.choices[0].finish_reason == "stop"
    (rec,) = server.recorder.calls("stopped")
    kept = rec.choices[0].response_ids
    # the kept tokens end with the token that completed the stop string
    assert policy.tokenizer.decode(kept) == " ".join(words[: first + 1])
    assert len(rec.choices[0].logprobs) == len(kept)


# ------------------------------------------------- recorded log-probs == trainer
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_the_trainers_scoring(policy, temperature: float) -> None:  # type: ignore[no-untyped-def]
    """Concurrent requests of different prompt lengths share left-padded batches; the
    trainer's HFPolicy.score of the recorded ids reproduces the sampling log-probs."""
    prompts = ["hello", "red blue green one two", "a b c", "the answer is two"]
    with serve_policy(policy, seed=1, engine=EngineConfig(batch_wait_s=0.05)) as (url, rec):

        async def ask(i: int, text: str) -> None:
            async with openai.AsyncOpenAI(
                base_url=url, api_key="x", timeout=TIMEOUT, max_retries=0
            ) as c:
                await c.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": text}],
                    n=2,
                    max_tokens=10,
                    temperature=temperature,
                    user=f"lp-{i}",
                )

        async def main() -> None:
            await asyncio.gather(*(ask(i, p) for i, p in enumerate(prompts)))

        asyncio.run(main())
        calls = [c for i in range(len(prompts)) for c in rec.calls(f"lp-{i}")]
    assert len(calls) == 4
    worst = 0.0
    for call in calls:
        assert call.temperature == temperature
        for ch in call.choices:
            got = _score(policy, call.prompt_ids, ch.response_ids, temperature)
            worst = max(worst, float((got - torch.tensor(ch.logprobs)).abs().max()))
    assert worst < 1e-4, f"trainer vs sampler log-prob difference {worst}"


def test_forced_temperature_overrides_the_request(policy) -> None:  # type: ignore[no-untyped-def]
    with serve_policy(policy, engine=EngineConfig(temperature=1.0)) as (url, rec):
        c = _client(url)
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "a"}],
            temperature=0.2,
            top_p=0.5,
            user="forced",
        )
        c.close()
        (call,) = rec.calls("forced")
    assert (call.temperature, call.top_p) == (1.0, 1.0)


# ------------------------------------------------------------ concurrency
def test_concurrent_multi_turn_sessions_are_kept_apart(server) -> None:  # type: ignore[no-untyped-def]
    sessions = [f"conc-{i}" for i in range(8)]
    batches_before = server.engine.batches

    async def converse(sid: str, c: openai.AsyncOpenAI) -> list[str]:
        msgs = [{"role": "user", "content": f"hello {sid[-1]}"}]
        replies = []
        for turn in range(3):
            r = await c.chat.completions.create(
                model="m", messages=msgs, max_tokens=5, extra_headers={"X-Credo-Session": sid}
            )
            reply = r.choices[0].message.content
            replies.append(reply)
            msgs = [
                *msgs,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"turn {turn}"},
            ]
        return replies

    async def main() -> list[list[str]]:
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="x", timeout=TIMEOUT, max_retries=0
        ) as c:
            return await asyncio.gather(*(converse(s, c) for s in sessions))

    replies = asyncio.run(main())
    for sid, rs in zip(sessions, replies):
        calls = server.recorder.calls(sid)
        assert [c.choices[0].content for c in calls] == rs
        assert [len(c.messages) for c in calls] == [1, 3, 5]
        assert calls[0].messages[0]["content"] == f"hello {sid[-1]}"
        for a, b in itertools.pairwise(calls):
            assert b.messages[len(a.messages)]["content"] == a.choices[0].content
    # 24 requests, 8 at a time: the engine batched them into far fewer generate calls
    assert server.engine.batches - batches_before < 24


def test_an_idle_connection_outlives_the_clients_keepalive(server) -> None:  # type: ignore[no-untyped-def]
    """The openai client (httpx) reuses a connection idle for up to 5 s; a server that
    also closes it at 5 s races the client's next request, which then fails as
    "Connection error" (seen: 4 of 500 agent episodes of a loaded evaluation). The
    server keeps an idle connection longer than any client's default expiry."""
    import http.client
    import time

    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
    try:
        for i in range(2):
            if i:
                time.sleep(5.5)  # idle past httpx's and uvicorn's default 5 s, on one socket
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["data"]
    finally:
        conn.close()


# ----------------------------------------------------------- bad requests
def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, r"messages\[0\]\.role must be one of"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n must be an integer ≥ 1"),
        (
            {"messages": [{"role": "user", "content": "x"}], "temperature": 3},
            r"temperature must be a number in \[0.0, 2.0\]",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 0.5},
            "frequency_penalty=0.5 is not supported",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]},
            "stop takes at most 4",
        ),
        (
            {"messages": [{"role": "user", "content": "x " * 300}]},
            "the model's context is 256 tokens",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            r"tools\[0\] must be",
        ),
    ],
)
def test_malformed_requests_get_a_clear_400_and_the_server_keeps_serving(
    client, kwargs, match
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError, match=match) as err:
        client.chat.completions.create(model="m", **kwargs)
    assert err.value.status_code == 400
    ok = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=2
    )
    assert ok.choices[0].message.role == "assistant"


def test_invalid_json_and_unknown_routes(server) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(server.base_url, b"{not json")
    assert status == 400 and body["error"]["message"].startswith(
        "the request body is not valid JSON"
    )
    status, body = _post(server.base_url, b"[1, 2]")
    assert status == 400 and body["error"]["message"] == "the request body must be a JSON object"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.base_url + "/nothing", timeout=TIMEOUT)
    assert err.value.code == 404
    status, _ = _post(
        server.base_url,
        json.dumps({"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}).encode(),
    )
    assert status == 200


def test_oversized_bodies_are_refused_with_413(policy) -> None:  # type: ignore[no-untyped-def]
    with serve_policy(policy, max_body_bytes=1000, stop_timeout_s=5) as (url, _):
        big = json.dumps({"messages": [{"role": "user", "content": "a " * 1000}]}).encode()
        status, body = _post(url, big)
        assert status == 413
        assert body["error"]["message"] == "the request body is larger than 1000 bytes"
        small = json.dumps({"messages": [{"role": "user", "content": "a"}], "max_tokens": 1})
        assert _post(url, small.encode())[0] == 200


def test_engine_waits_until_idle(policy) -> None:  # type: ignore[no-untyped-def]
    engine = GenerationEngine(policy, EngineConfig())
    engine.start()
    try:
        req = parse_chat_request(
            {"messages": [{"role": "user", "content": "a"}], "max_tokens": 8, "n": 8}
        )
        futures = [engine.submit(req) for _ in range(4)]
        assert engine.wait_idle(TIMEOUT)
        assert all(f.done() for f in futures)
        assert sum(len(f.result().choices) for f in futures) == 32
    finally:
        assert engine.stop(5)


# --------------------------------------------------------- disconnects
def test_client_disconnecting_mid_stream_does_not_disturb_the_server(server, client) -> None:  # type: ignore[no-untyped-def]
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=64,
        n=8,
        stream=True,
        user="gone",
    )
    next(iter(stream))  # the first chunk arrives...
    stream.close()  # ...and the client hangs up
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=3, user="gone"
    )
    calls = server.recorder.calls("gone")
    assert len(calls) == 2 and calls[1].delivered
    steps = calls_to_steps(calls)
    # a call whose stream was cut is never a step; the completed one always is
    assert len(steps) == (2 if calls[0].delivered else 1)
    assert steps[-1].response_ids == calls[1].choices[0].response_ids
    assert r.choices[0].message.content == calls[1].choices[0].content


def test_a_stream_cut_by_the_client_is_recorded_as_undelivered(policy) -> None:  # type: ignore[no-untyped-def]
    """Deterministic version at the ASGI level: the client disconnects after two chunks."""
    engine = GenerationEngine(policy, EngineConfig())
    engine.start()
    recorder = SessionRecorder()
    app = create_app(engine, recorder)
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "hello"}],
            "stream": True,
            "max_tokens": 40,
            "n": 4,
            "user": "cut",
        }
    ).encode()
    sent: list[dict] = []

    async def main() -> None:
        two = asyncio.Event()
        first = True

        async def receive() -> dict:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.wait_for(two.wait(), TIMEOUT)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if sum(m["type"] == "http.response.body" for m in sent) >= 2:
                two.set()
            await asyncio.sleep(0)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "root_path": "",
            "scheme": "http",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2),
            "http_version": "1.1",
        }
        await asyncio.wait_for(app(scope, receive, send), TIMEOUT)

    try:
        asyncio.run(main())
    finally:
        assert engine.stop(5)
    chunks = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert b"[DONE]" not in chunks
    (call,) = recorder.calls("cut")
    assert not call.delivered
    assert calls_to_steps([call]) == []


# ------------------------------------------------------------------- tools
TOOL_TEMPLATE = (
    "{% if tools %}<tools> {% for t in tools %}{{ t.function.name }} {% endfor %}</tools> {% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<assistant> "
    "{% set c = m.content or '' %}"
    # like Qwen3: the reasoning of earlier turns is not shown again
    "{% if not loop.last and '</think>' in c %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{% if c.strip() %}{{ c.strip() }} {% endif %}"
    "{% for t in m.tool_calls or [] %}<tool_call> "
    "{{ {'name': t.function.name, 'arguments': t.function.arguments} | tojson }} </tool_call> {% endfor %}"
    "{{ eos_token }} "
    "{% else %}<{{ m.role }}> {{ m.content }} {{ eos_token }} {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a + b",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]
QUESTION = "what is 2 plus 3 plus 4"
#: The conversation the tool model is taught: (reasoning, call) twice, then the answer.
TURNS = [
    ("<think> first 2 plus 3 </think>", {"a": 2, "b": 3}),
    ("<think> then 5 plus 4 </think>", {"a": 5, "b": 4}),
    ("the answer is 9", None),
]


def _reply_text(content: str, args: dict | None) -> str:
    if args is None:
        return content
    return f"{content} <tool_call> {json.dumps({'name': 'add', 'arguments': args})} </tool_call>"


def _tool_conversations() -> list[list[dict]]:
    msgs: list[dict] = [{"role": "user", "content": QUESTION}]
    out = [list(msgs)]
    for k, (content, args) in enumerate(TURNS[:-1]):
        cid = f"c{k}"
        call = {
            "id": cid,
            "type": "function",
            "function": {"name": "add", "arguments": json.dumps(args)},
        }
        msgs = [*msgs, {"role": "assistant", "content": content, "tool_calls": [call]}]
        msgs.append({"role": "tool", "tool_call_id": cid, "content": str(args["a"] + args["b"])})
        out.append(list(msgs))
    return out


@pytest.fixture(scope="module")
def tool_policy():  # type: ignore[no-untyped-def]
    """A tiny model taught (teacher forcing, Adam) to hold the conversation of TURNS."""
    words = set(split_words(TOOL_TEMPLATE + " add " + QUESTION))
    for content, args in TURNS:
        words.update(split_words(_reply_text(content, args)))
    words.update(["<tools>", "</tools>", "<assistant>", "<user>", "<tool>"])
    cfg = TinyModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=128,
        max_position_embeddings=256,
    )
    pol = create_tiny_policy(sorted(words), cfg, seed=0)
    tok = pol.tokenizer
    tok.chat_template = TOOL_TEMPLATE
    examples = []
    for msgs, (content, args) in zip(_tool_conversations(), TURNS):
        prompt = render_prompt(tok, msgs, TOOLS).ids
        response = [
            *tok.encode(_reply_text(content, args), add_special_tokens=False),
            tok.eos_token_id,
        ]
        assert tok.unk_token_id not in prompt + response
        examples.append((prompt, response))
    width = max(len(p) + len(r) for p, r in examples)
    ids = torch.zeros(len(examples), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    target = torch.full_like(ids, -100)
    for i, (p, r) in enumerate(examples):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        mask[i, : len(p) + len(r)] = 1
        target[i, len(p) : len(p) + len(r)] = torch.tensor(r)
    opt = torch.optim.Adam(pol.model.parameters(), lr=3e-3)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for _ in range(400):
            logits = pol.model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            keep = target[:, 1:] != -100
            if bool((logits.argmax(-1)[keep] == target[:, 1:][keep]).all()):
                break
    assert bool((logits.argmax(-1)[keep] == target[:, 1:][keep]).all()), (
        "the tool model did not learn"
    )
    pol.model.eval()
    return pol


def _add(arguments: str) -> str:
    args = json.loads(arguments)
    return str(args["a"] + args["b"])


@pytest.fixture(scope="module")
def tool_session(tool_policy):  # type: ignore[no-untyped-def]
    """The tool-calling loop, run once with the openai client; records what generate saw."""
    seen: list[list[int]] = []
    original = tool_policy.generate

    def spy(prompts, sampling, generator=None):  # type: ignore[no-untyped-def]
        seen.extend(list(p) for p in prompts)
        return original(prompts, sampling, generator)

    tool_policy.generate = spy
    try:
        with serve_policy(tool_policy, stop_timeout_s=5) as (url, rec):
            c = _client(url)
            msgs: list[dict] = [{"role": "user", "content": QUESTION}]
            replies = []
            for _ in range(5):
                r = c.chat.completions.create(
                    model="m",
                    messages=msgs,
                    tools=TOOLS,
                    temperature=0,
                    extra_headers={"X-Credo-Session": "tools"},
                )
                m = r.choices[0].message
                replies.append(r.choices[0])
                if not m.tool_calls:
                    break
                msgs.append(
                    m.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
                )
                for call in m.tool_calls:
                    msgs.append(
                        {
                            "role": "tool",
                            "tool_call_id": call.id,
                            "content": _add(call.function.arguments),
                        }
                    )
            stream = c.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": QUESTION}],
                tools=TOOLS,
                temperature=0,
                stream=True,
            )
            streamed = list(stream)
            c.close()
            calls = rec.calls("tools")
    finally:
        del tool_policy.generate
    return {"replies": replies, "calls": calls, "seen": seen, "streamed": streamed}


def test_tool_calling_loop_over_three_turns(tool_session) -> None:  # type: ignore[no-untyped-def]
    replies = tool_session["replies"]
    assert [r.finish_reason for r in replies] == ["tool_calls", "tool_calls", "stop"]
    for r, (content, args) in zip(replies[:2], TURNS):
        (call,) = r.message.tool_calls
        assert call.type == "function" and call.function.name == "add"
        assert json.loads(call.function.arguments) == args
        assert r.message.content == content
    assert replies[2].message.content == "the answer is 9" and replies[2].message.tool_calls is None


def test_streamed_tool_call(tool_session) -> None:  # type: ignore[no-untyped-def]
    calls = [
        tc
        for ch in tool_session["streamed"]
        for c in ch.choices
        for tc in (c.delta.tool_calls or [])
    ]
    assert len(calls) == 1 and calls[0].function.name == "add"
    assert json.loads(calls[0].function.arguments) == {"a": 2, "b": 3}
    finish = [
        c.finish_reason for ch in tool_session["streamed"] for c in ch.choices if c.finish_reason
    ]
    assert finish == ["tool_calls"]


def test_template_that_is_not_append_only_keeps_the_ids_the_model_saw(
    tool_session, tool_policy
) -> None:  # type: ignore[no-untyped-def]
    calls, seen = tool_session["calls"], tool_session["seen"]
    assert len(calls) == 3
    assert [c.prompt_ids for c in calls] == seen[:3]  # recorded == given to generate
    tok = tool_policy.tokenizer
    think = tok.convert_tokens_to_ids("<think>")
    steps = calls_to_steps(calls, reward=1.0)
    assert [s.info["append_only"] for s in steps] == [True, False, False]
    for a, b in itertools.pairwise(steps):
        assert think in a.response_ids  # the model reasoned...
        assert b.prompt_ids[: len(a.prompt_ids)] == a.prompt_ids  # (the earlier prompt is kept)
        assert (
            b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] != a.prompt_ids + a.response_ids
        )
    assert all(think not in s.prompt_ids for s in steps)  # ...but never sees it again
    # re-rendering the final conversation would give the last prompt, not the first ones
    assert steps[2].prompt_ids == render_prompt(tok, calls[2].messages, TOOLS).ids


def test_session_becomes_forest_rows_the_trainer_scores_exactly(tool_session, tool_policy) -> None:  # type: ignore[no-untyped-def]
    calls = tool_session["calls"]
    episode = session_to_episode(calls, reward=1.0, success=True, group=5, task_id="sum")
    forest = episodes_to_forest([episode])
    assert forest.parent.tolist() == [-1, 0, 1]
    assert forest.group.tolist() == [5, 5, 5]
    assert forest.reward.tolist() == [0.0, 0.0, 1.0]
    assert forest.terminal.tolist() == [False, False, True]
    assert forest.success.tolist() == [False, False, True]
    for i, call in enumerate(calls):
        assert forest.prompt_ids[i].tolist() == call.prompt_ids
        assert forest.response_ids[i].tolist() == call.choices[0].response_ids
        assert forest.old_logprobs[i].tolist() == pytest.approx(call.choices[0].logprobs, abs=0)
    # the trainer's path: token batch, then HFPolicy.score on it
    batch = forest.to_batch(torch.zeros(3), pad_id=tool_policy.pad_id)
    with torch.no_grad():
        lp = tool_policy.score(batch.input_ids, batch.attention_mask, temperature=1.0).logprobs
    diff = (lp - batch.old_logprobs)[batch.response_mask].abs().max()
    assert float(diff) < 1e-4


def test_text_tool_format_for_templates_without_tools(policy) -> None:  # type: ignore[no-untyped-def]
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "x1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "x1", "content": "3"},
    ]
    text = render_prompt(
        policy.tokenizer, parse_chat_request({"messages": msgs, "tools": TOOLS}).messages, TOOLS
    ).text
    assert text.startswith('system : be brief\n\nYou can call these tools: [{"name": "add"')
    assert (
        'assistant : <tool_call> {"name": "add", "arguments": {"a": 1, "b": 2}} </tool_call> <eos>'
        in text
    )
    assert "user : <tool_response> add : 3 </tool_response> <eos> assistant :" in text


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', None, [("f", '{"x": 1}')]),
        (
            'ok <tool_call> {"name" : "f" , "arguments" : {}} </tool_call> then',
            "ok  then",
            [("f", "{}")],
        ),
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}', None, [("f", '{"x": 1}')]),  # cut off
        ('{"name": "g", "parameters": {"y": "z"}}', None, [("g", '{"y": "z"}')]),  # Llama 3.1
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
        ('{"no": "name"}', '{"no": "name"}', []),
        ("plain words", "plain words", []),
    ],
)
def test_parse_tool_calls(text: str, content: str | None, calls: list) -> None:
    assert parse_tool_calls(text) == (content, calls)


# -------------------------------------------------------- steps from calls
def _call(
    seq: int, messages: list[dict], prompt: list[int], replies: list[str], state: str | None = None
) -> RecordedCall:
    return RecordedCall(
        session_id="s",
        seq=seq,
        messages=messages,
        prompt_ids=prompt,
        choices=[
            RecordedChoice([10 + i, 3], [-0.5, -0.25], r, r, [], "stop")
            for i, r in enumerate(replies)
        ],
        temperature=1.0,
        top_p=1.0,
        state=state,
    )


def test_steps_follow_the_choice_the_agent_continued_with() -> None:
    u = {"role": "user", "content": "q"}
    first = _call(0, [u], [1, 2], ["a", "b", "c"])
    second = _call(
        1,
        [u, {"role": "assistant", "content": "b"}, {"role": "user", "content": "more"}],
        [1, 2, 11, 3, 4],
        ["d"],
        state="S1",
    )
    steps = calls_to_steps([second, first], reward=2.0)  # order comes from seq, not the list
    assert [s.info["choice"] for s in steps] == [1, 0]
    assert steps[0].response_ids == [11, 3] and steps[0].action == "b"
    assert [s.reward for s in steps] == [0.0, 2.0] and [s.terminal for s in steps] == [False, True]
    assert steps[0].observation == "user: q" and steps[1].observation == "user: more"
    assert (steps[0].state, steps[0].next_state, steps[1].state, steps[1].next_state) == (
        "user: q",
        "S1",
        "S1",
        "<end>",
    )
    assert [s.info["append_only"] for s in steps] == [True, True]


def test_the_last_steps_choice_is_the_one_the_agent_names_else_marked_unknown() -> None:
    """With n > 1 no later request shows which choice of the last request the agent
    used: it is the ``choice`` the agent returned, else choice 0 marked unknown (never
    silently choice 0). A history trimmed between turns still shows the choice used."""
    u = {"role": "user", "content": "q"}
    last = _call(0, [u], [1, 2], ["a", "b"])
    named = session_to_episode([last], reward=1.0, success=True, last_choice=1)
    assert named.steps[0].response_ids == [11, 3] and named.steps[0].action == "b"
    assert named.steps[0].info["choice"] == 1 and named.steps[0].info["choice_known"]
    (unnamed,) = calls_to_steps([last], reward=1.0)
    assert unnamed.info["choice"] == 0 and unnamed.info["choice_known"] is False
    same = _call(0, [u], [1, 2], ["a", "a"])  # equal replies: either is what the agent got
    assert calls_to_steps([same])[0].info["choice_known"]
    # an agent keeping only its last reply: the next request does not extend this one
    history = [u, {"role": "assistant", "content": "b"}, {"role": "user", "content": "r"}]
    mid = _call(0, history, [1, 2, 11, 3, 4], ["b", "c"])
    trimmed = [{"role": "assistant", "content": "c"}, {"role": "user", "content": "s"}]
    steps = calls_to_steps([mid, _call(1, trimmed, [12, 3, 5], ["d"])])
    assert steps[0].info["choice"] == 1 and steps[0].info["choice_known"]
    assert steps[0].info["append_only"] and not steps[1].info["append_only"]
    # the appended reply repeats an earlier one: still the choice used
    again = _call(1, [*history, {"role": "assistant", "content": "b"}], [1], ["d"])
    assert [s.info["choice"] for s in calls_to_steps([mid, again])] == [0, 0]
    assert calls_to_steps([mid, again])[0].info["choice_known"]


def test_a_session_without_a_model_reply_is_a_failed_episode() -> None:
    """An agent that returns without calling the model did nothing the policy can be
    credited with: a failure (not a success with return 0), the reward it returned kept
    in the error."""
    ep = session_to_episode([], reward=0.75, success=True, task_id="t")
    assert ep.steps == [] and ep.success is False
    assert ep.error == (
        "the agent never called the model: nothing the policy did to learn from, counted as "
        "failed (the agent returned reward 0.75, success True)"
    )
    cut = _call(0, [{"role": "user", "content": "q"}], [1], ["a"])
    cut.delivered = False
    ep = session_to_episode([cut], reward=0.0)
    assert ep.error is not None and ep.error.startswith("no reply of the model reached")
    raised = session_to_episode([], error="agent: ValueError: boom")
    assert raised.error == "agent: ValueError: boom"  # the agent's own error stays


def test_recorder_closes_popped_sessions_and_bounds_its_size() -> None:
    rec = SessionRecorder(max_sessions=2)
    kw = {"messages": [], "prompt_ids": [1], "choices": [], "temperature": 1.0, "top_p": 1.0}
    for s in ("a", "b", "c"):
        rec.record(s, **kw)
    assert rec.sessions() == ["b", "c"]
    assert len(rec.pop("b")) == 1
    assert rec.record("b", **kw) is None and rec.calls("b") == []  # a late reply is dropped
    assert [c.seq for c in rec.calls("c")] == [2]


# -------------------------------------------------------------- agents
class _Task:
    def __init__(self, id: str, question: str) -> None:
        self.id, self.question = id, question


async def _agent(task: _Task, client, session_id: str):  # type: ignore[no-untyped-def]
    g = int(session_id.rsplit("-", 1)[1])
    msgs = [{"role": "user", "content": task.question}]
    r = await client.chat.completions.create(model="m", messages=msgs, max_tokens=4)
    if task.id == "t0" and g == 1:
        raise ValueError("boom")
    if task.id == "t1" and g == 2:
        await asyncio.sleep(30)  # longer than the timeout
    if task.id == "t1" and g == 0:
        return "not a reward"
    msgs += [
        {"role": "assistant", "content": r.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    await client.chat.completions.create(model="m", messages=msgs, max_tokens=4)
    return {"reward": 1.0, "success": True} if g == 0 else 0.5


@pytest.mark.slow
def test_run_agent_episodes_fails_only_the_bad_episodes(policy) -> None:  # type: ignore[no-untyped-def]
    tasks = [_Task("t0", "hello"), _Task("t1", "red blue")]
    res = run_agent_episodes(policy, _agent, tasks, group_size=3, timeout_s=2.0, stop_timeout_s=5)
    eps = res.episodes
    assert [e.group for e in eps] == [0, 0, 0, 1, 1, 1]
    assert [e.task_id for e in eps] == ["t0"] * 3 + ["t1"] * 3
    assert [e.error for e in eps] == [
        None,
        "agent: ValueError: boom",
        None,
        "agent: ValueError: the agent returned 'not a reward'; it must return a finite number "
        "(the reward) or {'reward': number, 'success': bool}",
        None,
        "agent: timed out after 2.0 s",
    ]
    assert [len(e.steps) for e in eps] == [2, 1, 2, 1, 2, 1]
    assert [e.ret for e in eps] == [1.0, 0.0, 0.5, 0.0, 0.5, 0.0]
    assert [e.success for e in eps] == [True, False, True, False, True, False]
    assert res.forest.num_rows == res.env_steps == 9
    assert res.forest.group.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert res.generated_tokens == sum(len(s.response_ids) for e in eps for s in e.steps)
    assert res.stats["rollout/agent_errors"] == 3 and res.stats["rollout/agent_timeouts"] == 1
    assert res.stats["rollout/requests"] == 9
    assert len(res.trajectories) == 6
    for e in eps:  # recorded, not re-tokenised: the trainer scores what was sampled
        for s in e.steps:
            assert (
                float(
                    (_score(policy, s.prompt_ids, s.response_ids) - torch.tensor(s.logprobs))
                    .abs()
                    .max()
                )
                < 1e-4
            )


async def _chatty_agent(task: str, client, session_id: str) -> float:  # type: ignore[no-untyped-def]
    msgs = [{"role": "user", "content": task}]
    for _ in range(2):
        r = await client.chat.completions.create(
            model="m", messages=msgs, temperature=0.3, max_tokens=50
        )
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "more"},
        ]
    return 1.0


def test_trainer_style_server_records_what_the_objectives_need(policy) -> None:  # type: ignore[no-untyped-def]
    """A long-lived server sampling as the trainer says (temperature, cap, KLPO's draws),
    called from inside a running event loop; the forest carries the token extras and the
    trainer's scoring reproduces every recorded log-prob, auxiliary draws included."""
    from credo.policy.base import SamplingParams

    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, aux_samples=2, topk_logprobs=3)
    with PolicyServer(policy, engine=EngineConfig.from_sampling(sampling), stop_timeout_s=5) as srv:

        async def inside_a_loop():  # type: ignore[no-untyped-def]
            return run_agent_episodes(
                policy,
                _chatty_agent,
                ["hello", "red blue"],
                group_size=2,
                timeout_s=TIMEOUT,
                server=srv,
                generator=torch.Generator().manual_seed(7),
            )

        res = asyncio.run(inside_a_loop())
    assert res.forest.num_rows == 8 and not any(e.error for e in res.episodes)
    assert res.forest.group.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    steps = [s for e in res.episodes for s in e.steps]
    assert all(s.info["temperature"] == 1.0 and len(s.response_ids) <= 6 for s in steps)
    assert sorted(res.forest.token_extras) == [
        "aux_ids",
        "aux_old_logprobs",
        "topk_ids",
        "topk_old_logprobs",
    ]
    for s in steps:
        n = len(s.response_ids)
        assert s.token_data["aux_ids"].shape == (n, 2) and s.token_data["topk_ids"].shape == (n, 3)
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        aux = torch.zeros(1, ids.shape[1], 2, dtype=torch.long)
        aux[0, len(s.prompt_ids) :] = s.token_data["aux_ids"]
        with torch.no_grad():
            out = policy.score(ids, torch.ones_like(ids), temperature=1.0, extra_ids=aux)
        got = out.extra_logprobs[0, len(s.prompt_ids) :]
        assert float((got - s.token_data["aux_old_logprobs"]).abs().max()) < 1e-4
        assert (
            float((out.logprobs[0, len(s.prompt_ids) :] - torch.tensor(s.logprobs)).abs().max())
            < 1e-4
        )
    batch = res.forest.to_batch(torch.zeros(8))
    assert batch.token_extras["aux_ids"].shape[-1] == 2


def test_agent_sampler_for_the_trainer(policy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from credo.policy.base import SamplingParams
    from credo.serve import AgentSampler

    f = tmp_path / "agent_mod.py"
    f.write_text(
        "async def run(task, client, session_id):\n"
        "    r = await client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': task}])\n"
        "    return 1.0 if r.choices[0].message.content else 0.0\n"
    )
    with AgentSampler(
        f"{f}:run", policy, SamplingParams(max_new_tokens=4), timeout_s=TIMEOUT, stop_timeout_s=5
    ) as s:
        first = s.sample(["hello", "red"], 2, generator=torch.Generator().manual_seed(0))
        s.weights_updated()
        second = s.sample(["blue"], 3)
    assert [e.group for e in first.episodes] == [0, 0, 1, 1] and len(second.episodes) == 3
    assert all(len(st.response_ids) <= 4 for e in first.episodes for st in e.steps)
    assert {st.info["weights_version"] for e in first.episodes for st in e.steps} == {0}
    assert {st.info["weights_version"] for e in second.episodes for st in e.steps} == {1}


def test_load_agent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from credo.serve import load_agent

    f = tmp_path / "my_agent.py"
    f.write_text(
        "async def run(task, client, session_id):\n    return 1.0\n\ndef sync(t, c, s):\n    return 0\n"
    )
    fn = load_agent(f"{f}:run")
    assert asyncio.run(fn(None, None, "s")) == 1.0
    assert load_agent(f"{f}:sync")(None, None, "s") == 0  # a plain def runs in a thread
    assert load_agent("credo.serve.agents:_run_all") is not None  # a module:function spec
    for spec, match in [
        ("no_colon", "expected 'package.module:function'"),
        (f"{tmp_path}/missing.py:run", "no such file"),
        ("credo_no_such_module:run", "cannot import"),
        (f"{f}:nothing", "has no attribute 'nothing'"),
        ("credo.serve.agents:RESULT_KEYS", r"RESULT_KEYS \(of type tuple\) is not a function"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_agent(spec)


def test_load_agent_finds_modules_in_the_working_folder_and_beside_a_file(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """As ``--env`` does: ``module:fn`` is found from the working folder, and a file agent
    imports the modules beside it."""
    import sys

    from credo.serve import load_agent

    monkeypatch.setattr(sys, "path", list(sys.path))  # the folders added are undone
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    (tmp_path / "credo_test_cwd_agent.py").write_text(
        "def run(task, client, session_id):\n    return 2.0\n"
    )
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "credo_test_sibling.py").write_text("REWARD = 3.0\n")
    (sub / "credo_test_file_agent.py").write_text(
        "from credo_test_sibling import REWARD\n\n"
        "def run(task, client, session_id):\n    return REWARD\n"
    )
    monkeypatch.chdir(tmp_path)
    assert load_agent("credo_test_cwd_agent:run")(None, None, "s") == 2.0
    assert load_agent("sub/credo_test_file_agent.py:run")(None, None, "s") == 3.0
    with pytest.raises(ValueError, match=r"importing 'sub/broken\.py' failed: NameError"):
        (sub / "broken.py").write_text("nope\n")
        load_agent("sub/broken.py:run")


def _sync_agent(barrier: threading.Barrier):  # type: ignore[no-untyped-def]
    """A plain ``def`` agent that blocks until all its peers are running at once."""

    def agent(task: str, client, session_id: str) -> dict:  # type: ignore[no-untyped-def]
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task}], max_tokens=2
        )
        barrier.wait()  # blocking: on a shared event loop the others could never arrive
        return {"reward": 1.0 if r.choices[0].message.content is not None else 0.0}

    return agent


def test_sync_agents_run_in_threads_of_their_own(server) -> None:  # type: ignore[no-untyped-def]
    """Four plain ``def`` agents that block until all four are in the same place at once:
    they finish only if each runs in a thread of its own (the barrier breaks after 20 s
    otherwise), with a synchronous client that sends its session header."""
    barrier = threading.Barrier(4, timeout=20)
    res = run_agent_episodes(
        None,
        _sync_agent(barrier),
        ["hello", "red blue"],
        group_size=2,
        timeout_s=TIMEOUT,
        server=server,
    )
    assert [e.error for e in res.episodes] == [None] * 4
    assert [len(e.steps) for e in res.episodes] == [1, 1, 1, 1]
    assert [e.ret for e in res.episodes] == [1.0] * 4 and not barrier.broken
    assert res.stats["rollout/agent_errors"] == 0 and res.stats["rollout/requests"] == 4


def _counting_agent(live: list[int], peak: list[int]):  # type: ignore[no-untyped-def]
    """An async agent that counts the agents running at once (``peak[0]``: the most)."""

    async def agent(task: str, client, session_id: str) -> float:  # type: ignore[no-untyped-def]
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        try:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": task}], max_tokens=2
            )
        finally:
            live[0] -= 1
        return 1.0

    return agent


@pytest.mark.parametrize(("max_concurrency", "peak"), [(None, 2), (6, 6)])
def test_by_default_as_many_agents_run_as_the_engine_batches(  # type: ignore[no-untyped-def]
    policy, max_concurrency: int | None, peak: int
) -> None:
    """Unbounded, every episode's request queues at once and the timeout measures the
    queue (a 135M model on a CPU: 428 of 500 held-out episodes timed out): by default
    as many agents run as the engine batches (``max_batch``); more when asked."""
    live, most = [0], [0]
    with PolicyServer(policy, engine=EngineConfig(max_batch=2), stop_timeout_s=5) as srv:
        res = run_agent_episodes(
            None,
            _counting_agent(live, most),
            ["hello", "red blue", "blue"],
            group_size=2,
            timeout_s=TIMEOUT,
            max_concurrency=max_concurrency,
            server=srv,
        )
    assert [e.error for e in res.episodes] == [None] * 6
    assert most[0] == peak


async def _two_choice_agent(task: str, client, session_id: str) -> dict:  # type: ignore[no-untyped-def]
    """Asks for 4 choices and goes on with the last one that differs from choice 0; names
    it in its result when the task says so."""
    msgs = [{"role": "user", "content": task}]
    r = await client.chat.completions.create(model="m", messages=msgs, n=4, max_tokens=4)
    texts = [c.message.content for c in r.choices]
    used = max((i for i, t in enumerate(texts) if t != texts[0]), default=0)
    _two_choice_agent.used[session_id] = (used, texts[used])  # type: ignore[attr-defined]
    return {"reward": 1.0, "choice": used} if task == "name it" else {"reward": 1.0}


def test_the_recorded_last_step_is_the_choice_the_agent_used(server) -> None:  # type: ignore[no-untyped-def]
    _two_choice_agent.used = {}  # type: ignore[attr-defined]
    res = run_agent_episodes(
        None,
        _two_choice_agent,
        ["name it", "keep quiet"],
        group_size=1,
        timeout_s=TIMEOUT,
        server=server,
        generator=torch.Generator().manual_seed(1),
    )
    named, quiet = res.episodes
    assert named.error is None and quiet.error is None
    used = _two_choice_agent.used  # type: ignore[attr-defined]
    (n_used, n_text), (q_used, _) = (used[e.steps[0].info["session"]] for e in res.episodes)
    assert n_used > 0 and q_used > 0  # the seeded draws have choices that differ
    assert named.steps[0].info["choice"] == n_used and named.steps[0].info["choice_known"]
    assert named.steps[0].action == n_text
    # not named: recorded as choice 0, but said to be unknown and counted
    assert quiet.steps[0].info["choice"] == 0 and quiet.steps[0].info["choice_known"] is False
    assert res.stats["rollout/choice_unknown"] == 1.0


def test_parse_agent_result() -> None:
    assert parse_agent_result(1) == (1.0, True)
    assert parse_agent_result(0.0) == (0.0, False)
    assert parse_agent_result({"reward": -1, "success": True}) == (-1.0, True)
    assert parse_agent_result({"reward": 1, "choice": 2}) == (1.0, True)
    for bad, match in [
        (None, "must return a finite number"),
        (float("nan"), "must return a finite number"),
        ({"score": 1}, "accepted: 'reward'"),
        ({"reward": 1, "success": "yes"}, "'success' must be true or false"),
        ({"reward": 1, "choice": -1}, "'choice' must be an integer ≥ 0"),
        ({"reward": 1, "choice": True}, "'choice' must be an integer ≥ 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_agent_result(bad)


# ---------------------------------------------------------------- binding
def test_non_loopback_bind_without_a_key_is_refused(policy) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"refusing to serve on '0\.0\.0\.0' without an API key"):
        PolicyServer(policy, host="0.0.0.0")
    with pytest.raises(ValueError, match="without an API key"):
        check_bind("example.org", None)
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)
    check_bind("0.0.0.0", "secret")


def test_cli_refuses_a_public_bind_without_a_key(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from credo.serve.cli import main

    monkeypatch.delenv("CREDO_API_KEY", raising=False)
    assert main(["/nonexistent/model", "--host", "0.0.0.0"]) == 2
    assert "refusing to serve on '0.0.0.0' without an API key" in capsys.readouterr().err


def test_model_errors_become_a_500_and_the_server_keeps_serving(policy) -> None:  # type: ignore[no-untyped-def]
    original = policy.generate
    failures = iter([RuntimeError("CUDA out of memory")])

    def flaky(prompts, sampling, generator=None):  # type: ignore[no-untyped-def]
        for exc in failures:
            raise exc
        return original(prompts, sampling, generator)

    policy.generate = flaky
    try:
        with serve_policy(policy, stop_timeout_s=5) as (url, _):
            c = _client(url)
            with pytest.raises(
                openai.InternalServerError,
                match="generation failed: RuntimeError: CUDA out of memory",
            ):
                c.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
            r = c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "a"}], max_tokens=2
            )
            assert r.choices[0].message.role == "assistant"
            c.close()
    finally:
        del policy.generate


def test_api_key_is_checked(policy) -> None:  # type: ignore[no-untyped-def]
    with serve_policy(policy, api_key="s3cret", stop_timeout_s=5) as (url, _):
        bad = _client(url, api_key="wrong")
        with pytest.raises(openai.AuthenticationError, match="wrong API key"):
            bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        bad.close()
        good = _client(url, api_key="s3cret")
        r = good.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a"}], max_tokens=2
        )
        assert r.choices[0].message.role == "assistant"
        assert [m.id for m in good.models.list()] == ["credo"]
        good.close()


def test_protocol_errors_name_the_field() -> None:
    with pytest.raises(RequestError, match=r"messages\[1\] has no content") as err:
        parse_chat_request({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]})
    assert err.value.param == "messages[1]"
    req = parse_chat_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "stop": "x",
            "max_completion_tokens": 7,
            "tool_choice": "none",
            "tools": TOOLS,
        }
    )
    assert (
        req.messages[0]["content"] == "ab"
        and req.stop == ["x"]
        and req.max_tokens == 7
        and req.tools == []
    )


def test_server_thread_is_not_left_behind(policy) -> None:  # type: ignore[no-untyped-def]
    before = {t.name for t in threading.enumerate()}
    with serve_policy(policy, stop_timeout_s=5) as (url, _):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    after = {t.name for t in threading.enumerate()}
    assert "credo-serve-http" not in after - before and "credo-serve-engine" not in after - before


def test_episode_types() -> None:
    """The conversion produces the data model's own types."""
    ep = session_to_episode([], reward=1.0, success=True)
    assert isinstance(ep, Episode) and ep.steps == []
    assert not ep.success and ep.error is not None  # no model call: not a success
    assert isinstance(
        calls_to_steps([_call(0, [{"role": "user", "content": "q"}], [1], ["a"])])[0], Step
    )


def test_rods_llm_synthesiser_asks_a_served_model(server) -> None:  # type: ignore[no-untyped-def]
    """``tasks.params.llm`` as an OpenAI-compatible base URL: each executor call is one
    chat request to the server (its model found by listing), answered as text."""
    from credo.tasks.llm_synthesis import make_chat

    chat = make_chat(server.base_url, max_new_tokens=4)
    replies = [chat("write a task", seed) for seed in (7, 8)]
    assert all(isinstance(r, str) and r.strip() for r in replies)
