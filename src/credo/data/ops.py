"""Vectorised segment operations shared by the advantage estimators.

Every estimator in :mod:`credo.credit` reduces values over *segments* (a group, an
anchor state, a node's out-edges, ...). These helpers do that with ``index_add_`` /
``scatter_reduce_`` so that no estimator needs a Python loop over rows.

All functions are pure and deterministic on CPU. ``index`` arguments are int64 tensors
of segment ids in ``[0, num_segments)``.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = [
    "compact_ids",
    "hash_key",
    "segment_count",
    "segment_max",
    "segment_mean",
    "segment_std",
    "segment_sum",
    "segment_zscore",
]


def hash_key(key: str) -> int:
    """Stable signed 64-bit hash of a string (Python's ``hash`` is salted per process).

    Used to turn an env's canonical ``state_key()`` into the int64 ``state`` column.
    """
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def compact_ids(*keys: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map (possibly composite) int64 keys to dense ids ``0..K-1``.

    Args:
        *keys: one or more int64 tensors of shape ``[N]``; rows with equal tuples of
            keys get the same id (e.g. ``compact_ids(group, state)`` = anchor groups).

    Returns:
        ``(ids [N] int64, K)``. Ids follow the sorted order of the key tuples, so the
        result does not depend on row order.
    """
    if not keys:
        raise ValueError("compact_ids needs at least one key tensor")
    n = keys[0].numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.long), 0
    # Fold the keys one at a time (much faster than unique(dim=0)): dense ranks keep
    # each key's sorted order, so rank_a * K_b + rank_b sorts like the pair (a, b).
    ids, num = _dense_rank(keys[0].to(torch.long))
    for key in keys[1:]:
        ids_b, num_b = _dense_rank(key.to(torch.long))
        ids, num = _dense_rank(ids * num_b + ids_b)
    return ids, num


def _dense_rank(key: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Rank of each value among the distinct values of ``key [N]`` (sorted), and K.

    Keys spanning a small range (≤ 4N) are ranked by counting, O(N); others by sorting.
    """
    lo, hi = int(key.min()), int(key.max())
    if hi - lo <= 4 * key.numel():
        offset = key - lo
        present = torch.bincount(offset, minlength=hi - lo + 1) > 0
        rank = torch.cumsum(present, 0) - 1
        return rank[offset], int(rank[-1]) + 1
    uniq, inverse = torch.unique(key, return_inverse=True)
    return inverse, uniq.numel()


def segment_sum(values: torch.Tensor, index: torch.Tensor, num: int) -> torch.Tensor:
    """Sum of ``values [N]`` per segment → ``[num]``."""
    out = torch.zeros(num, dtype=values.dtype, device=values.device)
    return out.index_add_(0, index, values)


def segment_count(
    index: torch.Tensor, num: int, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Number of rows per segment → ``[num]`` (as ``dtype``)."""
    return segment_sum(torch.ones(index.numel(), dtype=dtype, device=index.device), index, num)


def segment_mean(values: torch.Tensor, index: torch.Tensor, num: int) -> torch.Tensor:
    """Mean of ``values [N]`` per segment → ``[num]``; empty segments give 0."""
    count = segment_count(index, num, values.dtype)
    return segment_sum(values, index, num) / count.clamp(min=1)


def segment_max(values: torch.Tensor, index: torch.Tensor, num: int) -> torch.Tensor:
    """Max of ``values [N]`` per segment → ``[num]``; empty segments give -inf."""
    out = torch.full((num,), float("-inf"), dtype=values.dtype, device=values.device)
    return out.scatter_reduce_(0, index, values, reduce="amax", include_self=True)


def segment_std(
    values: torch.Tensor, index: torch.Tensor, num: int, *, unbiased: bool = True
) -> torch.Tensor:
    """Standard deviation per segment → ``[num]``.

    Unbiased (n−1) by default, as ``torch.std``; segments with fewer than two rows
    (unbiased) or no rows get 0 rather than NaN.
    """
    count = segment_count(index, num, values.dtype)
    mean = segment_sum(values, index, num) / count.clamp(min=1)
    sq = segment_sum((values - mean[index]) ** 2, index, num)
    denom = (count - 1) if unbiased else count
    var = torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))
    return var.clamp(min=0).sqrt()


def segment_zscore(
    values: torch.Tensor,
    index: torch.Tensor,
    num: int,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> torch.Tensor:
    """``(x − mean_seg)/(std_seg + eps)`` per row (or ``x − mean_seg`` without std).

    A segment of one row gets mean = its value, so 0 — never NaN.
    """
    mean = segment_mean(values, index, num)
    centred = values - mean[index]
    if not norm_by_std:
        return centred
    std = segment_std(values, index, num, unbiased=unbiased)
    return centred / (std[index] + eps)
