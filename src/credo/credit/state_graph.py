"""A group's rollouts as a graph over states: nodes, Bellman values and path sums.

Shared by the state-aware estimators (:mod:`~credo.credit.gigpo` anchor states,
:mod:`~credo.credit.graph` trajectory graph, :mod:`~credo.credit.graphpo` rollout DAG).

Nodes. Every row is an edge ``state → next_state`` of its group's graph. A node is a
``(group, state key)`` pair, so groups never share nodes. With a similarity threshold τ,
state keys of one group whose observation texts are similar are merged into one node:

- the text of a key is the lexicographically smallest ``forest.observations`` entry among
  the rows taken in that state (normally all equal: the key is the hashed observation);
- similarity is :func:`text_similarity`, difflib's ``SequenceMatcher.ratio`` =
  2·(matched characters)/(total characters), the measure verl-agent's GiGPO uses;
- greedy clustering: the group's keys, sorted by (text, key), are visited in that order;
  each joins the first existing cluster whose representative (its first member) has
  ``text_similarity(text, representative_text) ≥ τ``, or starts a new cluster. Sorting
  first makes the clusters independent of row order. Identical texts always merge.

A ``next_state`` key that is never a ``state`` key of its group (e.g. the final state of a
truncated episode) has no text and stays its own node. The exact path is vectorised; the
similarity path compares strings in Python (O(keys × clusters) ratios per group).
"""

from __future__ import annotations

import difflib
import warnings
from collections import defaultdict
from typing import NamedTuple

import torch

from credo.data import RolloutForest
from credo.data.ops import compact_ids, segment_count, segment_max, segment_sum

__all__ = [
    "StateNodes",
    "bellman_values",
    "path_prefix_sum",
    "state_nodes",
    "suffix_discounted_sum",
    "text_similarity",
]

BACKUPS = ("mean", "max")


class StateNodes(NamedTuple):
    """Node ids of every row's edge.

    Attributes:
        src: ``[N]`` int64 node of ``(group, state)`` — the node the row leaves.
        dst: ``[N]`` int64 node of ``(group, next_state)`` — the node it arrives at.
        num_nodes: K; ids are dense in ``[0, K)`` and follow sorted (group, key) order.
    """

    src: torch.Tensor
    dst: torch.Tensor
    num_nodes: int


def text_similarity(a: str, b: str) -> float:
    """difflib ``SequenceMatcher(None, a, b).ratio()`` in [0, 1] (1 = identical)."""
    return difflib.SequenceMatcher(None, a, b).ratio()


def _similar(a: str, b: str, threshold: float) -> bool:
    if a == b:
        return True
    m = difflib.SequenceMatcher(None, a, b)
    # the quick ratios are upper bounds of ratio(): skip the full match when they fail
    return (
        m.real_quick_ratio() >= threshold
        and m.quick_ratio() >= threshold
        and (m.ratio() >= threshold)
    )


def check_similarity_threshold(threshold: float | None, forest: RolloutForest) -> None:
    """Raise ``ValueError`` unless ``threshold`` is None or in (0, 1] with texts present."""
    if threshold is None:
        return
    if not 0.0 < float(threshold) <= 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1] or None, got {threshold}")
    if forest.num_rows and len(forest.observations) != forest.num_rows:
        raise ValueError(
            "similarity_threshold needs forest.observations (one text per row); this forest "
            f"has {len(forest.observations)} texts for {forest.num_rows} rows"
        )


def state_nodes(forest: RolloutForest, *, similarity_threshold: float | None = None) -> StateNodes:
    """Group-local state nodes of every row (see the module docstring).

    Args:
        forest: the rollouts; uses ``group``, ``state``, ``next_state`` and, with a
            threshold, ``observations``.
        similarity_threshold: None (default) = exact key match; τ in (0, 1] = also merge
            keys whose texts have :func:`text_similarity` ≥ τ (greedy, order-independent).

    Returns:
        :class:`StateNodes` ``(src [N], dst [N], K)``.
    """
    check_similarity_threshold(similarity_threshold, forest)
    n = forest.num_rows
    ids, k = compact_ids(
        torch.cat([forest.group, forest.group]), torch.cat([forest.state, forest.next_state])
    )
    src, dst = ids[:n], ids[n:]
    if similarity_threshold is None or n == 0:
        return StateNodes(src, dst, k)

    # text of each state node: smallest observation among its rows
    text: dict[int, str] = {}
    for node, obs in zip(src.tolist(), forest.observations):
        cur = text.get(node)
        if cur is None or obs < cur:
            text[node] = obs
    node_group = torch.zeros(k, dtype=torch.long)
    node_group[src] = forest.group
    group_of = node_group.tolist()
    by_group: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for node, t in text.items():
        by_group[group_of[node]].append((t, node))
    merged = list(range(k))
    for g in sorted(by_group):
        reps: list[tuple[str, int]] = []
        for t, node in sorted(by_group[g]):
            for rep_text, rep_node in reps:
                if _similar(t, rep_text, float(similarity_threshold)):
                    merged[node] = rep_node
                    break
            else:
                reps.append((t, node))
    m = torch.tensor(merged, dtype=torch.long)
    ids, k = compact_ids(torch.cat([m[src], m[dst]]))
    return StateNodes(ids[:n], ids[n:], k)


def bellman_values(
    src: torch.Tensor,
    dst: torch.Tensor,
    reward: torch.Tensor,
    terminal: torch.Tensor,
    num_nodes: int,
    *,
    gamma: float,
    backup: str = "mean",
    tol: float = 1e-6,
    max_iters: int = 10_000,
) -> torch.Tensor:
    """Node values of a graph whose edges are observed steps, by Bellman iteration.

    ``V(n) ← backup_{e=(n→n')} [r_e + γ · V(n') · (1 − terminal_e)]``, starting from
    ``V = 0``, all nodes updated at once (Jacobi) until ``max |ΔV| < tol`` or
    ``max_iters`` sweeps (then a ``RuntimeWarning``). A terminal edge leads to the
    absorbing terminal node (value 0); a node without out-edges (end of a truncated
    episode) has value 0. γ < 1 makes the update a γ-contraction, so it converges even on
    cycles (the error after stopping is below tol·γ/(1 − γ)); on an acyclic graph it is
    exact after (longest path + 1) sweeps for any γ ≤ 1.

    Args:
        src: ``[M]`` int64 source node of each edge.
        dst: ``[M]`` int64 destination node (ignored where ``terminal``).
        reward: ``[M]`` edge rewards.
        terminal: ``[M]`` bool, the edge ends its episode.
        num_nodes: K.
        gamma: discount γ in [0, 1].
        backup: ``"mean"`` (mean over out-edges; each observed step counts once) or
            ``"max"`` (best out-edge).
        tol: stop when the largest change of a sweep is below this.
        max_iters: at most this many sweeps.

    Returns:
        ``[K]`` float64 values.
    """
    if backup not in BACKUPS:
        raise ValueError(f"backup must be one of {BACKUPS}, got {backup!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if tol <= 0 or max_iters < 1:
        raise ValueError(f"need tol > 0 and max_iters >= 1, got tol={tol}, max_iters={max_iters}")
    r = reward.to(torch.float64)
    cont = (~terminal.to(torch.bool)).to(torch.float64) * gamma
    v = torch.zeros(num_nodes, dtype=torch.float64)
    if src.numel() == 0:
        return v
    count = segment_count(src, num_nodes)
    has_out = count > 0
    change = float("inf")
    for _ in range(max_iters):
        q = r + cont * v[dst]
        if backup == "mean":
            new = segment_sum(q, src, num_nodes) / count.clamp(min=1)
        else:
            new = torch.where(has_out, segment_max(q, src, num_nodes), torch.zeros_like(v))
        change = float((new - v).abs().max())
        v = new
        if change < tol:
            break
    else:
        warnings.warn(
            f"Bellman iteration stopped after max_iters={max_iters} sweeps with a last change "
            f"of {change:.3g} >= tol={tol} (γ = 1 on a graph with cycles does not converge)",
            RuntimeWarning,
            stacklevel=2,
        )
    return v


def _levels(t: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Rows sorted by depth and the offsets of each depth level in that order."""
    order = torch.argsort(t, stable=True)
    counts = torch.bincount(t, minlength=int(t.max()) + 1)
    offsets = [0, *torch.cumsum(counts, 0).tolist()]
    return order, offsets


def suffix_discounted_sum(
    values: torch.Tensor, forest: RolloutForest, discount: float
) -> torch.Tensor:
    """``X_i = x_i + discount · mean_{children c of i} X_c`` for every row → ``[N]`` float64.

    On a chain this is ``Σ_{l≥0} discount^l x_{t+l}`` to the end of the episode; on a tree
    the children's sums are averaged (as :meth:`RolloutForest.discounted_returns`).
    One pass per depth level, deepest first.

    Args:
        values: ``[N]`` per-row values x.
        forest: gives ``parent`` and ``t``.
        discount: the per-step factor.
    """
    x = values.to(torch.float64).clone()
    n = forest.num_rows
    if n == 0:
        return x
    order, offsets = _levels(forest.t)
    child_sum = torch.zeros(n, dtype=torch.float64)
    nchild = forest.num_children().to(torch.float64)
    for depth in range(len(offsets) - 2, -1, -1):
        rows = order[offsets[depth] : offsets[depth + 1]]
        if rows.numel() == 0:
            continue
        nc = nchild[rows]
        x[rows] += discount * child_sum[rows] / nc.clamp(min=1)
        if depth > 0:
            child_sum.index_add_(0, forest.parent[rows], x[rows])
    return x


def path_prefix_sum(values: torch.Tensor, forest: RolloutForest) -> torch.Tensor:
    """``P_i = x_i + P_{parent(i)}``: the sum of ``values`` from the root down to each row.

    Args:
        values: ``[N]`` per-row values x (e.g. response token counts).
        forest: gives ``parent`` and ``t``.

    Returns:
        ``[N]`` float64. One pass per depth level.
    """
    p = values.to(torch.float64).clone()
    n = forest.num_rows
    if n == 0:
        return p
    order, offsets = _levels(forest.t)
    for depth in range(1, len(offsets) - 1):
        rows = order[offsets[depth] : offsets[depth + 1]]
        if rows.numel():
            p[rows] += p[forest.parent[rows]]
    return p
