"""``HFPolicy``: any Hugging Face causal LM as a credo policy.

Batched, left-padded sampling with a KV cache (temperature, top-p, stop at the end of
an action), per-token log-probs of sampled and given sequences, and train-mode log-probs
with grad for the loss.

Large vocabularies (SmolLM2: 49 152 tokens) make the ``[B, L, V]`` logits the biggest
tensor of a step, so the prefill of a generation asks the model for the last position's
logits only, and :meth:`HFPolicy.score` can compute logits only for the positions the
caller needs (``scored``: the response tokens at the end of each row).

Multi-turn episodes can keep their KV cache between turns: :meth:`HFPolicy.generate`
with ``sessions`` (one opaque key per row, one per live episode) feeds only the tokens
after the longest prefix the prompt shares with what that session's model already read,
and falls back to a full prefill when the prompt does not extend it
(:mod:`credo.policy.kvcache`; :meth:`HFPolicy.end_sessions` frees finished episodes).

The model may be a ``peft`` LoRA model (:mod:`credo.policy.lora`): :meth:`HFPolicy.save`
then writes the adapters only, :meth:`HFPolicy.load_weights` restores them exactly, and
a policy with ``adapters_disabled`` (the frozen reference) runs the same weights with the
adapters switched off.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import logging
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from credo.policy.base import Generation, SamplingParams
from credo.policy.kvcache import (
    DEFAULT_KV_CACHE_MB,
    DEFAULT_MIN_PREFIX,
    KVEntry,
    KVSessions,
    KVStats,
    cache_layers,
    make_cache,
    row_entry,
    stack_caches,
)
from credo.policy.precision import precision

__all__ = ["HFPolicy", "ScoreOutput", "require_peft"]


class _NoAcceleratorGuess(logging.Filter):
    """DeepSpeed, when installed (the ``deepspeed`` extra), is imported by accelerate on
    every ``save_pretrained`` and warns on a machine without a GPU that it is "unable to
    detect" one. On a CPU that is expected: the line is dropped, DeepSpeed's others kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "unable to detect it" not in record.getMessage()


logging.getLogger("DeepSpeed").addFilter(_NoAcceleratorGuess())

try:  # transformers' per-file progress bars would fight with credo's own display
    from transformers.utils import logging as _hf_logging

    _hf_logging.disable_progress_bar()
except ImportError:  # pragma: no cover
    pass

#: Default of ``HFPolicy.trim_min_vocab``.
TRIM_MIN_VOCAB = 4096

_CHAT_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def require_peft() -> Any:
    """The ``peft`` module (LoRA adapters), or an ``ImportError`` that says how to
    install it."""
    try:
        import peft
    except ImportError as exc:
        raise ImportError(
            "LoRA needs the 'peft' package: pip install peft (make smollm installs it)"
        ) from exc
    return peft


@dataclass
class ScoreOutput:
    """What :meth:`HFPolicy.score` returns (all aligned with ``input_ids``).

    Attributes:
        logprobs: ``[B, L]`` log p(token_j | tokens_<j); position 0 is 0.
        entropy: ``[B, L]`` entropy of the distribution that scored token j, or ``None``.
        extra_logprobs: ``[B, L, M]`` log p of ``extra_ids`` at each position, or ``None``.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    extra_logprobs: torch.Tensor | None = None


class HFPolicy:
    """Wraps an ``AutoModelForCausalLM`` and its tokenizer.

    Args:
        model: the causal LM (optionally wrapped by ``peft``).
        tokenizer: its tokenizer (padding side is irrelevant: credo pads itself).
        device: where to run (default: the model's device).
        adapters_disabled: run the model with its LoRA adapters switched off (default
            false; the frozen reference of a LoRA run shares the policy's model this way).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str | torch.device | None = None,
        *,
        adapters_disabled: bool = False,
    ) -> None:
        self.model = model
        self.adapters_disabled = adapters_disabled
        self.tokenizer = tokenizer
        self.device = (
            torch.device(device) if device is not None else next(model.parameters()).device
        )
        self.model.to(self.device)
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_id = int(pad)
        self.stop_ids = self._stop_ids()
        # transformers ≥ 5.x calls the KV cache `cache`; older releases `past_key_values`.
        # A peft wrapper forwards **kwargs: look at the model it wraps.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(type(base).forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keep_arg = next(
            (k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None
        )
        self.vocab_size = int(getattr(base.config, "vocab_size", 0) or len(tokenizer))
        #: :meth:`score` trims logits to the scored positions from this vocabulary size on
        #: (below it the saving is nil, and scoring everything keeps the built-in model's
        #: numbers identical to earlier versions).
        self.trim_min_vocab = TRIM_MIN_VOCAB
        #: Counters of prefill and KV reuse (cumulative, over every generate call).
        self.kv_stats = KVStats()
        #: The per-session KV caches (``None``: reuse off); see :meth:`configure_kv_reuse`.
        self.kv_sessions: KVSessions | None = None
        #: Why reuse was switched off by the policy itself (a model whose cache is not a
        #: plain per-layer key/value list), or ``None``.
        self.kv_off_reason: str | None = None
        self._weights_stamp: tuple[int, ...] | None = None
        self.configure_kv_reuse()

    @property
    def is_peft(self) -> bool:
        """The model is a ``peft`` model (LoRA adapters)."""
        return hasattr(self.model, "disable_adapter") and hasattr(self.model, "peft_config")

    @contextlib.contextmanager
    def _running(self) -> Any:
        """The context of every forward pass: the adapters switched off for a frozen
        reference, and autocast when the model is marked for mixed precision
        (:mod:`credo.policy.precision`)."""
        with contextlib.ExitStack() as stack:
            if self.adapters_disabled and self.is_peft:
                stack.enter_context(self.model.disable_adapter())
            stack.enter_context(precision(self.model, self.device))
            yield

    # ------------------------------------------------------------ sessions
    def configure_kv_reuse(
        self,
        enabled: bool = True,
        budget_mb: float = DEFAULT_KV_CACHE_MB,
        *,
        min_prefix: int = DEFAULT_MIN_PREFIX,
    ) -> None:
        """Switch multi-turn KV reuse on or off (on by default) and set its memory budget.

        Args:
            enabled: keep per-session caches when :meth:`generate` gets ``sessions``
                (``rollout.kv_reuse``). A model whose cache is not a plain per-layer
                key/value list switches it off by itself at the first generation
                (:attr:`kv_off_reason` says why).
            budget_mb: most MiB of cached keys and values kept between calls
                (``rollout.kv_cache_mb``); least recently used sessions are evicted
                beyond it.
            min_prefix: shortest shared prefix worth reusing, in tokens.

        Drops every cached session.
        """
        if budget_mb < 0:
            raise ValueError(f"the KV cache budget must be ≥ 0 MiB, got {budget_mb}")
        self.kv_sessions = (
            KVSessions(int(budget_mb * 2**20), min_prefix, stats=self.kv_stats)
            if enabled and self.kv_off_reason is None
            else None
        )

    @property
    def kv_reuse(self) -> bool:
        """Multi-turn KV reuse is on."""
        return self.kv_sessions is not None

    def end_sessions(self, keys: Iterable[Hashable]) -> None:
        """Free the cached keys and values of these sessions (finished episodes)."""
        if self.kv_sessions is not None:
            self.kv_sessions.end(keys)

    def _fresh_sessions(self, store: KVSessions) -> None:
        """Drop every cached session when a weight changed since the last call (an
        optimizer step or :meth:`load_weights` bumps the parameters' version counters):
        keys and values computed by other weights would no longer be exact."""
        stamp = tuple(p._version for p in self.model.parameters())
        if stamp != self._weights_stamp:
            store.clear()
            self._weights_stamp = stamp

    # ------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> HFPolicy:
        """Load a model folder (or hub name, where reachable) and its tokenizer.

        A LoRA adapter folder (``adapter_config.json``, as :meth:`save` writes for a peft
        model) loads its base model from the folder the adapter names, then the adapters
        (trainable). ``dtype=None`` keeps the dtype the weights were saved in.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        adapter_cfg = Path(path) / "adapter_config.json"
        if adapter_cfg.exists():
            peft = require_peft()
            base_path = json.loads(adapter_cfg.read_text()).get("base_model_name_or_path")
            if not base_path:
                raise ValueError(f"{adapter_cfg} does not name its base model")
            base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=dtype, **kwargs)
            model = peft.PeftModel.from_pretrained(base, str(path), is_trainable=True)
            return cls(model, AutoTokenizer.from_pretrained(str(path)), device=device)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kwargs)
        return cls(model, tokenizer, device=device)

    def frozen_copy(self) -> HFPolicy:
        """A copy of this policy's model, in eval mode and without gradients (its own KV
        caches, default reuse settings): the frozen reference, a sampling copy."""
        frozen = HFPolicy(copy.deepcopy(self.model).eval(), self.tokenizer, self.device)
        for p in frozen.model.parameters():
            p.requires_grad_(False)
        return frozen

    def save(self, path: str | Path) -> None:
        """Save weights (safetensors) and tokenizer as an ordinary HF folder; a peft model
        saves its adapters only (``adapter_model.safetensors`` + ``adapter_config.json``)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)

    def load_weights(self, path: str | Path) -> None:
        """Restore weights saved by :meth:`save` into this (identically built) policy.

        Keeps the model's set-up (dtype, device, LoRA wrapping, gradient checkpointing):
        an adapter folder restores the adapters, a model folder every weight (tied
        weights such as a shared ``lm_head`` may be absent from the files). Raises
        ``ValueError`` when the folder does not fit the model.
        """
        from safetensors.torch import load_file

        if self.kv_sessions is not None:
            self.kv_sessions.clear()  # keys and values of the old weights
        path = Path(path)
        if (path / "adapter_model.safetensors").exists():
            if not self.is_peft:
                raise ValueError(f"{path} holds LoRA adapters but the policy has none")
            peft = require_peft()
            state = load_file(str(path / "adapter_model.safetensors"))
            own = set(peft.get_peft_model_state_dict(self.model))
            if set(state) != own:
                raise ValueError(
                    f"{path}: the adapters do not fit the model (missing "
                    f"{sorted(own - set(state))[:3]}, unexpected {sorted(set(state) - own)[:3]})"
                )
            peft.set_peft_model_state_dict(self.model, state)
            return
        if self.is_peft:
            raise ValueError(f"{path} holds a full model but the policy is a LoRA model")
        index = path / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (path / "model.safetensors").exists():
            files = ["model.safetensors"]
        else:
            raise ValueError(f"{path} has neither model.safetensors nor adapter weights")
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(str(path / name)))
        # weights this model shares (a tied output layer) must be one tensor in the files
        # too: else loading writes one over the other and the model is silently broken
        shared = self.model.get_input_embeddings().weight
        tied = [n for n, p in self.model.named_parameters(remove_duplicate=False) if p is shared]
        held = [state[n] for n in tied if n in state]
        if any(not torch.equal(held[0], t) for t in held[1:]):
            raise ValueError(
                f"{path} holds an output layer of its own but this model ties it to the "
                f"input embedding ({', '.join(tied)}); for the built-in model set "
                "model.tiny.tie_embeddings=false"
            )
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        own = {n for n, _ in self.model.named_parameters()}  # tied duplicates listed once
        missing = [k for k in missing if k in own and k not in state]
        if missing or unexpected:
            raise ValueError(
                f"{path} does not fit the model: missing {missing[:5]}, unexpected "
                f"{list(unexpected)[:5]}"
            )

    def _stop_ids(self) -> list[int]:
        ids: set[int] = set()
        eos = self.tokenizer.eos_token_id
        if eos is not None:
            ids.add(int(eos))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(int(i) for i in gen_eos)
        vocab = self.tokenizer.get_vocab()
        for tok in _CHAT_END_TOKENS:
            if tok in vocab:
                ids.add(int(vocab[tok]))
        if not ids:
            raise ValueError("the tokenizer has no eos token: cannot tell where an action ends")
        return sorted(ids)

    # ----------------------------------------------------------- sampling
    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        sessions: Sequence[Hashable] | None = None,
    ) -> list[Generation]:
        """Sample one response per prompt, all prompts in one left-padded batch.

        Rows that have produced a stop token keep riding along (their later tokens are
        discarded); the loop ends when every row has stopped or at ``max_new_tokens``.

        Args:
            prompts: token ids, one list per row.
            sampling: how to sample.
            generator: the random stream (``None``: torch's global one).
            sessions: one opaque key per row (e.g. one per live episode), or ``None``.
                With KV reuse on (:meth:`configure_kv_reuse`), a row whose prompt starts
                with at least ``min_prefix`` tokens its session's model already read
                feeds only the rest; the others get a full prefill. Each row's session
                then keeps its prompt and response. Free finished sessions with
                :meth:`end_sessions`.
        """
        if not prompts:
            return []
        if sessions is not None and len(sessions) != len(prompts):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(sessions)} sessions")
        store = self.kv_sessions if sessions is not None else None
        if store is not None and sessions is not None:
            self._fresh_sessions(store)
            rows = [store.take(key, p) for key, p in zip(sessions, prompts)]
        else:
            rows = [(0, None)] * len(prompts)
        if any(c > 0 for c, _ in rows):
            input_ids, attn, pos, past = self._cached_batch(prompts, rows)
        else:
            input_ids, attn = self._full_batch(prompts)
            pos, past = (attn.cumsum(-1) - 1).clamp(min=0), None
        self.kv_stats.prefill_tokens += sum(len(p) - c for p, (c, _) in zip(prompts, rows))
        was_training = self.model.training
        self.model.eval()
        try:
            with self._running():
                results, past, attn = self._generate(
                    input_ids, attn, pos, past, sampling, _on_device(generator, self.device)
                )
        finally:
            self.model.train(was_training)
        if store is not None and sessions is not None:
            self._keep(store, sessions, prompts, results, past, attn)
        return results

    @torch.no_grad()
    def embed(self, prompts: Sequence[Sequence[int]], micro_batch: int = 32) -> torch.Tensor:
        """``[B, d]`` float32: the last hidden layer averaged over each prompt's tokens
        (the policy's own reading of a state; the trajectory graph's embedding merge).
        No graph is built; the model's train/eval mode is restored."""
        out: list[torch.Tensor] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for i in range(0, len(prompts), micro_batch):
                chunk = [list(p) for p in prompts[i : i + micro_batch]]
                width = max(1, max(len(p) for p in chunk))  # right-padded: positions from 0
                ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
                attn = torch.zeros((len(chunk), width), dtype=torch.long)
                for j, p in enumerate(chunk):
                    ids[j, : len(p)] = torch.as_tensor(p, dtype=torch.long)
                    attn[j, : len(p)] = 1
                ids, attn = ids.to(self.device), attn.to(self.device)
                with self._running():
                    hidden = self.model(
                        input_ids=ids, attention_mask=attn, output_hidden_states=True
                    ).hidden_states[-1]
                m = attn.unsqueeze(-1).to(hidden.dtype)
                out.append(((hidden * m).sum(1) / m.sum(1).clamp(min=1)).float().cpu())
        finally:
            self.model.train(was_training)
        if not out:
            return torch.zeros(0, int(self.model.config.hidden_size))
        return torch.cat(out)

    def _full_batch(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` ``[B, W]``: the prompts left-padded."""
        b = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if len(p):
                input_ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
                attn[i, width - len(p) :] = 1
        return input_ids.to(self.device), attn.to(self.device)

    def _cached_batch(
        self, prompts: list[list[int]], rows: list[tuple[int, KVEntry | None]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """The prefill batch of rows with cached prefixes of lengths ``c_i``.

        Returns ``(input_ids [B, W], attention_mask [B, P + W], position_ids [B, W],
        cache)``: the cache holds row i's prefix right-aligned in its ``P`` columns, the
        new tokens ``prompt_i[c_i:]`` are left-padded in ``W`` columns with positions
        ``c_i, c_i + 1, …``; the mask is 0 on the holes in both blocks.
        """
        like = next(e for c, e in rows if c > 0 and e is not None).layers
        layers, past_mask = stack_caches(rows, like)
        new = [p[c:] for p, (c, _) in zip(prompts, rows)]
        b, width = len(prompts), max(len(n) for n in new)
        input_ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((b, width), dtype=torch.long)
        pos = torch.zeros((b, width), dtype=torch.long)
        for i, (n, (c, _)) in enumerate(zip(new, rows)):
            if n:
                input_ids[i, width - len(n) :] = torch.as_tensor(n, dtype=torch.long)
                new_mask[i, width - len(n) :] = 1
                pos[i, width - len(n) :] = torch.arange(c, c + len(n))
        attn = torch.cat([past_mask, new_mask], 1)
        dev = self.device
        return input_ids.to(dev), attn.to(dev), pos.to(dev), make_cache(layers)

    def _keep(
        self,
        store: KVSessions,
        sessions: Sequence[Hashable],
        prompts: list[list[int]],
        results: list[Generation],
        past: Any,
        attn: torch.Tensor,
    ) -> None:
        """Store each row's prompt and the response tokens the model read (all but the
        last sampled one, and nothing after a stop token) under its session."""
        layers = cache_layers(past)
        if layers is None:
            self.kv_off_reason = (
                f"{type(past).__name__} is not a plain per-layer key/value cache "
                "(sliding-window, recurrent or quantised layers): KV reuse is off"
            )
            self.kv_sessions = None
            return
        fed = max(len(g.token_ids) for g in results) - 1  # decode steps that fed a token
        for i, (key, prompt, gen) in enumerate(zip(sessions, prompts, results)):
            ids = list(prompt) + gen.token_ids[: min(len(gen.token_ids), fed)]
            row = [(k[i], v[i]) for k, v in layers]
            store.put(key, row_entry(row, attn[i], ids))

    def _generate(
        self,
        input_ids: torch.Tensor,
        attn: torch.Tensor,
        pos: torch.Tensor,
        past: Any,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[list[Generation], Any, torch.Tensor]:
        """Prefill (``past``: a cache of earlier columns of ``attn``, or ``None``) and
        decode; returns the generations, the final cache and the final attention mask
        (``[B, T]``, one column per cached token)."""
        b = input_ids.shape[0]
        keep = {self._keep_arg: 1} if self._keep_arg else {}  # prefill: last position only
        if past is not None:
            keep[self._cache_arg] = past
        start = time.perf_counter()
        out = self.model(
            input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True, **keep
        )
        if self.device.type == "cuda":  # count the prefill, not its launch
            torch.cuda.synchronize(self.device)
        self.kv_stats.prefill_seconds += time.perf_counter() - start
        past = _cache_of(out)
        logits = out.logits[:, -1, :].float()
        next_pos = pos[:, -1:] + 1
        stop = torch.as_tensor(self.stop_ids, device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        length = torch.full((b,), sampling.max_new_tokens, dtype=torch.long, device=self.device)
        tokens, lps, auxes, aux_lps, tops, top_lps = [], [], [], [], [], []
        for k in range(sampling.max_new_tokens):
            tok, lp, aux, aux_lp = _sample(logits, sampling, generator)
            tokens.append(tok)
            lps.append(lp)
            if aux is not None:
                auxes.append(aux)
                aux_lps.append(aux_lp)
            if sampling.topk_logprobs > 0:
                t = sampling.temperature if sampling.temperature > 0 else 1.0
                top_lp, top = F.log_softmax(logits / t, dim=-1).topk(sampling.topk_logprobs, -1)
                tops.append(top)
                top_lps.append(top_lp)
            newly = torch.isin(tok, stop) & ~done
            length = torch.where(newly, torch.full_like(length, k + 1), length)
            done |= newly
            if bool(done.all()) or k == sampling.max_new_tokens - 1:
                break
            attn = torch.cat([attn, torch.ones((b, 1), dtype=attn.dtype, device=self.device)], 1)
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=next_pos,
                use_cache=True,
                **{self._cache_arg: past},
            )
            past = _cache_of(out)
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        tok_mat = torch.stack(tokens, 1).cpu()
        lp_mat = torch.stack(lps, 1).cpu()
        aux_mat = torch.stack(auxes, 1).cpu() if auxes else None
        aux_lp_mat = torch.stack(aux_lps, 1).cpu() if auxes else None
        top_mat = torch.stack(tops, 1).cpu() if tops else None
        top_lp_mat = torch.stack(top_lps, 1).cpu() if tops else None
        results = []
        for i in range(b):
            n = int(length[i])
            ids = tok_mat[i, :n].tolist()
            finished = bool(done[i])
            body = ids[:-1] if finished else ids
            results.append(
                Generation(
                    token_ids=ids,
                    logprobs=lp_mat[i, :n].clone(),
                    text=self.tokenizer.decode(body, skip_special_tokens=True).strip(),
                    finished=finished,
                    aux_ids=aux_mat[i, :n].clone() if aux_mat is not None else None,
                    aux_logprobs=aux_lp_mat[i, :n].clone() if aux_lp_mat is not None else None,
                    topk_ids=top_mat[i, :n].clone() if top_mat is not None else None,
                    topk_logprobs=top_lp_mat[i, :n].clone() if top_lp_mat is not None else None,
                )
            )
        return results, past, attn

    # ------------------------------------------------------------- scoring
    def score(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        entropy: bool = False,
        entropy_grad: bool = False,
        extra_ids: torch.Tensor | None = None,
        scored: torch.Tensor | None = None,
    ) -> ScoreOutput:
        """Log-probs of right-padded sequences (with grad when grad is enabled).

        Args:
            input_ids: ``[B, L]`` tokens, right-padded.
            attention_mask: ``[B, L]`` real tokens.
            temperature: logits are divided by it (as when sampling); 0 is treated as 1.
            entropy: also return the per-position entropy (no grad).
            entropy_grad: the entropy keeps its graph (for an entropy bonus).
            extra_ids: ``[B, L, M]`` token ids whose log-probs to gather at each position.
            scored: ``[B, L]`` bool, the positions whose values the caller needs (e.g. the
                response tokens), or ``None`` (default): all. With a vocabulary of at least
                ``trim_min_vocab`` tokens, logits are then computed only for the last K
                real tokens of every row, K just covering each row's scored positions
                (responses end their rows, prompts are long: most of the ``[B, L, V]``
                logits are never needed). Values outside that window are 0.
        """
        input_ids = input_ids.to(self.device)
        mask = attention_mask.to(self.device).bool()
        window = self._score_window(mask, scored)
        if window is None:
            return self._score_all(input_ids, mask, temperature, entropy, entropy_grad, extra_ids)
        return self._score_last(
            input_ids, mask, window, temperature, entropy, entropy_grad, extra_ids
        )

    def _score_window(self, mask: torch.Tensor, scored: torch.Tensor | None) -> int | None:
        """K, the number of final tokens per row holding every scored position, or
        ``None`` when scoring everything is as cheap (small vocabulary, short rows)."""
        if scored is None or self.vocab_size < self.trim_min_vocab:
            return None
        scored = scored.to(mask.device).bool() & mask
        length = mask.shape[1]
        if not bool(scored.any()):
            return 0
        first = torch.where(scored.any(1), scored.float().argmax(1), mask.sum(1))
        k = int((mask.sum(1) - first).max())
        return None if k + 1 >= length else k

    def _score_all(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        temperature: float,
        entropy: bool,
        entropy_grad: bool,
        extra_ids: torch.Tensor | None,
    ) -> ScoreOutput:
        with self._running():
            logits = self.model(
                input_ids=input_ids, attention_mask=mask.long(), use_cache=False
            ).logits
        t = temperature if temperature > 0 else 1.0
        logp_all = F.log_softmax(logits[:, :-1].float() / t, dim=-1)
        b, length = input_ids.shape
        lp = torch.zeros((b, length), dtype=torch.float32, device=self.device)
        lp[:, 1:] = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        lp = lp * mask.to(lp.dtype)
        ent = None
        if entropy or entropy_grad:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = torch.zeros((b, length), dtype=torch.float32, device=self.device)
                ent[:, 1:] = -(logp_all.exp() * logp_all).sum(-1)
        extra = None
        if extra_ids is not None:
            m = extra_ids.shape[-1]
            extra = torch.zeros((b, length, m), dtype=torch.float32, device=self.device)
            extra[:, 1:] = logp_all.gather(-1, extra_ids[:, 1:].to(self.device).clamp(min=0))
        return ScoreOutput(lp, ent, extra)

    def _score_last(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        k: int,
        temperature: float,
        entropy: bool,
        entropy_grad: bool,
        extra_ids: torch.Tensor | None,
    ) -> ScoreOutput:
        """Score the last ``k`` real tokens of every row: right-align the rows (left
        padding, positions counted from the mask, as in :meth:`generate`), ask the model
        for the last ``k + 1`` positions' logits only, and put the values back in place."""
        b, length = input_ids.shape
        lp = torch.zeros((b, length), dtype=torch.float32, device=self.device)
        ent = torch.zeros_like(lp) if entropy or entropy_grad else None
        m = extra_ids.shape[-1] if extra_ids is not None else 0
        extra = (
            torch.zeros((b, length, m), dtype=torch.float32, device=self.device)
            if extra_ids is not None
            else None
        )
        if k == 0:
            return ScoreOutput(lp, ent, extra)
        shift = length - mask.sum(1)  # [B] how far each row moves right
        src = torch.arange(length, device=self.device)[None] - shift[:, None]  # [B, L]
        real = src >= 0
        ids = input_ids.gather(1, src.clamp(min=0)).masked_fill(~real, self.pad_id)
        pos = (real.long().cumsum(1) - 1).clamp(min=0)
        keep = {self._keep_arg: k + 1} if self._keep_arg else {}
        with self._running():
            logits = self.model(
                input_ids=ids,
                attention_mask=real.long(),
                position_ids=pos,
                use_cache=False,
                **keep,
            ).logits[:, -(k + 1) :]
        t = temperature if temperature > 0 else 1.0
        logp = F.log_softmax(logits[:, :-1].float() / t, dim=-1)  # [B, k, V]: columns L-k..
        orig = src[:, length - k :]  # original column of each scored token
        ok = orig >= 1  # padding and position 0 get no value
        index = orig.clamp(min=0)
        values = logp.gather(-1, ids[:, length - k :, None]).squeeze(-1)
        lp = lp.scatter(1, index, torch.where(ok, values, torch.zeros_like(values)))
        if ent is not None:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                h = -(logp.exp() * logp).sum(-1)
                ent = ent.scatter(1, index, torch.where(ok, h, torch.zeros_like(h)))
        if extra is not None and extra_ids is not None:
            idx3 = index[..., None].expand(-1, -1, m)
            aux = extra_ids.to(self.device).gather(1, idx3).clamp(min=0)
            vals = logp.gather(-1, aux)
            extra = extra.scatter(1, idx3, torch.where(ok[..., None], vals, torch.zeros_like(vals)))
        return ScoreOutput(lp, ent, extra)

    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0
    ) -> torch.Tensor:
        return self.score(input_ids, attention_mask, temperature=temperature).logprobs

    def parameters(self) -> Any:
        return self.model.parameters()


def _on_device(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on ``device`` for sampling there: a CPU generator (what the trainer
    passes) seeds a fresh device generator from its own stream, so runs stay determined
    by the CPU seed on any device."""
    if generator is None or generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _sample(
    logits: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One token per row from ``logits [B, V]`` → (token [B], logprob [B], aux [B, M] | None,
    aux log-probs [B, M] | None). Auxiliary tokens are drawn with replacement from the
    temperature-scaled full distribution (no top-p), independently of the sampled token."""
    t = sp.temperature if sp.temperature > 0 else 1.0
    logp = F.log_softmax(logits / t, dim=-1)
    if sp.temperature == 0:
        tok = logp.argmax(-1)
    else:
        probs = logp.exp()
        if sp.top_p < 1.0:
            sorted_p, order = probs.sort(-1, descending=True)
            keep = (sorted_p.cumsum(-1) - sorted_p) < sp.top_p
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    aux = aux_lp = None
    if sp.aux_samples > 0:
        aux = torch.multinomial(logp.exp(), sp.aux_samples, replacement=True, generator=generator)
        aux_lp = logp.gather(-1, aux)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1), aux, aux_lp
