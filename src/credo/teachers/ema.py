"""An exponential moving average (EMA) of the student as a teacher (MT-SDPO's π_EMA).

After each optimiser step the trainer calls :meth:`EMATeacher.update`:

    θ_EMA ← d · θ_EMA + (1 − d) · θ_student        (every parameter, same name)

with decay ``d`` in [0, 1] (``d = 0`` copies the student, ``d = 1`` freezes the teacher).
Floating-point buffers follow the same rule; other buffers are copied. The EMA holds its
own copy of the weights (deep-copied from the student at construction, frozen:
``requires_grad = False``), so its memory equals the student's.
"""

from __future__ import annotations

import copy
import math

import torch

from credo.policy import HFPolicy
from credo.teachers.policy_teacher import PolicyTeacher

__all__ = ["EMATeacher"]


class EMATeacher(PolicyTeacher):
    """A frozen EMA copy of the student that scores like any :class:`PolicyTeacher`.

    Args:
        student: the student policy (its model is deep-copied).
        decay: the default decay ``d`` of :meth:`update` (default 0.99).
        micro_batch, temperature: as :class:`PolicyTeacher`.
    """

    def __init__(
        self,
        student: HFPolicy,
        *,
        decay: float = 0.99,
        micro_batch: int = 16,
        temperature: float = 1.0,
    ) -> None:
        _check_decay(decay)
        model = copy.deepcopy(student.model)
        model.requires_grad_(False)
        policy = HFPolicy(
            model,
            student.tokenizer,
            device=student.device,
            adapters_disabled=student.adapters_disabled,
        )
        super().__init__(
            policy, name=f"ema({decay})", micro_batch=micro_batch, temperature=temperature
        )
        self.decay = float(decay)
        self.updates = 0

    @torch.no_grad()
    def update(self, student: HFPolicy, decay: float | None = None) -> None:
        """``θ_EMA ← d·θ_EMA + (1−d)·θ_student`` for every parameter and float buffer.

        Args:
            student: the student policy (same architecture as at construction).
            decay: ``d`` for this update (default: the teacher's ``decay``).
        """
        d = self.decay if decay is None else float(decay)
        _check_decay(d)
        mine = dict(self.policy.model.named_parameters())
        theirs = dict(student.model.named_parameters())
        if mine.keys() != theirs.keys():
            missing = sorted(set(mine) ^ set(theirs))[:3]
            raise ValueError(
                f"EMA teacher: the student's parameters no longer match the EMA copy ({missing})"
            )
        for name, p in mine.items():
            p.mul_(d).add_(theirs[name].detach().to(p.dtype), alpha=1.0 - d)
        bufs = dict(student.model.named_buffers())
        for name, buf in self.policy.model.named_buffers():
            src = bufs.get(name)
            if src is None:
                continue
            if buf.is_floating_point():
                buf.mul_(d).add_(src.to(buf.dtype), alpha=1.0 - d)
            else:
                buf.copy_(src)
        self.updates += 1


def _check_decay(decay: float) -> None:
    if not (math.isfinite(decay) and 0.0 <= decay <= 1.0):
        raise ValueError(f"EMA teacher: decay must be in [0, 1], got {decay}")
