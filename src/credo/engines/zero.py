"""ZeRO stage 1 and 2 (DeepSpeed) behind an ordinary accelerate config file
(``distributed_type: DEEPSPEED``; ``accelerate launch`` then sets
``ACCELERATE_USE_DEEPSPEED=true`` and the ``ACCELERATE_DEEPSPEED_*`` variables this module
reads).

How a ZeRO run keeps the exact update of :mod:`credo.engines.distributed` (the 1-process
update on the same global batch):

1. **The weights stay whole in every process.** ZeRO-1 shards AdamW's moments (and the
   fp32 master weights) over the processes, ZeRO-2 the gradients too; the model itself is
   whole everywhere and is updated in place after each step, so rollouts, evaluations,
   teachers and the checkpoints' weights use it as in plain data parallelism, with no
   extra copy. ``deepspeed.initialize`` wraps credo's own AdamW
   (``zero_allow_untested_optimizer``) with a config built from credo's options
   (:func:`engine_config`): the clip is ``optim.grad_clip``, and credo marks the last
   micro-batch of each mini-batch as the step boundary itself.
2. **Equal passes.** ZeRO-2 reduces gradient buckets during every backward, so the ranks
   pad their micro-batches with zero-weight passes exactly as under FSDP
   (:func:`credo.engines.distributed.padding`).
3. **Summed gradients.** DeepSpeed averages the gradients over the ranks; each backward
   gets its loss × N, so the average is credo's sum (exact for N a power of two, within
   rounding otherwise).
4. **Checkpoints** hold full tensors in the files one process writes: every rank
   assembles each parameter's AdamW moments from the ranks' fragments (an all-reduce per
   tensor, :meth:`Zero.gathered`), rank 0 writes; on ``--resume`` each rank copies its own
   fragments out of the full tensors (:meth:`Zero.load_state_dict`), so a run resumes
   with another number of processes, another stage or no DeepSpeed at all.

Memory per process: the weights whole, plus 1/N of the fp32 master weights and AdamW
moments (ZeRO-1) and of the gradients (ZeRO-2, transiently whole per bucket). ZeRO-3
(sharded weights) is refused: use the FSDP config (:mod:`credo.engines.fsdp`).

Paper: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (SC 2020), https://arxiv.org/abs/1910.02054.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DEEPSPEED_ENV", "Zero", "engine_config", "requested", "require", "stage"]

#: What ``accelerate launch`` sets for a DeepSpeed config.
DEEPSPEED_ENV = "ACCELERATE_USE_DEEPSPEED"

#: AdamW's per-parameter tensors a checkpoint keeps.
MOMENTS = ("exp_avg", "exp_avg_sq")


def requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher asked for DeepSpeed (``ACCELERATE_USE_DEEPSPEED`` is true)."""
    env = os.environ if env is None else env
    return env.get(DEEPSPEED_ENV, "").strip().lower() in ("1", "true", "yes")


def stage(env: Mapping[str, str] | None = None) -> int:
    """The ZeRO stage accelerate asks for (1 or 2).

    Raises:
        ValueError: one line for a stage, an offload or a DeepSpeed JSON file credo does
            not support, saying what to use instead.
    """
    env = os.environ if env is None else env
    config_file = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "").strip()
    if config_file and config_file.lower() != "none":
        raise ValueError(
            f"deepspeed_config_file={config_file}: credo builds DeepSpeed's config from its own "
            "options; give zero_stage in the accelerate config instead"
        )
    raw = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2").strip()
    if raw not in ("0", "1", "2", "3"):
        raise ValueError(f"zero_stage={raw!r}: expected 1 or 2")
    if raw == "0":
        raise ValueError(
            "zero_stage=0 shards nothing: launch plain data parallelism (accelerate launch "
            "--multi_gpu or torchrun)"
        )
    if raw == "3":
        raise ValueError(
            "zero_stage=3 (sharded weights) is not supported: use the FSDP config "
            "(examples/accelerate/fsdp.yaml), which shards the weights too"
        )
    for name in ("OFFLOAD_OPTIMIZER_DEVICE", "OFFLOAD_PARAM_DEVICE"):
        value = env.get(f"ACCELERATE_DEEPSPEED_{name}", "none").strip().lower()
        if value not in ("", "none"):
            raise ValueError(
                f"{name.lower()}={value}: DeepSpeed offload is not supported; use "
                "offload_optimizer_device: none"
            )
    return int(raw)


def require() -> None:
    """Import DeepSpeed, or stop with one line saying how to install it.

    Raises:
        ImportError: the ``deepspeed`` package is missing.
    """
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        raise ImportError(
            "an accelerate DeepSpeed config needs the deepspeed package: pip install "
            "'credo[deepspeed]' (it builds against the installed torch, see "
            "docs/engines/accelerate.md)"
        ) from None


def engine_config(cfg: Any, zero_stage: int) -> dict[str, Any]:
    """DeepSpeed's config for credo's update: one engine call per micro-batch (credo sets
    the step boundary), ``optim.grad_clip``, fp32 (credo chooses the model's dtype)."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": float(cfg.optim.grad_clip),
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


class Zero:
    """credo's AdamW inside a DeepSpeed ZeRO-1/2 engine.

    Args:
        model: the policy's model (whole; DeepSpeed keeps it whole and updates it).
        optimizer: AdamW over the model's trainable parameters, not stepped yet.
        cfg: the run config (``optim.grad_clip``).
        zero_stage: 1 or 2.
    """

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any, zero_stage: int
    ) -> None:
        import deepspeed

        _skip_cpu_shm_kernel()
        #: The optimizer's parameter groups as one process saves them (``params`` numbered).
        self.param_groups = optimizer.state_dict()["param_groups"]
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=engine_config(cfg, zero_stage)
        )

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Back-propagate one micro-batch's ``loss`` (× N: DeepSpeed averages, credo sums);
        ``last``: the mini-batch's last pass on this rank, where the gradients are reduced."""
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * dist.get_world_size())

    def step(self) -> torch.Tensor:
        """Clip to ``optim.grad_clip`` and step; returns the global gradient norm before
        clipping (as ``clip_grad_norm_`` does)."""
        self.engine.step()
        return torch.as_tensor(float(self.engine.get_global_grad_norm()))

    def close(self) -> None:
        """After the last update: let go of the process groups. The engine removes its
        gradient hooks, the model loses the forward hooks that call back into the engine,
        and the parameters the group and fragment mapping it attached to them (the model
        outlives the engine); :func:`credo.engines.distributed.teardown` can then free the
        groups while Python still runs."""
        self.engine.destroy()
        for name in (
            "module_forward_pre_hook",
            "module_forward_post_hook",
            "first_dataloader_check",
        ):
            handle = getattr(self.engine, name, None)
            if handle is not None:
                handle.remove()
                setattr(self.engine, name, None)
        for p in self.params:
            for attr in ("_dp_group", "_hp_mapping"):
                if hasattr(p, attr):
                    delattr(p, attr)

    def _fragments(self) -> list[tuple[torch.nn.Parameter, torch.Tensor, Any]]:
        """``(parameter, its group's flat fp32 partition, its fragment mapping)`` of every
        trainable parameter, in the order one process numbers them."""
        where: dict[int, torch.Tensor] = {}
        for group, flat in zip(
            self.optimizer.bit16_groups, self.optimizer.single_partition_of_fp32_groups
        ):
            for p in group:
                where[id(p)] = flat
        return [(p, where[id(p)], getattr(p, "_hp_mapping", None)) for p in self.params]

    def gathered(self) -> _SavedState:
        """AdamW's state with every moment whole, as one process holds it (a collective:
        every rank calls it, one all-reduce per tensor)."""
        base = self.optimizer.optimizer.state
        state: dict[int, dict[str, Any]] = {}
        for i, (p, flat, mapping) in enumerate(self._fragments()):
            entry: dict[str, Any] = {}
            for key in MOMENTS:
                full = torch.zeros(p.numel(), dtype=torch.float32, device=flat.device)
                if mapping is not None and flat in base:
                    hp, lp = mapping.get_hp_fragment_address(), mapping.lp_fragment_address
                    part = base[flat][key].narrow(0, hp.start, hp.numel)
                    full.narrow(0, lp.start, lp.numel).copy_(part)
                dist.all_reduce(full, op=dist.ReduceOp.SUM)  # fragments are disjoint
                entry[key] = full.view(p.shape).cpu()
            steps = torch.tensor(
                [float(base[flat]["step"]) if flat in base and "step" in base[flat] else 0.0],
                device=flat.device,
            )
            dist.all_reduce(steps, op=dist.ReduceOp.MAX)
            state[i] = {"step": torch.tensor(float(steps.item())), **entry}
        return _SavedState({"state": state, "param_groups": self.param_groups})

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Load a full (single-process) AdamW state: each rank copies its own fragments of
        every moment into DeepSpeed's flat partitions (no communication)."""
        base = self.optimizer.optimizer.state
        fragments = self._fragments()
        for pid, entry in saved["state"].items():
            _, flat, mapping = fragments[int(pid)]
            if flat not in base:
                step = torch.tensor(float(entry["step"]))
                base[flat] = {"step": step} | {k: torch.zeros_like(flat) for k in MOMENTS}
            if mapping is None:
                continue
            hp, lp = mapping.get_hp_fragment_address(), mapping.lp_fragment_address
            for key in MOMENTS:
                whole = entry[key].reshape(-1).to(flat.device, torch.float32)
                base[flat][key].narrow(0, hp.start, hp.numel).copy_(
                    whole.narrow(0, lp.start, lp.numel)
                )
        groups = saved["param_groups"]
        for group, own in zip(self.optimizer.optimizer.param_groups, groups):
            for k, v in own.items():
                if k != "params":
                    group[k] = v


def _skip_cpu_shm_kernel() -> None:
    """On DeepSpeed's CPU accelerator, do not compile its shared-memory all-reduce kernel.

    DeepSpeed's communication backend JIT-compiles it (about 80 s on 2 cores, once per
    machine) whenever a C++ compiler and ninja are present, but uses it only for
    ``inference_all_reduce``; ZeRO's reductions go through ``torch.distributed`` (gloo).
    Marking the op incompatible makes the backend skip it. Nothing changes on a GPU.
    """
    from deepspeed import ops
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return
    builder = accelerator.create_op_builder("ShareMemCommBuilder")
    compatible = getattr(ops, "__compatible_ops__", None)
    if builder is not None and isinstance(compatible, dict):
        compatible[builder.NAME] = False


class _SavedState:
    """A gathered optimizer state in the shape ``save_checkpoint`` reads (``state_dict``)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        """The state as one process's AdamW gives it."""
        return self._state
