"""Data-parallel training over ``torch.distributed`` (launched by ``torchrun`` or ``accelerate
launch``): the few collective steps the single-process loop needs, each a no-op in one process.

What N processes do, and why the result is the 1-process update on the same global batch:

1. **Rollouts are split by whole groups.** Each iteration's tasks are cut into N contiguous
   shards (:func:`shard`); rank ``r`` samples G episodes of each task of its shard, so a
   group never spans two processes. Rank ``r`` samples from its own random stream
   (:func:`rank_seed`): the sampler draws all live episodes from one generator per call,
   so a shard's episodes cannot equal the ones a 1-process run would draw for those tasks;
   an N-process run is reproducible for that N (and resumes exactly), not equal to a
   1-process run's rollouts.
2. **The forests are gathered before credit** (:func:`gather_rollouts`): every rank holds
   the whole iteration's forest, with the group ids the 1-process run would give (shard
   offsets), so every estimator sees the whole batch — also those with state or statistics
   across groups (GiGPO's anchor states, the state graph, ProAS's progress graph, the task
   source's buffer), and the teachers, the KL reward penalty and the task source observe
   the same rows on every rank. Their state stays identical across ranks without any
   further exchange.
3. **The update splits micro-batches, not the normalisation.** ``policy_update`` computes the
   aggregation weights on each whole mini-batch (global token and row counts) and the
   micro-batch losses add up to the mini-batch loss; rank ``r`` back-propagates every N-th
   micro-batch (:func:`my_share`) and the gradients are **summed** across ranks
   (:func:`reduce_gradients`), which is the gradient of the whole mini-batch — the same
   one a single process accumulates. Clipping and the AdamW step then run on identical
   gradients in every rank, so the weights stay equal without a broadcast.
   With an accelerate FSDP config the trainer is sharded (:mod:`credo.engines.fsdp`):
   every rank then runs the same number of passes (:func:`padding`) and FSDP's
   reduce-scatter does the sum.
4. **Rank 0 owns the run folder**: the run lock, ``config.yaml``, checkpoints (already
   written atomically), ``metrics.jsonl``, the progress bar, the held-out evaluations and
   the final policy. Other ranks keep their own env-error log under ``ranks/<r>/``
   (:func:`rank_dir`).

Every collective waits at most the process group's timeout (``CREDO_DIST_TIMEOUT`` seconds,
default 1800: long enough for rank 0's held-out evaluation, during which the others wait);
``torchrun`` stops the other workers when one fails.

Objects cross processes with ``torch.distributed``'s object collectives (pickle), between
the processes of one job only.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import os
import sys
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from credo.data import RolloutForest
from credo.engines import fsdp, zero
from credo.rollout import RolloutResult
from credo.utils.atomic import write_text_atomic

__all__ = [
    "active",
    "any_rank",
    "barrier",
    "broadcast_object",
    "check_same_weights",
    "gather_rollouts",
    "is_main",
    "main_first",
    "my_share",
    "note_processes",
    "padding",
    "rank",
    "rank_dir",
    "rank_seed",
    "reduce_gradients",
    "setup",
    "shard",
    "shard_bounds",
    "sharded",
    "sharding_name",
    "sum_metrics",
    "teardown",
    "world_size",
]

T = TypeVar("T")

#: Default seconds any collective may wait (``CREDO_DIST_TIMEOUT`` overrides).
DEFAULT_TIMEOUT_S = 1800.0

#: What ``accelerate launch`` sets for the engines that shard the model (FSDP is supported:
#: :mod:`credo.engines.fsdp`; the others are refused, :data:`REFUSED_ENGINES`).
SHARDED_ENGINES = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_MEGATRON_LM")

#: The sharded engines credo refuses, and why (one line each).
REFUSED_ENGINES = {
    "ACCELERATE_USE_MEGATRON_LM": "Megatron-LM's tensor/pipeline parallelism is not integrated",
}

#: ``rollout.stats`` keys that are means over a rank's episodes (averaged across ranks,
#: weighted by episodes); every other key is a count (summed).
MEAN_STATS = frozenset(
    {
        "rollout/resample_confidence",
        "rollout/tree_p_root",
        "rollout/tree_roots",
        "rollout/tree_branch_depth",
    }
)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer (set by torchrun)") from None


def active() -> bool:
    """More than one process is training together (the process group is up)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 alone)."""
    return dist.get_rank() if active() else 0


def world_size() -> int:
    """The number of processes training together (1 alone)."""
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """This process is rank 0 (always true alone): it writes the run folder."""
    return rank() == 0


def timeout_s() -> float:
    """Seconds any collective may wait: ``CREDO_DIST_TIMEOUT`` or :data:`DEFAULT_TIMEOUT_S`."""
    raw = os.environ.get("CREDO_DIST_TIMEOUT", "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"CREDO_DIST_TIMEOUT={raw!r}: expected seconds > 0") from None
    if not value > 0:
        raise ValueError(f"CREDO_DIST_TIMEOUT={raw!r}: expected seconds > 0")
    return value


def setup(device: str = "auto") -> bool:
    """Join the process group when launched as one of several processes.

    Reads ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` (set by ``torchrun`` and ``accelerate
    launch``; ``MASTER_ADDR``/``MASTER_PORT`` give the rendezvous). Without ``WORLD_SIZE``
    or with ``WORLD_SIZE=1`` nothing happens. The backend is NCCL when the model goes to a
    CUDA device (each rank on ``cuda:LOCAL_RANK``), else gloo. Idempotent.

    With an accelerate FSDP or DeepSpeed config (``ACCELERATE_USE_FSDP``,
    ``ACCELERATE_USE_DEEPSPEED``), its settings are checked here
    (:func:`credo.engines.fsdp.settings`, :func:`credo.engines.zero.stage`) and the training
    state shards itself later (:func:`sharded`).

    Raises:
        ValueError: Megatron-LM was asked for (:data:`REFUSED_ENGINES`), an FSDP or
            DeepSpeed setting credo does not support, or the launcher's variables are
            incomplete or malformed.
        ImportError: a DeepSpeed config without the deepspeed package.

    Args:
        device: ``model.device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``).

    Returns:
        Whether several processes train together.
    """
    refused = [n for n in REFUSED_ENGINES if os.environ.get(n, "").lower() in ("1", "true")]
    if refused:
        raise ValueError(
            f"{refused[0]} is set (an accelerate config with Megatron-LM): "
            f"{REFUSED_ENGINES[refused[0]]}; use an FSDP or DeepSpeed config "
            "(examples/accelerate/) or plain data parallelism (accelerate launch --multi_gpu, "
            "torchrun), see docs/engines/accelerate.md"
        )
    if fsdp.requested() and zero.requested():
        raise ValueError("ACCELERATE_USE_FSDP and ACCELERATE_USE_DEEPSPEED are both set: pick one")
    if fsdp.requested():
        fsdp.settings()  # a setting credo does not support stops here, in one line
    if zero.requested():
        zero.stage()
        zero.require()
    size = _env_int("WORLD_SIZE", 1)
    if size < 1:
        raise ValueError(f"WORLD_SIZE={size}: expected at least 1 process")
    if size == 1 or active():
        return active()
    if not dist.is_available():
        raise RuntimeError(f"WORLD_SIZE={size} but this torch build has no torch.distributed")
    wait = timeout_s()
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise ValueError(
                f"WORLD_SIZE={size} but {name} is not set; launch with torchrun "
                "--nproc_per_node N -m credo train ... or accelerate launch"
            )
    cuda = torch.cuda.is_available() and device != "cpu"
    if cuda:
        torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
    # torch.distributed.nn.functional binds the default group as its functions' default
    # argument when it is first imported: imported once the group exists (torch's FSDP
    # imports it, and transformers imports that when it builds a model), it keeps the
    # group alive past teardown(), whose docstring says why that matters; imported now,
    # the default is None (the default group at call time)
    importlib.import_module("torch.distributed.nn.functional")

    dist.init_process_group(
        backend="nccl" if cuda else "gloo",
        timeout=timedelta(seconds=wait),
    )
    return active()


def _device() -> torch.device:
    """Where collective tensors live: the current CUDA device under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sharded() -> bool:
    """The training state is sharded over the processes (an accelerate FSDP or DeepSpeed
    config, several processes): see :mod:`credo.engines.fsdp` and :mod:`credo.engines.zero`.
    Every rank then runs the same number of passes, and the engine reduces the gradients."""
    return active() and (fsdp.requested() or zero.requested())


def sharding_name() -> str:
    """The sharding engine the launcher asked for, as error messages name it."""
    if zero.requested():
        return f"accelerate's DeepSpeed ZeRO-{zero.stage()} (ACCELERATE_USE_DEEPSPEED=true)"
    return fsdp.NAME


def barrier() -> None:
    """Wait for every rank (bounded by the process group's timeout); a no-op alone."""
    if active():
        dist.barrier()


def broadcast_object(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (``obj`` itself alone)."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, device=_device())
    return box[0]


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (e.g. a stop request that reached only one)."""
    if not active():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def main_first(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0, then on the other ranks (which then find what rank 0 cached,
    e.g. the warm start). A failure on rank 0 stops the other ranks with one line naming
    it instead of leaving them waiting."""
    if not active():
        return fn()
    error: str | None = None
    result: Any = None
    if is_main():
        try:
            result = fn()
        except BaseException as exc:  # tell the others, then re-raise
            error = f"{type(exc).__name__}: {exc}"
            broadcast_object(error)
            raise
    error = broadcast_object(error)
    if error is not None:
        raise RuntimeError(f"rank 0 failed, so rank {rank()} stops: {error}")
    if not is_main():
        result = fn()
    return result


def rank_dir(run_dir: Path) -> Path:
    """Where this rank keeps its own files: ``run_dir`` on rank 0, ``run_dir/ranks/<r>``
    on the others (created)."""
    if is_main():
        return run_dir
    out = run_dir / "ranks" / str(rank())
    out.mkdir(parents=True, exist_ok=True)
    return out


def rank_seed(seed: int) -> int:
    """This rank's seed of a random stream whose 1-process seed is ``seed`` (``seed``
    itself alone, so one process is unchanged)."""
    if not active():
        return seed
    return int(np.random.SeedSequence([seed, rank(), world_size()]).generate_state(1)[0])


def shard(items: Sequence[T]) -> tuple[list[T], int]:
    """This rank's contiguous share of ``items`` and the index of its first item.

    Sizes differ by at most one, larger shares first (``len(items) = 10``, 4 ranks →
    3, 3, 2, 2). Alone: all items, offset 0.

    Raises:
        ValueError: fewer items than ranks (a rank would sample no group).
    """
    n, size = len(items), world_size()
    if size == 1:
        return list(items), 0
    if n < size:
        raise ValueError(
            f"rollout.tasks_per_iter={n} is smaller than the {size} training processes; "
            f"each process samples whole groups, so use at least {size} tasks per iteration"
        )
    start, stop = shard_bounds(n, size, rank())
    return list(items[start:stop]), start


def shard_bounds(n: int, size: int, r: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``r``'s share of ``n`` items over ``size`` ranks: contiguous,
    in rank order, covering ``0..n`` once, sizes differing by at most one (larger first)."""
    base, extra = divmod(n, size)
    start = r * base + min(r, extra)
    return start, start + base + (r < extra)


def my_share(chunks: Sequence[T]) -> list[T]:
    """The chunks this rank processes: every N-th, starting at its rank (all alone)."""
    return list(chunks[rank() :: world_size()])


def padding(chunks: int) -> int:
    """How many zero-weight passes this rank adds to its :func:`my_share` of ``chunks``
    micro-batches so that every rank runs ``ceil(chunks / N)`` passes, as a sharded
    trainer needs (its collectives pair up pass by pass); 0 unsharded or alone."""
    if not sharded():
        return 0
    size = world_size()
    return -(-chunks // size) - len(range(rank(), chunks, size))


def _shift_groups(result: RolloutResult, offset: int) -> tuple[RolloutForest, list[Any]]:
    """A rank's forest and episodes with group ids counted from the global ``offset``."""
    forest = result.forest
    if offset:
        forest = dataclasses.replace(forest, group=forest.group + offset, _episodes=None)
    episodes = [dataclasses.replace(e, group=e.group + offset) for e in result.episodes]
    return forest, episodes


def gather_rollouts(result: RolloutResult, offset: int) -> RolloutResult:
    """Every rank's rollouts as one, in rank order: the whole iteration's forest (parent
    pointers shifted, group ids = ``offset`` + local id, so task ``i`` of the iteration is
    group ``i`` as in one process) and episodes; env steps, generated tokens and count
    stats summed, mean stats averaged weighted by episodes, seconds the slowest rank's.
    The samplers' trajectories (env handles) stay local and are dropped. Alone:
    ``result`` unchanged."""
    if not active():
        return result
    forest, episodes = _shift_groups(result, offset)
    mine = (forest, episodes, result.env_steps, result.generated_tokens, result.seconds)
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, (*mine, dict(result.stats)))
    stats: dict[str, float] = defaultdict(float)
    n_eps = sum(len(p[1]) for p in parts)
    for _, eps, _, _, _, st in parts:
        for k, v in st.items():
            weight = len(eps) / max(1, n_eps) if k in MEAN_STATS else 1.0
            stats[k] += weight * float(v)
    return RolloutResult(
        forest=RolloutForest.concat([p[0] for p in parts]),
        episodes=[e for p in parts for e in p[1]],
        env_steps=sum(p[2] for p in parts),
        generated_tokens=sum(p[3] for p in parts),
        seconds=max(p[4] for p in parts),
        stats=dict(stats),
    )


def reduce_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks, in place (a no-op alone).

    A parameter no rank gave a gradient keeps ``grad = None`` (AdamW then skips it, as in
    one process); one that some ranks did not reach counts zero there. One all-reduce per
    dtype over a flat buffer. Sharded (FSDP, DeepSpeed), the engine reduces the gradients:
    nothing to do.
    """
    if not active() or sharded():
        return
    params = [p for p in params if p.requires_grad]
    dev = _device()
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=dev)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    live = [p for p, h in zip(params, has.tolist()) if h > 0]
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = defaultdict(list)
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype[p.grad.dtype].append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1).to(dev) for p in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        start = 0
        for p in group:
            n = p.grad.numel()
            p.grad.copy_(flat[start : start + n].view_as(p.grad).to(p.grad.device))
            start += n


def sum_metrics(
    metrics: dict[str, float], merge: Mapping[str, Callable[[float, float], float]] | None = None
) -> defaultdict[str, float]:
    """Per-key sums of the ranks' metric sums (keys a rank lacks count zero there), except
    the keys of ``merge``, combined with their own function over the ranks that report
    them (e.g. ``min`` for a minimum); the dict itself alone."""
    out: defaultdict[str, float] = defaultdict(float)
    if not active():
        out.update(metrics)
        return out
    merge = merge or {}
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, dict(metrics))
    seen: set[str] = set()
    for part in parts:
        for k, v in part.items():
            if k in merge:
                out[k] = merge[k](out[k], float(v)) if k in seen else float(v)
                seen.add(k)
            else:
                out[k] += float(v)
    return out


def check_same_weights(model: torch.nn.Module) -> None:
    """Stop with one line when the ranks start from different weights (a warm start or a
    checkpoint that differs between them): data parallelism keeps equal weights equal, it
    cannot make unequal ones equal. A no-op alone."""
    if not active():
        return
    with torch.no_grad():
        total = torch.zeros(2, dtype=torch.float64, device=_device())
        for i, t in enumerate(model.state_dict().values()):
            if t.is_floating_point():
                x = t.detach().to(torch.float64)
                total[0] += x.sum().to(total.device)
                total[1] += (x.abs().sum() * ((i % 7) + 1)).to(total.device)
        low, high = total.clone(), total.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if not torch.equal(low, high):
        raise RuntimeError(
            f"rank {rank()}: the {world_size()} processes start from different weights; "
            "clear the warm-start cache (CREDO_CACHE) or the run's checkpoints and start again"
        )


def teardown() -> int:
    """Leave the process groups (after :func:`setup`) and free them; returns how many
    outlived it (a no-op returning 0 when none is up).

    Destroying a gloo group does not stop its worker threads: they run until no Python
    object references the group. A worker that lets go of a finished collective's tensors
    after the interpreter began to exit aborts the process ("terminate called without an
    active exception", pytorch/pytorch#109478), which a process leaving right after its
    last collective (a rank other than 0, while rank 0 evaluates) meets on a busy machine.
    So the other references go too: DeepSpeed's (its own ``destroy_process_group``; its
    engine's, the parameters' and FSDP's device mesh's went with
    :meth:`credo.engines.Engine.close`), and the garbage is collected: each group's
    destructor then joins its threads while Python runs.

    One reference stays on rank 0 of a run without a DeepSpeed config (plain data
    parallelism, FSDP) when DeepSpeed is installed: accelerate imports it while rank 0
    saves a checkpoint, and DeepSpeed's backend binds the default group as a default
    argument. Harmless there: rank 0's last collective comes before its final
    evaluation, so no worker is still busy when it exits.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    groups = [weakref.ref(g) for g in list(dist.distributed_c10d._world.pg_map)]
    deepspeed_comm = sys.modules.get("deepspeed.comm")
    if deepspeed_comm is not None and deepspeed_comm.is_initialized():
        deepspeed_comm.destroy_process_group()  # torch's, then DeepSpeed's references
    else:
        dist.destroy_process_group()
    gc.collect()
    return sum(g() is not None for g in groups)


#: The file in a run folder that records how many processes trained it (absent: one).
PROCESSES_FILE = "processes.json"


def note_processes(run_dir: Path, *, resuming: bool, say: Callable[[str], None]) -> None:
    """Rank 0 records how many processes train the run (``processes.json``, only when more
    than one; ``"sharding": "fsdp"`` when the trainer is sharded) and, on a resume with another number, says that the run continues correctly
    but not identically (each rank's random stream depends on the number). Rank 0 only;
    nothing alone on a fresh single-process run."""
    if not is_main():
        return
    path = run_dir / PROCESSES_FILE
    before = 1
    if resuming and path.exists():
        try:
            before = int(json.loads(path.read_text())["processes"])
        except (ValueError, KeyError, TypeError):
            say(f"warning: {path} is unreadable; it is rewritten")
    now = world_size()
    if resuming and before != now:
        say(
            f"note: {run_dir} was trained with {before} process(es) and continues with {now}: "
            f"the rollouts now come from other random streams (resume with {before} to "
            "continue it exactly)"
        )
    record: dict[str, Any] = {"processes": now}
    if sharded():  # accelerate's FSDP or DeepSpeed
        record["sharding"] = "fsdp" if fsdp.requested() else f"zero{zero.stage()}"
    if now > 1 or path.exists():
        write_text_atomic(path, json.dumps(record) + "\n")
