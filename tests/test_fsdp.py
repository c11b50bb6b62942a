"""Sharded training (:mod:`credo.engines.fsdp`) with 2 gloo processes on 127.0.0.1.

- One update on the same global batch with a trainer sharded by ``fully_shard`` (as an
  accelerate FSDP config asks: ``ACCELERATE_USE_FSDP=true``) gives the weights, the
  metrics and the AdamW moments of 1 process; the ranks' micro-batch counts differ, so
  one rank runs zero-weight passes; the gathered optimizer state loads back shard by shard.
- ``accelerate launch --config_file examples/accelerate/fsdp.yaml -m credo train`` writes
  one run folder with full safetensors checkpoints, and ``--resume`` with 2 processes ends
  with the weights and metrics of the uninterrupted run.

Every process has a bounded wait (``CREDO_DIST_TIMEOUT``, the join deadline, the
subprocess timeout) and is killed in a ``finally``.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from credo.engines import Engine, fsdp, zero
from credo.engines import distributed as dp
from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.policy.lora import trainable_parameters
from credo.train.config import load_config
from credo.train.parts import update_context
from credo.train.run import build_run
from credo.train.update import policy_update
from test_distributed import (
    CREDO_SRC,
    REPO,
    TINY,
    UPDATE,
    WORLD,
    _free_port,
    _metrics,
    _spawn,
    cut_after,
    join_group,
    run_launcher,
)

pytestmark = pytest.mark.slow  # the slow tier: several processes, sharded training (FSDP2)

ACCELERATE = Path(sys.executable).with_name("accelerate")
FSDP_YAML = REPO / "examples" / "accelerate" / "fsdp.yaml"
RUN_S = 150  # one launch's deadline


#: ``optim.lr_schedule=linear`` over 2 iterations: iteration 1 steps at half ``optim.lr``.
ANNEALED = ["optim.lr_schedule=linear", "train.iterations=2"]


def _sharded_update() -> dict[str, torch.Tensor]:
    """One ``policy_update`` (iteration 1 of 2: the rate annealed to half) on 4 tasks × 4
    episodes (fixed generator and advantages), sharded as the launcher's variables ask
    (FSDP: a sharded trainer; DeepSpeed: a ZeRO engine around the AdamW); returns the
    (full) weights, the metrics, the (gathered) AdamW state and, sharded, the zero-weight
    passes run and a reload check of that state."""
    torch.manual_seed(0)
    # 3 micro-batches per mini-batch: rank 1 pads; the rate annealed to half at the update
    # of iteration 1 of 2 reaches the engine's step (DeepSpeed wraps the AdamW)
    cfg = load_config("grpo", [*UPDATE, *ANNEALED])
    run = build_run(cfg)
    policy = run.policy
    tasks = [Task.make("train", i) for i in range(4)]
    full = run.rollouts(policy, tasks, generator=torch.Generator().manual_seed(11), choice_seed=3)
    adv = torch.randn(full.forest.num_rows, generator=torch.Generator().manual_seed(5))
    batch = full.forest.to_batch(adv, pad_id=policy.pad_id)
    reference = HFPolicy(copy.deepcopy(policy.model).eval(), policy.tokenizer, policy.device)
    use_fsdp = dp.sharded() and fsdp.requested()
    use_zero = dp.sharded() and zero.requested()
    start = copy.deepcopy(policy.model) if use_zero else None  # for the reload check
    trainer = fsdp.shard_policy(policy, fsdp.settings()) if use_fsdp else policy

    def adamw(model: torch.nn.Module) -> torch.optim.AdamW:
        return torch.optim.AdamW(trainable_parameters(model), lr=cfg.optim.lr)

    opt = adamw(trainer.model)
    engine = zero.Zero(policy.model, opt, cfg, zero.stage()) if use_zero else None
    idle = [0]
    real_idle = fsdp.idle_loss

    def counted(*args: object) -> torch.Tensor:
        idle[0] += 1
        return real_idle(*args)  # type: ignore[arg-type]

    fsdp.idle_loss = counted  # type: ignore[assignment]
    engines = Engine(trainer=trainer if use_fsdp else None, zero=engine)
    try:
        metrics = policy_update(
            update_context(cfg, trainer, opt, reference, engine=engines),
            batch,
            iteration=1,
            generator=torch.Generator().manual_seed(7),
        )
    finally:
        fsdp.idle_loss = real_idle  # type: ignore[assignment]
    out: dict[str, torch.Tensor] = {}
    if use_fsdp:
        fsdp.copy_full_weights(trainer, policy)
        local = sum(p.to_local().numel() for p in trainer.model.parameters())  # type: ignore[attr-defined]
        out["x.shard_frac"] = torch.tensor(local / sum(p.numel() for p in policy.parameters()))
        state = fsdp.gathered_optimizer(opt).state_dict()
        fresh = adamw(trainer.model)
        fsdp.FullStateOptimizer(fresh).load_state_dict(state)
        again = fsdp.gathered_optimizer(fresh).state_dict()
    elif engine is not None:
        assert start is not None
        state = engine.gathered().state_dict()
        other = zero.Zero(start, adamw(start), cfg, zero.stage())
        other.load_state_dict(state)
        again = other.gathered().state_dict()
        other.close()
    else:
        state = again = opt.state_dict()
    if dp.sharded():
        out["x.idle"] = torch.tensor(float(idle[0]))
        same = all(
            torch.equal(state["state"][i][k], again["state"][i][k])
            for i in state["state"]
            for k in state["state"][i]
        )
        out["x.reload_equal"] = torch.tensor(float(same and len(again["state"]) > 0))
    out.update({f"w.{k}": v.detach().clone() for k, v in policy.model.state_dict().items()})
    out.update({f"m.{k}": torch.tensor(float(v)) for k, v in metrics.items()})
    for i, st in state["state"].items():
        for k in ("exp_avg", "exp_avg_sq", "step"):
            out[f"o.{i}.{k}"] = st[k].detach().clone()
    engines.close()  # as the loop does after the last update (sharded_worker checks it)
    return out


#: The variables ``accelerate launch`` sets for the FSDP config.
FSDP_ENV = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
}


def sharded_worker(engine: dict[str, str], rank: int, world: int, port: int, out: str) -> None:
    """One rank of a sharded update (``engine``: the variables accelerate sets for its
    FSDP or DeepSpeed config); saves :func:`_sharded_update`'s tensors for the test, and
    how many of the process groups outlived ``dp.teardown`` (their worker threads abort a
    process that exits right after a collective, see ``dp.teardown``)."""
    join_group(rank, world, port, **engine)
    assert dp.setup("cpu") and dp.sharded() and dp.rank() == rank
    groups = 0
    try:
        save_file(_sharded_update(), str(Path(out) / f"rank{rank}.safetensors"))
        groups = len(dist.distributed_c10d._world.pg_map)
    finally:
        live = dp.teardown()
    (Path(out) / f"rank{rank}.groups.json").write_text(json.dumps([live, groups]))


def ranks_equal_one_process(engine: dict[str, str], tmp_path: Path) -> list[dict[str, Any]]:
    """Run the update alone and on :data:`WORLD` sharded ranks; assert that both ranks
    equal each other and the single process (weights, metrics, AdamW moments), that the
    rank with fewer micro-batches padded, and that the optimizer state reloads; return
    the ranks' tensors and, last, the single process's."""
    assert not dp.active()
    one = _sharded_update()  # this process alone: the plain single-process path
    _spawn(WORLD, tmp_path, worker=functools.partial(sharded_worker, engine))
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(WORLD)]
    extra = {k for k in ranks[0] if k.startswith("x.")}
    assert ranks[0].keys() - extra == one.keys()
    for k in one:
        assert torch.equal(ranks[0][k], ranks[1][k]), f"{k} differs between the ranks"
        torch.testing.assert_close(ranks[0][k], one[k], rtol=1e-5, atol=1e-6, msg=k)
    # odd micro-batch counts: rank 1 padded with zero-weight passes, rank 0 did not
    assert float(ranks[0]["x.idle"]) == 0 and float(ranks[1]["x.idle"]) >= 1
    assert all(float(r["x.reload_equal"]) == 1.0 for r in ranks)
    assert float(one["m.policy/grad_norm"]) > 0
    # the ranks stepped at the annealed rate, as one process did: Adam's first step moves
    # a weight by about the rate, so a rank at the full rate would fail the comparison
    assert float(one["m.optim/lr"]) == pytest.approx(0.005)
    for r in range(WORLD):  # every group (the default one, the engine's) was freed
        live, total = json.loads((tmp_path / f"rank{r}.groups.json").read_text())
        assert total >= 1 and live == 0, f"rank {r}: {live} of {total} process groups live on"
    return [*ranks, one]


def test_sharded_update_equals_one_process(tmp_path: Path) -> None:
    *ranks, one = ranks_equal_one_process(FSDP_ENV, tmp_path)
    # the trainer held about half of the weights per rank (1-row shards round up)
    assert all(0.45 < float(r["x.shard_frac"]) < 0.6 for r in ranks)
    assert any(k.startswith("o.") for k in one)


def _accelerate(args: list[str], cwd: Path, launch: list[str] | None = None) -> str:
    """``accelerate launch`` (``launch``: its own options; default: the FSDP config) of
    ``credo train args`` with 2 processes; returns the output."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(CREDO_SRC), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        "OMP_NUM_THREADS": "1",
        "CREDO_DIST_TIMEOUT": "60",
    }
    cmd = [
        str(ACCELERATE),
        "launch",
        *(launch or ["--config_file", str(FSDP_YAML)]),
        "--num_processes",
        str(WORLD),
        "--main_process_port",
        str(_free_port()),
        "-m",
        "credo",
        "train",
        *args,
        "--quiet",
    ]
    return run_launcher(cmd, cwd, env)


def assert_sharded_run(full: Path, sharding: str, iterations: int) -> list[dict[str, Any]]:
    """The launcher's variables reached credo (``processes.json`` names ``sharding``),
    every iteration was logged with a gradient, and the checkpoints hold full tensors;
    returns the metrics."""
    assert json.loads((full / "processes.json").read_text()) == {
        "processes": WORLD,
        "sharding": sharding,
    }
    records = _metrics(full)
    assert [r["iteration"] for r in records] == list(range(iterations))
    assert all(r["policy/grad_norm"] > 0 for r in records)
    # the default trust region (optim.max_kl) is not built on a sharded optimizer state
    assert not any("policy/steps_kept" in r for r in records)
    assert_full_checkpoints(full)
    return records


def assert_resume_is_exact(
    full: Path,
    tmp_path: Path,
    iterations: int,
    records: list[dict[str, Any]],
    launch: list[str] | None = None,
) -> None:
    """Resuming a copy of ``full`` cut after iteration ``iterations - 1`` (with the
    same launcher) gives the same metrics and bitwise the same final weights."""
    cut = cut_after(full, tmp_path, iterations)
    _accelerate(["--resume", str(cut)], tmp_path, launch=launch)
    assert _metrics(cut) == records
    a = load_file(str(full / "final_policy" / "model.safetensors"))
    b = load_file(str(cut / "final_policy" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_full_checkpoints(full: Path) -> None:
    """The checkpoint after iteration 1 holds full tensors, written once: every AdamW
    moment has the shape of its parameter."""
    weights = load_file(str(full / "checkpoints" / "step_1" / "policy" / "model.safetensors"))
    moments = load_file(str(full / "checkpoints" / "step_1" / "optimizer.safetensors"))
    shapes = sorted(tuple(v.shape) for v in weights.values())
    assert sorted(tuple(v.shape) for k, v in moments.items() if k.endswith("exp_avg")) == shapes


@pytest.mark.skipif(
    not ACCELERATE.exists(), reason="accelerate not installed (make smollm installs it)"
)
def test_accelerate_fsdp_train_and_resume(tmp_path: Path) -> None:
    iterations = 2
    out = _accelerate(
        [
            "--recipe",
            "grpo",
            *TINY,
            "objective.entropy_coef=0.01",
            "optim.micro_batch_rows=24",  # an odd number of micro-batches: padded passes
            f"train.iterations={iterations}",
            "train.checkpoint_every=1",
            f"train.keep_checkpoints={iterations}",
            f"train.runs_dir={tmp_path}",
            "train.name=full",
        ],
        tmp_path,
    )
    full = tmp_path / "full"
    assert out.count("run folder:") == 1
    assert out.count("optim.max_kl=0.2 is off with accelerate's FSDP") == 1  # rank 0 alone
    # the launcher's ACCELERATE_USE_FSDP reached credo: the trainer was sharded
    records = assert_sharded_run(full, "fsdp", iterations)
    assert not list((full / "ranks").rglob("checkpoints"))
    assert_resume_is_exact(full, tmp_path, iterations, records)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FSDP_RESHARD_AFTER_FORWARD": "no_shard"}, "for no sharding launch plain data"),
        (  # FSDP1's older field, as the launcher passes it with the default reshard flag
            {"FSDP_SHARDING_STRATEGY": "HYBRID_SHARD", "FSDP_RESHARD_AFTER_FORWARD": "true"},
            "'HYBRID_SHARD': credo shards over all processes of one group only",
        ),
        ({"FSDP_RESHARD_AFTER_FORWARD": "maybe"}, "expected true, false"),
        ({"FSDP_OFFLOAD_PARAMS": "true"}, "CPU offload is not supported"),
        ({"FSDP_ACTIVATION_CHECKPOINTING": "true"}, "model.gradient_checkpointing=true"),
        ({"FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP"}, "fsdp_auto_wrap_policy=SIZE_BASED_WRAP"),
    ],
)
def test_unsupported_fsdp_settings_are_one_line(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        fsdp.settings({"ACCELERATE_USE_FSDP": "true", **env})


def test_fsdp_settings_from_accelerate() -> None:
    assert fsdp.settings({}) == fsdp.FsdpSettings(True, (), True)
    got = fsdp.settings(
        {
            "FSDP_RESHARD_AFTER_FORWARD": "shard_grad_op",  # FSDP1's name, as accelerate passes it
            "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer, LlamaMLP",
            "FSDP_AUTO_WRAP_POLICY": "transformer_based_wrap",
        }
    )
    assert got == fsdp.FsdpSettings(False, ("LlamaDecoderLayer", "LlamaMLP"), True)
    fsdp2 = {"FSDP_VERSION": "2", "FSDP_SHARDING_STRATEGY": "FULL_SHARD"}  # the launcher's default
    assert not fsdp.settings({**fsdp2, "FSDP_RESHARD_AFTER_FORWARD": "false"}).reshard_after_forward
    old = {"FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP", "FSDP_RESHARD_AFTER_FORWARD": "true"}
    assert not fsdp.settings(old).reshard_after_forward  # FSDP1's older field
    assert fsdp.requested({"ACCELERATE_USE_FSDP": "true"}) and not fsdp.requested({})


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["model.lora={r: 4}"], "model.lora with accelerate's FSDP"),
        ([], "rollout.engine=vllm with accelerate's FSDP"),
    ],
)
def test_unsupported_run_options_are_one_line(overrides: list[str], says: str) -> None:
    cfg = load_config("grpo", [*TINY, *overrides])
    if not overrides:  # vllm is not installed here: the config check refuses it earlier
        cfg.rollout.engine = "vllm"
    with pytest.raises(ValueError, match=says):
        fsdp.check_config(cfg)


def test_padding_is_zero_unsharded() -> None:
    assert not dp.sharded() and dp.padding(5) == 0


def test_padding_evens_every_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sharded, each rank's micro-batches plus its zero-weight passes make ceil(n / N)."""
    monkeypatch.setattr(dp, "sharded", lambda: True)
    for size in range(1, 7):
        monkeypatch.setattr(dp, "world_size", lambda size=size: size)
        for n in range(1, 30):
            for r in range(size):
                monkeypatch.setattr(dp, "rank", lambda r=r: r)
                share = dp.my_share(list(range(n)))
                assert len(share) + dp.padding(n) == -(-n // size)
                assert dp.padding(n) in (0, 1)
