"""GraphPO: out-edge correctness and in-edge efficiency advantages on a rollout DAG.

"GraphPO: graph-based policy optimisation for reasoning models" (Renmin University of
China, Gaoling School of AI / Ant Group; https://arxiv.org/abs/2606.18954;
``docs/algorithms.md#graphpo``). [paper] for the idea and claims (rollouts as a DAG in
which equivalent states merge and share suffixes; correctness advantage on out-edges,
efficiency advantage on in-edges; lower variance than trees at equal budget); [recon] for
every formula below.

The rollouts of a group are merged into a graph over state keys, exactly as in
:mod:`credo.credit.graph` (nodes = (group, state) pairs, optional similarity merging with
``similarity_threshold``); every row is an edge n → n' (``state → next_state``).

Node value V(n) (``value`` knob):

- ``"mc"`` (default): the mean return R of the distinct episodes that pass through n
  (take a step from n, or arrive at n by a non-terminal step). The value reached by an
  edge is ``Q(e) = V(n')``, and for a terminal edge the episode's own outcome R (the
  mean over its episodes for a shared row). With outcome-only rewards this is the
  empirical success rate after the edge, no discounting and no iteration.
- ``"bellman"``: V from Bellman iteration as in :mod:`credo.credit.graph` (``gamma``,
  ``backup``, ``tol``, ``max_iters``; terminal node 0) and ``Q(e) = r_e + γ V(n')``, so
  that the edge's own reward counts (without it every terminal edge would get −V(n)).

Advantages of a row (edge e = n → n'):

- out-edge correctness ``A_out(e) = Q(e) − V(n)``, normalised over the out-edges of n
  (rows leaving n): ``out_norm="mean_std"`` z-score (σ unbiased, + ε), ``"mean"`` or
  ``"none"``; a node left by one row gets 0 (``singleton="zero"``) or its raw A_out.
- in-edge efficiency ``A_in(e)``: among the rows arriving at n' (same group, same
  ``next_state`` node; terminal rows included, so paths to the same final state compete),
  the z-score of ``−L(e)`` where L is the length of the path arriving by e: its number of
  steps from the root (``length="steps"``, = t + 1) or its response tokens summed from the
  root (``"tokens"``, needs token data). A node reached by one row, or by rows of equal
  length, gives 0. This term does not look at rewards: with λ > 0, equal rewards do not
  give zero advantages. With ``efficiency="success"`` the term counts only at nodes that a
  successful episode of the group passes through (leaves, or arrives at): reaching a
  dead end, or a failure, by a shorter path earns nothing (rows arriving elsewhere get 0).
  With ``revisit="skip"`` a row that re-enters a node its own path already left (a
  back-track; GraphPO's reasoning DAGs have none) gets A_in = 0 and is left out of the
  other in-edges' z-score, so a necessary back-track is not scored as a long path.
- ``A = A^E + A_out + λ·A_in`` where A^E is the GRPO episode advantage
  (``episode_norm="mean_std_norm"`` by default; ``"mean_norm"`` or ``"none"``). The
  episode term is on by default so that steps on paths that never merge (where A_out and
  A_in are 0) still get the outcome signal; ``"none"`` gives the pure edge advantage.
  λ = 0.5 by default: efficiency is secondary to correctness ([recon] choice).
"""

from __future__ import annotations

import torch

from credo.credit.graph import check_choice, episode_term, normalise_by_node
from credo.credit.registry import register_estimator
from credo.credit.state_graph import (
    BELLMAN_TOL,
    StateNodes,
    bellman_values,
    path_prefix_sum,
    state_nodes,
)
from credo.data import RolloutForest
from credo.data.ops import segment_mean, segment_zscore

__all__ = [
    "graphpo",
    "graphpo_in_edge_advantage",
    "graphpo_out_edge_advantage",
    "revisits",
    "success_nodes",
]

VALUES = ("mc", "bellman")
LENGTHS = ("steps", "tokens")
OUT_NORMS = ("mean_std", "mean", "none")
EFFICIENCIES = ("all", "success")
REVISITS = ("count", "skip")


def _mc_values(forest: RolloutForest, nodes: StateNodes) -> torch.Tensor:
    """``[K]`` mean return of the distinct episodes that pass through each node."""
    ep = forest.episodes()
    k, e = nodes.num_nodes, ep.num_episodes
    rows, epi = ep.rows, ep.episode_of
    arrive = ~forest.terminal[rows]
    node = torch.cat([nodes.src[rows], nodes.dst[rows][arrive]])
    owner = torch.cat([epi, epi[arrive]])
    pairs = torch.unique(node * e + owner)
    return segment_mean(ep.ret.to(torch.float64)[pairs % e], pairs // e, k)


def graphpo_out_edge_advantage(
    forest: RolloutForest,
    nodes: StateNodes,
    *,
    value: str = "mc",
    gamma: float = 0.95,
    backup: str = "mean",
    tol: float = BELLMAN_TOL,
    max_iters: int = 10_000,
) -> torch.Tensor:
    """Raw out-edge correctness advantage ``Q(e) − V(n)`` per row → ``[N]`` float64.

    Args:
        forest: the rollouts.
        nodes: :func:`~credo.credit.state_graph.state_nodes` of ``forest``.
        value: ``"mc"`` or ``"bellman"`` (see the module docstring).
        gamma, backup, tol, max_iters: Bellman iteration settings (``value="bellman"``).
    """
    check_choice("value", value, VALUES)
    terminal = forest.terminal
    if value == "mc":
        v = _mc_values(forest, nodes)
        outcome = forest.episode_values_to_rows(forest.episodes().ret)
        q = torch.where(terminal, outcome, v[nodes.dst])
    else:
        v = bellman_values(
            nodes.src,
            nodes.dst,
            forest.reward,
            terminal,
            nodes.num_nodes,
            gamma=gamma,
            backup=backup,
            tol=tol,
            max_iters=max_iters,
        )
        q = forest.reward.to(torch.float64) + gamma * (~terminal).to(torch.float64) * v[nodes.dst]
    return q - v[nodes.src]


def revisits(forest: RolloutForest, nodes: StateNodes) -> torch.Tensor:
    """``[N]`` bool: the row arrives at a node its own path already left (a back-track or
    a self-loop: n' is the ``src`` node of the row itself or of one of its ancestors)."""
    src, dst, parent = nodes.src, nodes.dst, forest.parent
    out = src == dst
    cur = parent.clone()
    while bool((cur >= 0).any()):  # one sweep per depth level
        live = cur >= 0
        at = cur.clamp(min=0)
        out |= live & (src[at] == dst)
        cur = torch.where(live, parent[at], cur)
    return out


def graphpo_in_edge_advantage(
    forest: RolloutForest,
    nodes: StateNodes,
    *,
    length: str = "steps",
    skip_revisits: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """In-edge efficiency advantage: z-score of −(path length) among rows arriving at the
    same node → ``[N]`` float64 (0 for a node reached once).

    Args:
        forest: the rollouts.
        nodes: :func:`~credo.credit.state_graph.state_nodes` of ``forest``.
        length: ``"steps"`` (t + 1) or ``"tokens"`` (response tokens from the root).
        skip_revisits: rows that re-enter a node their path already left
            (:func:`revisits`) get 0 and are left out of the other rows' z-score.
        eps: added to the unbiased std.
    """
    check_choice("length", length, LENGTHS)
    if length == "steps":
        path_len = (forest.t + 1).to(torch.float64)
    else:
        if not forest.has_tokens:
            raise ValueError('length="tokens" needs token data (forest.response_ids is empty)')
        tokens = torch.tensor([r.numel() for r in forest.response_ids], dtype=torch.float64)
        path_len = path_prefix_sum(tokens, forest)
    if not skip_revisits:
        return segment_zscore(-path_len, nodes.dst, nodes.num_nodes, norm_by_std=True, eps=eps)
    first = ~revisits(forest, nodes)
    out = torch.zeros(forest.num_rows, dtype=torch.float64)
    out[first] = segment_zscore(
        -path_len[first], nodes.dst[first], nodes.num_nodes, norm_by_std=True, eps=eps
    )
    return out


def success_nodes(forest: RolloutForest, nodes: StateNodes) -> torch.Tensor:
    """``[K]`` bool: nodes that a successful episode leaves or arrives at (``success``
    column of the leaves)."""
    ep = forest.episodes()
    on_success = forest.episode_values_to_rows(ep.success.to(torch.float64)) > 0
    mark = torch.zeros(nodes.num_nodes, dtype=torch.bool)
    mark[nodes.src[on_success]] = True
    mark[nodes.dst[on_success]] = True
    return mark


@register_estimator("graphpo")
def graphpo(
    forest: RolloutForest,
    *,
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
    tol: float = BELLMAN_TOL,
    max_iters: int = 10_000,
    similarity_threshold: float | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GraphPO edge advantage ``A^E + A_out + λ·A_in`` per row → ``[N]`` float32.

    Args:
        forest: the rollouts; ``state``/``next_state`` keys define the DAG.
        value: node value V: ``"mc"`` (default, mean return of the episodes through the
            node) or ``"bellman"`` (Bellman iteration, see :mod:`credo.credit.graph`).
        lam: λ ≥ 0, weight of the in-edge efficiency advantage, default 0.5.
        length: path length for efficiency: ``"steps"`` (default) or ``"tokens"``.
        out_norm: normalisation of A_out over a node's out-edges: ``"mean_std"``
            (default, z-score), ``"mean"`` or ``"none"``.
        singleton: a node left by one row gets ``"zero"`` (default) or its ``"raw"`` A_out.
        episode_norm: episode term A^E: ``"mean_std_norm"`` (default, GRPO),
            ``"mean_norm"`` (Dr.GRPO) or ``"none"`` (edge advantage only).
        efficiency: where A_in counts: ``"all"`` (default) nodes, or only ``"success"``
            nodes (a successful episode of the group leaves or reaches them).
        revisit: a row that re-enters a node its path already left (back-tracking, a
            self-loop) is ``"count"``-ed (default) among the node's in-edges, or
            ``"skip"``-ped: A_in = 0 and left out of the others' z-score.
        gamma: discount for ``value="bellman"``, default 0.95 (unused by ``"mc"``).
        backup: ``"mean"`` (default) or ``"max"``, for ``value="bellman"``.
        tol: Bellman convergence tolerance, default 1e-15 (see :mod:`credo.credit.graph`).
        max_iters: Bellman sweep limit, default 10 000.
        similarity_threshold: None (default, exact keys) or τ in (0, 1]: merge states with
            similar observation texts (needs ``forest.observations``).
        eps: ε of the normalisations, default 1e-6.
    """
    check_choice("value", value, VALUES)
    check_choice("length", length, LENGTHS)
    check_choice("out_norm", out_norm, OUT_NORMS)
    check_choice("singleton", singleton, ("zero", "raw"))
    check_choice("efficiency", efficiency, EFFICIENCIES)
    check_choice("revisit", revisit, REVISITS)
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    a_e = episode_term(forest, episode_norm, eps)
    if forest.num_rows == 0:
        return torch.zeros(0, dtype=torch.float32)
    nodes = state_nodes(forest, similarity_threshold=similarity_threshold)
    a_out = graphpo_out_edge_advantage(
        forest, nodes, value=value, gamma=gamma, backup=backup, tol=tol, max_iters=max_iters
    )
    a_out = normalise_by_node(
        a_out, nodes.src, nodes.num_nodes, norm=out_norm, singleton=singleton, eps=eps
    )
    a_in = graphpo_in_edge_advantage(
        forest, nodes, length=length, skip_revisits=revisit == "skip", eps=eps
    )
    if efficiency == "success":
        a_in = torch.where(success_nodes(forest, nodes)[nodes.dst], a_in, torch.zeros_like(a_in))
    return (a_e + a_out + lam * a_in).to(torch.float32)
