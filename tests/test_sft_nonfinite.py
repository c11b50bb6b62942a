"""A warm-start SFT step on a non-finite loss or gradient is refused, not taken.

Found on an H200 (2026-12-04): SmolLM2's warm start in bfloat16 came out with every
weight NaN, and was cached and evaluated as if valid. One AdamW step on a NaN gradient
does that; ``sft_train`` now stops before it with one line."""

from __future__ import annotations

import math

import pytest
import torch

from credo.policy.tiny import TinyModelConfig, create_tiny_policy
from credo.train.sft import sft_train


def _rows(policy) -> list[tuple[list[int], list[int]]]:  # type: ignore[no-untyped-def]
    ids = policy.tokenizer("a b a b")["input_ids"]
    return [(ids[:2], ids[2:]), (ids[:1], ids[1:])]


def test_a_nan_loss_stops_sft_before_the_step() -> None:
    policy = create_tiny_policy(["a", "b"], TinyModelConfig(32, 1, 2, 64), seed=0)
    with torch.no_grad():
        policy.model.get_output_embeddings().weight[0, 0] = float("nan")
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with pytest.raises(FloatingPointError, match=r"SFT step 1 of 3: the loss is nan.*not taken"):
        sft_train(policy, _rows(policy), steps=3, batch_size=2, lr=1e-2)
    after = policy.model.state_dict()
    for k, v in before.items():  # no weight moved (the NaN one stays as it was)
        assert torch.equal(v.nan_to_num(), after[k].nan_to_num()), k


def test_finite_sft_steps_are_taken() -> None:
    policy = create_tiny_policy(["a", "b"], TinyModelConfig(32, 1, 2, 64), seed=0)
    before = policy.model.get_output_embeddings().weight.detach().clone()
    stats = sft_train(policy, _rows(policy), steps=3, batch_size=2, lr=1e-2)
    assert stats.steps == 3 and math.isfinite(stats.final_loss)
    assert not torch.equal(before, policy.model.get_output_embeddings().weight)
