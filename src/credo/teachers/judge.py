"""Judges: a causal LM asked a yes/no question about a response, scored from the
probability of its verdict, never from a sampled answer (SERPO's probabilistic rubric
reward; docs/algorithms.md#serpo). [recon]

The judge reads a prompt that holds the question (a rubric item), the context (e.g. the
task) and the response, and the score is the judge's probability of "yes" against "no"
for its next token::

    s = p_yes / (p_yes + p_no) = σ(logsumexp_{v∈Y} z_v − logsumexp_{v∈N} z_v)

where ``Y`` and ``N`` are the single-token spellings of the two verdicts the tokenizer
has (``yes``, `` Yes``, …) and ``z`` the next-token logits. The softmax normaliser
cancels, so the score is exact from the logits of the two sets alone.

Any causal LM is a judge: the packaged SmolLM2-135M (chat template: the question goes in
a user message and the verdict is the first assistant token), any Hugging Face model, or
the built-in model (plain prompt ``question : … context : … response : … verdict :``).
Calls are batched (left-padded, one forward pass per micro-batch, only the last position's
logits computed where the model supports it), cached by (question, context, response),
and their cost counted in :class:`JudgeCost`.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from credo.policy import HFPolicy
from credo.policy.tokenizer import user_message_ids
from credo.teachers.scoring import _keep_arg

__all__ = [
    "DEFAULT_NO",
    "DEFAULT_YES",
    "Judge",
    "JudgeCost",
    "verdict_ids",
    "verdict_margins",
    "verdict_scores",
]

#: Spellings of the verdicts looked up in the judge's vocabulary (single tokens only).
DEFAULT_YES = ("yes", "Yes", " yes", " Yes", "YES")
DEFAULT_NO = ("no", "No", " no", " No", "NO")

#: The plain prompt (models without a chat template, e.g. the built-in model).
PLAIN_TEMPLATE = "question : {question} context : {context} response : {response} verdict :"
#: The user message for chat models.
CHAT_TEMPLATE = (
    "{question}\n\nContext: {context}\n\nResponse: {response}\n\nAnswer with one word: yes or no."
)


def verdict_margins(logits: torch.Tensor, yes: Sequence[int], no: Sequence[int]) -> torch.Tensor:
    """``[N]`` verdict log-odds ``logsumexp_{v∈Y} z_v − logsumexp_{v∈N} z_v`` from
    next-token logits ``[N, V]`` (``yes``/``no``: the ids that spell each verdict; their
    probabilities add up). :func:`verdict_scores` is its sigmoid; a judge is fitted
    with the binary cross-entropy of it (:mod:`credo.teachers.judge_fit`)."""
    if not yes or not no:
        raise ValueError("verdict_margins needs at least one 'yes' and one 'no' token id")
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.logsumexp(z[:, list(yes)], dim=-1) - torch.logsumexp(z[:, list(no)], dim=-1)


def verdict_scores(logits: torch.Tensor, yes: Sequence[int], no: Sequence[int]) -> torch.Tensor:
    """``[N]`` scores ``p_yes / (p_yes + p_no)`` from next-token logits.

    Args:
        logits: ``[N, V]`` next-token logits.
        yes: token ids that spell "yes" (their probabilities add up).
        no: token ids that spell "no".
    """
    return torch.sigmoid(verdict_margins(logits, yes, no))


def verdict_ids(
    tokenizer: object, yes: Sequence[str] = DEFAULT_YES, no: Sequence[str] = DEFAULT_NO
) -> tuple[list[int], list[int]]:
    """The single-token ids of the verdict spellings the tokenizer has (unknown words
    left out); ``ValueError`` naming the missing verdict if none."""
    unk = getattr(tokenizer, "unk_token_id", None)

    def ids(forms: Sequence[str]) -> list[int]:
        out: list[int] = []
        for form in forms:
            enc = tokenizer.encode(form, add_special_tokens=False)  # type: ignore[attr-defined]
            if len(enc) == 1 and enc[0] != unk and enc[0] not in out:
                out.append(int(enc[0]))
        return out

    y, n = ids(yes), ids(no)
    for name, found, forms in (("yes", y, yes), ("no", n, no)):
        if not found:
            raise ValueError(
                f"the judge's tokenizer has no single token for {name!r} (tried "
                f"{', '.join(map(repr, forms))}): give other spellings"
            )
    if set(y) & set(n):
        raise ValueError("the judge's 'yes' and 'no' spellings share a token")
    return y, n


@dataclass
class JudgeCost:
    """What judging cost so far.

    Attributes:
        calls: :meth:`Judge.scores` calls.
        asked: (question, response) pairs asked for.
        cached: of them, answered from the cache.
        forwards: forward passes (micro-batches) run.
        tokens: prompt tokens read by the judge.
        seconds: wall time in the judge.
    """

    calls: int = 0
    asked: int = 0
    cached: int = 0
    forwards: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        """``judge/<field>`` entries for a metrics record."""
        return {f"judge/{k}": float(v) for k, v in asdict(self).items()}


class Judge:
    """A causal LM that scores responses against yes/no questions (module docstring).

    Args:
        policy: the judge model (any :class:`~credo.policy.HFPolicy`).
        yes, no: verdict spellings to look up (single tokens of the tokenizer).
        template: the prompt, with ``{question}``, ``{context}`` and ``{response}``
            (default: the chat message for models with a chat template, else the plain
            prompt).
        micro_batch: prompts per forward pass (default 16).
        cache_size: most (question, context, response) scores kept (default 100 000;
            least recently used dropped first).
        max_response_chars: a longer response is cut to this many characters before it
            is shown to the judge (default 2000).
    """

    def __init__(
        self,
        policy: HFPolicy,
        *,
        yes: Sequence[str] = DEFAULT_YES,
        no: Sequence[str] = DEFAULT_NO,
        template: str | None = None,
        micro_batch: int = 16,
        cache_size: int = 100_000,
        max_response_chars: int = 2000,
    ) -> None:
        if micro_batch < 1:
            raise ValueError(f"judge micro_batch must be >= 1, got {micro_batch}")
        self.policy = policy
        self.yes, self.no = verdict_ids(policy.tokenizer, yes, no)
        self.chat = bool(getattr(policy.tokenizer, "chat_template", None))
        self.template = template or (CHAT_TEMPLATE if self.chat else PLAIN_TEMPLATE)
        self.micro_batch = micro_batch
        self.cache_size = cache_size
        self.max_response_chars = max_response_chars
        self.cost = JudgeCost()
        self._cache: OrderedDict[str, float] = OrderedDict()

    # ------------------------------------------------------------------ prompts
    def prompt_ids(self, question: str, response: str, context: str = "") -> list[int]:
        """The token ids the judge reads before its verdict."""
        text = self.template.format(
            question=question, context=context, response=response[: self.max_response_chars]
        )
        return user_message_ids(self.policy.tokenizer, text)

    def clear_cache(self) -> None:
        """Forget every cached score (after the judge's weights changed)."""
        self._cache.clear()

    @staticmethod
    def _key(question: str, response: str, context: str) -> str:
        blob = "\x00".join((question, context, response)).encode()
        return hashlib.sha256(blob).hexdigest()

    # ------------------------------------------------------------------ scoring
    def scores(
        self,
        questions: Sequence[str],
        responses: Sequence[str],
        contexts: Sequence[str] | None = None,
    ) -> torch.Tensor:
        """``[N]`` verdict scores of ``N`` (question, response[, context]) triples."""
        if len(questions) != len(responses) or (
            contexts is not None and len(contexts) != len(responses)
        ):
            raise ValueError(
                f"judge: {len(questions)} questions, {len(responses)} responses and "
                f"{'no' if contexts is None else len(contexts)} contexts must match"
            )
        t0 = time.perf_counter()
        ctx = list(contexts) if contexts is not None else [""] * len(responses)
        keys = [self._key(q, r, c) for q, r, c in zip(questions, responses, ctx)]
        out = torch.empty(len(keys), dtype=torch.float32)
        todo: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            if k in self._cache:
                self._cache.move_to_end(k)
                out[i] = self._cache[k]
                self.cost.cached += 1
            else:
                todo.setdefault(k, []).append(i)
        firsts = [rows[0] for rows in todo.values()]
        prompts = [self.prompt_ids(questions[i], responses[i], ctx[i]) for i in firsts]
        new = self._score_prompts(prompts)
        for k, rows, s in zip(todo, todo.values(), new.tolist()):
            out[rows] = s
            self._cache[k] = s
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        self.cost.calls += 1
        self.cost.asked += len(keys)
        self.cost.seconds += time.perf_counter() - t0
        return out

    @torch.no_grad()
    def _score_prompts(self, prompts: list[list[int]]) -> torch.Tensor:
        """``[N]`` scores of tokenised prompts, in left-padded micro-batches."""
        out = torch.empty(len(prompts), dtype=torch.float32)
        if not prompts:
            return out
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            for lo in range(0, len(prompts), self.micro_batch):
                chunk = prompts[lo : lo + self.micro_batch]
                out[lo : lo + len(chunk)] = torch.sigmoid(self.margins(chunk)).cpu()
                self.cost.forwards += 1
                self.cost.tokens += sum(len(p) for p in chunk)
        finally:
            model.train(was_training)
        return out

    def margins(self, prompts: list[list[int]]) -> torch.Tensor:
        """``[N]`` verdict log-odds (:func:`verdict_margins`) of tokenised prompts in one
        left-padded forward pass, with gradients where autograd is on (fitting)."""
        policy, model = self.policy, self.policy.model
        keep = _keep_arg(model)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), policy.pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for j, p in enumerate(prompts):
            ids[j, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
            attn[j, width - len(p) :] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        dev = policy.device
        logits = model(
            input_ids=ids.to(dev),
            attention_mask=attn.to(dev),
            position_ids=pos.to(dev),
            use_cache=False,
            **({keep: 1} if keep else {}),
        ).logits[:, -1]
        return verdict_margins(logits, self.yes, self.no)
