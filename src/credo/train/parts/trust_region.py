"""A trust region on each update (``optim.max_kl``): after every optimizer step the policy
is scored on the mini-batch it stepped on, and a step whose KL to the sampler (k3, token
mean) exceeds ``max_kl`` is undone (weights and optimizer state) and the update's
remaining steps skipped. Metrics ``policy/kl_after_step``, ``policy/steps_kept``,
``policy/steps_undone``. On by default (0.2); left off, with one printed line, under FSDP
and ZeRO, which shard the optimizer's state (registered :class:`Unsharded`)."""

from __future__ import annotations

from typing import Any

import torch

from credo.data import TokenBatch
from credo.objectives.health import sampler_kl
from credo.policy.lora import trainable_parameters
from credo.train.parts.base import Part, PartContext, Unsharded, register_part
from credo.train.update import UpdateContext, score_batch

__all__ = ["TrustRegion"]


class Snapshot:
    """The trainable weights and the optimizer's state before a step, to undo it exactly.

    Its buffers are allocated at the first :meth:`take` and reused by every later one (a
    step allocates nothing; the copy of ``optimizer.state_dict()`` this replaces allocated
    and freed three times the trainable weights every step). They live in host memory,
    pinned, when the weights are on an accelerator, so the default bound adds no device
    memory (a full fine-tune that fits without it fits with it); on the CPU they take
    the same three times the trainable weights. Copies to and from pinned memory are
    ordered on the device's stream, so the step that follows :meth:`take` reads the
    weights before the copy and :meth:`restore` is complete before the next kernel.
    """

    def __init__(self) -> None:
        self.weights: list[torch.Tensor] = []
        self.state: dict[int, dict[str, Any]] = {}  # parameter index -> its saved state

    def take(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
        """Copy ``params`` and their optimizer state into the buffers."""
        if not self.weights:
            self.weights = [_buffer(p) for p in params]
        for buf, p in zip(self.weights, params):
            buf.copy_(p.detach(), non_blocking=True)
        saved: dict[int, dict[str, Any]] = {}
        for i, p in enumerate(params):
            for key, value in optimizer.state.get(p, {}).items():
                old = self.state.get(i, {}).get(key)
                if isinstance(value, torch.Tensor):
                    buf = old if _fits(old, value) else _buffer(value)
                    value = buf.copy_(value, non_blocking=True)
                saved.setdefault(i, {})[key] = value
        self.state = saved

    @torch.no_grad()
    def restore(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
        """Put back what :meth:`take` copied: the weights, each state tensor in place, and no
        state for a parameter that had none (the first step creates it)."""
        for buf, p in zip(self.weights, params):
            p.copy_(buf, non_blocking=True)
        for i, p in enumerate(params):
            if i not in self.state:
                optimizer.state.pop(p, None)
                continue
            live = optimizer.state[p]
            for key in set(live) - set(self.state[i]):
                del live[key]
            for key, value in self.state[i].items():
                if isinstance(value, torch.Tensor) and isinstance(live.get(key), torch.Tensor):
                    live[key].copy_(value, non_blocking=True)
                else:
                    live[key] = value.clone() if isinstance(value, torch.Tensor) else value


def _fits(buf: Any, t: torch.Tensor) -> bool:
    """``buf`` is a buffer ``t`` can be copied into as it is."""
    return isinstance(buf, torch.Tensor) and (buf.shape, buf.dtype) == (t.shape, t.dtype)


def _buffer(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor like ``t``: on the CPU, pinned when ``t`` is on an accelerator."""
    pin = t.device.type != "cpu"
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)


def _kl_after_step(
    ctx: UpdateContext, mb: TokenBatch, sampler_lp: torch.Tensor, keep: torch.Tensor
) -> float:
    """The KL between the sampler and π_θ per loss token (k3 as ``policy/kl_sampler_*``
    reads it, :func:`~credo.objectives.health.sampler_kl`; token mean) on the ``keep``
    rows of the mini-batch just stepped on, with the weights after the step (no grad).
    Every process holds the whole batch and the same weights, so every rank finds the
    same value and takes the same decision."""
    rows = torch.nonzero(keep).flatten()
    if rows.numel() == 0:
        return 0.0
    sub = mb.index(rows)
    s = ctx.settings
    lp = score_batch(
        ctx.policy,
        sub,
        temperature=s.temperature,
        micro_rows=s.micro_batch_rows,
        micro_tokens=s.micro_batch_tokens,
    )
    mask = sub.loss_mask
    kl = sampler_kl(lp, sampler_lp[rows], mask.float(), mask)
    return float(kl) / max(1.0, float(mask.sum()))


@register_part(
    "trust_region",
    when=lambda cfg: cfg.optim.max_kl is not None,
    unsharded=Unsharded(
        "optim.max_kl",
        "null",
        "undoing a step copies the optimizer's state, which the engine shards",
    ),
)
class TrustRegion(Part):
    """Undo the step that crossed ``max_kl`` and stop the update (module docstring)."""

    def __init__(self, ctx: PartContext) -> None:
        self.max_kl: float = ctx.cfg.optim.max_kl
        self.before = Snapshot()
        self.guard: dict[str, float] = {}

    def prepare(self, ctx: UpdateContext, batch: TokenBatch, keep: torch.Tensor) -> None:
        self.guard = {}

    def before_step(self, ctx: UpdateContext) -> None:
        self.before.take(trainable_parameters(ctx.policy.model), ctx.optimizer)

    def after_step(
        self, ctx: UpdateContext, mb: TokenBatch, sampler_lp: torch.Tensor, keep: torch.Tensor
    ) -> bool:
        self.guard["policy/kl_after_step"] = kl = _kl_after_step(ctx, mb, sampler_lp, keep)
        if kl <= self.max_kl:
            return False
        self.before.restore(trainable_parameters(ctx.policy.model), ctx.optimizer)
        self.guard["policy/steps_undone"] = 1.0
        return True

    def finish(self, ctx: UpdateContext, out: dict[str, float], steps: int) -> None:
        kept = steps - int(self.guard.get("policy/steps_undone", 0.0))
        out.update({"policy/steps_undone": 0.0, **self.guard, "policy/steps_kept": float(kept)})
