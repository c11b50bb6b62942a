"""``HFPolicy``: any Hugging Face causal LM as a credo policy.

Batched, left-padded sampling with a KV cache (temperature, top-p, stop at the end of
an action), per-token log-probs of sampled and given sequences, and train-mode log-probs
with grad for the loss.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from credo.policy.base import Generation, SamplingParams

__all__ = ["HFPolicy", "ScoreOutput"]

try:  # transformers' per-file progress bars would fight with credo's own display
    from transformers.utils import logging as _hf_logging

    _hf_logging.disable_progress_bar()
except ImportError:  # pragma: no cover
    pass

_CHAT_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


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
        model: the causal LM.
        tokenizer: its tokenizer (padding side is irrelevant: credo pads itself).
        device: where to run (default: the model's device).
    """

    def __init__(
        self, model: Any, tokenizer: Any, device: str | torch.device | None = None
    ) -> None:
        self.model = model
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
        # transformers ≥ 5.x calls the KV cache `cache`; older releases `past_key_values`
        params = inspect.signature(type(model).forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

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
        """Load a model folder (or hub name, where reachable) and its tokenizer."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kwargs)
        return cls(model, tokenizer, device=device)

    def save(self, path: str | Path) -> None:
        """Save weights (safetensors) and tokenizer as an ordinary HF folder."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)

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
    ) -> list[Generation]:
        """Sample one response per prompt, all prompts in one left-padded batch.

        Rows that have produced a stop token keep riding along (their later tokens are
        discarded); the loop ends when every row has stopped or at ``max_new_tokens``.
        """
        if not prompts:
            return []
        was_training = self.model.training
        self.model.eval()
        b = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if len(p):
                input_ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
                attn[i, width - len(p) :] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True)
        past = _cache_of(out)
        logits = out.logits[:, -1, :].float()
        next_pos = pos[:, -1:] + 1
        stop = torch.as_tensor(self.stop_ids, device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        length = torch.full((b,), sampling.max_new_tokens, dtype=torch.long, device=self.device)
        tokens, lps, auxes, aux_lps = [], [], [], []
        for k in range(sampling.max_new_tokens):
            tok, lp, aux, aux_lp = _sample(logits, sampling, generator)
            tokens.append(tok)
            lps.append(lp)
            if aux is not None:
                auxes.append(aux)
                aux_lps.append(aux_lp)
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
        self.model.train(was_training)
        tok_mat = torch.stack(tokens, 1).cpu()
        lp_mat = torch.stack(lps, 1).cpu()
        aux_mat = torch.stack(auxes, 1).cpu() if auxes else None
        aux_lp_mat = torch.stack(aux_lps, 1).cpu() if auxes else None
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
                )
            )
        return results

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
    ) -> ScoreOutput:
        """Log-probs of right-padded sequences (with grad when grad is enabled).

        Args:
            input_ids: ``[B, L]`` tokens, right-padded.
            attention_mask: ``[B, L]`` real tokens.
            temperature: logits are divided by it (as when sampling); 0 is treated as 1.
            entropy: also return the per-position entropy (no grad).
            entropy_grad: the entropy keeps its graph (for an entropy bonus).
            extra_ids: ``[B, L, M]`` token ids whose log-probs to gather at each position.
        """
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask.long()).logits
        t = temperature if temperature > 0 else 1.0
        logp_all = F.log_softmax(logits[:, :-1].float() / t, dim=-1)
        b, length = input_ids.shape
        lp = torch.zeros((b, length), dtype=torch.float32, device=self.device)
        lp[:, 1:] = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        lp = lp * attention_mask.to(lp.dtype)
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

    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0
    ) -> torch.Tensor:
        return self.score(input_ids, attention_mask, temperature=temperature).logprobs

    def parameters(self) -> Any:
        return self.model.parameters()


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
