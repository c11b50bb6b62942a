"""``credo serve`` against hostile requests (issue 46, item 3).

Before: a prompt up to the 32 MiB body cap was tokenised before the 512-token context was
checked (one 30 MB request: 53 s of CPU, 1.07 → 4.3 GB, other clients blocked 21–53 s); a
lone surrogate or 100,000-deep JSON gave a 500; a ``text/plain`` POST with
``Host: evil.example`` was served without a key (a web page could reach the server);
per-session recordings were never evicted; ``--port 70000`` and ``--max-batch 0`` printed
tracebacks. Servers bind 127.0.0.1 on an ephemeral port, every wait bounded.
"""

from __future__ import annotations

import errno
import json
import random
import socket
import string
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from credo.policy.tiny import TinyModelConfig, create_tiny_policy
from credo.serve import PolicyServer, SessionRecorder
from credo.serve.bounds import FALLBACK_BYTES_PER_TOKEN, PromptBound
from credo.serve.cli import main as serve_main

TIMEOUT = 30.0
WORDS = ["hello", "world", "user", "assistant", "a", "b", "[", "]"]
CONTEXT = 256


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    cfg = TinyModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=256
    )
    return create_tiny_policy(WORDS, cfg, seed=3)


@pytest.fixture(scope="module")
def server(policy):  # type: ignore[no-untyped-def]
    srv = PolicyServer(policy, seed=0, start_timeout_s=TIMEOUT, stop_timeout_s=5).start()
    yield srv
    assert srv.stop(), "the server did not stop within its bounded waits"


def _post(
    url: str, body: bytes, headers: dict[str, str] | None = None, path: str = "/chat/completions"
) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + path, data=body, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _chat(content: str, **extra: object) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], **extra}).encode()


OK = _chat("hello", max_tokens=1)


# ------------------------------------------------------------------ the bound
def _byte_bpe(normalizer: normalizers.Normalizer | None = None) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = ["hello world, the quick brown fox jumps over the lazy dog. " * 40, "été ça 🙂 " * 20]
    tok.train_from_iterator(text, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _random_texts(n: int, seed: int) -> list[str]:
    """Texts made to probe the bound: runs of letters, digits and punctuation, every kind
    of whitespace (the ones Python and Rust disagree on included), accents, emoji,
    special tokens, long unbroken runs."""
    rng = random.Random(seed)
    pieces = [
        "hello",
        "world",
        "a",
        "[",
        "]",
        "x" * 300,
        "!!!",
        "é",
        "🙂",
        "<|im_start|>",
        "<eos>",
        "12",
        "K",  # the Kelvin sign: lower-cases to one ASCII byte
        *string.punctuation,
    ]
    spaces = [" ", "  ", "\t", "\n", "\r\n", "\xa0", "\u3000", "\x1c", "\u2028", "\x0b", ""]
    return [
        "".join(rng.choice(pieces) + rng.choice(spaces) for _ in range(rng.randint(0, 40)))
        for _ in range(n)
    ]


@pytest.mark.parametrize("kind", ["word-level", "byte-level BPE"])
def test_the_lower_bound_never_exceeds_the_true_token_count(kind: str, policy) -> None:  # type: ignore[no-untyped-def]
    tok = policy.tokenizer if kind == "word-level" else _byte_bpe()
    bound = PromptBound.of(tok)
    assert bound.words
    assert (bound.bytes_per_token is None) == (kind == "word-level")
    lows, counts = 0, 0
    for text in _random_texts(400, seed=1):
        n = len(tok.encode(text, add_special_tokens=False))
        low = bound.min_tokens(text, 10**9)
        assert low <= n, (text, low, n)
        lows, counts = lows + low, counts + n
    assert lows > 0.05 * counts  # a real bound, not a constant 0 (punctuation is not counted)
    words = " ".join(["hello", "world"] * 50)
    assert bound.min_tokens(words, 10**9) == 100  # plain words: every word counted


def test_the_bound_is_read_from_the_tokenizer(policy) -> None:  # type: ignore[no-untyped-def]
    bpe = _byte_bpe()
    longest = max(len(t) for t in bpe.backend_tokenizer.get_vocab())
    assert PromptBound.of(bpe) == PromptBound(words=True, bytes_per_token=max(longest, 13))
    # NFC may shrink a text (e + combining acute → é): no bytes bound
    assert PromptBound.of(_byte_bpe(normalizers.NFC())) == PromptBound(words=True)
    assert PromptBound.of(policy.tokenizer) == PromptBound(words=True)
    assert PromptBound.of(object()) == PromptBound()
    # hand-counted: "hello world!" is 12 bytes, 2 runs holding a letter; "[ ! ]" none
    assert PromptBound(words=True).min_tokens("hello  world!", 99) == 2
    assert PromptBound(words=True).min_tokens("[ ! ]", 99) == 0
    assert PromptBound(bytes_per_token=5).min_tokens("hello world!", 99) == 3
    assert PromptBound(words=True).min_tokens("a " * 10_000, 7) == 7  # stops at 7


# ------------------------------------------------------- the context, unread
def test_a_30_mb_prompt_is_refused_before_it_is_tokenised(server, policy) -> None:  # type: ignore[no-untyped-def]
    """The issue's probe, bounded by CPU time: the whole process (client, server, engine)
    spends about a second on it (encoding, sending and parsing 60 MB of JSON), where
    tokenising it took 53 s. The bound, 10 s, sits between the two with room for a busy
    machine and for other threads of the test process (2.6 s in a full run beside a
    training job; the earlier bound of 2 s failed there)."""
    batches = server.engine.batches
    cpu = time.process_time()
    status, body = _post(server.base_url, _chat("hello world " * 2_500_000))
    assert status == 400
    assert body["error"]["message"] == (
        f"the prompt has at least {CONTEXT} tokens (counted without tokenising it); the "
        f"model's context is {CONTEXT} tokens, leaving no room for a reply"
    )
    # one token for the word-level model: user : a…a <eos> assistant : is 30,000,025 bytes
    one_word = _chat("a" * 30_000_000)
    status, body = _post(server.base_url, one_word)
    assert status == 400
    assert body["error"]["message"] == (
        f"the prompt is 30,000,025 bytes: more than this server tokenises "
        f"({FALLBACK_BYTES_PER_TOKEN * CONTEXT:,} bytes)"
    )
    assert time.process_time() - cpu < 10.0
    assert server.engine.batches == batches  # nothing was generated
    assert _post(server.base_url, OK)[0] == 200


def test_prompts_that_fit_are_served_however_close_to_the_context(server, policy) -> None:  # type: ignore[no-untyped-def]
    url = server.base_url
    # the template adds 5 tokens: user : … <eos> assistant :
    for words in (10, 200, CONTEXT - 6):  # the last leaves room for exactly one token
        status, body = _post(url, _chat(" ".join(["hello"] * words), max_tokens=1))
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == words + 5
    # an unknown word of 5,000 letters is one token: it fits, and is served
    status, body = _post(url, _chat("q" * 5000, max_tokens=1))
    assert status == 200 and body["usage"]["prompt_tokens"] == 6
    # one token more fills the context: the bound (3 runs fewer than the tokens) is below
    # the context, so it is tokenised, and refused exactly
    status, body = _post(url, _chat(" ".join(["hello"] * (CONTEXT - 5)), max_tokens=1))
    assert status == 400 and body["error"]["message"] == (
        f"the prompt has {CONTEXT} tokens; the model's context is {CONTEXT} tokens, leaving "
        "no room for a reply"
    )


# ------------------------------------------------------- malformed → 400
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_chat("\\ud800 x").replace(b"\\\\ud800", b"\\ud800"), "messages[0].content is not valid"),
        (b'{"\\udc00": 1, "messages": []}', "a key of the request body is not valid Unicode"),
        (b"[" * 100_000 + b"]" * 100_000, "nested more than 64 levels deep"),
        (b'{"messages": ' + b"[" * 70 + b"]" * 70 + b"}", "nested more than 64 levels deep"),
        (b'{"n": ' + b"9" * 5000 + b"}", "Exceeds the limit (4300 digits)"),
        (b'{"a": "\xff"}', "not valid JSON: 'utf-8' codec can't decode byte 0xff"),
        (_chat("x", temperature=float("nan")), "temperature must be a number in [0.0, 2.0]"),
        # found by the hostile suite's fuzzer: logits / 1e-308 overflowed to a NaN
        # distribution, a 500
        (_chat("x", temperature=1e-308), "temperature must be 0 (greedy) or in [0.001, 2.0]"),
    ],
)
def test_malformed_bodies_are_a_400_and_the_server_keeps_serving(
    server, raw: bytes, message: str
) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(server.base_url, raw)
    assert status == 400, body
    assert message in body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"
    assert _post(server.base_url, OK)[0] == 200


# ------------------------------------------------- a browser page is refused
def test_without_a_key_only_this_machines_programs_are_answered(server) -> None:  # type: ignore[no-untyped-def]
    url, port = server.base_url, server.port
    recorded = len(server.recorder.sessions())
    batches = server.engine.batches
    session = {"X-Credo-Session": "page"}
    cases = [
        ({"Host": "evil.example"}, 403, "Host 'evil.example' is not this server"),
        ({"Host": f"evil.example:{port}"}, 403, "is not this server"),
        ({"Origin": "http://evil.example"}, 403, "Origin 'http://evil.example' is another site"),
        ({"Origin": "null"}, 403, "is another site"),
        ({"Content-Type": "text/plain"}, 415, "Content-Type: application/json, got 'text/plain'"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "got 'application/x-www"),
    ]
    for headers, status, message in cases:
        got, body = _post(url, _chat("hello", user="page"), {**session, **headers})
        assert (got, message in body["error"]["message"]) == (status, True), (headers, body)
    assert server.engine.batches == batches and len(server.recorder.sessions()) == recorded
    for headers in (
        {"Host": f"localhost:{port}"},
        {"Host": f"127.0.0.1:{port}"},
        {"Origin": "http://localhost:3000"},
        {"Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/json; charset=utf-8"},
    ):
        assert _post(url, OK, headers)[0] == 200, headers


def test_with_a_key_the_key_is_the_rule(policy) -> None:  # type: ignore[no-untyped-def]
    with PolicyServer(policy, api_key="k", stop_timeout_s=5) as srv:
        key = {"Authorization": "Bearer k", "Host": "proxy.example"}
        assert _post(srv.base_url, OK, {"Host": "proxy.example"})[0] == 401
        assert _post(srv.base_url, OK, key)[0] == 200
        assert _post(srv.base_url, OK, {**key, "Content-Type": "text/plain"})[0] == 415


def test_allowed_hosts_extend_the_loopback_names(policy) -> None:  # type: ignore[no-untyped-def]
    with PolicyServer(policy, allowed_hosts={"box.local"}, stop_timeout_s=5) as srv:
        assert _post(srv.base_url, OK, {"Host": "box.local:1"})[0] == 200
        assert _post(srv.base_url, OK, {"Origin": "http://box.local"})[0] == 200
        assert _post(srv.base_url, OK, {"Host": "other.local"})[0] == 403


# ------------------------------------------------------ bounded recordings
def _record(rec: SessionRecorder, sid: str) -> None:
    kw = {"messages": [], "prompt_ids": [1], "choices": [], "temperature": 1.0, "top_p": 1.0}
    rec.record(sid, **kw)


def test_recordings_are_bounded_in_calls_least_recent_session_first() -> None:
    rec = SessionRecorder(max_calls=4)
    for sid in ("a", "a", "b", "c"):  # calls 0..3
        _record(rec, sid)
    assert rec.sessions() == ["a", "b", "c"] and rec.dropped == 0
    _record(rec, "b")  # call 4: 5 calls; a, least recently used (2 calls), goes whole
    assert rec.sessions() == ["c", "b"] and rec.dropped == 2
    assert rec.lost("a") and not rec.lost("b")
    _record(rec, "d")  # call 5: 4 calls, within the bound
    for _ in range(5):  # calls 6..10: c, b, d go in turn, then e's oldest call
        _record(rec, "e")
    assert rec.sessions() == ["e"] and [c.seq for c in rec.calls("e")] == [7, 8, 9, 10]
    assert rec.dropped == 2 + 1 + 2 + 1 + 1 and rec.lost("e") and rec.lost("b")
    assert len(rec.pop("e")) == 4
    _record(rec, "f")
    assert rec.calls("f")[0].seq == 11 and rec.sessions() == ["f"] and not rec.lost("f")


def test_an_agent_whose_recording_was_cut_fails_its_episode(policy) -> None:  # type: ignore[no-untyped-def]
    from credo.serve import run_agent_episodes

    async def agent(task: object, client, session_id: str) -> float:  # type: ignore[no-untyped-def]
        for _ in range(3):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=1
            )
        return 1.0

    with PolicyServer(policy, recorder=SessionRecorder(max_calls=2), stop_timeout_s=5) as srv:
        res = run_agent_episodes(policy, agent, ["t"], 1, server=srv, timeout_s=TIMEOUT)
    (episode,) = res.episodes
    assert episode.error is not None and "recorder dropped calls of this session" in episode.error
    assert not episode.success


# --------------------------------------------------------------- the flags
@pytest.fixture(scope="module")
def model_dir(policy, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("model") / "m"
    policy.save(folder)
    return folder


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "70000"], "argument --port: the port must be a whole number in 0..65535"),
        (["--port", "x"], "the port must be a whole number in 0..65535, got 'x'"),
        (["--max-batch", "0"], "--max-batch must be a whole number in 1 or more, got '0'"),
        (["--temperature", "3"], "the temperature must be a number in [0, 2], got '3'"),
        (["--max-prompt-bytes", "-1"], "--max-prompt-bytes must be a whole number in 1 or more"),
    ],
)
def test_bad_flags_are_one_line(model_dir: Path, flags: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stop:
        serve_main([str(model_dir), *flags], prog="credo serve")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: credo serve: ") and message in err


def test_a_port_in_use_is_one_line(model_dir: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert serve_main([str(model_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: cannot bind 127.0.0.1:{port}: [Errno {errno.EADDRINUSE}]")
