"""Checkpoints by hand: optimizer moments, RNG streams and trainer state round-trip exactly;
atomic layout, the ``latest`` marker and pruning."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from credo.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint


class FilePolicy:
    """Stands in for a policy: ``save`` writes one file holding a number."""

    def __init__(self, value: float) -> None:
        self.value = value

    def save(self, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "weights.json").write_text(json.dumps(self.value))


def _model_and_adamw(lr: float = 0.1) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.arange(6, dtype=torch.float32).reshape(2, 3) / 10)
        model.bias.copy_(torch.tensor([0.5, -0.5]))
    return model, torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.8, 0.9))


def _step(model: torch.nn.Linear, opt: torch.optim.Optimizer, x: float) -> None:
    opt.zero_grad()
    (model(torch.full((1, 3), x)) ** 2).sum().backward()
    opt.step()


def test_optimizer_state_rng_and_trainer_state_round_trip(tmp_path: Path) -> None:
    model, opt = _model_and_adamw()
    for x in (1.0, -2.0):
        _step(model, opt, x)
    opt.param_groups[0]["lr"] = 0.025  # a scheduler moved it: the saved value must come back
    torch.manual_seed(11)
    np.random.seed(12)
    random.seed(13)
    path = save_checkpoint(tmp_path, 7, FilePolicy(1.5), opt, {"estimator": {"n": 3}})
    assert path == tmp_path / "checkpoints" / "step_7"
    expected_draws = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    saved = {k: {n: v.clone() for n, v in s.items()} for k, s in opt.state_dict()["state"].items()}

    # a fresh optimizer with other moments and other RNG positions
    model2, opt2 = _model_and_adamw(lr=0.5)
    _step(model2, opt2, 3.0)
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    state = load_checkpoint(path, opt2)

    assert state == {"iteration": 7, "estimator": {"n": 3}}
    loaded = opt2.state_dict()
    assert loaded["param_groups"][0]["lr"] == 0.025
    assert tuple(loaded["param_groups"][0]["betas"]) == (0.8, 0.9)  # a list after JSON
    assert loaded["state"].keys() == saved.keys() == {0, 1}
    for pid, moments in saved.items():
        assert loaded["state"][pid].keys() == moments.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for name, value in moments.items():
            assert torch.equal(loaded["state"][pid][name], value), (pid, name)
    assert float(loaded["state"][0]["step"]) == 2.0
    # the RNG streams continue exactly where the checkpoint left them
    assert torch.equal(torch.rand(3), expected_draws[0])
    assert np.array_equal(np.random.rand(3), expected_draws[1])
    assert [random.random() for _ in range(3)] == expected_draws[2]
    # with the weights loaded too (the caller's job), one more step is identical
    model2.load_state_dict(model.state_dict())
    _step(model, opt, 0.5)
    _step(model2, opt2, 0.5)
    assert torch.equal(model.weight, model2.weight) and torch.equal(model.bias, model2.bias)


def test_layout_is_safetensors_and_json_only(tmp_path: Path) -> None:
    model, opt = _model_and_adamw()
    _step(model, opt, 1.0)
    path = save_checkpoint(tmp_path, 1, FilePolicy(2.0), opt, {})
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert files == [
        "optimizer.json",
        "optimizer.safetensors",
        "policy/weights.json",
        "rng.safetensors",
        "state.json",
    ]
    assert json.loads((path / "policy" / "weights.json").read_text()) == 2.0
    meta = json.loads((path / "optimizer.json").read_text())
    assert meta["state"] == {
        "0": {"step": "tensor", "exp_avg": "tensor", "exp_avg_sq": "tensor"},
        "1": {"step": "tensor", "exp_avg": "tensor", "exp_avg_sq": "tensor"},
    }
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_1"
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_without_an_optimizer_only_rng_and_state_are_saved(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 3, FilePolicy(0.0), None, {"x": 1})
    assert not (path / "optimizer.safetensors").exists()
    assert not (path / "optimizer.json").exists()
    _, opt = _model_and_adamw()
    before = opt.state_dict()
    assert load_checkpoint(path, opt) == {"iteration": 3, "x": 1}
    assert opt.state_dict() == before  # nothing to restore: untouched
    assert load_checkpoint(path, None) == {"iteration": 3, "x": 1}


@pytest.mark.parametrize(("keep", "left"), [(2, [4, 10]), (1, [10]), (0, [1, 2, 4, 10])])
def test_keep_prunes_the_oldest_by_step_number(keep: int, left: list[int], tmp_path: Path) -> None:
    # step 10 sorts before step 2 as text: pruning must order by number
    for it in (1, 2, 4, 10):
        save_checkpoint(tmp_path, it, FilePolicy(it), None, {}, keep=keep)
    root = tmp_path / "checkpoints"
    steps = sorted(int(p.name.split("_")[1]) for p in root.glob("step_*"))
    assert steps == left
    assert latest_checkpoint(tmp_path) == root / "step_10"


def test_saving_a_step_again_replaces_it_and_clears_a_stale_tmp(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    (root / "step_5.tmp" / "junk").mkdir(parents=True)  # a crash mid-write
    save_checkpoint(tmp_path, 5, FilePolicy(1.0), None, {"v": 1})
    path = save_checkpoint(tmp_path, 5, FilePolicy(2.0), None, {"v": 2})
    assert not (root / "step_5.tmp").exists()
    assert json.loads((path / "policy" / "weights.json").read_text()) == 2.0
    assert load_checkpoint(path, None) == {"iteration": 5, "v": 2}


def test_latest_checkpoint_follows_the_marker_then_falls_back(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert latest_checkpoint(tmp_path) is None  # no checkpoints folder at all
    for it in (2, 9, 10):
        save_checkpoint(tmp_path, it, FilePolicy(it), None, {}, keep=0)
    assert latest_checkpoint(tmp_path) == root / "step_10"
    # the marker may name an older complete checkpoint: it wins
    (root / "latest").write_text("step_9\n")
    assert latest_checkpoint(tmp_path) == root / "step_9"
    # a marker naming an incomplete folder: the highest complete step, by number
    (root / "step_11").mkdir()
    (root / "latest").write_text("step_11")
    assert latest_checkpoint(tmp_path) == root / "step_10"
    # no marker: the same fallback
    (root / "latest").unlink()
    (root / "step_10" / "state.json").unlink()
    assert latest_checkpoint(tmp_path) == root / "step_9"
