"""Per-episode KV caches: multi-turn generation without re-reading the conversation.

In a multi-turn episode the prompt of turn t+1 often *starts with* the prompt of turn t
followed by the response the policy gave (a chat history that grows by one action and
one observation). The keys and values of that shared start were already computed while
generating turn t; recomputing them makes the cost of turn t grow with t. A
:class:`KVSessions` store keeps, per *session* (an opaque key, one per live episode), the
token ids the model has seen and their per-layer keys and values, so that the next
prefill feeds only the tokens after the longest prefix the new prompt shares with them.

Whether a prompt extends the cached sequence is decided from the token ids, never
assumed: :func:`shared_prefix` compares them. A history window that slides (the built-in
model's plain format shows the last ``history_turns`` actions at the very start of its
prompt) or a chat template that rewrites earlier turns shares a short prefix or none; the
store then reports nothing to reuse (below ``min_prefix`` tokens) and the policy runs a
full prefill, exactly as without sessions.

Reuse is exact for attention with per-token keys and values and explicit positions
(rotary or learned): the keys and values of tokens ``0..c-1`` depend only on those
tokens and their positions, so a cached prefix equals the one a full prefill would
compute, up to floating-point summation order. Models whose cache is not a plain
per-layer key/value list (sliding windows, recurrent or hybrid layers) are not served:
:func:`cache_layers` returns ``None`` for them and the policy switches reuse off.

Rows with caches of different lengths share one batch: :func:`stack_caches` right-aligns
each row's cached prefix in a ``[B, H, P, D]`` block (``P`` the longest prefix), the
columns before it being holes masked out by the attention mask; the new tokens follow,
left-padded, with explicit position ids (:meth:`credo.policy.hf.HFPolicy.generate`).

Memory stays bounded: a session's entry is dropped when its episode ends
(:meth:`KVSessions.end`), and the store never holds more than its byte budget, evicting
the least recently used sessions (they fall back to a full prefill next turn).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "DEFAULT_KV_CACHE_MB",
    "DEFAULT_MIN_PREFIX",
    "KVEntry",
    "KVSessions",
    "KVStats",
    "cache_layers",
    "make_cache",
    "row_entry",
    "shared_prefix",
    "stack_caches",
]

#: Default byte budget of a policy's session store, in MiB (``rollout.kv_cache_mb``).
DEFAULT_KV_CACHE_MB = 1024.0
#: Shared prefixes shorter than this many tokens are not reused: the saving is nil, and a
#: full prefill keeps the numbers bit-identical to a run without sessions.
DEFAULT_MIN_PREFIX = 16

Layers = list[tuple[torch.Tensor, torch.Tensor]]


def shared_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """Length of the longest common prefix of two token id sequences.

    >>> shared_prefix([1, 2, 3, 4], [1, 2, 5])
    2
    """
    n = min(len(cached), len(prompt))
    if n == 0:
        return 0
    a = torch.as_tensor(list(cached[:n]), dtype=torch.long)
    b = torch.as_tensor(list(prompt[:n]), dtype=torch.long)
    diff = (a != b).nonzero()
    return int(diff[0, 0]) if diff.numel() else n


@dataclass
class KVEntry:
    """What a session keeps: the tokens the model has read and their keys and values.

    Attributes:
        ids: the ``n`` token ids, in order (a prompt and the response tokens fed back).
        layers: per layer ``(keys, values)``, each ``[H, n, D]`` (heads, tokens, head dim).
    """

    ids: list[int]
    layers: Layers

    def __post_init__(self) -> None:
        n = len(self.ids)
        for k, v in self.layers:
            if k.shape[-2] != n or v.shape[-2] != n:
                raise ValueError(
                    f"KVEntry: {n} token ids but keys/values of {k.shape[-2]}/{v.shape[-2]}"
                )

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values."""
        return sum(
            k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers
        )

    def prefix(self, c: int) -> Layers:
        """The first ``c`` tokens' keys and values, per layer (views, no copy)."""
        return [(k[:, :c], v[:, :c]) for k, v in self.layers]


@dataclass
class KVStats:
    """Counters of a session store (cumulative; the benchmark reads differences).

    Attributes:
        lookups: rows that came with a session key.
        hits: rows that reused a cached prefix.
        reused_tokens: prompt tokens not fed again thanks to a cached prefix.
        prefill_tokens: prompt tokens fed to the model (real tokens, padding excluded;
            counted by the policy for every generate call, with or without sessions).
        evictions: entries dropped to stay within the budget.
        prefill_seconds: wall time of the prefill forward passes (every generate call).
    """

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    prefill_tokens: int = 0
    evictions: int = 0
    prefill_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class KVSessions:
    """An LRU store of per-session KV caches within a byte budget.

    Args:
        budget_bytes: most bytes of keys and values held at once (``0`` stores nothing:
            every turn is a full prefill).
        min_prefix: shortest shared prefix worth reusing (default
            :data:`DEFAULT_MIN_PREFIX`).
    """

    budget_bytes: int
    min_prefix: int = DEFAULT_MIN_PREFIX
    stats: KVStats = field(default_factory=KVStats)
    _entries: OrderedDict[Hashable, KVEntry] = field(default_factory=OrderedDict, repr=False)
    _bytes: int = 0

    def __post_init__(self) -> None:
        if self.budget_bytes < 0:
            raise ValueError(f"the KV cache budget must be ≥ 0 bytes, got {self.budget_bytes}")
        if self.min_prefix < 1:
            raise ValueError(f"min_prefix must be ≥ 1, got {self.min_prefix}")

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def take(self, key: Hashable, prompt: Sequence[int]) -> tuple[int, KVEntry | None]:
        """Remove ``key``'s entry and say how much of it ``prompt`` can reuse.

        Returns ``(c, entry)``: the first ``c`` tokens of ``prompt`` are the first ``c``
        tokens of ``entry`` (at most ``len(prompt) − 1``, so that the last prompt token is
        fed and gives the next token's logits); ``(0, None)`` when there is no entry or the
        shared prefix is shorter than ``min_prefix``. The entry leaves the store either way
        (the generation that follows stores its successor).
        """
        self.stats.lookups += 1
        entry = self._entries.pop(key, None)
        if entry is None:
            return 0, None
        self._bytes -= entry.nbytes
        c = min(shared_prefix(entry.ids, prompt), len(prompt) - 1)
        if c < self.min_prefix:
            return 0, None
        self.stats.hits += 1
        self.stats.reused_tokens += c
        return c, entry

    def put(self, key: Hashable, entry: KVEntry) -> None:
        """Store ``entry`` as ``key``'s most recent one; evict the least recently used
        entries while over budget (an entry larger than the whole budget is not kept)."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        size = entry.nbytes
        if size > self.budget_bytes:
            self.stats.evictions += 1
            return
        while self._entries and self._bytes + size > self.budget_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.nbytes
            self.stats.evictions += 1
        self._entries[key] = entry
        self._bytes += size

    def end(self, keys: Iterable[Hashable]) -> None:
        """Free the entries of these sessions (finished episodes); unknown keys are
        ignored."""
        for key in keys:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes

    def clear(self) -> None:
        """Free every entry (e.g. after the weights changed: the caches are stale)."""
        self._entries.clear()
        self._bytes = 0


def cache_layers(cache: Any) -> Layers | None:
    """A model's KV cache as per-layer ``(keys, values)`` ``[B, H, T, D]``, or ``None``
    when it is not a plain per-layer key/value cache (sliding-window, recurrent or hybrid
    layers, quantised caches): reuse is then not exact and the policy switches it off."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        try:
            from transformers.cache_utils import DynamicLayer
        except ImportError:  # pragma: no cover
            return None
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            return None
        out = [(layer.keys, layer.values) for layer in layers]
    elif hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):  # transformers < 4.56
        if type(cache).__name__ != "DynamicCache":
            return None
        out = list(zip(cache.key_cache, cache.value_cache, strict=True))
    else:
        return None
    if any(k is None or v is None or k.dim() != 4 for k, v in out):
        return None
    return out


def make_cache(layers: Layers) -> Any:
    """A ``DynamicCache`` holding ``layers`` (per layer ``(keys, values)`` ``[B, H, P, D]``)."""
    from transformers import DynamicCache

    return DynamicCache([(k, v) for k, v in layers])


def stack_caches(
    rows: Sequence[tuple[int, KVEntry | None]], like: Layers
) -> tuple[Layers, torch.Tensor]:
    """One batch cache from per-row cached prefixes of different lengths.

    Args:
        rows: per row ``(c, entry)`` as :meth:`KVSessions.take` returns (``c = 0``: no
            prefix).
        like: any entry's layers (``[H, n, D]`` tensors), for the head counts, dtype and
            device.

    Returns:
        ``(layers, mask)``: per layer ``(keys, values)`` ``[B, H, P, D]`` with ``P = max c``
        and row ``i``'s prefix in its last ``c_i`` columns (zeros before), and ``mask``
        ``[B, P]`` (long), 1 on those columns.
    """
    b, p = len(rows), max(c for c, _ in rows)
    mask = torch.zeros((b, p), dtype=torch.long)
    out: Layers = []
    for layer, (k0, v0) in enumerate(like):
        keys = k0.new_zeros((b, k0.shape[0], p, k0.shape[-1]))
        values = v0.new_zeros((b, v0.shape[0], p, v0.shape[-1]))
        for i, (c, entry) in enumerate(rows):
            if c > 0 and entry is not None:
                k, v = entry.layers[layer]
                keys[i, :, p - c :] = k[:, :c]
                values[i, :, p - c :] = v[:, :c]
        out.append((keys, values))
    for i, (c, _) in enumerate(rows):
        if c > 0:
            mask[i, p - c :] = 1
    return out, mask


def row_entry(layers: Layers, mask_row: torch.Tensor, ids: list[int]) -> KVEntry:
    """Row ``i``'s session entry from a batch cache: the first ``len(ids)`` columns where
    ``mask_row`` (``[T]``, the row of the final attention mask) is 1, copied out of the
    ``[B, H, T, D]`` tensors ``layers`` already indexed to the row (``[H, T, D]``)."""
    cols = mask_row.nonzero().squeeze(-1)[: len(ids)]
    if cols.numel() != len(ids):
        raise ValueError(f"row has {cols.numel()} cached tokens, {len(ids)} ids asked for")
    cols = cols.to(layers[0][0].device)
    return KVEntry(
        list(ids), [(k.index_select(1, cols), v.index_select(1, cols)) for k, v in layers]
    )
