"""The built-in model: a small Llama-style causal LM created from a config.

No weights are downloaded: the model is initialised from :class:`TinyModelConfig` with a
word-level tokenizer built from the env's vocabulary, and saved as an ordinary HF folder
(``config.json``, ``model.safetensors``, tokenizer files) that ``from_pretrained`` loads.

One departure from a plain random init: number tokens (``"35"``) start with a sinusoidal
code of their value in the first ``2·len(NUMBER_FREQUENCIES)`` embedding dimensions. A
pretrained LM knows that 35 < 40; a model trained from scratch on a CPU must otherwise
discover the order of every number token from indirect evidence, which we measured to
take far longer than the rest of the warm start (clicking the in-budget item stayed at
chance, 1/3, after 2500 SFT steps without the code; 98 % after 1500 steps with it).
The frequencies run from 0.5 (monotone over 0..100: the order of prices) to 32 (one
step of 0.32π per unit: the small numbers, such as result ranks, get distinct codes
instead of nearly the same one). With only the low frequencies (0.5..4) the copy skills
(search query, size) appeared after 750–2000 clean SFT steps depending on the seed; with
the full range, by step 1000 for both seeds we probed (1 and 2).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from credo.policy.hf import HFPolicy
from credo.policy.tokenizer import build_word_tokenizer

__all__ = [
    "NUMBER_FREQUENCIES",
    "TinyModelConfig",
    "create_tiny_policy",
    "init_number_embeddings",
    "is_tiny",
]

#: Frequencies (in units of π per 100) of the value code given to number tokens.
NUMBER_FREQUENCIES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


@dataclass
class TinyModelConfig:
    """Size of the built-in model (a ``LlamaForCausalLM``).

    Attributes:
        hidden_size: width (default 128).
        num_layers: transformer blocks (default 2).
        num_heads: attention heads (default 8).
        intermediate_size: MLP width (default 256).
        max_position_embeddings: longest prompt + response (default 512).
        number_code: scale of the value code of number tokens (default 1.0; 0 = off).
        tie_embeddings: the output layer shares the input embedding (default true).
            Tied, on ``shop``'s ``multi`` (seed 0) the embeddings of the 12 category
            words collapsed onto nearly one vector in SFT (mean cosine 0.92 after 2,500
            clean steps; colours 0.34) and the model copied the goal's category into
            its search at chance among them; untied they stayed apart (0.14) and the
            copy was learned (docs/results.md). ``false`` gives the output layer its
            own weights.
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 8
    intermediate_size: int = 256
    max_position_embeddings: int = 512
    number_code: float = 1.0
    tie_embeddings: bool = True


def is_tiny(policy: HFPolicy) -> bool:
    """Whether ``policy`` is credo's built-in model (made by :func:`create_tiny_policy`,
    or loaded from a folder one was saved in): its config records its size."""
    return hasattr(policy.model.config, "credo_tiny")


def create_tiny_policy(words: Iterable[str], cfg: TinyModelConfig, *, seed: int = 0) -> HFPolicy:
    """A freshly initialised built-in model over the vocabulary ``words``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_word_tokenizer(words)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=cfg.tie_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config.credo_tiny = asdict(cfg)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    if cfg.number_code:
        init_number_embeddings(model, tokenizer, cfg.number_code)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return HFPolicy(model, tokenizer, device="cpu")


@torch.no_grad()
def init_number_embeddings(model: torch.nn.Module, tokenizer: object, scale: float) -> int:
    """Write ``scale·[cos(πfv/100), sin(πfv/100)]_f`` into the first embedding dimensions
    of every all-digit token with value ``v``; returns how many tokens were set."""
    emb = model.get_input_embeddings().weight
    width = 2 * len(NUMBER_FREQUENCIES)
    if emb.shape[1] < width:
        return 0
    count = 0
    for tok, idx in tokenizer.get_vocab().items():  # type: ignore[attr-defined]
        if tok.isdigit():
            v = math.pi * int(tok) / 100.0
            code = [math.cos(v * f) for f in NUMBER_FREQUENCIES]
            code += [math.sin(v * f) for f in NUMBER_FREQUENCIES]
            emb[idx, :width] = scale * torch.tensor(code, dtype=emb.dtype)
            count += 1
    return count
