"""Sharded data parallelism: torch's FSDP2 (``fully_shard``) behind an ordinary accelerate
config file (``distributed_type: FSDP``; ``accelerate launch`` then sets
``ACCELERATE_USE_FSDP=true`` and the ``FSDP_*`` variables this module reads).

How a sharded run keeps the exact update of :mod:`credo.engines.distributed` (the 1-process
update on the same global batch) and still samples with the full weights:

1. **Two copies of the model.** ``TrainState.policy`` stays a full, unsharded model in
   every process — the *sampling copy*: rollouts, held-out evaluations, teachers, the
   reference and the checkpoints' weights use it, with no collective, so each rank
   generates its own share of the groups at its own pace. The *trainer*
   (:func:`shard_policy`) is a deep copy of it sharded with ``fully_shard``: every
   decoder layer (the model's ``_no_split_modules``, or ``fsdp_transformer_layer_cls_to_wrap``)
   is one FSDP group, the root holds the rest (embeddings, final norm, LM head, tied or
   not). Its parameters, gradients and AdamW moments take 1/N of their size per process.
2. **Equal passes.** Every forward of the trainer all-gathers each group's parameters and
   every backward reduce-scatters its gradients, so all ranks must run the same number of
   forward/backward passes per optimizer step. ``policy_update`` gives rank ``r`` every
   N-th micro-batch (unequal counts when N does not divide their number); a rank with
   fewer back-propagates :func:`idle_loss` (a real micro-batch, × 0) until the counts are
   equal (:func:`credo.engines.distributed.padding`). Its gradient is exactly zero, so the
   gradients stay those of one process.
3. **Summed gradients.** FSDP averages by default; credo's micro-batch losses already add
   up to the mini-batch loss, so the reduce-scatter must sum (:func:`shard_policy` sets
   the divide factor to 1 and forces a plain SUM, the op gloo and NCCL both have).
   Clipping sees the global norm (a DTensor reduced over the ranks, :func:`plain_norm`).
4. **After each update** :func:`copy_full_weights` all-gathers every trainer parameter and
   copies it into the sampling copy (the generation cost: one all-gather of the model per
   update, and one full copy of the weights per process).
5. **Checkpoints** hold full tensors, in the files one process writes: every rank gathers
   the AdamW moments (:func:`gathered_optimizer`, a collective), rank 0 writes the
   checkpoint; on ``--resume`` each rank cuts its own shard from the full tensors
   (:class:`FullStateOptimizer`), so a run can resume with another number of processes
   or without FSDP.

Memory per process: the full weights once (the sampling copy), plus 1/N of the trainer's
weights, gradients and AdamW moments — versus 4 full copies (weights, gradients, 2
moments) in plain data parallelism. The frozen reference, when a KL term needs one, stays
a full copy in every process.

Paper: Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel"
(VLDB 2023), https://arxiv.org/abs/2304.11277.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from credo.policy.hf import HFPolicy

__all__ = [
    "FSDP_ENV",
    "NAME",
    "FsdpSettings",
    "FullStateOptimizer",
    "check_config",
    "copy_full_weights",
    "gathered_optimizer",
    "idle_loss",
    "plain_norm",
    "release",
    "requested",
    "settings",
    "shard_policy",
]

#: The engine as messages name it (:func:`credo.engines.distributed.sharding_name`).
NAME = "accelerate's FSDP (ACCELERATE_USE_FSDP=true)"

#: What ``accelerate launch`` sets for an FSDP config.
FSDP_ENV = "ACCELERATE_USE_FSDP"

#: ``FSDP_RESHARD_AFTER_FORWARD`` values (FSDP2's booleans, FSDP1's sharding strategies as
#: accelerate passes them) → whether a group's weights are freed after its forward.
_RESHARD = {
    "true": True,
    "full_shard": True,
    "1": True,
    "false": False,
    "shard_grad_op": False,
    "2": False,
}
_NOT_SHARDED = {"no_shard", "3", "hybrid_shard", "hybrid_shard_zero2", "4", "5"}
_WRAP = ("TRANSFORMER_BASED_WRAP", "NO_WRAP")


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes")


def requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher asked for FSDP (``ACCELERATE_USE_FSDP`` is true)."""
    return _flag(os.environ if env is None else env, FSDP_ENV)


@dataclass(frozen=True)
class FsdpSettings:
    """The FSDP choices credo takes from accelerate's variables.

    Attributes:
        reshard_after_forward: free each group's gathered weights after its forward
            (``FULL_SHARD``, default) or keep them until the backward (``SHARD_GRAD_OP``:
            more memory, one all-gather fewer per micro-batch).
        layer_classes: class names of the modules sharded as one group each
            (``fsdp_transformer_layer_cls_to_wrap``); empty: the model's
            ``_no_split_modules``.
        wrap_layers: shard per layer (``TRANSFORMER_BASED_WRAP``, default) or the whole
            model as one group (``NO_WRAP``).
    """

    reshard_after_forward: bool = True
    layer_classes: tuple[str, ...] = ()
    wrap_layers: bool = True


def settings(env: Mapping[str, str] | None = None) -> FsdpSettings:
    """Read accelerate's ``FSDP_*`` variables.

    Raises:
        ValueError: one line naming a setting credo does not support and what to use.
    """
    env = os.environ if env is None else env
    raw = _reshard_value(env)
    value = raw.strip().lower()
    if value in _NOT_SHARDED:
        raise ValueError(
            f"fsdp_reshard_after_forward / fsdp_sharding_strategy={raw!r}: credo shards over "
            "all processes of one group only (FULL_SHARD/true or SHARD_GRAD_OP/false); for "
            "no sharding launch plain data parallel (accelerate launch --multi_gpu or torchrun)"
        )
    if value not in _RESHARD:
        raise ValueError(
            f"fsdp_reshard_after_forward={raw!r}: expected true, false, FULL_SHARD or SHARD_GRAD_OP"
        )
    for name, why in (
        ("FSDP_OFFLOAD_PARAMS", "CPU offload is not supported; use model.lora or more processes"),
        (
            "FSDP_ACTIVATION_CHECKPOINTING",
            "use credo's model.gradient_checkpointing=true instead",
        ),
    ):
        if _flag(env, name):
            raise ValueError(f"{name}=true (an accelerate FSDP setting): {why}")
    policy = (env.get("FSDP_AUTO_WRAP_POLICY") or "TRANSFORMER_BASED_WRAP").strip().upper()
    if policy not in _WRAP:
        raise ValueError(
            f"fsdp_auto_wrap_policy={policy}: credo shards per transformer layer "
            f"(TRANSFORMER_BASED_WRAP) or the whole model as one group (NO_WRAP)"
        )
    classes = tuple(
        c.strip() for c in env.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "").split(",") if c.strip()
    )
    return FsdpSettings(_RESHARD[value], classes, policy == "TRANSFORMER_BASED_WRAP")


def _reshard_value(env: Mapping[str, str]) -> str:
    """The sharding choice as accelerate passes it: FSDP2 reads the boolean
    ``FSDP_RESHARD_AFTER_FORWARD``; FSDP1 (``FSDP_VERSION=1``, accelerate's default) a
    strategy name there (what ``accelerate config`` writes) or else in the older
    ``FSDP_SHARDING_STRATEGY``."""
    reshard = env.get("FSDP_RESHARD_AFTER_FORWARD", "").strip()
    if env.get("FSDP_VERSION", "1").strip() == "2":
        return reshard or "true"
    if reshard and reshard.lower() not in ("true", "false"):
        return reshard
    return env.get("FSDP_SHARDING_STRATEGY", "").strip() or reshard or "true"


def check_config(cfg: Any, what: str = NAME) -> None:
    """Refuse, in one line, the run options a sharded run (FSDP, or ``what`` names another
    engine: DeepSpeed ZeRO) does not support.

    The run's parts declare their own (:class:`credo.train.parts.base.Unsharded`:
    SERO's oracle rows are refused, the trust region is left off).

    Raises:
        ValueError: LoRA (its optimizer state is already small: plain data parallelism
            fits) or the vLLM engine (its weight sync reads the sampling copy but has not
            been run with FSDP).
    """
    if cfg.model.lora is not None:
        raise ValueError(
            f"model.lora with {what}: LoRA's optimizer state is only the adapters'; train "
            "it with plain data parallelism (accelerate launch --multi_gpu or torchrun)"
        )
    if cfg.rollout.engine != "hf":
        raise ValueError(
            f"rollout.engine={cfg.rollout.engine} with {what} is not supported (untested); "
            "use rollout.engine=hf or plain data parallelism"
        )


def _layer_classes(model: torch.nn.Module, chosen: tuple[str, ...]) -> set[str]:
    names = set(chosen) or set(getattr(model, "_no_split_modules", None) or ())
    present = {type(m).__name__ for m in model.modules()}
    missing = sorted(names - present)
    if chosen and missing:
        raise ValueError(
            f"fsdp_transformer_layer_cls_to_wrap names {missing}, not in the model; it has "
            f"e.g. {sorted(n for n in present if 'Layer' in n or 'Block' in n)[:5]}"
        )
    return names & present


def shard_policy(policy: HFPolicy, opts: FsdpSettings) -> HFPolicy:
    """The trainer: a deep copy of ``policy``'s model sharded over all processes.

    Each module whose class is in the layer classes is one ``fully_shard`` group, then
    the root; every group reduce-scatters with a plain SUM and no division (the
    micro-batch losses already add up to the mini-batch loss). ``policy`` is unchanged.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = copy.deepcopy(policy.model)
    mesh = init_device_mesh(policy.device.type, (dist.get_world_size(),))
    if opts.wrap_layers:
        classes = _layer_classes(model, opts.layer_classes)
        for module in [m for m in model.modules() if type(m).__name__ in classes]:
            fully_shard(module, mesh=mesh, reshard_after_forward=opts.reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=opts.reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return HFPolicy(model, policy.tokenizer, policy.device)


def release(trainer: HFPolicy) -> None:
    """After the last update: the trainer's device mesh lets go of its process groups.

    DTensor's sharding caches keep the mesh for the life of the process, and the mesh
    keeps the groups, whose worker threads must end before Python does
    (:func:`credo.engines.distributed.teardown` says why). The trainer runs no collective
    afterwards."""
    for p in trainer.model.parameters():  # a sharded parameter names its mesh
        registry = getattr(getattr(p, "device_mesh", None), "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (an all-gather, on every rank); a plain tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def plain_norm(norm: torch.Tensor) -> torch.Tensor:
    """``clip_grad_norm_``'s result as a plain tensor (the trainer's is a DTensor)."""
    return _full(norm)


@torch.no_grad()
def copy_full_weights(trainer: HFPolicy, sampling: HFPolicy) -> None:
    """Copy the trainer's weights, gathered whole, into the sampling copy (a collective:
    every rank calls it after every update)."""
    for name, p in trainer.model.named_parameters():
        sampling.model.get_parameter(name).copy_(_full(p.detach()))


def idle_loss(
    policy: HFPolicy, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """A loss whose gradient is exactly zero (a real forward, × 0): back-propagated, it
    runs the collectives of one micro-batch, for a rank with fewer micro-batches than the
    others (under FSDP and DeepSpeed ZeRO alike).

    Args:
        policy: the trainer.
        input_ids: ``[B, L]`` tokens of a real micro-batch (finite log-probs).
        attention_mask: ``[B, L]``.

    Returns:
        The 0-d loss, with its graph.
    """
    return policy.score(input_ids, attention_mask).logprobs.sum() * 0.0


class FullStateOptimizer:
    """The trainer's optimizer as checkpoints see it: ``state_dict`` gives the state a
    single process would hold (full tensors, parameters numbered in order), and
    ``load_state_dict`` takes such a state and keeps this rank's shard of each tensor.

    Built by :func:`gathered_optimizer` (for a save) or directly (for a load).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, full: dict[str, Any] | None = None):
        self.optimizer = optimizer
        self.full = full

    def state_dict(self) -> dict[str, Any]:
        """The gathered full state (as :func:`gathered_optimizer` collected it)."""
        if self.full is None:
            raise RuntimeError("FullStateOptimizer.state_dict: build it with gathered_optimizer")
        return self.full

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a full (single-process) state: each parameter-shaped tensor is cut to this
        rank's shard, locally (every rank reads the same checkpoint)."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        local: dict[int, dict[str, Any]] = {}
        for pid, st in state["state"].items():
            p = params[int(pid)]
            local[int(pid)] = {
                k: distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)
                if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.shape == p.shape
                else v
                for k, v in st.items()
            }
        self.optimizer.load_state_dict({"state": local, "param_groups": state["param_groups"]})


def gathered_optimizer(optimizer: torch.optim.Optimizer) -> FullStateOptimizer:
    """The optimizer's state with every sharded tensor gathered whole, on the CPU (a
    collective: every rank calls it, in the same order)."""
    sd = optimizer.state_dict()
    state = {
        pid: {
            k: _full(v).detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in st.items()
        }
        for pid, st in sorted(sd["state"].items())
    }
    return FullStateOptimizer(optimizer, {"state": state, "param_groups": sd["param_groups"]})
