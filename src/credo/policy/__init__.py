"""Policies: the protocol, the Hugging Face backend and the built-in tiny model."""

from credo.policy.base import Generation, Policy, SamplingParams
from credo.policy.hf import HFPolicy, ScoreOutput
from credo.policy.tiny import TinyModelConfig, create_tiny_policy
from credo.policy.tokenizer import build_word_tokenizer

__all__ = [
    "Generation",
    "HFPolicy",
    "Policy",
    "SamplingParams",
    "ScoreOutput",
    "TinyModelConfig",
    "build_word_tokenizer",
    "create_tiny_policy",
]
