"""Policies: the protocol, the Hugging Face backend and the built-in tiny model."""

from credo.policy.base import Generation, Policy, SamplingParams, SessionPolicy
from credo.policy.hf import HFPolicy, ScoreOutput
from credo.policy.kvcache import KVSessions
from credo.policy.lora import LoRAConfig, apply_lora, merge_lora, shared_reference
from credo.policy.models import MODEL_ALIASES, resolve_model
from credo.policy.tiny import TinyModelConfig, create_tiny_policy
from credo.policy.tokenizer import build_word_tokenizer

__all__ = [
    "MODEL_ALIASES",
    "Generation",
    "HFPolicy",
    "KVSessions",
    "LoRAConfig",
    "Policy",
    "SamplingParams",
    "ScoreOutput",
    "SessionPolicy",
    "TinyModelConfig",
    "apply_lora",
    "build_word_tokenizer",
    "create_tiny_policy",
    "merge_lora",
    "resolve_model",
    "shared_reference",
]
