"""Checkpoints: safetensors only, written atomically.

``checkpoints/step_N/`` holds the policy as an ordinary HF folder (``model.safetensors``,
config, tokenizer), ``optimizer.safetensors`` + ``optimizer.json`` (AdamW moments and
hyper-parameters), ``rng.safetensors`` + ``state.json`` (torch/numpy/python RNG states,
the iteration, the estimator's state, anything else the trainer keeps). Nothing is
pickled. A checkpoint is written into ``step_N.tmp`` and renamed into place, so a crash
mid-write never leaves a half checkpoint; ``latest`` names the newest complete one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

__all__ = ["latest_checkpoint", "load_checkpoint", "save_checkpoint"]


def _optimizer_to_files(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {"param_groups": sd["param_groups"], "state": {}}
    for pid, st in sd["state"].items():
        keys = {}
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{pid}.{k}"] = v.detach().cpu().contiguous()
                keys[k] = "tensor"
            else:
                keys[k] = v
        meta["state"][str(pid)] = keys
    return tensors, meta


def _optimizer_from_files(opt: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    state = {}
    for pid, keys in meta["state"].items():
        state[int(pid)] = {
            k: tensors[f"{pid}.{k}"] if v == "tensor" else v for k, v in keys.items()
        }
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def _rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    np_state = np.random.get_state()
    py_state = random.getstate()
    tensors = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
    }
    meta = {
        "numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    return tensors, meta


def _set_rng_state(tensors: dict, meta: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    n = meta["numpy"]
    np.random.set_state((n[0], tensors["numpy_keys"].numpy().astype(np.uint32), n[1], n[2], n[3]))
    p = meta["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def save_checkpoint(
    run_dir: Path,
    iteration: int,
    policy: Any,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    *,
    keep: int = 2,
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``checkpoints/step_<iteration>`` atomically; keep the ``keep`` newest.
    ``write_extra(folder)`` writes more files (e.g. an EMA teacher's weights) into the
    checkpoint folder before it is renamed into place."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{iteration}"
    tmp = root / f"step_{iteration}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    policy.save(tmp / "policy")
    if write_extra is not None:
        write_extra(tmp)
    if optimizer is not None:
        tensors, meta = _optimizer_to_files(optimizer)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(meta))
    rng_tensors, rng_meta = _rng_state()
    save_file(rng_tensors, str(tmp / "rng.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"iteration": iteration, "rng": rng_meta, **state}))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    steps = sorted(
        (p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")),
        key=lambda p: int(p.name.split("_")[1]),
    )
    for old in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or ``None``."""
    root = Path(run_dir) / "checkpoints"
    marker = root / "latest"
    if marker.exists():
        path = root / marker.read_text().strip()
        if (path / "state.json").exists():
            return path
    steps = sorted(
        (p for p in root.glob("step_*") if (p / "state.json").exists()),
        key=lambda p: int(p.name.split("_")[1]),
    )
    return steps[-1] if steps else None


def load_checkpoint(path: Path, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Restore optimizer and RNG states from ``path``; returns the saved trainer state.

    The policy itself is loaded by the caller from ``path / "policy"``.
    """
    path = Path(path)
    if optimizer is not None and (path / "optimizer.safetensors").exists():
        _optimizer_from_files(
            optimizer,
            load_file(str(path / "optimizer.safetensors")),
            json.loads((path / "optimizer.json").read_text()),
        )
    state = json.loads((path / "state.json").read_text())
    _set_rng_state(load_file(str(path / "rng.safetensors")), state.pop("rng"))
    return state
