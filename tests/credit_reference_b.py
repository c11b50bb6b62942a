"""Slow, obviously-correct loop references for the ProAS, TSBPO and AXPO estimators.

Each ``<name>_reference(forest, **kwargs)`` has the signature of the estimator
``credo.credit.<name>`` and returns ``[N]`` float32 advantages computed with plain
Python loops over rows and root-to-leaf paths (no segment ops), so the vectorised code
can be checked against it on random forests (and benchmarked against it).

ProAS's graph: :func:`proas_reference` reads the :class:`ProgressGraph` through its
``state_dict()`` (Python dicts, a BFS with a deque) and writes the online update back
with ``load_state_dict()``; only ``apply_initial_pruning`` (random, tested on its own) is
shared with the estimator.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque

import torch

from credo.credit.proas import ProgressGraph
from credo.data import RolloutForest

__all__ = ["axpo_reference", "proas_reference", "tsbpo_reference"]


# ------------------------------------------------------------------ shared helpers
def paths(forest: RolloutForest) -> list[list[int]]:
    """Root-to-leaf row lists, one per leaf, leaves in row order (as ``episodes()``)."""
    parent = forest.parent.tolist()
    n = len(parent)
    has_child = [False] * n
    for i in range(n):
        if parent[i] >= 0:
            has_child[parent[i]] = True
    out = []
    for leaf in range(n):
        if has_child[leaf]:
            continue
        path, i = [], leaf
        while i >= 0:
            path.append(i)
            i = parent[i]
        out.append(path[::-1])
    return out


def returns(forest: RolloutForest, eps_paths: list[list[int]]) -> list[float]:
    reward = forest.reward.tolist()
    return [math.fsum(reward[i] for i in p) for p in eps_paths]


def grpo_values(
    values: list[float], keys: list[object], norm_by_std: bool, eps: float
) -> list[float]:
    """GRPO per item within items of equal key; a key with one item: μ = 0, σ = 1."""
    out = []
    for i, v in enumerate(values):
        members = [values[j] for j in range(len(values)) if keys[j] == keys[i]]
        if len(members) < 2:
            mu, sd = 0.0, 1.0
        else:
            mu, sd = statistics.fmean(members), statistics.stdev(members)
        a = v - mu
        out.append(a / (sd + eps) if norm_by_std else a)
    return out


def rows_mean(n: int, eps_paths: list[list[int]], per_entry: list[list[float]]) -> list[float]:
    """Row value = mean over the paths through the row of that path's value at the row."""
    acc: list[list[float]] = [[] for _ in range(n)]
    for path, vals in zip(eps_paths, per_entry):
        for i, v in zip(path, vals):
            acc[i].append(v)
    return [statistics.fmean(a) if a else 0.0 for a in acc]


def _f32(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


# --------------------------------------------------------------------------- ProAS
def verb(action: str) -> str:
    m = re.match(r"\s*([^\s\[]+)", action)
    return m.group(1).lower() if m else ""


def abstract_states(forest: RolloutForest) -> tuple[list[int], list[int]]:
    if "abstract_state" in forest.extras:
        return (
            forest.extras["abstract_state"].tolist(),
            forest.extras["abstract_next_state"].tolist(),
        )
    return forest.state.tolist(), forest.next_state.tolist()


def graph_distances(edges: dict, goals: dict) -> dict[int, float]:
    """BFS from the goals over reversed edges."""
    radj: dict[int, list[int]] = {}
    for a, b in edges:
        radj.setdefault(b, []).append(a)
    dist: dict[int, float] = {}
    queue = deque()
    for g in goals:
        dist[g] = 0.0
        queue.append(g)
    while queue:
        x = queue.popleft()
        for y in radj.get(x, []):
            if y not in dist:
                dist[y] = dist[x] + 1.0
                queue.append(y)
    return dist


def graph_update_reference(graph: ProgressGraph, forest: RolloutForest) -> None:
    """Merge the successes of ``forest`` into ``graph`` (loop version of ``update``)."""
    sd = graph.state_dict()
    edges = {(a, b): c for a, b, c in sd["edges"]}
    actions = {(a, t): c for a, t, c in sd["action_edges"]}
    goals = {g: c for g, c in sd["goals"]}
    if graph.decay < 1.0:
        for table in (edges, actions, goals):
            for k in table:
                table[k] = table[k] * graph.decay
    s, s2 = abstract_states(forest)
    valid = forest.valid.tolist()
    success = forest.success.tolist()
    merged_rows = set()
    for path in paths(forest):
        if success[path[-1]]:
            merged_rows.update(path)
            goals[s2[path[-1]]] = goals.get(s2[path[-1]], 0.0) + 1.0
    for i in sorted(merged_rows):
        if not graph.include_invalid and not valid[i]:
            continue
        if not graph.include_self_loops and s[i] == s2[i]:
            continue
        edges[(s[i], s2[i])] = edges.get((s[i], s2[i]), 0.0) + 1.0
        if forest.actions:
            key = (s[i], verb(forest.actions[i]))
            actions[key] = actions.get(key, 0.0) + 1.0
    if graph.decay < 1.0:
        for table in (edges, actions, goals):
            for k in [k for k, c in table.items() if c < graph.min_count]:
                del table[k]
    sd["edges"] = [[a, b, c] for (a, b), c in edges.items()]
    sd["action_edges"] = [[a, t, c] for (a, t), c in actions.items()]
    sd["goals"] = [[g, c] for g, c in goals.items()]
    sd["num_updates"] = sd["num_updates"] + 1
    graph.load_state_dict(sd)


def proas_reference(
    forest: RolloutForest,
    *,
    state: ProgressGraph | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    shaping: str = "advantage",
    mask_positive: bool = True,
    mask_negative: bool = True,
    redistribute: str = "future_drift",
    match: str = "edge",
    spare: str = "reasonable",
    min_graph_edges: int = 1,
    reward_coef: float = 0.1,
    frozen: bool = False,
    update_first: bool = False,
) -> torch.Tensor:
    graph = state if state is not None else ProgressGraph()
    graph.apply_initial_pruning()
    if update_first and not frozen:
        graph_update_reference(graph, forest)
    sd = graph.state_dict()
    edges = {(a, b) for a, b, _ in sd["edges"]}
    actions = {(a, t) for a, t, _ in sd["action_edges"]}
    dist = graph_distances(edges, {g: c for g, c in sd["goals"]})
    n = forest.num_rows
    s, s2 = abstract_states(forest)
    reasonable, progress = [], []
    for i in range(n):
        r = (s[i], s2[i]) in edges
        if match == "edge_or_action":
            r = r or (s[i], verb(forest.actions[i])) in actions
        reasonable.append(r)
        progress.append(dist.get(s2[i], math.inf) < dist.get(s[i], math.inf))
    active = n > 0 and len(edges) >= min_graph_edges

    eps_paths = paths(forest)
    group = forest.group.tolist()
    keys = [group[p[-1]] for p in eps_paths]
    ret = returns(forest, eps_paths)
    per_entry = []
    if shaping == "reward" or not active:
        if active:
            for k, p in enumerate(eps_paths):
                bonus = [reward_coef * (float(progress[i]) - float(not reasonable[i])) for i in p]
                ret[k] = ret[k] + math.fsum(bonus)
        adv = grpo_values(ret, keys, norm_by_std, eps)
        per_entry = [[adv[k]] * len(p) for k, p in enumerate(eps_paths)]
    else:
        adv = grpo_values(ret, keys, norm_by_std, eps)
        for k, p in enumerate(eps_paths):
            a, length = adv[k], len(p)
            masked = [
                (mask_positive and a > 0 and not reasonable[i])
                or (
                    mask_negative
                    and a < 0
                    and reasonable[i]
                    and (spare == "reasonable" or progress[i])
                )
                for i in p
            ]
            values = [0.0 if m else a for m in masked]
            if a < 0 and redistribute != "none":
                if redistribute == "future_drift":
                    drift = [
                        sum(not progress[p[u]] for u in range(t, length)) for t in range(length)
                    ]
                else:
                    drift = [length - t for t in range(length)]
                unmasked = [t for t in range(length) if not masked[t]]
                total = sum(drift[t] for t in unmasked)
                if total > 0:
                    for t in unmasked:
                        values[t] = a * len(unmasked) * drift[t] / total
            per_entry.append(values)
    out = rows_mean(n, eps_paths, per_entry)
    if not update_first and not frozen:
        graph_update_reference(graph, forest)
    return _f32(out)


# --------------------------------------------------------------------------- TSBPO
def tsbpo_reference(
    forest: RolloutForest,
    *,
    omega: float = 1.0,
    norm_by_std: bool = False,
    eps: float = 1e-6,
    only_child: str = "inherit",
) -> torch.Tensor:
    n = forest.num_rows
    eps_paths = paths(forest)
    ret = returns(forest, eps_paths)
    value = rows_mean(n, eps_paths, [[r] * len(p) for r, p in zip(ret, eps_paths)])
    group, parent, state = forest.group.tolist(), forest.parent.tolist(), forest.state.tolist()

    def relative(i: int, members: list[int]) -> float:
        if len(members) < 2:
            return 0.0
        vals = [value[j] for j in members]
        a = value[i] - statistics.fmean(vals)
        return a / (statistics.stdev(vals) + eps) if norm_by_std else a

    def siblings(i: int) -> list[int]:
        return [j for j in range(n) if group[j] == group[i] and parent[j] == parent[i]]

    def a_sib(i: int) -> float:
        sib = siblings(i)
        if only_child == "inherit" and len(sib) < 2 and parent[i] >= 0:
            return a_sib(parent[i])
        return relative(i, sib)

    out = []
    for i in range(n):
        same = [j for j in range(n) if group[j] == group[i] and state[j] == state[i]]
        out.append(a_sib(i) + omega * relative(i, same))
    return _f32(out)


# ---------------------------------------------------------------------------- AXPO
def axpo_reference(
    forest: RolloutForest,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    recovery_coef: float = 1.0,
) -> torch.Tensor:
    n = forest.num_rows
    parent, source = forest.parent.tolist(), forest.source.tolist()
    group, success = forest.group.tolist(), forest.success.tolist()

    def branch_start(i: int) -> int | None:
        """The topmost resample row among i and its ancestors (None: not in a branch)."""
        top = None
        while i >= 0:
            if source[i] == 2:
                top = i
            i = parent[i]
        return top

    eps_paths = paths(forest)
    ret = returns(forest, eps_paths)
    set_of: list[tuple[int, int] | None] = []
    for p in eps_paths:
        start = branch_start(p[-1])
        set_of.append(None if start is None else (group[p[-1]], parent[start]))
    orig = [k for k in range(len(eps_paths)) if set_of[k] is None]
    res = [k for k in range(len(eps_paths)) if set_of[k] is not None]
    adv = [0.0] * len(eps_paths)
    for k, a in zip(
        orig,
        grpo_values(
            [ret[k] for k in orig], [group[eps_paths[k][-1]] for k in orig], norm_by_std, eps
        ),
    ):
        adv[k] = a
    for k, a in zip(
        res, grpo_values([ret[k] for k in res], [set_of[k] for k in res], norm_by_std, eps)
    ):
        adv[k] = a
    out = rows_mean(n, eps_paths, [[adv[k]] * len(p) for k, p in enumerate(eps_paths)])

    prefix_values: list[list[float]] = [[] for _ in range(n)]
    for key in sorted({s for s in set_of if s is not None}):
        g, p = key
        y = float(any(success[eps_paths[k][-1]] for k in res if set_of[k] == key))
        orig_succ = [float(success[eps_paths[k][-1]]) for k in orig if group[eps_paths[k][-1]] == g]
        base = statistics.fmean(orig_succ) if orig_succ else 0.0
        i = p
        while i >= 0:
            prefix_values[i].append(recovery_coef * (y - base))
            i = parent[i]
    for i in range(n):
        if prefix_values[i]:
            out[i] = statistics.fmean(prefix_values[i])
    return _f32(out)
