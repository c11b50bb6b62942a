"""Where the memory of an update step goes: full fine-tuning vs LoRA on SmolLM2.

docs/llm.md measured a higher peak RSS for LoRA (11.7 GiB) than for full fine-tuning
(9.3 GiB) at the same batch. This script takes one update step apart, each mode in a
fresh process (peak RSS is per process): the bytes autograd saves for the backward pass
(``saved_tensors_hooks``; parameters excluded, each storage counted once), the bytes of
gradients and AdamW state, and the growth of the process's peak RSS (``VmHWM``, reset
before the step through ``/proc/self/clear_refs``) over the resident size before it,
with glibc's heap statistics (``mallinfo2``: bytes in use vs held by the allocator).

    python benchmarks/lora_memory.py [--rows 4] [--tokens 256] [--steps 2] [--lora-r 16]
        [--mmap-threshold BYTES]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

GIB = 2**30


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _heap() -> dict[str, int]:
    """glibc ``mallinfo2``: bytes in use by malloc'ed chunks, and bytes the heap holds."""

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"heap_in_use": m.uordblks + m.hblkhd, "heap_free_held": m.fordblks}


def _mmap_threshold(nbytes: int) -> bool:
    """Fix glibc's mmap threshold (``mallopt(M_MMAP_THRESHOLD)``): allocations from
    ``nbytes`` on get their own mapping, returned to the system when freed. By default the
    threshold grows with every freed large block (up to 32 MiB), after which activations
    and temporaries come from the heap, whose freed holes stay resident."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, int(nbytes)))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def measure(
    mode: str, rows: int, tokens: int, steps: int, lora_r: int, mmap_threshold: int = 0
) -> dict[str, Any]:
    """One mode (``full`` or ``lora``) in this process."""
    import time

    fixed = _mmap_threshold(mmap_threshold) if mmap_threshold > 0 else False
    from credo.policy import HFPolicy
    from credo.policy.lora import LoRAConfig, apply_lora, trainable_parameters
    from credo.policy.models import MODEL_ALIASES, load_gguf, packaged_gguf

    torch.set_num_threads(1)
    model, tok = load_gguf(packaged_gguf(MODEL_ALIASES["smollm2-135m"]))
    policy = HFPolicy(model, tok)
    if mode == "lora":
        policy = apply_lora(policy, LoRAConfig(r=lora_r, alpha=2.0 * lora_r))
    params = list(trainable_parameters(policy.model))
    opt = torch.optim.AdamW(params, lr=1e-6)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40_000, (rows, tokens), generator=gen)
    mask = torch.ones_like(ids)
    scored = torch.zeros_like(ids, dtype=torch.bool)
    scored[:, tokens // 2 :] = True  # a prompt and a response, as in an update
    param_ptrs = {p.untyped_storage().data_ptr() for p in policy.model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in param_ptrs:
            saved[s.data_ptr()] = s.nbytes()
        return t

    policy.model.train()
    rss_before = _status("VmRSS")
    can_reset = _reset_peak()
    start = time.perf_counter()
    for _ in range(steps):
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = policy.score(ids, mask, scored=scored)
            loss = -(out.logprobs * scored).sum() / scored.sum()
        saved_bytes = sum(saved.values())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    state = sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for v in s.values()
        if torch.is_tensor(v)
    )
    grads = sum(p.numel() * p.element_size() for p in params)
    seconds = time.perf_counter() - start
    return {
        "mode": (mode if mode == "full" else f"lora r={lora_r}")
        + (f", mmap ≥ {mmap_threshold >> 10} KiB" if fixed else ""),
        "step_s": seconds / steps,
        "trained_params": sum(p.numel() for p in params),
        "saved_activations_gib": saved_bytes / GIB,
        "grads_gib": grads / GIB,
        "adam_state_gib": state / GIB,
        "rss_before_gib": rss_before / GIB,
        "peak_rss_growth_gib": (_status("VmHWM") - rss_before) / GIB if can_reset else None,
        **{k: v / GIB for k, v in _heap().items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        help="fix glibc's mmap threshold to this many bytes (0 = glibc's dynamic default)",
    )
    ap.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        out = measure(
            args.mode, args.rows, args.tokens, args.steps, args.lora_r, args.mmap_threshold
        )
        print(json.dumps(out))
        return
    from _common import print_table

    results = []
    for mode in ("full", "lora"):
        cmd = [
            sys.executable,
            __file__,
            "--mode",
            mode,
            "--rows",
            str(args.rows),
            "--tokens",
            str(args.tokens),
            "--steps",
            str(args.steps),
            "--lora-r",
            str(args.lora_r),
            "--mmap-threshold",
            str(args.mmap_threshold),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = list(results[0])
    print_table(
        f"one update step, {args.rows} rows × {args.tokens} tokens, float32, "
        f"{args.steps} steps (GiB)",
        keys,
        [[f"{r[k]:.3f}" if isinstance(r[k], float) else r[k] for k in keys] for r in results],
    )


if __name__ == "__main__":
    main()
