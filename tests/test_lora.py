"""LoRA adapters, the shared reference, partial scoring and gradient checkpointing, on the
built-in model (fast); the same code on SmolLM2 is in test_smollm2.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from credo.commands.evaluate import evaluate_target
from credo.envs import StepResult, Task
from credo.envs.shop import ShopEnv
from credo.policy import HFPolicy, LoRAConfig, TinyModelConfig, apply_lora, create_tiny_policy
from credo.policy.lora import merge_lora, shared_reference
from credo.rollout.render import PLAIN_WORDS
from credo.train.config import ConfigError, load_config
from credo.train.loop import train
from credo.train.run import enable_gradient_checkpointing
from credo.utils.cache import cache_dir

#: Only the tests that build adapters need peft; full fine-tuning, tied-embedding
#: checkpoints and partial scoring run without it.
needs_peft = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None,
    reason="peft not installed: LoRA needs it (make smollm installs it)",
)

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
IDS = torch.tensor([[4, 5, 6, 7, 8, 9], [9, 8, 7, 6, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)


def _policy(seed: int = 0) -> HFPolicy:
    return create_tiny_policy([*ShopEnv().vocabulary(), *PLAIN_WORDS], SMALL, seed=seed)


def _lp(policy: HFPolicy) -> torch.Tensor:
    with torch.no_grad():
        return policy.logprobs(IDS, MASK)


@needs_peft
def test_lora_starts_as_the_base_and_trains_only_adapters() -> None:
    base = _policy()
    before = _lp(base)
    pol = apply_lora(base, LoRAConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    # B = 0 at init: the wrapped model computes exactly the base model
    assert torch.equal(_lp(pol), before)
    trainable = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    # 2 layers × {q_proj, v_proj} × {lora_A, lora_B}
    assert len(trainable) == 8 and all("lora_" in n for n in trainable)
    ref = shared_reference(pol)
    assert ref.model is pol.model  # no second copy of the weights
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.05)
    assert not torch.allclose(_lp(pol), before, atol=1e-4)
    assert torch.equal(_lp(ref), before)  # adapters off: still the base model
    # merging folds B·A into W: same function, no adapters left
    merged = merge_lora(pol)
    assert not merged.is_peft
    torch.testing.assert_close(_lp(merged), _lp(pol), atol=1e-5, rtol=0)


@needs_peft
def test_lora_target_modules_must_exist() -> None:
    with pytest.raises(ValueError, match=r"match no layer.*q_proj"):
        apply_lora(_policy(), LoRAConfig(target_modules=["c_attn"]))


def test_lora_rank_is_checked_in_the_config() -> None:
    with pytest.raises(ConfigError, match=r"model\.lora\.r must be ≥ 1"):
        load_config("grpo", ["model.lora.r=0"])


@needs_peft
def test_adapter_checkpoint_restores_exactly(tmp_path: Path) -> None:
    cfg = LoRAConfig(r=4, alpha=8)
    pol = apply_lora(_policy(), cfg, seed=1)
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(n)))
    pol.save(tmp_path / "ck")
    files = {p.name for p in (tmp_path / "ck").iterdir()}
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files
    other = apply_lora(_policy(), cfg, seed=2)  # different A init
    assert not torch.equal(_lp(other), _lp(pol))
    other.load_weights(tmp_path / "ck")
    assert torch.equal(_lp(other), _lp(pol))
    with pytest.raises(ValueError, match="holds LoRA adapters but the policy has none"):
        _policy().load_weights(tmp_path / "ck")
    q_only = apply_lora(_policy(), LoRAConfig(r=4, alpha=8, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="do not fit the model"):
        q_only.load_weights(tmp_path / "ck")


def test_full_checkpoint_with_tied_embeddings_restores_exactly(tmp_path: Path) -> None:
    pol = _policy(seed=3)
    pol.save(tmp_path / "full")
    other = _policy(seed=4)
    other.load_weights(tmp_path / "full")  # lm_head is tied: absent from the file
    assert torch.equal(_lp(other), _lp(pol))


def test_scoring_only_the_scored_positions_matches_full_scoring() -> None:
    """With logit trimming on (``trim_min_vocab = 0``), rows of different lengths are
    right-aligned and only their last K tokens scored: log-probs, entropy, extra ids and
    gradients at the scored positions equal those of scoring everything."""
    pol = _policy()
    pol.model.train()
    ids = torch.tensor([[4, 5, 6, 7, 8, 9, 10], [9, 8, 7, 6, 5, 0, 0], [4, 6, 8, 10, 0, 0, 0]])
    mask = ids != 0
    scored = torch.zeros_like(mask)
    scored[0, 5:7] = True  # the last two tokens of row 0
    scored[1, 3:5] = True  # the last two real tokens of row 1
    # row 2 has nothing scored
    extra = torch.randint(4, 20, (3, 7, 2), generator=torch.Generator().manual_seed(0))
    outs, grads = [], []
    for trim in (10**9, 0):
        pol.trim_min_vocab = trim
        pol.model.zero_grad()
        out = pol.score(ids, mask, entropy=True, extra_ids=extra, scored=scored)
        (out.logprobs * scored).sum().backward()
        outs.append(out)
        grads.append([p.grad.clone() for p in pol.model.parameters() if p.grad is not None])
    full, part = outs
    assert pol._score_window(mask.bool(), scored) == 2
    for a, b in ((full.logprobs, part.logprobs), (full.entropy, part.entropy)):
        torch.testing.assert_close(a[scored], b[scored], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        full.extra_logprobs[scored], part.extra_logprobs[scored], atol=1e-5, rtol=0
    )
    # only the last K = 2 real tokens of each row were computed; the rest is 0
    assert torch.equal(part.logprobs[0, :5], torch.zeros(5))
    assert torch.equal(part.logprobs[2, :2], torch.zeros(2))
    torch.testing.assert_close(part.logprobs[2, 2:4], full.logprobs[2, 2:4], atol=1e-5, rtol=0)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@needs_peft
def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    grads = []
    for ckpt in (False, True):
        pol = apply_lora(_policy(), LoRAConfig(r=4, alpha=8), seed=0)
        if ckpt:
            enable_gradient_checkpointing(pol.model)
        pol.model.train()
        with torch.no_grad():
            for n, p in pol.model.named_parameters():
                if "lora_B" in n:
                    p.fill_(0.01)
        pol.score(IDS, MASK).logprobs.sum().backward()
        grads.append(
            {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.grad is not None}
        )
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5)


class SayEnv:
    """One turn: reward 1 when the reply contains the word ``yes``. A random built-in
    model says it about once in five replies, so GRPO groups have mixed rewards without
    any warm start (LoRA cannot warm-start the built-in model: its embeddings are random
    and frozen)."""

    max_turns = 1

    def reset(self, task: Task, seed: int = 0) -> str:
        self.done = False
        return "say yes"

    def step(self, action: str) -> StepResult:
        ok = "yes" in action.split()
        return StepResult("done", float(ok), True, {"valid": True, "success": ok})

    def state_key(self) -> str:
        return "end" if self.done else "start"

    def snapshot(self) -> bool:
        return self.done

    def restore(self, snap: bool) -> None:
        self.done = snap

    def vocabulary(self) -> list[str]:
        return ["say", "yes", "no", "maybe", "done"]


def _say(tmp_path: Path, name: str, iterations: int, lora: bool = True) -> list[str]:
    return [
        "env.name=test_lora:SayEnv",
        "model.tiny={hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64}",
        "model.lora={r: 4, alpha: 8}" if lora else "model.lora=null",
        "model.gradient_checkpointing=true",
        "objective.kl_coef=0.05",
        "sft.enabled=false",
        "optim.lr=3e-3",
        "rollout.tasks_per_iter=4",
        "rollout.group_size=6",
        "rollout.max_new_tokens=3",
        "eval.episodes=8",
        "train.checkpoint_every=2",
        f"train.iterations={iterations}",
        f"train.runs_dir={tmp_path}",
        f"train.name={name}",
    ]


@needs_peft
@pytest.mark.slow
def test_lora_run_checkpoints_adapters_and_resumes_exactly(tmp_path: Path) -> None:
    sys.modules.setdefault("test_lora", sys.modules[__name__])
    full = train(load_config("grpo", _say(tmp_path, "full", 4)), quiet=True)
    part = train(load_config("grpo", _say(tmp_path, "part", 2)), quiet=True)
    resumed = train(load_config("grpo", _say(tmp_path, "part", 4)), resume=part.run_dir, quiet=True)
    stable = [
        [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in m]
        for m in (full.metrics, resumed.metrics)
    ]
    assert stable[0] == stable[1]
    # the adapters did learn something: non-zero advantages and gradients, a KL to the
    # shared reference (adapters off) that grows from 0 (B = 0 at the first of the first
    # iteration's four mini-batch steps: its mean over them is small, not 0)
    assert any(r["credit/adv_abs_max"] > 0 for r in full.metrics)
    assert all(r["policy/grad_norm"] > 0 for r in full.metrics)
    kl = [r["loss/kl"] for r in full.metrics]
    assert 0 < kl[0] < kl[-1]
    step = full.run_dir / "checkpoints" / "step_4" / "policy"
    assert (step / "adapter_model.safetensors").exists()
    assert not (step / "model.safetensors").exists()
    assert not (full.run_dir / "reference").exists()  # the reference is the shared base
    ev = evaluate_target(run_dir=full.run_dir, model=None, env=None, episodes=8)
    assert ev["eval"].success_rate == full.final.success_rate


@pytest.mark.slow
def test_full_fine_tuning_with_a_reference_copy_resumes_exactly(tmp_path: Path) -> None:
    sys.modules.setdefault("test_lora", sys.modules[__name__])
    full = train(load_config("grpo", _say(tmp_path, "full", 3, lora=False)), quiet=True)
    part = train(load_config("grpo", _say(tmp_path, "part", 2, lora=False)), quiet=True)
    resumed = train(
        load_config("grpo", _say(tmp_path, "part", 3, lora=False)), resume=part.run_dir, quiet=True
    )
    stable = [
        [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in m]
        for m in (full.metrics, resumed.metrics)
    ]
    assert stable[0] == stable[1]
    assert (full.run_dir / "reference" / "model.safetensors").exists()
    assert full.metrics[-1]["loss/kl"] > 0


@needs_peft
def test_an_adapter_folder_loads_with_its_base(tmp_path: Path) -> None:
    _policy(seed=5).save(tmp_path / "base")
    base = HFPolicy.from_pretrained(tmp_path / "base")  # records where its weights live
    pol = apply_lora(base, LoRAConfig(r=4, alpha=8), seed=0)
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.02)
    pol.save(tmp_path / "adapter")
    again = HFPolicy.from_pretrained(tmp_path / "adapter")
    assert again.is_peft and torch.equal(_lp(again), _lp(pol))
    assert all(p.requires_grad == ("lora_" in n) for n, p in again.model.named_parameters())


@needs_peft
@pytest.mark.slow
def test_lora_warm_start_is_merged_and_rebuilt_on_resume(tmp_path: Path) -> None:
    """SFT with LoRA merges its adapters into the weights (the cached warm start is a
    plain model); RL adds fresh adapters; resuming rebuilds that base from the cache."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    opts = [
        "env.name=examples.custom_env:GuessEnv",
        "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
        "model.lora={r: 4, alpha: 8}",
        "sft.episodes=40",
        "sft.steps=8",
        "sft.noisy_episodes=20",
        "sft.noisy_steps=2",
        "rollout.tasks_per_iter=2",
        "rollout.group_size=3",
        "rollout.max_new_tokens=4",
        "eval.episodes=4",
        "train.checkpoint_every=1",
        f"train.runs_dir={tmp_path}",
    ]
    full = train(load_config("grpo", [*opts, "train.iterations=3", "train.name=full"]), quiet=True)
    warm = json.loads((full.run_dir / "warmstart.json").read_text())
    folder = cache_dir() / "warmstart" / warm["key"] / "policy"
    assert (folder / "model.safetensors").exists() and not (folder / "adapter_config.json").exists()
    part = train(load_config("grpo", [*opts, "train.iterations=1", "train.name=part"]), quiet=True)
    resumed = train(
        load_config("grpo", [*opts, "train.iterations=3", "train.name=part"]),
        resume=part.run_dir,
        quiet=True,
    )
    stable = [
        [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in m]
        for m in (full.metrics, resumed.metrics)
    ]
    assert stable[0] == stable[1]
    assert resumed.final.success_rate == full.final.success_rate
