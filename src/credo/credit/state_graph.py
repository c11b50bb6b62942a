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

With ``similarity="embedding"`` the same greedy clustering compares vectors instead of
texts: the vector of a key is the mean of ``forest.extras["state_embedding"]`` (``[N, d]``,
the policy's own last hidden layer averaged over each row's prompt,
:meth:`~credo.policy.HFPolicy.embed`) over the rows taken in that state; keys are
visited in key order, and a key joins the first cluster whose representative's vector has
cosine similarity ≥ τ with its own.

A ``next_state`` key that is never a ``state`` key of its group (e.g. the final state of a
truncated episode) has no text and stays its own node. The exact path is vectorised; the
similarity path compares strings in Python (O(keys × clusters) ratios per group).
"""

from __future__ import annotations

import difflib
import itertools
import warnings
from collections import defaultdict
from typing import NamedTuple

import torch

from credo.data import RolloutForest
from credo.data.ops import compact_ids, segment_count

__all__ = [
    "BELLMAN_TOL",
    "StateNodes",
    "bellman_values",
    "check_similarity_threshold",
    "path_prefix_sum",
    "state_nodes",
    "suffix_discounted_sum",
    "text_similarity",
]

#: What ``similarity_threshold`` compares (:func:`state_nodes`).
SIMILARITIES = ("text", "embedding")
#: The forest's extra column of per-row state embeddings (``similarity="embedding"``).
EMBEDDING = "state_embedding"

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


def check_similarity_threshold(
    threshold: float | None, forest: RolloutForest, similarity: str = "text"
) -> None:
    """Raise ``ValueError`` unless ``threshold`` is None or in (0, 1] with texts (or, for
    ``similarity="embedding"``, the embedding column) present."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    if threshold is None:
        if similarity == "embedding":
            raise ValueError("similarity='embedding' needs a similarity_threshold in (0, 1]")
        return
    if not 0.0 < float(threshold) <= 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1] or None, got {threshold}")
    if similarity == "embedding":
        col = forest.extras.get(EMBEDDING)
        if forest.num_rows and (col is None or col.dim() != 2):
            raise ValueError(
                f"similarity='embedding' needs forest.extras[{EMBEDDING!r}] ([N, d] floats, "
                "the policy's state embeddings); this forest has none"
            )
        return
    if forest.num_rows and len(forest.observations) != forest.num_rows:
        raise ValueError(
            "similarity_threshold needs forest.observations (one text per row); this forest "
            f"has {len(forest.observations)} texts for {forest.num_rows} rows"
        )


def state_nodes(
    forest: RolloutForest,
    *,
    similarity_threshold: float | None = None,
    similarity: str = "text",
) -> StateNodes:
    """Group-local state nodes of every row (see the module docstring).

    Args:
        forest: the rollouts; uses ``group``, ``state``, ``next_state`` and, with a
            threshold, ``observations`` (or ``extras["state_embedding"]``).
        similarity_threshold: None (default) = exact key match; τ in (0, 1] = also merge
            keys whose texts have :func:`text_similarity` ≥ τ (greedy, order-independent).
        similarity: ``"text"`` (default: difflib on the observations) or
            ``"embedding"`` (cosine of the mean state embeddings; needs a threshold).

    Returns:
        :class:`StateNodes` ``(src [N], dst [N], K)``.
    """
    check_similarity_threshold(similarity_threshold, forest, similarity)
    n = forest.num_rows
    ids, k = compact_ids(
        torch.cat([forest.group, forest.group]), torch.cat([forest.state, forest.next_state])
    )
    src, dst = ids[:n], ids[n:]
    if similarity_threshold is None or n == 0:
        return StateNodes(src, dst, k)
    if similarity == "embedding":
        return _embedding_nodes(forest, src, dst, k, float(similarity_threshold))

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


def _embedding_nodes(
    forest: RolloutForest, src: torch.Tensor, dst: torch.Tensor, k: int, threshold: float
) -> StateNodes:
    """:func:`state_nodes`'s merge by cosine similarity of the state embeddings."""
    emb = forest.extras[EMBEDDING].to(torch.float64)
    n = src.numel()
    sums = torch.zeros(k, emb.shape[1], dtype=torch.float64).index_add_(0, src, emb)
    rows = segment_count(src, k)
    has = rows > 0  # a key seen only as a next_state has no vector: its own node
    vec = torch.nn.functional.normalize(sums / rows.clamp(min=1).unsqueeze(1), dim=1)
    node_group = torch.full((k,), -1, dtype=torch.long)
    node_group[src] = forest.group
    merged = list(range(k))
    reps: dict[int, list[int]] = defaultdict(list)  # group → representative nodes
    for node in torch.nonzero(has).flatten().tolist():  # key order within every group
        g = int(node_group[node])
        for rep in reps[g]:
            if float(vec[node] @ vec[rep]) >= threshold:
                merged[node] = rep
                break
        else:
            reps[g].append(node)
    m = torch.tensor(merged, dtype=torch.long)
    ids, k2 = compact_ids(torch.cat([m[src], m[dst]]))
    return StateNodes(ids[:n], ids[n:], k2)


#: the Bellman iteration's default relative tolerance: float64's resolution, as the
#: estimators normalise differences of the values (see :func:`bellman_values`)
BELLMAN_TOL = 1e-15


def bellman_values(
    src: torch.Tensor,
    dst: torch.Tensor,
    reward: torch.Tensor,
    terminal: torch.Tensor,
    num_nodes: int,
    *,
    gamma: float,
    backup: str = "mean",
    tol: float = BELLMAN_TOL,
    max_iters: int = 10_000,
    block_edges: int = 1 << 17,
) -> torch.Tensor:
    """Node values of a graph whose edges are observed steps, by Bellman iteration.

    ``V(n) ← backup_{e=(n→n')} [r_e + γ · V(n') · (1 − terminal_e)]``, starting from
    ``V = 0``, all nodes updated at once (Jacobi). Each connected part of the graph (a
    group, or a part of one) stops on its own, after the first sweep whose largest change
    on it is below ``tol · (1 + max |V|)`` (its largest value: relative, so that a tol
    near float64's resolution is reachable at any reward scale), or after ``max_iters``
    sweeps (then a ``RuntimeWarning``), so a group's values are the same to the bit
    whatever else is in the batch. A terminal edge leads to the absorbing terminal node
    (value 0); a node without out-edges (end of a truncated episode) has value 0. γ < 1
    makes the update a γ-contraction, so it converges even on cycles (the error after
    stopping is below that bound times γ/(1 − γ)); on an acyclic graph it is exact after
    (longest path + 1) sweeps for any γ ≤ 1.

    The estimators normalise differences of these values per node (÷ σ + ε), which
    magnifies the solver's error by up to 1/ε: the default ``tol`` is 1e-15 (float64's
    resolution: a few units in the last place), not the 1e-6 of a plain value
    iteration (``docs/algorithms.md``). At γ = 0.95 that is about 700 sweeps.

    For speed the graph is cut, at node ids that no edge spans, into blocks of about
    ``block_edges`` edges (groups never share nodes and their node ids are contiguous, so
    a group is never cut), and each block is iterated with preallocated buffers small
    enough to stay in cache. Blocks change nothing in the values.

    Args:
        src: ``[M]`` int64 source node of each edge.
        dst: ``[M]`` int64 destination node (ignored where ``terminal``).
        reward: ``[M]`` edge rewards.
        terminal: ``[M]`` bool, the edge ends its episode.
        num_nodes: K.
        gamma: discount γ in [0, 1].
        backup: ``"mean"`` (mean over out-edges; each observed step counts once) or
            ``"max"`` (best out-edge).
        tol: a part stops when the largest change of a sweep on it is below
            ``tol · (1 + its largest |V|)`` (default 1e-15).
        max_iters: at most this many sweeps.
        block_edges: target number of edges per block (default 131 072).

    Returns:
        ``[K]`` float64 values.
    """
    if backup not in BACKUPS:
        raise ValueError(f"backup must be one of {BACKUPS}, got {backup!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if tol <= 0 or max_iters < 1:
        raise ValueError(f"need tol > 0 and max_iters >= 1, got tol={tol}, max_iters={max_iters}")
    v = torch.zeros(num_nodes, dtype=torch.float64)
    m = src.numel()
    if m == 0:
        return v
    order = torch.argsort(src, stable=True)
    s = src[order]
    term = terminal.to(torch.bool)[order]
    d = torch.where(term, s, dst[order])  # a terminal edge's dst is unused: keep it local
    r = reward.to(torch.float64)[order]
    cont = (~term).to(torch.float64) * gamma
    worst = 0.0
    bounds = _block_bounds(s, d, num_nodes, block_edges)
    for lo, hi in itertools.pairwise(bounds):
        a, b = (int(x) for x in torch.searchsorted(s, torch.tensor([lo, hi])))
        if a == b:
            continue
        v[lo:hi], change = _iterate(
            s[a:b] - lo, d[a:b] - lo, r[a:b], cont[a:b], hi - lo, backup, tol, max_iters
        )
        worst = max(worst, change)
    if worst >= tol:
        warnings.warn(
            f"Bellman iteration stopped after max_iters={max_iters} sweeps with a last "
            f"relative change of {worst:.3g} >= tol={tol} (γ = 1 on a graph with cycles does "
            "not converge)",
            RuntimeWarning,
            stacklevel=2,
        )
    return v


def _block_bounds(s: torch.Tensor, d: torch.Tensor, k: int, block_edges: int) -> list[int]:
    """Node ids 0 = c_0 < c_1 < ... = K cutting the graph into blocks no edge crosses.

    ``s`` is sorted. A cut c (between nodes c − 1 and c) is allowed when no edge has
    ``min(s, d) < c ≤ max(s, d)``; the cuts taken are the first allowed ones after every
    ``block_edges`` edges.
    """
    if s.numel() <= block_edges:
        return [0, k]
    cover = torch.zeros(k + 1, dtype=torch.long)
    cover.index_add_(0, torch.minimum(s, d) + 1, torch.ones_like(s))
    cover.index_add_(0, torch.maximum(s, d) + 1, -torch.ones_like(s))
    spanned = torch.cumsum(cover, 0)
    allowed = torch.nonzero(spanned[1:k] == 0).flatten() + 1
    edges_before = torch.searchsorted(s, allowed)
    targets = torch.arange(1, s.numel() // block_edges + 1) * block_edges
    pick = torch.searchsorted(edges_before, targets)
    cuts = allowed[torch.unique(pick[pick < allowed.numel()])]
    return [0, *cuts.tolist(), k]


def _components(s: torch.Tensor, d: torch.Tensor, k: int) -> torch.Tensor:
    """``[k]`` the smallest node id of each node's weakly connected part (edges ``s → d``
    in either direction), by min-label propagation with pointer jumping."""
    label = torch.arange(k)
    while True:
        m = torch.minimum(label[s], label[d])
        new = label.scatter_reduce(0, s, m, reduce="amin").scatter_reduce_(0, d, m, reduce="amin")
        new = new[new]
        if torch.equal(new, label):
            return label
        label = new


def _iterate(
    s: torch.Tensor,
    d: torch.Tensor,
    r: torch.Tensor,
    cont: torch.Tensor,
    k: int,
    backup: str,
    tol: float,
    max_iters: int,
) -> tuple[torch.Tensor, float]:
    """Jacobi sweeps on one block (local node ids) → (values [k], the largest last
    relative change of a connected part; each part stops at its own first sweep whose
    largest change is below tol × (1 + its largest |V|))."""
    count = segment_count(s, k)
    no_out = count == 0
    count.clamp_(min=1)
    part = _components(s, d, k)
    active = torch.ones(k, dtype=torch.bool)
    last = torch.zeros(k, dtype=torch.float64)  # each node's part's last change
    v = torch.zeros(k, dtype=torch.float64)
    new = torch.empty_like(v)
    diff = torch.empty_like(v)
    mag = torch.empty_like(v)
    change = torch.empty_like(v)  # per part, at its root's id
    size = torch.empty_like(v)  # per part, at its root's id
    node_change = torch.empty_like(v)  # each node's part's change
    q = torch.empty_like(r)
    for _ in range(max_iters):
        torch.index_select(v, 0, d, out=q)
        q.mul_(cont).add_(r)
        if backup == "mean":
            new.zero_().index_add_(0, s, q).div_(count)
        else:
            new.fill_(float("-inf")).scatter_reduce_(0, s, q, reduce="amax")
            new.masked_fill_(no_out, 0.0)
        torch.sub(new, v, out=diff).abs_()
        change.zero_().scatter_reduce_(0, part, diff, reduce="amax")
        size.zero_().scatter_reduce_(0, part, torch.abs(new, out=mag), reduce="amax")
        change.div_(size.add_(1.0))  # relative to 1 + the part's largest |V|
        torch.index_select(change, 0, part, out=node_change)
        torch.where(active, new, v, out=v)
        torch.where(active, node_change, last, out=last)
        active &= node_change >= tol
        if not active.any():
            break
    return v, float(last.max())


class _Levels(NamedTuple):
    """The forest's rows laid out by depth, so that each depth level is one slice."""

    order: torch.Tensor  # [N] row at each depth-sorted position
    parent_pos: torch.Tensor  # [N] depth-sorted position of each position's parent (-1)
    offsets: list[int]  # level d is positions offsets[d]:offsets[d + 1]


def _levels(forest: RolloutForest) -> _Levels:
    t = forest.t
    order = torch.argsort(t, stable=True)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel())
    par = forest.parent[order]
    parent_pos = torch.where(par >= 0, pos[par.clamp(min=0)], par)
    counts = torch.bincount(t, minlength=int(t.max()) + 1)
    return _Levels(order, parent_pos, [0, *torch.cumsum(counts, 0).tolist()])


def suffix_discounted_sum(
    values: torch.Tensor, forest: RolloutForest, discount: float
) -> torch.Tensor:
    """``X_i = x_i + discount · mean_{children c of i} X_c`` for every row → ``[N]`` float64.

    On a chain this is ``Σ_{l≥0} discount^l x_{t+l}`` to the end of the episode; on a tree
    the children's sums are averaged (as :meth:`RolloutForest.discounted_returns`).
    One pass per depth level, deepest first, on rows laid out by depth (contiguous).

    Args:
        values: ``[N]`` per-row values x.
        forest: gives ``parent`` and ``t``.
        discount: the per-step factor.
    """
    n = forest.num_rows
    if n == 0:
        return values.to(torch.float64).clone()
    lv = _levels(forest)
    x = values.to(torch.float64)[lv.order]
    child_sum = torch.zeros(n, dtype=torch.float64)
    nchild = torch.zeros(n, dtype=torch.float64)
    has_parent = lv.parent_pos >= 0
    nchild.index_add_(
        0, lv.parent_pos[has_parent], torch.ones(int(has_parent.sum()), dtype=x.dtype)
    )
    nchild.clamp_(min=1)
    for depth in range(len(lv.offsets) - 2, -1, -1):
        a, b = lv.offsets[depth], lv.offsets[depth + 1]
        if a == b:
            continue
        x[a:b] += discount * child_sum[a:b] / nchild[a:b]
        if depth > 0:
            child_sum.index_add_(0, lv.parent_pos[a:b], x[a:b])
    out = torch.empty_like(x)
    out[lv.order] = x
    return out


def path_prefix_sum(values: torch.Tensor, forest: RolloutForest) -> torch.Tensor:
    """``P_i = x_i + P_{parent(i)}``: the sum of ``values`` from the root down to each row.

    Args:
        values: ``[N]`` per-row values x (e.g. response token counts).
        forest: gives ``parent`` and ``t``.

    Returns:
        ``[N]`` float64. One pass per depth level.
    """
    n = forest.num_rows
    if n == 0:
        return values.to(torch.float64).clone()
    lv = _levels(forest)
    p = values.to(torch.float64)[lv.order]
    for depth in range(1, len(lv.offsets) - 1):
        a, b = lv.offsets[depth], lv.offsets[depth + 1]
        if a < b:
            p[a:b] += p[lv.parent_pos[a:b]]
    out = torch.empty_like(p)
    out[lv.order] = p
    return out
