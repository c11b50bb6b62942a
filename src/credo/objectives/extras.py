"""Extras providers: what a loss reads of the token batch besides the sampled tokens.

Some losses need more than the log-probs of the sampled tokens: KLPO the trainer's
log-probs of the sampler's auxiliary draws and top-K head, the distillation losses the
student's log-probs of the teacher's head ids, RAPO the reference's two scorings. The part
that puts such data into the token batch (``TokenBatch.token_extras``, which follows every
mini- and micro-batch split) registers a provider of it::

    register_extras("name", ids=ids, extras=extras)

- ``ids(token_extras) -> [B, L, K] | None``: token ids whose log-probs the policy must
  gather in the update's own forward pass (with grad), or ``None``;
- ``extras(token_extras, logprobs, device) -> dict``: the micro-batch's
  :attr:`LossInputs.extras <credo.objectives.inputs.LossInputs.extras>`, from its token
  extras and the gathered log-probs of its ids (``None`` without ids). A provider whose
  data the batch does not carry returns ``{}``.

The update asks every registered provider, in the order of their names, and never a loss
by its name (:func:`extra_token_ids`, :func:`loss_extras`); gathering is exact per id, so
the order only decides where each provider's columns sit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from credo.utils.registry import Registry

__all__ = ["EXTRAS", "ExtrasProvider", "extra_token_ids", "loss_extras", "register_extras"]

TokenExtras = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class ExtrasProvider:
    """A registered provider (module docstring)."""

    name: str
    extras: Callable[[TokenExtras, torch.Tensor | None, torch.device], dict[str, torch.Tensor]]
    ids: Callable[[TokenExtras], torch.Tensor | None] | None = None


EXTRAS: Registry[ExtrasProvider] = Registry("loss extras provider")


def register_extras(
    name: str,
    *,
    extras: Callable[[TokenExtras, torch.Tensor | None, torch.device], dict[str, torch.Tensor]],
    ids: Callable[[TokenExtras], torch.Tensor | None] | None = None,
) -> ExtrasProvider:
    """Register a provider of loss extras (module docstring) and return it."""
    provider = ExtrasProvider(name, extras, ids)
    EXTRAS.register(name)(provider)
    return provider


def _providers() -> list[ExtrasProvider]:
    return [EXTRAS.get(n) for n in EXTRAS.names()]


def extra_token_ids(token_extras: TokenExtras) -> tuple[torch.Tensor | None, list[int]]:
    """``(ids [B, L, K_1 + K_2 + ...] | None, [K_1, K_2, ...])``: every provider's extra
    token ids for one micro-batch, concatenated in the providers' order, and how many each
    gave (0 for none)."""
    sets = [p.ids(token_extras) if p.ids is not None else None for p in _providers()]
    sizes = [0 if s is None else int(s.shape[-1]) for s in sets]
    given = [s for s in sets if s is not None]
    ids = torch.cat(given, -1) if len(given) > 1 else (given[0] if given else None)
    return ids, sizes


def loss_extras(
    token_extras: TokenExtras,
    extra_logprobs: torch.Tensor | None,
    sizes: list[int],
    *,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """The micro-batch's ``LossInputs.extras``: every provider's, each from its own
    columns of ``extra_logprobs`` (the policy's log-probs of :func:`extra_token_ids`)."""
    out: dict[str, torch.Tensor] = {}
    start = 0
    for provider, size in zip(_providers(), sizes):
        lp = (
            None
            if extra_logprobs is None or size == 0
            else extra_logprobs[..., start : start + size]
        )
        out.update(provider.extras(token_extras, lp, device))
        start += size
    return out
