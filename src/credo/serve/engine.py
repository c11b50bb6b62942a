"""The generation engine: one thread that owns the model and batches concurrent requests.

Every request becomes a job on a queue. The engine thread takes the first waiting job,
waits ``batch_wait_s`` for more (up to ``max_batch`` sequences), renders their prompts,
refuses those certainly over the model's context or longer than it tokenises before
tokenising them (:mod:`credo.serve.bounds`: a 30 MB prompt costs a regex scan, not a
minute of CPU), tokenises the others, and samples all choices of all jobs that share sampling parameters in one
``policy.generate`` call (G agents talking to the server at once cost one batched
generation per turn, as the built-in samplers do). Tokenisation, generation and decoding
all run on this one thread, so the tokenizer and the model are never used concurrently.

Each choice then gets its post-processing: stop strings cut the response at the token
that completes them (the recorded ids and log-probs are cut to the same tokens: what the
model sampled *and kept*), tool calls are parsed, and streaming pieces are computed.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.policy.base import Generation, SamplingParams
from credo.serve.bounds import FALLBACK_BYTES_PER_TOKEN, PromptBound
from credo.serve.chat import RenderedPrompt, render_text
from credo.serve.protocol import ChatRequest, RequestError
from credo.serve.tools import parse_tool_calls

__all__ = ["ChoiceResult", "CompletionResult", "EngineConfig", "GenerationEngine"]


@dataclass
class EngineConfig:
    """Knobs of :class:`GenerationEngine`.

    Attributes:
        max_batch: most sequences (prompts × ``n``) in one ``generate`` call (default 64).
        batch_wait_s: how long the first job of a batch waits for others (default 0.005).
        default_max_tokens: response cap when a request sets none (default 256).
        temperature: when set, every request samples at this temperature and the
            request's own temperature and ``top_p`` are ignored (training: the recorded
            log-probs must come from the distribution the trainer scores). Default
            ``None``: the request decides.
        top_p: with ``temperature`` set, the nucleus mass every request uses (default
            ``None``: 1.0).
        max_tokens_cap: the most tokens any request may ask for (default ``None``).
        aux_samples: M > 0 also draws M auxiliary tokens per position (KLPO), recorded
            per step as ``token_data["aux_ids"]`` / ``["aux_old_logprobs"]``.
        topk_logprobs: K > 0 also records the K most likely tokens per position (KLPO's
            top-K KL) as ``token_data["topk_ids"]`` / ``["topk_old_logprobs"]``.
        chat_template: a template replacing the tokenizer's (default ``None``).
        max_prompt_bytes: the longest rendered prompt (UTF-8 bytes) the engine tokenises;
            longer ones get a 400 unread (default ``None``: the context times the
            tokenizer's bytes per token when it has a certain bound, which refuses only
            prompts certainly over the context, else times
            :data:`~credo.serve.bounds.FALLBACK_BYTES_PER_TOKEN`; no cap when the model's
            context is unknown).
    """

    max_batch: int = 64
    batch_wait_s: float = 0.005
    default_max_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    max_tokens_cap: int | None = None
    aux_samples: int = 0
    topk_logprobs: int = 0
    chat_template: str | None = None
    max_prompt_bytes: int | None = None

    @classmethod
    def from_sampling(cls, sampling: SamplingParams, **kwargs: Any) -> EngineConfig:
        """The engine a trainer wants: every request sampled as ``sampling`` says
        (temperature, top-p, KLPO's auxiliary draws and top-K head; at most
        ``max_new_tokens`` tokens), whatever the agent asks for."""
        return cls(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens_cap=sampling.max_new_tokens,
            default_max_tokens=sampling.max_new_tokens,
            aux_samples=sampling.aux_samples,
            topk_logprobs=sampling.topk_logprobs,
            **kwargs,
        )

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be ≥ 1, got {self.max_batch}")
        if not 0 <= self.batch_wait_s <= 1:
            raise ValueError(f"batch_wait_s must be in [0, 1] seconds, got {self.batch_wait_s}")
        if self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be ≥ 1, got {self.default_max_tokens}")
        if self.max_prompt_bytes is not None and self.max_prompt_bytes < 1:
            raise ValueError(f"max_prompt_bytes must be ≥ 1, got {self.max_prompt_bytes}")


@dataclass
class ChoiceResult:
    """One sampled choice.

    Attributes:
        index: the choice's index in the request.
        response_ids: the tokens kept (stop token included when the model ended its turn;
            cut after the token completing a stop string).
        logprobs: ``[len(response_ids)]`` sampling log-probs of those tokens.
        text: the decoded reply (stop string and everything after it removed).
        content: the reply without its tool calls (``None`` when only tool calls).
        tool_calls: OpenAI tool calls ``{"id", "type", "function": {"name", "arguments"}}``.
        finish_reason: ``"stop"``, ``"length"`` or ``"tool_calls"``.
        token_data: per-token tensors for the trainer (first dimension
            ``len(response_ids)``): KLPO's ``aux_ids``/``aux_old_logprobs`` and
            ``topk_ids``/``topk_old_logprobs`` when the engine samples them.
        token_texts: the text of each kept token (for ``logprobs``).
        top: ``[len(response_ids)]`` lists of ``(token text, log-prob)``, or ``None``.
        pieces: streaming deltas of ``content`` (they concatenate to it exactly).
    """

    index: int
    response_ids: list[int]
    logprobs: list[float]
    text: str
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    token_data: dict[str, torch.Tensor] = field(default_factory=dict)
    token_texts: list[str] = field(default_factory=list)
    top: list[list[tuple[str, float]]] | None = None
    pieces: list[str] = field(default_factory=list)


@dataclass
class CompletionResult:
    """What the engine returns for a request.

    Attributes:
        prompt_ids: the exact ids the model was given.
        prompt_text: the rendered prompt.
        choices: one :class:`ChoiceResult` per ``n``.
        sampling: the sampling parameters used.
        native_tools: the template rendered the tools natively.
    """

    prompt_ids: list[int]
    prompt_text: str
    choices: list[ChoiceResult]
    sampling: SamplingParams
    native_tools: bool


@dataclass
class _Job:
    request: ChatRequest
    future: Future
    session: str | None = None
    prompt: Any = None
    sampling: SamplingParams | None = None


def _context_size(policy: Any) -> int | None:
    model = getattr(policy, "model", None)
    cfg = getattr(model, "config", None)
    size = getattr(cfg, "max_position_embeddings", None)
    return int(size) if isinstance(size, int) and size > 0 else None


class GenerationEngine:
    """Owns ``policy`` on one thread; :meth:`submit` hands it requests (see module doc).

    Args:
        policy: an :class:`~credo.policy.hf.HFPolicy` (anything with ``generate``,
            ``tokenizer`` and ``stop_ids``).
        config: the engine's knobs.
        generator: the sampling RNG (default: a CPU generator seeded with 0).
    """

    def __init__(
        self,
        policy: Any,
        config: EngineConfig | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.policy = policy
        self.config = config or EngineConfig()
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.context = _context_size(policy)
        #: lower bounds on a prompt's tokens that hold for this tokenizer (credo.serve.bounds)
        self.bound = PromptBound.of(getattr(policy, "tokenizer", None))
        #: the longest rendered prompt, in UTF-8 bytes, the engine tokenises
        self.max_prompt_bytes = self.config.max_prompt_bytes
        if self.max_prompt_bytes is None and self.context is not None:
            per_token = self.bound.bytes_per_token or FALLBACK_BYTES_PER_TOKEN
            self.max_prompt_bytes = per_token * self.context
        self.stop_ids = set(getattr(policy, "stop_ids", []))
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition()
        #: ``generate`` calls made so far.
        self.batches = 0

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the engine thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._loop, name="credo-serve-engine", daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Ask the thread to finish its batch and end; True when it ended within
        ``timeout_s``. Jobs still queued fail with a ``RuntimeError``."""
        if self._thread is None:
            return True
        self._queue.put(None)
        self._thread.join(timeout_s)
        alive = self._thread.is_alive()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.future.set_running_or_notify_cancel():
                job.future.set_exception(RuntimeError("the server is shutting down"))
        return not alive

    def submit(self, request: ChatRequest, session: str | None = None) -> Future:
        """Queue ``request`` (of the agent session ``session``, if known); the future
        resolves to a :class:`CompletionResult` or raises
        :class:`~credo.serve.protocol.RequestError` (bad prompt) or the model's error.
        A policy with ``wants_sessions = True`` gets each row's session in ``generate``
        (the warm start's oracle replier, :mod:`credo.agent.demos`)."""
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the generation engine is not running")
        fut: Future = Future()
        with self._idle:
            self._pending += 1
        fut.add_done_callback(self._done)
        self._queue.put(_Job(request, fut, session))
        return fut

    def _done(self, fut: Future) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until every submitted request is answered (a trainer about to change the
        weights waits for stragglers); True when idle within ``timeout_s``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    # ---------------------------------------------------------------- the thread
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, size, stop = [first], first.request.n, False
            deadline = time.monotonic() + self.config.batch_wait_s
            while size < self.config.max_batch:
                left = deadline - time.monotonic()
                try:
                    job = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                jobs.append(job)
                size += job.request.n
            try:
                self._run(jobs)
            except Exception as exc:  # never leave a request waiting on a dead thread
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(exc)
            if stop:
                return

    def _check_length(self, text: str) -> None:
        """Refuse (400) a rendered prompt that is certainly over the context, or longer
        than the engine tokenises, before tokenising it (:mod:`credo.serve.bounds`)."""
        if self.context is not None:
            floor = self.bound.min_tokens(text, self.context)
            if floor >= self.context:
                raise RequestError(
                    f"the prompt has at least {floor} tokens (counted without tokenising "
                    f"it); the model's context is {self.context} tokens, leaving no room "
                    "for a reply",
                    "messages",
                )
        size = len(text.encode("utf-8", "surrogatepass"))
        if self.max_prompt_bytes is not None and size > self.max_prompt_bytes:
            raise RequestError(
                f"the prompt is {size:,} bytes: more than this server tokenises "
                f"({self.max_prompt_bytes:,} bytes)",
                "messages",
            )

    def _prepare(self, job: _Job) -> bool:
        req = job.request
        try:
            text, native = render_text(
                self.policy.tokenizer,
                req.messages,
                req.tools,
                chat_template=self.config.chat_template,
            )
            self._check_length(text)
            ids = self.policy.tokenizer.encode(text, add_special_tokens=False)
            job.prompt = RenderedPrompt(text=text, ids=list(ids), native_tools=native)
            n_prompt = len(job.prompt.ids)
            want = req.max_tokens or self.config.default_max_tokens
            if self.config.max_tokens_cap is not None:
                want = min(want, self.config.max_tokens_cap)
            if self.context is not None:
                room = self.context - n_prompt
                if room < 1:
                    raise RequestError(
                        f"the prompt has {n_prompt} tokens; the model's context is "
                        f"{self.context} tokens, leaving no room for a reply",
                        "messages",
                    )
                want = min(want, room)
            cfg = self.config
            forced = cfg.temperature is not None
            job.sampling = SamplingParams(
                temperature=cfg.temperature if forced else req.temperature,  # type: ignore[arg-type]
                top_p=(cfg.top_p or 1.0) if forced else req.top_p,
                max_new_tokens=want,
                aux_samples=cfg.aux_samples,
                topk_logprobs=max(req.top_logprobs, cfg.topk_logprobs),
            )
        except Exception as exc:
            job.future.set_exception(exc)
            return False
        return True

    def _run(self, jobs: list[_Job]) -> None:
        live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
        live = [j for j in live if self._prepare(j)]
        by_sampling: dict[SamplingParams, list[_Job]] = {}
        for j in live:
            by_sampling.setdefault(j.sampling, []).append(j)  # type: ignore[arg-type]
        for sampling, group in by_sampling.items():
            prompts = [j.prompt.ids for j in group for _ in range(j.request.n)]
            by_session = {}
            if getattr(self.policy, "wants_sessions", False):
                by_session["sessions"] = [j.session for j in group for _ in range(j.request.n)]
            try:
                gens = self.policy.generate(prompts, sampling, self.generator, **by_session)
                self.batches += 1
            except Exception as exc:
                for j in group:
                    j.future.set_exception(exc)
                continue
            k = 0
            for j in group:
                mine = gens[k : k + j.request.n]
                k += j.request.n
                try:
                    choices = [self._choice(i, g, j.request) for i, g in enumerate(mine)]
                    j.future.set_result(
                        CompletionResult(
                            prompt_ids=list(j.prompt.ids),
                            prompt_text=j.prompt.text,
                            choices=choices,
                            sampling=sampling,
                            native_tools=j.prompt.native_tools,
                        )
                    )
                except Exception as exc:
                    j.future.set_exception(exc)

    # ----------------------------------------------------------- post-processing
    def _decode(self, ids: list[int]) -> str:
        return self.policy.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def _choice(self, index: int, gen: Generation, req: ChatRequest) -> ChoiceResult:
        ids = list(gen.token_ids)
        lps = [float(x) for x in gen.logprobs.tolist()]
        body = ids[:-1] if gen.finished and ids and ids[-1] in self.stop_ids else ids
        text = self._decode(body)
        finish = "stop" if gen.finished else "length"
        cut = _stop_cut(req.stop, text, body, self._decode)
        if cut is not None:
            keep, text = cut
            ids, lps, finish = body[:keep], lps[:keep], "stop"
            body = ids
        content: str | None = text
        calls: list[dict[str, Any]] = []
        if req.tools:
            content, parsed = parse_tool_calls(text)
            calls = [
                {
                    "id": "call_" + uuid.uuid4().hex[:24],
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }
                for name, args in parsed
            ]
            if calls and finish == "stop":
                finish = "tool_calls"
        n = len(ids)
        token_data: dict[str, torch.Tensor] = {}
        if gen.aux_ids is not None and gen.aux_logprobs is not None:
            token_data.update(aux_ids=gen.aux_ids[:n], aux_old_logprobs=gen.aux_logprobs[:n])
        if self.config.topk_logprobs and gen.topk_ids is not None:
            k = self.config.topk_logprobs
            token_data.update(
                topk_ids=gen.topk_ids[:n, :k], topk_old_logprobs=gen.topk_logprobs[:n, :k]
            )
        tok = self.policy.tokenizer
        token_texts = (
            [tok.decode([t], skip_special_tokens=False) for t in ids] if req.logprobs else []
        )
        top = None
        if req.top_logprobs and gen.topk_ids is not None and gen.topk_logprobs is not None:
            k = req.top_logprobs
            top = [
                [
                    (tok.decode([int(t)], skip_special_tokens=False), float(lp))
                    for t, lp in zip(
                        gen.topk_ids[i, :k].tolist(), gen.topk_logprobs[i, :k].tolist()
                    )
                ]
                for i in range(n)
            ]
        pieces = _pieces(content or "", body, self._decode) if req.stream else []
        return ChoiceResult(
            index=index,
            response_ids=ids,
            logprobs=lps,
            text=text,
            content=content,
            tool_calls=calls,
            finish_reason=finish,
            token_data=token_data,
            token_texts=token_texts,
            top=top,
            pieces=pieces,
        )


def _stop_cut(stops: list[str], text: str, body: list[int], decode: Any) -> tuple[int, str] | None:
    """``(tokens to keep, text before the stop string)`` for the earliest stop string, or
    ``None`` when no stop string occurs in ``text``."""
    if not stops or not any(s in text for s in stops):
        return None
    for k in range(1, len(body) + 1):
        prefix = decode(body[:k])
        hits = [prefix.find(s) for s in stops if s in prefix]
        if hits:
            return k, prefix[: min(hits)].rstrip()
    return None  # pragma: no cover (the full body contains a stop string)


def _pieces(content: str, body: list[int], decode: Any) -> list[str]:
    """Streaming deltas: the growth of ``content`` token by token (where the decoded
    prefix is a prefix of ``content``); they concatenate to ``content`` exactly."""
    out: list[str] = []
    sent = ""
    for k in range(1, len(body) + 1):
        prefix = decode(body[:k])
        if len(prefix) > len(sent) and content.startswith(prefix):
            out.append(prefix[len(sent) :])
            sent = prefix
    if len(sent) < len(content):
        out.append(content[len(sent) :])
    return out
