"""Mixed precision: float32 weights, bfloat16 matrix products.

``model.mixed_precision: bf16`` keeps every weight, gradient and optimizer moment in
float32 (so small updates are not rounded away, as they are with ``model.dtype:
bfloat16``) and runs the model's forward passes under :func:`torch.autocast` with
bfloat16, the matrix products then use the CPU's bfloat16 units (AMX, AVX-512 BF16) or
a GPU's tensor cores. On a 2-core Xeon with AMX this made SmolLM2-135M's forward pass
3–4× and a training step 1.7× faster than float32 (``docs/llm.md``).

Two places stay in float32, because they set the log-probs that every ratio, KL and
advantage of the trainer is built on:

* the residual stream and the norms (transformers' Llama blocks add each projection's
  bfloat16 output to the float32 stream and normalise in float32);
* the output head: bfloat16 logits of magnitude 10–30 are off by up to 0.1, which would
  be a log-prob error of the same size. :func:`enable_mixed_precision` makes the head
  compute its logits in float32 with autocast switched off (one ``[B, k, V]`` product,
  only for the positions asked for).

The setting is kept on the model object itself (:data:`ATTRIBUTE`), so that every
:class:`~credo.policy.hf.HFPolicy` built around it (the LoRA wrapper, the merged warm
start, a deep-copied reference, an EMA teacher) runs it the same way.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["ATTRIBUTE", "PRECISIONS", "autocast_dtype", "enable_mixed_precision", "precision"]

#: ``model.mixed_precision`` values and the autocast dtype each one means.
PRECISIONS: dict[str, torch.dtype] = {"bf16": torch.bfloat16}

#: Name of the attribute of the (base) model that holds the autocast dtype.
ATTRIBUTE = "credo_autocast_dtype"


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def enable_mixed_precision(model: Any, mode: str | None) -> None:
    """Mark ``model`` (float32 weights) to run under autocast with ``mode``'s dtype, its
    output head kept in float32. ``mode`` is a key of :data:`PRECISIONS`; ``None`` does
    nothing.

    Raises:
        ValueError: an unknown mode, or weights that are not float32 (autocast over
            bfloat16 weights gains nothing and loses the float32 master copy).
    """
    if mode is None:
        return
    if mode not in PRECISIONS:
        raise ValueError(f"mixed precision {mode!r}: accepted values are {', '.join(PRECISIONS)}")
    dtype = PRECISIONS[mode]
    base = _base(model)
    weights = {p.dtype for p in base.parameters()}
    if weights != {torch.float32}:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in weights))
        raise ValueError(
            f"mixed precision {mode!r} keeps float32 weights, but the model's are {names}: "
            "set model.dtype=float32"
        )
    setattr(base, ATTRIBUTE, dtype)
    head = base.get_output_embeddings()
    if head is not None and isinstance(head, torch.nn.Linear):
        head.forward = _float32_head.__get__(head)  # a bound method: deepcopy rebinds it


def _float32_head(self: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """The output head's forward with autocast off: float32 logits from float32 inputs."""
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        bias = None if self.bias is None else self.bias.float()
        return F.linear(hidden.float(), self.weight.float(), bias)


def autocast_dtype(model: Any) -> torch.dtype | None:
    """The autocast dtype ``model`` was marked with, or ``None`` (plain precision)."""
    return getattr(_base(model), ATTRIBUTE, None)


def precision(model: Any, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context to run ``model``'s forward passes in: autocast with its marked dtype
    on ``device``, or nothing."""
    dtype = autocast_dtype(model)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
