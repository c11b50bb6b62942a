"""benchmarks/gpu_smoke.py: its config is valid, and without CUDA it fails clearly.

(A real run needs a GPU; ``--device cpu --iterations 1`` runs the same code on the CPU in
about three minutes, too slow for the suite.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from credo.train.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_smoke


def test_its_overrides_make_a_valid_lora_bf16_config() -> None:
    args = gpu_smoke.overrides(gpu_smoke.parse_args([]))
    assert "model.device=cuda" in args
    # the device is checked when the config loads: on a CPU-only machine, load it for the CPU
    cpu = [a for a in args if not a.startswith("model.device=")] + ["model.device=cpu"]
    cfg = load_config("grpo", cpu)
    assert cfg.model.name == "smollm2-135m" and cfg.model.device == "cpu"
    assert cfg.model.dtype == "bfloat16" and cfg.model.lora is not None
    assert cfg.model.lora.r == 16 and cfg.model.lora.alpha == 32
    assert cfg.optim.micro_batch_tokens == 4096 and not cfg.sft.enabled
    full = load_config(
        "grpo",
        gpu_smoke.overrides(
            gpu_smoke.parse_args(["--lora-r", "0", "--grad-ckpt", "--device", "cpu"])
        ),
    )
    assert full.model.lora is None and full.model.gradient_checkpointing


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_smoke.main([]) == 2
    err = capsys.readouterr().err
    assert "torch sees no CUDA device" in err and "--device cpu" in err
