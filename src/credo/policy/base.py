"""The policy protocol and sampling parameters."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Generation", "Policy", "SamplingParams", "SessionPolicy"]


#: The smallest positive sampling temperature: the logits are divided by it, and below
#: this a float32 logit can overflow to inf (a request at 1e-308 turned the sampling
#: distribution into NaN); 0 means greedy.
MIN_TEMPERATURE = 1e-3


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a response.

    Attributes:
        temperature: softmax temperature; 0 means greedy (argmax), else at least
            :data:`MIN_TEMPERATURE`. Default 1.0.
        top_p: nucleus sampling mass (1.0 = off). Log-probs are always those of the
            temperature-scaled full distribution, as the trainer computes them.
        max_new_tokens: cap on the response length (the end-of-action token included).
        aux_samples: M > 0 also draws M auxiliary tokens per position from the same
            distribution (KLPO); stored in ``Generation.aux_ids``.
        topk_logprobs: K > 0 also stores the K most likely token ids at every position
            with their log-probs (KLPO's top-K KL); in ``Generation.topk_ids``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    aux_samples: int = 0
    topk_logprobs: int = 0

    def __post_init__(self) -> None:
        if self.temperature != 0 and not MIN_TEMPERATURE <= self.temperature < float("inf"):
            raise ValueError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got "
                f"{self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    """One sampled response.

    Attributes:
        token_ids: response tokens, the stop token included when one was produced.
        logprobs: ``[len(token_ids)]`` sampler log-probs of those tokens.
        text: decoded response without the stop token.
        finished: a stop token was produced (else the length cap was hit).
        aux_ids: ``[len(token_ids), M]`` auxiliary tokens, or ``None``.
        aux_logprobs: ``[len(token_ids), M]`` the sampler's log-probs of them, or ``None``.
        topk_ids: ``[len(token_ids), K]`` the sampler's K most likely tokens, or ``None``.
        topk_logprobs: ``[len(token_ids), K]`` their log-probs, or ``None``.
    """

    token_ids: list[int]
    logprobs: torch.Tensor
    text: str
    finished: bool
    aux_ids: torch.Tensor | None = None
    aux_logprobs: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None


@runtime_checkable
class Policy(Protocol):
    """What samplers and trainers need from a model."""

    tokenizer: Any

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Sample one response per prompt (token id lists), all in one batch."""
        ...

    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0
    ) -> torch.Tensor:
        """``[B, L]`` log-prob of each token given the previous ones (position 0 gets 0).
        Runs with grad when grad is enabled."""
        ...


@runtime_checkable
class SessionPolicy(Policy, Protocol):
    """A policy that can keep each episode's KV cache between turns.

    ``generate(..., sessions=keys)`` takes one opaque hashable key per prompt (one per
    live episode); a prompt that extends what its session's model already read feeds only
    the new tokens, any other gets a full prefill (decided from the token ids). The
    responses are the same as without ``sessions``. ``end_sessions(keys)`` frees the
    caches of finished episodes. :class:`credo.policy.hf.HFPolicy` is one
    (:mod:`credo.policy.kvcache`).
    """

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        sessions: Sequence[Hashable] | None = None,
    ) -> list[Generation]:
        """Sample one response per prompt; ``sessions``: one key per prompt, or ``None``."""
        ...

    def end_sessions(self, keys: Iterable[Hashable]) -> None:
        """Free the cached keys and values of these sessions."""
        ...
