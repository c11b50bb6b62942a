"""Data-parallel training (:mod:`credo.engines.distributed`) with 2 gloo processes on 127.0.0.1.

- One update on the same global batch in 2 processes gives the weights, the metrics and
  the gathered forest of 1 process (the processes are spawned; each builds the same run,
  rollouts and batch, then splits the update's micro-batches).
- ``torchrun --nproc_per_node 2 -m credo train`` writes one run folder (one metrics file,
  checkpoints once, one report), and ``--resume`` with 2 processes from a checkpoint ends
  with the weights and metrics of the uninterrupted 2-process run.

Every process has a bounded wait (``CREDO_DIST_TIMEOUT``, the join deadline, the
subprocess timeout) and is killed in a ``finally``.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

import credo
from credo.credit import compute_advantages
from credo.engines import distributed as dp
from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.policy.lora import trainable_parameters
from credo.rollout import RolloutResult
from credo.train.config import load_config
from credo.train.parts import update_context
from credo.train.run import build_run
from credo.train.update import policy_update

pytestmark = pytest.mark.slow  # the slow tier: several processes (torchrun, gloo)

CREDO_SRC = Path(credo.__file__).resolve().parents[1]
REPO = CREDO_SRC.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
WORLD = 2
JOIN_S = 120.0  # the spawned processes' deadline
RUN_S = 150  # one torchrun launch's deadline
VOLATILE = ("time/", "perf/")

#: A tiny untrained model on GuessEnv: no warm start; the entropy bonus gives every update
#: a gradient even when all advantages are 0.
TINY = [
    "env.name=examples.custom_env:GuessEnv",
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
    "sft.enabled=false",
    "rollout.max_new_tokens=6",
    "rollout.tasks_per_iter=4",
    "rollout.group_size=4",
    "eval.episodes=8",
    "train.threads=1",
    "model.device=cpu",
]

#: The update under test: 2 mini-batches (π_old re-scored) of 8 four-turn episodes,
#: micro-batches of at most 12 rows cut at episode boundaries (3 per mini-batch: 12, 12, 8
#: rows, so the ranks get unequal shares, 2 and 1), a KL term to a reference, an entropy
#: bonus.
UPDATE = [
    *TINY,
    "optim.minibatches=2",
    "optim.micro_batch_rows=12",
    "optim.lr=0.01",
    "objective.kl_coef=0.1",
    "objective.entropy_coef=0.01",
    # lr 0.01 on the tiny model: the default trust region (0.2) would undo the steps whose
    # distribution these tests compare (it is tested in tests/test_update_guard.py)
    "optim.max_kl=null",
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _local_part(full: RolloutResult, groups: range) -> RolloutResult:
    """What a rank samples for tasks ``groups`` (local group ids from 0), cut from a
    rollout of all tasks."""
    rows = torch.nonzero((full.forest.group >= groups.start) & (full.forest.group < groups.stop))
    forest = full.forest.select(rows.flatten())
    forest = dataclasses.replace(forest, group=forest.group - groups.start, _episodes=None)
    episodes = [
        dataclasses.replace(e, group=e.group - groups.start)
        for e in full.episodes
        if e.group in groups
    ]
    steps = sum(len(e) for e in episodes)
    return RolloutResult(forest, episodes, steps, 0, 0.0)


def _one_update() -> dict[str, torch.Tensor]:
    """Build the run, sample 4 tasks × 4 episodes with a fixed generator, give the rows
    fixed random advantages and run one ``policy_update``; return the weights and the
    metrics (as 0-d tensors). With several processes, also check that gathering each
    rank's share of the groups rebuilds the whole forest."""
    torch.manual_seed(0)
    cfg = load_config("grpo", UPDATE)
    run = build_run(cfg)
    policy = run.policy
    tasks = [Task.make("train", i) for i in range(4)]
    full = run.rollouts(policy, tasks, generator=torch.Generator().manual_seed(11), choice_seed=3)
    if dp.active():
        mine, offset = dp.shard(tasks)
        gathered = dp.gather_rollouts(_local_part(full, range(offset, offset + len(mine))), offset)
        for name in ("group", "parent", "t", "state", "reward", "valid", "success"):
            assert torch.equal(getattr(gathered.forest, name), getattr(full.forest, name)), name
        assert [r.tolist() for r in gathered.forest.response_ids] == [
            r.tolist() for r in full.forest.response_ids
        ]
        assert [e.group for e in gathered.episodes] == [e.group for e in full.episodes]
        assert gathered.env_steps == full.env_steps
        gigpo = {"omega": 1.0}
        assert torch.equal(
            compute_advantages("gigpo", gathered.forest, gigpo, None),
            compute_advantages("gigpo", full.forest, gigpo, None),
        )
    adv = torch.randn(full.forest.num_rows, generator=torch.Generator().manual_seed(5))
    batch = full.forest.to_batch(adv, pad_id=policy.pad_id)
    reference = HFPolicy(copy.deepcopy(policy.model).eval(), policy.tokenizer, policy.device)
    opt = torch.optim.AdamW(trainable_parameters(policy.model), lr=cfg.optim.lr)
    ctx = update_context(cfg, policy, opt, reference)
    metrics = policy_update(ctx, batch, iteration=0, generator=torch.Generator().manual_seed(7))
    out = {f"w.{k}": v.detach().clone() for k, v in policy.model.state_dict().items()}
    out.update({f"m.{k}": torch.tensor(float(v)) for k, v in metrics.items()})
    return out


def join_group(rank: int, world: int, port: int, **extra: str) -> None:
    """Set what torchrun sets for one rank of ``world`` on 127.0.0.1 (plus ``extra``,
    e.g. what accelerate adds for a sharded config); one torch thread."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        CREDO_DIST_TIMEOUT="60",
        **extra,
    )
    torch.set_num_threads(1)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    join_group(rank, world, port)
    assert dp.setup("cpu") and dp.world_size() == world and dp.rank() == rank
    try:
        save_file(_one_update(), str(Path(out) / f"rank{rank}.safetensors"))
    finally:
        dp.teardown()


def run_launcher(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Run a launcher command (torchrun, accelerate launch) with a bounded wait; kill it
    if it overruns; assert it succeeded; return its output."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=RUN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    return out


def cut_after(full: Path, tmp_path: Path, iterations: int) -> Path:
    """A copy of the finished run ``full`` as an interruption after iteration
    ``iterations - 1`` leaves it (no final policy or evaluation, the last checkpoint
    gone, no lock)."""
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "final_policy")
    (cut / "final_eval.json").unlink()
    shutil.rmtree(cut / "checkpoints" / f"step_{iterations}")
    (cut / "checkpoints" / "latest").write_text(f"step_{iterations - 1}")
    (cut / ".lock").unlink(missing_ok=True)
    return cut


def _spawn(world: int, out: Path, worker: Callable[[int, int, int, str], None] = _worker) -> None:
    ctx = mp.start_processes(
        worker,
        args=(world, _free_port(), str(out)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    try:
        deadline = time.monotonic() + JOIN_S
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world} processes did not finish in {JOIN_S:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)


def test_one_update_equals_one_process(tmp_path: Path) -> None:
    assert not dp.active()
    start = {
        k: v.clone()
        for k, v in build_run(load_config("grpo", UPDATE)).policy.model.state_dict().items()
    }
    one = _one_update()  # this process alone: the plain single-process path
    _spawn(WORLD, tmp_path)
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(WORLD)]
    assert ranks[0].keys() == ranks[1].keys() == one.keys()
    moved = 0.0
    for k in one:
        assert torch.equal(ranks[0][k], ranks[1][k]), f"{k} differs between the ranks"
        torch.testing.assert_close(ranks[0][k], one[k], rtol=1e-5, atol=1e-6, msg=k)
        if k.startswith("w.") and one[k].is_floating_point():
            moved = max(moved, float((one[k] - start[k[2:]]).abs().max()))
    # the update moved the weights far beyond the tolerance (lr 0.01: Adam's first step
    # moves each weight with a gradient by about lr), so a wrong normalisation (averaging
    # the gradients instead of summing, a rank's share missing) would fail above
    assert moved > 5e-3
    assert float(one["m.policy/grad_norm"]) > 0 and "m.loss/kl" in one


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CREDO_SRC), str(REPO)]),
        "OMP_NUM_THREADS": "1",
        "CREDO_DIST_TIMEOUT": "60",
    }
    cmd = [
        str(TORCHRUN),
        "--nproc_per_node",
        str(WORLD),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        "-m",
        "credo",
        "train",
        *args,
        "--quiet",
    ]
    out = run_launcher(cmd, cwd, env)
    return subprocess.CompletedProcess(cmd, 0, out)


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(VOLATILE)} for x in lines]


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed (it comes with torch)")
def test_torchrun_train_and_resume(tmp_path: Path) -> None:
    iterations = 3
    train_args = [
        "--recipe",
        "grpo",
        *TINY,
        "objective.entropy_coef=0.01",
        f"train.iterations={iterations}",
        "train.checkpoint_every=1",
        f"train.keep_checkpoints={iterations}",
        f"train.runs_dir={tmp_path}",
        "train.name=full",
    ]
    res = _torchrun(train_args, tmp_path)
    full = tmp_path / "full"
    assert res.stdout.count("run folder:") == 1  # rank 0 alone reports
    assert res.stdout.count("trained (grpo)") == 1
    records = _metrics(full)
    assert [r["iteration"] for r in records] == list(range(iterations))  # one line each
    # the whole iteration's 4 × 4 episodes are in the record, gathered from both ranks
    assert all(r["rollout/env_steps"] > 0 for r in records)
    assert all(r["policy/grad_norm"] > 0 for r in records)
    steps = sorted(p.name for p in (full / "checkpoints").iterdir() if p.name.startswith("step"))
    assert steps == [f"step_{i}" for i in range(1, iterations + 1)]
    assert (full / "final_policy" / "model.safetensors").exists()
    assert not list((full / "ranks").rglob("checkpoints"))  # rank 1 writes no checkpoint
    assert not (full / "ranks" / "1" / "final_policy").exists()
    assert json.loads((full / "processes.json").read_text()) == {"processes": WORLD}

    # an interruption after iteration 2: the run folder as it was then
    cut = cut_after(full, tmp_path, iterations)
    _torchrun(["--resume", str(cut)], tmp_path)
    assert _metrics(cut) == records
    a = load_file(str(full / "final_policy" / "model.safetensors"))
    b = load_file(str(cut / "final_policy" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_shard_bounds_cover_every_task_once() -> None:
    assert [dp.shard_bounds(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    for n in range(1, 30):
        for size in range(1, n + 1):
            bounds = [dp.shard_bounds(n, size, r) for r in range(size)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
            sizes = [b - a for a, b in bounds]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_one_process_is_untouched() -> None:
    """Without a launcher every helper is the identity (the single-process path)."""
    assert not dp.setup("cpu") and not dp.active() and dp.is_main()
    assert dp.shard(["a", "b", "c"]) == (["a", "b", "c"], 0)
    assert dp.rank_seed(1234) == 1234 and dp.my_share([1, 2, 3]) == [1, 2, 3]
    assert dp.any_rank(True) and not dp.any_rank(False)
    assert dp.main_first(lambda: 7) == 7 and dp.broadcast_object("x") == "x"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "true", "WORLD_SIZE": "2"},
            "FSDP_OFFLOAD_PARAMS=true",
        ),
        (
            {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"},
            "zero_stage=3 .* use the FSDP config",
        ),
        (
            {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_FSDP": "true"},
            "both set: pick one",
        ),
        ({"ACCELERATE_USE_MEGATRON_LM": "1"}, "Megatron-LM's tensor/pipeline parallelism"),
        ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two': expected an integer"),
        ({"WORLD_SIZE": "2", "CREDO_DIST_TIMEOUT": "-1"}, "CREDO_DIST_TIMEOUT='-1'"),
    ],
)
def test_bad_launch_is_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", *dp.SHARDED_ENGINES):
        monkeypatch.delenv(name, raising=False)
    for name in (
        "FSDP_OFFLOAD_PARAMS",
        "FSDP_RESHARD_AFTER_FORWARD",
        "FSDP_AUTO_WRAP_POLICY",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    ):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=says):
        dp.setup("cpu")
    assert not dp.active()


def test_resume_with_another_number_of_processes_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    dp.note_processes(tmp_path, resuming=False, say=said.append)
    assert not (tmp_path / dp.PROCESSES_FILE).exists() and not said  # one process: no file
    (tmp_path / dp.PROCESSES_FILE).write_text('{"processes": 2}')
    dp.note_processes(tmp_path, resuming=True, say=said.append)
    assert len(said) == 1 and "trained with 2 process(es) and continues with 1" in said[0]
    assert json.loads((tmp_path / dp.PROCESSES_FILE).read_text()) == {"processes": 1}
