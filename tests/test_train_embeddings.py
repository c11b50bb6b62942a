"""The trajectory graph's embedding merge in training: the policy's state embeddings
(:meth:`HFPolicy.embed`) and the part that puts them in the forest before credit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from credo.policy import TinyModelConfig, create_tiny_policy
from credo.train.config import load_config
from credo.train.loop import train
from credo.train.parts import PARTS
from credo.train.parts.state_embeddings import _wanted
from small_run import SMALL


def test_embed_is_the_mean_last_hidden_layer_whatever_the_batch() -> None:
    policy = create_tiny_policy(
        ["a", "b", "c"], TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2), seed=0
    )
    enc = lambda s: policy.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    prompts = [enc("a b c a"), enc("b"), enc("c c")]
    policy.model.train()
    together = policy.embed(prompts)
    alone = torch.cat([policy.embed([p]) for p in prompts])
    assert together.shape == (3, 16) and not together.requires_grad
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)  # padding changes nothing
    assert policy.model.training  # the mode is restored
    with torch.no_grad():  # by hand: the mean of the last hidden layer over the tokens
        ids = torch.tensor([prompts[0]])
        hidden = policy.model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    policy.model.train()
    torch.testing.assert_close(together[0], hidden[0].mean(0), atol=1e-5, rtol=0)


def test_the_part_is_wanted_only_for_an_embedding_merge() -> None:
    embed = load_config(
        "graph", ["credit.params={similarity: embedding, similarity_threshold: 0.9}"]
    )
    assert _wanted(embed) and not _wanted(load_config("graph")) and not _wanted(load_config("grpo"))
    assert "state_embeddings" in PARTS.names()


@pytest.mark.slow
def test_graph_with_embedding_merge_trains(tmp_path: Path) -> None:
    cfg = load_config(
        "graph",
        [
            *SMALL,
            "credit.params={similarity: embedding, similarity_threshold: 0.99}",
            "train.iterations=2",
            f"train.runs_dir={tmp_path}",
            "train.name=embed",
        ],
    )
    res = train(cfg, quiet=True)
    for r in res.metrics:  # signal: mixed groups, non-zero advantages and gradients
        assert r["credit/embed_seconds"] > 0
        print("merged", r["credit/embed_merged"])
        assert 0 < r["credit/embed_merged"] < 1  # some states merge, not all
        assert 0 < r["rollout/success_rate"] < 1
        assert r["policy/grad_norm"] > 0
