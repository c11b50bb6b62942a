"""The trainer's view of the processes it runs in: :class:`Engine`.

An iteration asks its engine how the rollouts are shared (:meth:`Engine.sample`), the
update asks it which micro-batches this process runs and how a micro-batch is
back-propagated, how the processes' gradients and metrics combine and how the optimizer
step is taken, and checkpoints ask it for the optimizer's full state. In one process every
method is the plain single-process step, so the loop and the update never branch on how
many processes there are or which engine shards what:

================  ==========================  =====================================
engine            the trainer                 the step
================  ==========================  =====================================
one process,      the policy                  clip, AdamW step (gradients summed over
data parallel                                 the processes first,
                                              :mod:`~credo.engines.distributed`)
FSDP              a sharded copy              the same on shards; the full sampling
                  (:mod:`~credo.engines.fsdp`)  copy refreshed after each update
DeepSpeed ZeRO    the policy                  DeepSpeed's clip and step
                  (:mod:`~credo.engines.zero`)
================  ==========================  =====================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from credo.engines import distributed as dp
from credo.engines import fsdp
from credo.engines.zero import Zero
from credo.policy.hf import HFPolicy
from credo.rollout import RolloutResult

__all__ = ["Engine"]

T = TypeVar("T")


@dataclass
class Engine:
    """How the trainer's work combines over the processes (module docstring).

    Attributes:
        trainer: with an FSDP config, the sharded copy of the policy that the optimizer
            updates (the policy itself stays the full sampling copy); else ``None``.
        zero: with a DeepSpeed config, the ZeRO-1/2 engine around the optimizer; else
            ``None``.
    """

    trainer: HFPolicy | None = None
    zero: Zero | None = None

    # ------------------------------------------------------------------ rollouts
    def sample(
        self,
        sample: Callable[[list[Any], int, int], RolloutResult],
        tasks: Sequence[Any],
        sampling_seed: int,
        choice_seed: int,
    ) -> RolloutResult:
        """The iteration's rollouts of ``tasks``: this process samples its share of the
        groups (``sample(tasks, sampling_seed, choice_seed)``, from its own streams) and
        every process gets them all, gathered in rank order (:mod:`~credo.engines.
        distributed`: the identity in one process)."""
        mine, offset = dp.shard(tasks)
        result = sample(mine, dp.rank_seed(sampling_seed), dp.rank_seed(choice_seed))
        return dp.gather_rollouts(result, offset)

    # ------------------------------------------------------------------ the update
    def my_share(self, chunks: Sequence[T]) -> list[T]:
        """The micro-batches this process back-propagates (all of them alone)."""
        return dp.my_share(chunks)

    def padding(self, chunks: int) -> int:
        """Zero-weight passes this process adds to its share of ``chunks`` micro-batches
        so that every process runs as many (a sharded trainer's collectives pair up)."""
        return dp.padding(chunks)

    def idle_loss(
        self, policy: HFPolicy, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """A loss with an exactly zero gradient for a padding pass (:func:`fsdp.idle_loss`)."""
        return fsdp.idle_loss(policy, input_ids, attention_mask)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Back-propagate one micro-batch (through DeepSpeed's engine under ZeRO; ``last``:
        this process's last pass of the mini-batch)."""
        if self.zero is not None:
            self.zero.backward(loss, last=last)
        else:
            loss.backward()

    def reduce_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the gradients over the processes (a sharded engine does it itself)."""
        dp.reduce_gradients(params)

    def sum_metrics(
        self,
        metrics: dict[str, float],
        merge: Mapping[str, Callable[[float, float], float]] | None = None,
    ) -> dict[str, float]:
        """Every process's metric sums added up (the keys of ``merge`` combined with
        their own function)."""
        return dp.sum_metrics(metrics, merge=merge)

    @property
    def steps_regardless(self) -> bool:
        """The step is taken before its gradient norm is known (DeepSpeed clips and steps
        in one call), so a non-finite norm is found after the step."""
        return self.zero is not None

    def step(
        self,
        params: Iterable[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        grad_clip: float,
        *,
        step_on_zero: bool = True,
    ) -> torch.Tensor:
        """Clip the gradients to ``grad_clip`` and take the optimizer step; returns the
        global gradient norm before clipping. A non-finite norm takes no step, except
        under DeepSpeed (:attr:`steps_regardless`). With ``step_on_zero=False`` neither
        does an exactly zero gradient (every advantage of the mini-batch 0 and no other
        loss term), on which Adam would still move the weights by its moments
        (``optim.zero_grad_step``); under DeepSpeed ZeRO its own engine takes every step
        (as with a non-finite norm)."""
        if self.zero is not None:
            return self.zero.step()
        norm = fsdp.plain_norm(torch.nn.utils.clip_grad_norm_(params, grad_clip))
        if torch.isfinite(norm) and (step_on_zero or norm > 0):  # NaN would reach every weight
            optimizer.step()
        return norm

    def after_update(self, policy: HFPolicy) -> None:
        """Give the sampling copy ``policy`` the trainer's new weights (FSDP: gathered
        whole, a collective); nothing when the trainer is the policy."""
        if self.trainer is not None:
            fsdp.copy_full_weights(self.trainer, policy)

    def close(self) -> None:
        """After the last update: release what holds the process groups (the ZeRO engine,
        FSDP's sharded copy), so that :func:`~credo.engines.distributed.teardown` frees
        them. The sampling copy of the policy stays."""
        if self.zero is not None:
            self.zero.close()
        if self.trainer is not None:
            fsdp.release(self.trainer)
        self.zero = self.trainer = None

    # ------------------------------------------------------------------ checkpoints
    def saved_optimizer(self, optimizer: torch.optim.Optimizer) -> Any:
        """What a checkpoint saves of ``optimizer``: its state as one process holds it
        (FSDP's shards and ZeRO's fragments gathered whole: a collective, every process
        calls it)."""
        if self.trainer is not None:
            return fsdp.gathered_optimizer(optimizer)
        if self.zero is not None:
            return self.zero.gathered()
        return optimizer

    def loaded_optimizer(self, optimizer: torch.optim.Optimizer) -> Any:
        """What a checkpoint's full (one-process) optimizer state loads into: each process
        keeps its own shards or fragments of it."""
        if self.trainer is not None:
            return fsdp.FullStateOptimizer(optimizer)
        if self.zero is not None:
            return self.zero
        return optimizer
