"""Generation engines (``rollout.engine``), the sampler/trainer mismatch and TIS.

vLLM does not run on this machine (no CUDA, no package): its engine is tested through its
pure parts (weight export with LoRA merged, output parsing) and its config errors; the
engine path itself (``EngineView``, a sync after every update, the engine's log-probs in
the loss) runs with engines built on the HF sampler.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from credo.objectives.tis import logprob_mismatch, tis_clipped, tis_weights
from credo.policy import SamplingParams, TinyModelConfig, create_tiny_policy
from credo.policy.engine import (
    EngineView,
    HFEngine,
    check_engine_config,
    engine_names,
    make_engine,
    register_engine,
)
from credo.policy.lora import LoRAConfig, apply_lora, merge_lora
from credo.policy.vllm_engine import (
    VLLMParams,
    export_state_dict,
    parse_output,
    request_seeds,
    vllm_problem,
)
from credo.train.config import ConfigError, load_config
from credo.train.parts import update_context
from credo.train.update import policy_update, score_batch
from small_run import SMALL as SMALL_RUN

ROOT = Path(__file__).resolve().parents[1]
TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
WORDS = [f"w{i}" for i in range(40)]
NO_VLLM = vllm_problem() is not None


def _policy():  # type: ignore[no-untyped-def]
    return create_tiny_policy(WORDS, TINY, seed=0)


# ----------------------------------------------------------- the hf engine
def test_hf_engine_reproduces_the_policy_sampler_exactly() -> None:
    policy = _policy()
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    sp = SamplingParams(temperature=1.0, max_new_tokens=6)
    direct = policy.generate(prompts, sp, torch.Generator().manual_seed(3))
    engine = make_engine("hf")
    assert isinstance(engine, HFEngine) and engine.view(policy) is policy  # samplers: same path
    engine.sync_weights(policy)
    view = EngineView(policy, engine)
    for gens in (
        engine.generate(prompts, sp, torch.Generator().manual_seed(3)),
        view.generate(prompts, sp, torch.Generator().manual_seed(3)),
    ):
        for a, b in zip(direct, gens):
            assert a.token_ids == b.token_ids and a.text == b.text and a.finished == b.finished
            assert torch.equal(a.logprobs, b.logprobs)
    assert view.tokenizer is policy.tokenizer and view.pad_id == policy.pad_id


def test_engine_names_and_the_hf_engine_without_weights() -> None:
    assert {"hf", "vllm"} <= set(engine_names())
    with pytest.raises(RuntimeError, match="sync_weights"):
        HFEngine().generate([[1]], SamplingParams())


# ------------------------------------------------ mismatch and TIS by hand
def test_tis_weights_hand_worked() -> None:
    trainer = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.3]]))
    engine = torch.log(torch.tensor([[0.25, 0.9, 0.4, 0.1]]))
    # ratios 2, 1, 0.5, 3 → truncated at C = 1.5: 1.5, 1, 0.5, 1.5
    w = tis_weights(trainer, engine, 1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 1.0, 0.5, 1.5]]), atol=1e-6)
    assert tis_clipped(trainer, engine, 1.5).tolist() == [[True, False, False, True]]
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        tis_weights(trainer, engine, 0.0)
    huge = tis_weights(torch.tensor([0.0]), torch.tensor([-1e4]), 2.0)  # no overflow
    assert huge.tolist() == [2.0]


def test_logprob_mismatch_hand_worked() -> None:
    d = torch.tensor([0.1, -0.2, 0.3, -0.4])
    m = logprob_mismatch(d)
    assert m["engine/logprob_diff_mean"] == pytest.approx(0.25)
    assert m["engine/logprob_diff_max"] == pytest.approx(0.4)
    assert m["engine/logprob_diff_signed"] == pytest.approx(-0.05)
    # |d| sorted 0.1 0.2 0.3 0.4: p50 at 1.5 → 0.25, p90 at 2.7 → 0.37, p99 at 2.97 → 0.397
    assert m["engine/logprob_diff_p50"] == pytest.approx(0.25)
    assert m["engine/logprob_diff_p90"] == pytest.approx(0.37)
    assert m["engine/logprob_diff_p99"] == pytest.approx(0.397)
    k3 = sum(math.exp(x) - 1 - x for x in d.tolist()) / 4
    assert m["engine/kl_k3"] == pytest.approx(k3)
    assert m["engine/tokens"] == 4
    assert set(logprob_mismatch(torch.zeros(0)).values()) == {0.0}


def _shifted_batch(policy, shift: float):  # type: ignore[no-untyped-def]
    """A token batch whose sampler log-probs are the policy's own minus ``shift``
    (an engine that is off by exactly ``shift`` nats on every token)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_update import _batch

    batch = _batch()
    lp = score_batch(policy, batch, temperature=1.0, micro_rows=256)
    batch.old_logprobs = (lp - shift) * batch.response_mask
    return batch


def _update(policy, batch, overrides: list[str]):  # type: ignore[no-untyped-def]
    one_step = "optim.minibatches=1"  # the default four steps would mix the ratio into the step
    unguarded = "optim.max_kl=null"  # SGD at lr 1 on a toy batch: the trust region would undo it
    cfg = load_config(
        "grpo", ["sft.enabled=false", "optim.grad_clip=1e9", one_step, unguarded, *overrides]
    )
    opt = torch.optim.SGD(policy.model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in policy.model.parameters()]
    m = policy_update(update_context(cfg, policy, opt), batch, iteration=0, generator=None)
    step = torch.cat(
        [(p.detach() - b).flatten() for p, b in zip(policy.model.parameters(), before)]
    )
    return m, step


@pytest.mark.parametrize(
    ("shift", "weight", "clipped"), [(math.log(2), 1.5, 1.0), (-math.log(2), 0.5, 0.0)]
)
def test_a_shifted_engine_shows_in_the_metrics_and_tis_scales_the_step(
    shift: float, weight: float, clipped: float
) -> None:
    """Engine log-probs = trainer's − shift on every token: |d| = log 2 everywhere, the
    TIS weight is min(e^shift, 1.5) (1.5 truncated, or 0.5), and with token-mean
    aggregation and plain SGD the step is exactly that weight times the plain step."""
    base = _policy()
    m_plain, step_plain = _update(copy.deepcopy(base), _shifted_batch(base, shift), [])
    m_tis, step_tis = _update(
        copy.deepcopy(base), _shifted_batch(base, shift), ["objective.tis_cap=1.5"]
    )
    for m in (m_plain, m_tis):
        assert m["engine/logprob_diff_mean"] == pytest.approx(math.log(2), abs=1e-5)
        assert m["engine/logprob_diff_max"] == pytest.approx(math.log(2), abs=1e-5)
        assert m["engine/logprob_diff_signed"] == pytest.approx(shift, abs=1e-5)
        assert m["engine/kl_k3"] == pytest.approx(math.exp(shift) - 1 - shift, abs=1e-5)
    assert "policy/tis_weight" not in m_plain
    assert m_tis["policy/tis_weight"] == pytest.approx(weight, abs=1e-5)
    assert m_tis["policy/tis_clip_frac"] == pytest.approx(clipped)
    assert step_plain.abs().max() > 0
    assert torch.allclose(step_tis, weight * step_plain, rtol=1e-4, atol=1e-6)


def test_mismatch_with_several_steps_uses_the_recomputed_old_logprobs() -> None:
    base = _policy()
    m, _ = _update(base, _shifted_batch(base, 0.25), ["optim.epochs=2", "optim.minibatches=2"])
    assert m["engine/logprob_diff_signed"] == pytest.approx(0.25, abs=1e-5)
    m, _ = _update(
        base,
        _shifted_batch(base, 0.25),
        ["optim.epochs=2", "optim.recompute_old_logprobs=false"],
    )  # an extra scoring pass measures it
    assert m["engine/logprob_diff_signed"] == pytest.approx(0.25, abs=1e-5)


# ------------------------------------------ the engine path in a training run
class ShiftedEngine:
    """The HF sampler behind the engine interface (so runs take the ``EngineView`` path
    a vLLM run takes), reporting log-probs ``shift`` nats below the true ones."""

    name = "test-shifted"
    shift = 0.5
    syncs: ClassVar[list[int]] = []

    def __init__(self) -> None:
        self.hf = HFEngine()

    def sync_weights(self, policy) -> None:  # type: ignore[no-untyped-def]
        self.hf.sync_weights(policy)
        ShiftedEngine.syncs.append(id(policy))

    def generate(self, prompts, sampling, generator=None):  # type: ignore[no-untyped-def]
        gens = self.hf.generate(prompts, sampling, generator)
        for g in gens:
            g.logprobs = g.logprobs - self.shift
        return gens

    def close(self) -> None:
        self.hf.close()


register_engine("test-shifted")(ShiftedEngine)


def _train(tmp: Path, name: str, extra: list[str]) -> list[dict]:
    from credo.train.loop import train

    cfg = load_config(
        "grpo",
        [
            *SMALL_RUN,
            "sft.enabled=false",
            "train.iterations=2",
            "eval.episodes=4",
            f"train.runs_dir={tmp}",
            f"train.name={name}",
            *extra,
        ],
    )
    return train(cfg, quiet=True).metrics


@pytest.mark.slow
def test_training_runs_log_the_mismatch_zero_for_hf_and_exact_for_a_shifted_engine(
    tmp_path: Path,
) -> None:
    hf = _train(tmp_path, "hf", [])
    for r in hf:  # the built-in model sampled and scored in float32: summation order only
        assert r["engine/tokens"] > 0
        assert 0 <= r["engine/logprob_diff_mean"] < 1e-5
        assert r["engine/logprob_diff_max"] < 1e-4
        assert "engine/sync_s" not in r
    ShiftedEngine.syncs.clear()
    shifted = _train(tmp_path, "shifted", ["rollout.engine=test-shifted", "objective.tis_cap=1.2"])
    assert len(ShiftedEngine.syncs) == 2  # before the first rollouts, then after the update
    for b in shifted:  # the log-probs off by 0.5 on every token
        assert b["engine/logprob_diff_signed"] == pytest.approx(0.5, abs=1e-4)
        assert b["engine/logprob_diff_mean"] == pytest.approx(0.5, abs=1e-4)
        assert b["policy/tis_weight"] == pytest.approx(1.2, abs=1e-5)  # e^0.5 = 1.65 → 1.2
        assert b["policy/tis_clip_frac"] == pytest.approx(1.0)
        assert b["engine/sync_s"] >= 0
    # iteration 0: same stream, same weights → the same samples as the hf engine's
    assert shifted[0]["rollout/gen_tokens"] == hf[0]["rollout/gen_tokens"]
    assert shifted[0]["rollout/return_mean"] == hf[0]["rollout/return_mean"]


# -------------------------------------------------------------- config
def test_vllm_without_the_package_fails_at_config_load_in_one_line() -> None:
    if not NO_VLLM:
        pytest.skip("vllm and CUDA are present here")
    with pytest.raises(ConfigError) as err:
        load_config("grpo", ["rollout.engine=vllm"])
    msg = str(err.value)
    assert "\n" not in msg and "rollout.engine=vllm" in msg and "rollout.engine=hf" in msg
    with pytest.raises(RuntimeError, match=r"rollout\.engine=vllm"):
        make_engine("vllm")


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["rollout.engine=vlm"], "Did you mean 'vllm'"),
        (["rollout.engine=vllm", "rollout.engine_params={bogus: 1}"], "bogus"),
        (["rollout.engine=vllm", "rollout.engine_params={lora: fold}"], "merge, adapter"),
        (["rollout.engine=vllm", "rollout.top_p=0.9"], "top_p=1"),
        (
            [
                "rollout.engine=vllm",
                "objective.loss=klpo",
                "rollout.sampler=single",
                "rollout.aux_samples=4",
            ],
            "auxiliary",
        ),
        (["rollout.engine=vllm", "rollout.topk_logprobs=32"], "max_logprobs"),
        (["rollout.engine=hf", "rollout.engine_params={x: 1}"], "no engine_params"),
        (["objective.tis_cap=0.5"], "objective.tis_cap must be ≥ 1"),
        (["objective.tis_cap=2", "optim.recompute_old_logprobs=false"], "recompute_old"),
    ],
)
def test_engine_and_tis_config_errors(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("grpo", overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_engine_config_accepts_the_defaults() -> None:
    cfg = load_config("grpo", ["objective.tis_cap=2"])
    assert cfg.rollout.engine == "hf" and cfg.objective.tis_cap == 2
    assert check_engine_config(cfg.rollout) is None


# ------------------------------------------------- the vLLM engine's pure parts
def test_export_state_dict_merges_lora_like_peft_without_touching_the_model() -> None:
    pytest.importorskip("peft")
    policy = apply_lora(_policy(), LoRAConfig(r=4, alpha=8.0), seed=1)
    with torch.no_grad():  # non-zero B, so the merge matters
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    merged = export_state_dict(policy, merge=True)
    base = export_state_dict(policy, merge=False)
    for k, v in policy.model.state_dict().items():
        assert torch.equal(v, before[k])  # the trainer's model is untouched
    reference = merge_lora(copy.deepcopy(policy)).model.state_dict()
    plain = _policy().model.state_dict()
    assert set(merged) == set(reference) == set(base) == set(plain)
    for k in reference:
        assert torch.allclose(merged[k], reference[k], atol=1e-6), k
        assert torch.equal(base[k], plain[k]), k  # the frozen base (same seed)
    assert any(not torch.equal(merged[k], base[k]) for k in merged)
    full = export_state_dict(_policy())
    assert all(torch.equal(full[k], plain[k]) for k in plain)


def test_the_folder_vllm_is_built_from_holds_the_merged_policy(tmp_path: Path) -> None:
    """vLLM is built from this folder: loaded back by transformers, it scores tokens as the
    LoRA policy does (adapters merged), and the write is atomic (no temp folder left)."""
    pytest.importorskip("peft")
    from credo.policy import HFPolicy
    from credo.policy.vllm_engine import write_model_folder

    policy = apply_lora(_policy(), LoRAConfig(r=4, alpha=8.0), seed=1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
    folder = tmp_path / "model"
    write_model_folder(policy, folder, export_state_dict(policy, merge=True))
    assert sorted(x.name for x in tmp_path.iterdir()) == ["model"]
    loaded = HFPolicy.from_pretrained(folder)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = policy.logprobs(ids, mask)
        got = loaded.logprobs(ids, mask)
        base = _policy().logprobs(ids, mask)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, base, atol=1e-3)  # the adapters mattered


def _completion(ids, lps, reason, tops=None):  # type: ignore[no-untyped-def]
    rows = []
    for i, (t, lp) in enumerate(zip(ids, lps)):
        row = {t: SimpleNamespace(logprob=lp, rank=3)}
        for rank, (tt, tlp) in enumerate(tops[i] if tops else [], start=1):
            row[tt] = SimpleNamespace(logprob=tlp, rank=rank)
        rows.append(row)
    return SimpleNamespace(token_ids=ids, logprobs=rows, finish_reason=reason)


def test_parse_output_reads_tokens_logprobs_stop_and_topk() -> None:
    policy = _policy()
    stop = policy.stop_ids
    w3, w4 = policy.tokenizer.convert_tokens_to_ids(["w3", "w4"])
    done = parse_output(
        _completion([w3, w4, stop[0]], [-0.1, -0.2, -0.3], "stop"), stop, policy.tokenizer
    )
    assert done.token_ids == [w3, w4, stop[0]] and done.finished and done.text == "w3 w4"
    assert torch.allclose(done.logprobs, torch.tensor([-0.1, -0.2, -0.3]))
    cut = parse_output(_completion([w3, w4], [-0.5, -0.6], "length"), stop, policy.tokenizer)
    assert not cut.finished and cut.text == "w3 w4" and cut.topk_ids is None
    tops = [[(7, -0.01), (8, -2.0)], [(9, -0.05), (w4, -0.6)]]
    k = parse_output(
        _completion([w3, w4], [-3.0, -0.6], "length", tops), stop, policy.tokenizer, topk=2
    )
    assert k.topk_ids.tolist() == [[7, 8], [9, w4]]
    assert torch.allclose(k.topk_logprobs, torch.tensor([[-0.01, -2.0], [-0.05, -0.6]]))
    with pytest.raises(ValueError, match="log-probs for None of 2"):
        parse_output(
            SimpleNamespace(token_ids=[1, 2], logprobs=None, finish_reason="length"),
            stop,
            policy.tokenizer,
        )


def test_request_seeds_follow_the_generator() -> None:
    a = request_seeds(5, torch.Generator().manual_seed(0))
    assert a == request_seeds(5, torch.Generator().manual_seed(0))
    assert a != request_seeds(5, torch.Generator().manual_seed(1))
    assert all(0 <= s < 2**31 - 1 for s in a)


def test_vllm_params_check_their_values() -> None:
    assert VLLMParams().lora == "merge"
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMParams(gpu_memory_utilization=0)
    with pytest.raises(ValueError, match="dtype"):
        VLLMParams(dtype="int4")


def test_the_gpu_benchmark_fails_in_one_line_without_vllm(capsys: pytest.CaptureFixture) -> None:
    if not NO_VLLM:
        pytest.skip("vllm and CUDA are present here")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_vllm

    assert gpu_vllm.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "vllm" in err
