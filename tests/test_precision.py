"""Mixed precision (``model.mixed_precision=bf16``): float32 weights, bfloat16 products
under autocast, a float32 output head; the setting travels with the model object."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from credo.policy import HFPolicy, SamplingParams, create_tiny_policy
from credo.policy.lora import LoRAConfig, apply_lora, merge_lora, shared_reference
from credo.policy.precision import autocast_dtype, enable_mixed_precision, precision
from credo.policy.tiny import TinyModelConfig
from credo.train.config import ConfigError, load_config
from credo.train.run import build_run
from small_run import SMALL

WORDS = [f"w{i}" for i in range(40)]
TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)


def _policy(seed: int = 0) -> HFPolicy:
    return create_tiny_policy(WORDS, TINY, seed=seed)


def _rows(policy: HFPolicy) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, len(WORDS), (3, 12), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[2, 9:] = False
    return ids, mask


def test_plain_model_has_no_autocast_and_the_context_is_a_no_op() -> None:
    policy = _policy()
    assert autocast_dtype(policy.model) is None
    with precision(policy.model, policy.device):
        assert not torch.is_autocast_enabled("cpu")
    enable_mixed_precision(policy.model, None)  # None: nothing to do
    assert autocast_dtype(policy.model) is None


def test_log_probs_are_close_to_float32_and_the_head_stays_float32() -> None:
    policy = _policy()
    ids, mask = _rows(policy)
    with torch.no_grad():
        exact = policy.score(ids, mask).logprobs
    enable_mixed_precision(policy.model, "bf16")
    assert autocast_dtype(policy.model) is torch.bfloat16
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    with torch.no_grad():
        mixed = policy.score(ids, mask).logprobs
        head = policy.model.get_output_embeddings()
        hidden = torch.randn(2, 5, head.in_features)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head(hidden)
    # the head ran in float32 under autocast: exactly the float32 product
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, F.linear(hidden, head.weight), rtol=0, atol=0)
    # bfloat16 products inside the blocks: close to float32, but not equal
    diff = (mixed - exact)[mask]
    assert float(diff.abs().max()) < 0.1
    assert float(diff.abs().max()) > 0.0


def test_gradients_and_weights_stay_float32() -> None:
    policy = _policy()
    enable_mixed_precision(policy.model, "bf16")
    ids, mask = _rows(policy)
    lp = policy.score(ids, mask).logprobs
    (-lp[mask].mean()).backward()
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def test_the_setting_follows_the_model_through_copies_and_lora() -> None:
    pytest.importorskip("peft")
    policy = _policy()
    enable_mixed_precision(policy.model, "bf16")
    # a deep copy (the frozen reference) runs mixed too, with its own head
    twin = copy.deepcopy(policy.model)
    assert autocast_dtype(twin) is torch.bfloat16
    head = twin.get_output_embeddings()
    with torch.no_grad():
        head.weight.zero_()
        out = head(torch.ones(1, head.in_features))
    assert float(out.abs().max()) == 0.0  # the copy's forward uses the copy's weight
    assert float(policy.model.get_output_embeddings().weight.detach().abs().max()) > 0
    lora = apply_lora(policy, LoRAConfig(r=4, alpha=8))
    assert autocast_dtype(lora.model) is torch.bfloat16
    assert autocast_dtype(shared_reference(lora).model) is torch.bfloat16
    assert autocast_dtype(merge_lora(lora).model) is torch.bfloat16


def test_greedy_generation_under_mixed_precision_matches_its_own_scores() -> None:
    policy = _policy()
    enable_mixed_precision(policy.model, "bf16")
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    gens = policy.generate(prompts, SamplingParams(temperature=0, max_new_tokens=4))
    for prompt, gen in zip(prompts, gens):
        ids = torch.tensor([prompt + gen.token_ids])
        mask = torch.ones_like(ids, dtype=torch.bool)
        with torch.no_grad():
            lp = policy.score(ids, mask).logprobs[0, len(prompt) :]
        # KV-cached decoding and one full pass round differently in bfloat16
        torch.testing.assert_close(lp, gen.logprobs, rtol=0, atol=0.05)


def test_bad_settings_stop_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"model.mixed_precision.*bf16"):
        load_config("grpo", ["model.mixed_precision=fp8"])
    with pytest.raises(ConfigError, match=r"set model.dtype=float32"):
        load_config("grpo", ["model.mixed_precision=bf16", "model.dtype=bfloat16"])
    with pytest.raises(ValueError, match="accepted values are bf16"):
        enable_mixed_precision(_policy().model, "fp8")
    half = _policy()
    half.model.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"set model\.dtype=float32"):
        enable_mixed_precision(half.model, "bf16")


@pytest.mark.slow
def test_a_training_run_in_mixed_precision_has_signal(tmp_path) -> None:
    from credo.train.loop import train

    cfg = load_config(
        "grpo",
        [
            *SMALL,
            "model.mixed_precision=bf16",
            "train.iterations=2",
            f"train.runs_dir={tmp_path}",
            "train.name=mixed",
        ],
    )
    assert autocast_dtype(build_run(cfg).policy.model) is torch.bfloat16
    result = train(cfg, quiet=True)
    assert result.final is not None and result.warm is not None
    for m in result.metrics:
        assert 0 < m["rollout/success_rate"] < 1  # mixed outcomes: advantages are not all 0
        assert m["credit/zero_adv_frac"] < 1
        assert m["policy/grad_norm"] > 0
        assert abs(m["policy/kl_sampler_first"]) < 0.05  # sampler and trainer agree closely


def test_a_saved_policy_loaded_by_a_run_runs_mixed_too(tmp_path) -> None:
    """``build_run(cfg, policy_path=...)`` (pipeline stages, ``credo eval RUN_DIR``) marks
    the loaded model like a freshly built one."""
    cfg = load_config("grpo", [*SMALL, "model.mixed_precision=bf16"])
    build_run(load_config("grpo", SMALL)).policy.save(tmp_path / "policy")
    assert autocast_dtype(build_run(cfg, policy_path=tmp_path / "policy").policy.model) is (
        torch.bfloat16
    )
