"""``model.tiny.tie_embeddings=false``: the built-in model's output layer gets its own
weights (on ``shop``'s ``multi`` the tied model's category embeddings collapsed onto one
vector in SFT; docs/results.md). The default adds nothing to a warm start's key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from credo.policy.hf import HFPolicy
from credo.train.config import load_config
from credo.train.run import build_run
from credo.train.warmstart import warm_start_key

SMALL = "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64"


def _policy(tie: bool) -> HFPolicy:
    cfg = load_config("grpo", [f"{SMALL}, tie_embeddings: {str(tie).lower()}}}"])
    run = build_run(cfg)
    run.close()
    return run.policy


def test_untied_has_its_own_output_layer_and_the_same_input_embedding() -> None:
    tied, untied = _policy(True), _policy(False)
    t, u = tied.model, untied.model
    assert t.lm_head.weight is t.get_input_embeddings().weight
    assert u.lm_head.weight is not u.get_input_embeddings().weight
    # the same initial input embedding (number codes included) and blocks
    assert torch.equal(t.get_input_embeddings().weight, u.get_input_embeddings().weight)
    assert torch.equal(t.model.layers[0].mlp.up_proj.weight, u.model.layers[0].mlp.up_proj.weight)
    # a gradient on the logits reaches the output layer, not the input embedding, through it
    ids = torch.tensor([[untied.tokenizer.bos_token_id or 1, 5, 6]])
    u.zero_grad()
    u(input_ids=ids).logits[0, -1, 7].backward()
    assert u.lm_head.weight.grad[7].abs().sum() > 0
    assert u.get_input_embeddings().weight.grad[7].abs().sum() == 0  # token 7 not in input


def test_an_untied_model_saves_and_loads_untied(tmp_path: Path) -> None:
    untied = _policy(False)
    with torch.no_grad():
        untied.model.lm_head.weight.add_(1.0)
    untied.save(tmp_path / "p")
    back = HFPolicy.from_pretrained(tmp_path / "p")
    m = back.model
    assert m.lm_head.weight is not m.get_input_embeddings().weight
    assert torch.equal(m.lm_head.weight, untied.model.lm_head.weight)
    assert torch.equal(m.get_input_embeddings().weight, untied.model.get_input_embeddings().weight)


def test_untied_weights_are_refused_by_a_tied_model_and_the_other_way(tmp_path: Path) -> None:
    """Loading them would write the output layer over the input embedding: refused."""
    untied, tied = _policy(False), _policy(True)
    untied.save(tmp_path / "untied")
    tied.save(tmp_path / "tied")
    with pytest.raises(ValueError, match=r"model\.tiny\.tie_embeddings=false"):
        tied.load_weights(tmp_path / "untied")
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        untied.load_weights(tmp_path / "tied")
    tied.load_weights(tmp_path / "tied")  # its own kind loads
    untied.load_weights(tmp_path / "untied")


def test_the_default_keeps_its_warm_start_key_and_untied_gets_its_own() -> None:
    base = load_config("grpo")
    tied = load_config("grpo", ["model.tiny.tie_embeddings=true"])
    untied = load_config("grpo", ["model.tiny.tie_embeddings=false"])
    assert base.model.tiny.tie_embeddings is True
    assert warm_start_key(tied) == warm_start_key(base) != warm_start_key(untied)
