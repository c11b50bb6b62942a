"""``train.threads: 0`` chooses torch's CPU threads (:mod:`credo.utils.threads`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from credo.train.config import load_config
from credo.train.run import threads_for
from credo.utils.threads import auto_threads, usable_cpus


@pytest.mark.parametrize(
    ("builtin", "cpus", "load", "processes", "want"),
    [
        (True, 16, 0.0, 1, 1),  # the built-in model: one thread, however many cores
        (False, 2, 0.0, 1, 2),  # quiet cores: all of them
        (False, 2, 0.4, 1, 2),  # round(0.4) = 0 busy
        (False, 2, 1.2, 1, 1),  # one core busy
        (False, 2, 7.5, 1, 1),  # overloaded: still one
        (False, 16, 3.0, 1, 13),
        (False, 16, 0.0, 4, 4),  # torchrun with 4 processes: a quarter each
        (False, 16, 30.0, 4, 1),
    ],
)
def test_auto_threads(builtin: bool, cpus: int, load: float, processes: int, want: int) -> None:
    assert auto_threads(builtin, cpus=cpus, load=load, processes=processes) == want


def test_auto_threads_reads_the_launchers_local_world_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert auto_threads(False, cpus=8, load=0.0) == 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert auto_threads(False, cpus=8, load=0.0) == 8


def test_threads_for_a_run() -> None:
    assert threads_for(load_config("grpo", ["train.threads=3"])) == 3
    assert threads_for(load_config("grpo")) == 1  # the built-in model
    hf = threads_for(load_config("grpo", ["model.name=smollm2-135m"]))
    assert 1 <= hf <= usable_cpus()


def test_build_run_sets_the_chosen_threads() -> None:
    from credo.train.run import build_run

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        build_run(
            load_config(
                "grpo",
                [
                    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
                    "sft.enabled=false",
                ],
            )
        )
        assert torch.get_num_threads() == 1  # train.threads: 0 on the built-in model
    finally:
        torch.set_num_threads(before)


def test_openmp_threads_wait_passively_unless_the_user_chose() -> None:
    """Importing credo sets OMP_WAIT_POLICY=PASSIVE (before torch reads it), and keeps a
    policy the user set."""
    code = "import credo, os; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "PASSIVE", out.stderr
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "ACTIVE", out.stderr
