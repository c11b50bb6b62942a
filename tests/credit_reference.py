"""Slow, obviously-correct per-row loop implementations of credo's estimators.

Each function mirrors an estimator in :mod:`credo.credit` with plain Python lists and
dicts: one loop over rows, paths and nodes at a time, no tensor tricks. The tests check
the vectorised estimators against them; ``benchmarks/credit.py`` times them.
All return a list of floats, one per row.
"""

from __future__ import annotations

import difflib
import math
from collections import defaultdict

from credo.data import RolloutForest

__all__ = [
    "REFERENCES",
    "gigpo_reference",
    "graph_reference",
    "graphpo_reference",
    "grpo_reference",
]


# --------------------------------------------------------------------------- helpers
def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:
    """Unbiased standard deviation (n − 1); 0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


class _Rows:
    """Plain-list view of a forest."""

    def __init__(self, forest: RolloutForest) -> None:
        self.n = forest.num_rows
        self.group = forest.group.tolist()
        self.parent = forest.parent.tolist()
        self.t = forest.t.tolist()
        self.state = forest.state.tolist()
        self.next_state = forest.next_state.tolist()
        self.reward = [float(r) for r in forest.reward.tolist()]
        self.terminal = forest.terminal.tolist()
        self.valid = forest.valid.tolist()
        self.success = forest.success.tolist()
        self.obs = list(forest.observations)
        self.tokens = [int(r.numel()) for r in forest.response_ids]
        self.children: list[list[int]] = [[] for _ in range(self.n)]
        for i in range(self.n):
            if self.parent[i] >= 0:
                self.children[self.parent[i]].append(i)
        # root-to-leaf paths, one per leaf
        self.paths: list[list[int]] = []
        for i in range(self.n):
            if not self.children[i]:
                path = [i]
                while self.parent[path[-1]] >= 0:
                    path.append(self.parent[path[-1]])
                self.paths.append(path[::-1])
        self.path_return = [sum(self.reward[i] for i in p) for p in self.paths]
        self.paths_of_row: list[list[int]] = [[] for _ in range(self.n)]
        for e, p in enumerate(self.paths):
            for i in p:
                self.paths_of_row[i].append(e)

    def row_mean_of_paths(self, per_path: list[float]) -> list[float]:
        return [_mean([per_path[e] for e in self.paths_of_row[i]]) for i in range(self.n)]

    def suffix(self, x: list[float], discount: float) -> list[float]:
        """X_i = x_i + discount · mean over children X_c (children have larger indices)."""
        out = list(x)
        for i in range(self.n - 1, -1, -1):
            if self.children[i]:
                out[i] = x[i] + discount * _mean([out[c] for c in self.children[i]])
        return out


def _nodes(rows: _Rows, threshold: float | None) -> tuple[list[tuple], list[tuple]]:
    """Node label (group, key) of each row's state and next state, similar keys merged."""
    rep: dict[tuple[int, int], int] = {}
    if threshold is not None:
        text: dict[tuple[int, int], str] = {}
        for i in range(rows.n):
            k = (rows.group[i], rows.state[i])
            if k not in text or rows.obs[i] < text[k]:
                text[k] = rows.obs[i]
        for g in sorted({g for g, _ in text}):
            reps: list[tuple[str, int]] = []
            for tx, key in sorted((tx, key) for (gg, key), tx in text.items() if gg == g):
                for rtx, rkey in reps:
                    if difflib.SequenceMatcher(None, tx, rtx).ratio() >= threshold:
                        rep[(g, key)] = rkey
                        break
                else:
                    reps.append((tx, key))
                    rep[(g, key)] = key

    def label(g: int, key: int) -> tuple[int, int]:
        return (g, rep.get((g, key), key))

    src = [label(rows.group[i], rows.state[i]) for i in range(rows.n)]
    dst = [label(rows.group[i], rows.next_state[i]) for i in range(rows.n)]
    return src, dst


def _zscore_by(
    values: list[float], keys: list, *, by_std: bool, eps: float, singleton: str = "zero"
) -> list[float]:
    members: dict = defaultdict(list)
    for i, k in enumerate(keys):
        members[k].append(values[i])
    out = []
    for i, k in enumerate(keys):
        xs = members[k]
        if len(xs) == 1:
            out.append(values[i] if singleton == "raw" else 0.0)
        elif by_std:
            out.append((values[i] - _mean(xs)) / (_std(xs) + eps))
        else:
            out.append(values[i] - _mean(xs))
    return out


def _episode_term(rows: _Rows, norm: str, eps: float) -> list[float]:
    """GRPO per path ((R − μ)/(σ + ε); a lone episode: μ = 0, σ = 1), mean over a row's paths."""
    if norm == "none":
        return [0.0] * rows.n
    by_group: dict[int, list[float]] = defaultdict(list)
    for e, p in enumerate(rows.paths):
        by_group[rows.group[p[-1]]].append(rows.path_return[e])
    adv = []
    for e, p in enumerate(rows.paths):
        rs = by_group[rows.group[p[-1]]]
        mu, sd = (0.0, 1.0) if len(rs) == 1 else (_mean(rs), _std(rs))
        a = rows.path_return[e] - mu
        adv.append(a / (sd + eps) if norm == "mean_std_norm" else a)
    return rows.row_mean_of_paths(adv)


def _bellman(
    rows: _Rows, src: list, dst: list, gamma: float, backup: str, tol: float, max_iters: int
) -> dict:
    out_edges: dict = defaultdict(list)
    for i in range(rows.n):
        out_edges[src[i]].append(i)
    v: dict = defaultdict(float)
    for _ in range(max_iters):
        new: dict = defaultdict(float)
        for node, edges in out_edges.items():
            qs = [rows.reward[i] + (0.0 if rows.terminal[i] else gamma * v[dst[i]]) for i in edges]
            new[node] = _mean(qs) if backup == "mean" else max(qs)
        change = max(abs(new[k] - v[k]) for k in set(new) | set(v))
        v = new
        if change < tol:
            break
    return v


# ------------------------------------------------------------------------ estimators
def grpo_reference(forest: RolloutForest, eps: float = 1e-6) -> list[float]:
    """GRPO, for the benchmark's baseline row."""
    return _episode_term(_Rows(forest), "mean_std_norm", eps)


def gigpo_reference(
    forest: RolloutForest,
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: str = "mean_norm",
    episode_stats: str = "steps",
    similarity_threshold: float | None = None,
    invalid_penalty: float = 0.0,
    eps: float = 1e-6,
) -> list[float]:
    rows = _Rows(forest)
    n = rows.n
    by_std = mode == "mean_std_norm"
    penalty = [0.0 if rows.valid[i] else invalid_penalty for i in range(n)]
    score = [s - p for s, p in zip(rows.row_mean_of_paths(rows.path_return), penalty)]
    # episode statistics per group
    stats: dict[int, list[float]] = defaultdict(list)
    if episode_stats == "steps":
        for i in range(n):
            stats[rows.group[i]].append(score[i])
    else:
        for e, p in enumerate(rows.paths):
            stats[rows.group[p[-1]]].append(rows.path_return[e])
    a_e = []
    for i in range(n):
        xs = stats[rows.group[i]]
        mu, sd = (0.0, 1.0) if len(xs) == 1 else (_mean(xs), _std(xs))
        a_e.append((score[i] - mu) / (sd + eps) if by_std else score[i] - mu)
    # step returns and anchor groups
    ret = rows.suffix(rows.reward, gamma)
    ret = [r - p for r, p in zip(ret, penalty)]
    src, _ = _nodes(rows, similarity_threshold)
    a_s = _zscore_by(ret, src, by_std=by_std, eps=eps)
    return [a_e[i] + omega * a_s[i] for i in range(n)]


def graph_reference(
    forest: RolloutForest,
    gamma: float = 0.95,
    lam: float = 0.95,
    omega: float = 1.0,
    backup: str = "mean",
    tol: float = 1e-6,
    max_iters: int = 10_000,
    state_norm: str = "mean_std",
    singleton: str = "zero",
    episode_norm: str = "mean_std_norm",
    similarity_threshold: float | None = None,
    eps: float = 1e-6,
) -> list[float]:
    rows = _Rows(forest)
    n = rows.n
    src, dst = _nodes(rows, similarity_threshold)
    v = _bellman(rows, src, dst, gamma, backup, tol, max_iters)
    delta = [
        rows.reward[i] + (0.0 if rows.terminal[i] else gamma * v[dst[i]]) - v[src[i]]
        for i in range(n)
    ]
    a = rows.suffix(delta, gamma * lam)
    if state_norm != "none":
        a = _zscore_by(a, src, by_std=state_norm == "mean_std", eps=eps, singleton=singleton)
    a_e = _episode_term(rows, episode_norm, eps)
    return [a_e[i] + omega * a[i] for i in range(n)]


def graphpo_reference(
    forest: RolloutForest,
    value: str = "mc",
    lam: float = 0.5,
    length: str = "steps",
    out_norm: str = "mean_std",
    singleton: str = "zero",
    episode_norm: str = "mean_std_norm",
    efficiency: str = "all",
    revisit: str = "count",
    gamma: float = 0.95,
    backup: str = "mean",
    tol: float = 1e-6,
    max_iters: int = 10_000,
    similarity_threshold: float | None = None,
    eps: float = 1e-6,
) -> list[float]:
    rows = _Rows(forest)
    n = rows.n
    src, dst = _nodes(rows, similarity_threshold)
    if value == "mc":
        through: dict = defaultdict(set)  # node -> episodes passing through it
        for e, p in enumerate(rows.paths):
            for i in p:
                through[src[i]].add(e)
                if not rows.terminal[i]:
                    through[dst[i]].add(e)
        v = {node: _mean([rows.path_return[e] for e in eps_]) for node, eps_ in through.items()}
        outcome = rows.row_mean_of_paths(rows.path_return)
        q = [outcome[i] if rows.terminal[i] else v[dst[i]] for i in range(n)]
    else:
        v = _bellman(rows, src, dst, gamma, backup, tol, max_iters)
        q = [rows.reward[i] + (0.0 if rows.terminal[i] else gamma * v[dst[i]]) for i in range(n)]
    a_out = [q[i] - v[src[i]] for i in range(n)]
    if out_norm != "none":
        a_out = _zscore_by(a_out, src, by_std=out_norm == "mean_std", eps=eps, singleton=singleton)
    # path length from the root, inclusive
    per_row = [1.0] * n if length == "steps" else [float(x) for x in rows.tokens]
    plen = [0.0] * n
    for i in range(n):  # parents come first
        plen[i] = per_row[i] + (plen[rows.parent[i]] if rows.parent[i] >= 0 else 0.0)
    first = list(range(n))
    if revisit == "skip":  # drop rows re-entering a node their own path (or they) left

        def left_before(i: int) -> set:
            seen, j = set(), i
            while j >= 0:
                seen.add(src[j])
                j = rows.parent[j]
            return seen

        first = [i for i in range(n) if dst[i] not in left_before(i)]
    z = _zscore_by([-plen[i] for i in first], [dst[i] for i in first], by_std=True, eps=eps)
    a_in = [0.0] * n
    for k, i in enumerate(first):
        a_in[i] = z[k]
    if efficiency == "success":
        # nodes a successful episode leaves or reaches
        good = {
            node for p in rows.paths if rows.success[p[-1]] for i in p for node in (src[i], dst[i])
        }
        a_in = [a_in[i] if dst[i] in good else 0.0 for i in range(n)]
    a_e = _episode_term(rows, episode_norm, eps)
    return [a_e[i] + a_out[i] + lam * a_in[i] for i in range(n)]


#: estimator name → loop reference (used by the tests and benchmarks/credit.py)
REFERENCES = {
    "grpo": grpo_reference,
    "gigpo": gigpo_reference,
    "graph": graph_reference,
    "graphpo": graphpo_reference,
}


def _add_b_references() -> None:
    """The loop references of proas, tsbpo and axpo live in credit_reference_b.py."""
    import credit_reference_b as b

    REFERENCES.update(proas=b.proas_reference, tsbpo=b.tsbpo_reference, axpo=b.axpo_reference)


_add_b_references()
