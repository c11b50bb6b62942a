"""Checkpoints: safetensors only, written atomically.

``checkpoints/step_N/`` holds the policy as an ordinary HF folder (``model.safetensors``,
config, tokenizer), ``optimizer.safetensors`` + ``optimizer.json`` (AdamW moments and
hyper-parameters), ``rng.safetensors`` + ``state.json`` (torch/numpy/python RNG states,
the iteration, the estimator's state, anything else the trainer keeps). Nothing is
pickled. A checkpoint is written into a hidden temporary folder and renamed into place,
so a crash mid-write never leaves a half checkpoint; old checkpoints are renamed aside
before they are deleted, so a crash mid-prune never leaves a half-deleted ``step_N``;
``latest`` (rewritten atomically) names the newest complete one. What an interrupted
save leaves behind is removed by the next save (:func:`clean_partial`).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from credo.utils.atomic import temp_path, write_text_atomic

__all__ = [
    "RngState",
    "checkpoint_iteration",
    "clean_partial",
    "latest_checkpoint",
    "load_checkpoint",
    "restore_rng",
    "rng_snapshot",
    "save_checkpoint",
]


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


RngState = tuple[Any, Any, Any]


def rng_snapshot() -> RngState:
    """The global torch, numpy and python RNG states (what a checkpoint saves), so that a
    checkpoint written after a failed iteration can carry the states of its start."""
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def restore_rng(snap: RngState) -> None:
    """Set the global RNGs back to what :func:`rng_snapshot` recorded."""
    torch.set_rng_state(snap[0])
    np.random.set_state(snap[1])
    random.setstate(snap[2])


def _set_rng_state(tensors: dict, meta: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    n = meta["numpy"]
    np.random.set_state((n[0], tensors["numpy_keys"].numpy().astype(np.uint32), n[1], n[2], n[3]))
    p = meta["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


_STEP = re.compile(r"step_(\d+)")
_REPLACED = re.compile(r"\.replaced-(step_\d+)-[0-9a-f]+")


def _steps(root: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints under ``root``, oldest first: folders named exactly
    ``step_<N>`` (a temporary or half-pruned folder never has that name)."""
    found = []
    for p in root.glob("step_*") if root.is_dir() else []:
        m = _STEP.fullmatch(p.name)
        if m and p.is_dir() and (p / "state.json").exists():
            found.append((int(m.group(1)), p))
    return sorted(found)


def clean_partial(run_dir: Path) -> list[str]:
    """Tidy what an interrupted save or prune left in ``run_dir/checkpoints``: hidden
    temporary and pruned folders (and the ``step_N.tmp`` folders of older versions) are
    deleted; a complete checkpoint that was renamed aside to be replaced
    (``.replaced-step_N-*``) is renamed back when the new ``step_N`` never arrived.
    Returns the names removed or restored."""
    root = Path(run_dir) / "checkpoints"
    touched = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        m = _REPLACED.fullmatch(p.name)
        if m and not (root / m.group(1)).exists() and (p / "state.json").exists():
            os.replace(p, root / m.group(1))
        elif p.name.startswith(".") or (p.name.startswith("step_") and p.name.endswith(".tmp")):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        else:
            continue
        touched.append(p.name)
    return touched


def _aside(path: Path, why: str) -> Path:
    """Rename ``path`` to a hidden sibling (atomic) so that it stops being a checkpoint
    before it is deleted: a kill in the middle of ``rmtree`` then leaves a hidden folder
    (:func:`clean_partial` removes it), never a half-deleted ``step_N``."""
    hidden = path.with_name(f".{why}-{path.name}-{uuid.uuid4().hex[:8]}")
    os.replace(path, hidden)
    return hidden


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

    The checkpoint is written into a hidden temporary folder and renamed into place; an
    existing ``step_<iteration>`` is renamed aside first and deleted only once the new
    one is in place (so at most one complete checkpoint is ever being replaced, and
    the older ones stay complete meanwhile); ``latest`` is then rewritten atomically and
    the old checkpoints beyond ``keep`` are renamed aside and deleted. Leftovers of an
    interrupted save are removed first (:func:`clean_partial`).
    ``write_extra(folder)`` writes more files (e.g. an EMA teacher's weights) into the
    checkpoint folder before it is renamed into place.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    clean_partial(run_dir)
    final = root / f"step_{iteration}"
    tmp = temp_path(final)
    try:
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
        (tmp / "state.json").write_text(
            json.dumps({"iteration": iteration, "rng": rng_meta, **state})
        )
        replaced = _aside(final, "replaced") if final.exists() else None
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    write_text_atomic(root / "latest", final.name)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    steps = [p for _, p in _steps(root)]
    for old in steps[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(_aside(old, "pruned"), ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or ``None``: the one ``latest`` names
    if it is complete, else the highest complete ``step_<N>``."""
    root = Path(run_dir) / "checkpoints"
    marker = root / "latest"
    if marker.exists():
        name = marker.read_text().strip()
        path = root / name
        if _STEP.fullmatch(name) and (path / "state.json").exists():
            return path
    steps = _steps(root)
    return steps[-1][1] if steps else None


def checkpoint_iteration(path: Path | None) -> int:
    """The iterations a run had done at checkpoint ``path`` (``step_<N>``: N), 0 for
    ``None`` (no checkpoint yet)."""
    if path is None:
        return 0
    m = _STEP.fullmatch(Path(path).name)
    if m is None:
        raise ValueError(f"{path} is not a checkpoint folder (step_<N>)")
    return int(m.group(1))


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
