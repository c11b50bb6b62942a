"""Trajectory-graph step advantage: Bellman values on merged rollouts + graph GAE. [recon]

"Step-level advantage estimation with trajectory graphs for agentic RL" (Shanghai Jiao
Tong University / Tencent AI Platform; relatives: GraphGPO, G2PO). The paper's details
were not available: this is a reconstruction from a summary, with every knob exposed
(``docs/algorithms.md#trajectory-graph``).

Per group, all rollouts are merged into one directed graph:

- nodes = state keys of the group (exact match, or similar observation texts merged with
  ``similarity_threshold`` τ; see :mod:`credo.credit.state_graph`); edges = rows
  ``state → next_state`` with reward r. A terminal row leads to an absorbing terminal
  node of value 0 (its reward is on the edge); a node without out-edges has value 0.
- Node values by Bellman iteration from V = 0 until the largest change < ``tol`` (relative,
  per connected part: :func:`~credo.credit.state_graph.bellman_values`):
  ``V(n) ← mean_{e=(n→n')} [r_e + γ V(n')]`` (``backup="mean"``; ``"max"`` takes the best
  out-edge). γ < 1 makes it converge even on cycles. ``tol`` defaults to 1e-15 (float64's
  resolution): the on-state z-score divides differences of V by σ + ε, so a solver error
  of 1e-6 became advantages of order 1 at nodes whose rows have equal values (a self-loop
  of a truncated episode; ``tests/test_credit_graph.py``), and 1e-10 still 5e-4.
- Graph GAE: ``δ_t = r_t + γ V(s_{t+1}) − V(s_t)`` and ``A_t = Σ_l (γλ)^l δ_{t+l}`` along
  the episode; on a tree ``A_t = δ_t + γλ · mean_{children c} A_c``.
- On-state normalisation over the rows leaving the same node (same group):
  ``(A − μ_node)/(max(σ_node, σ_min) + ε)`` (σ unbiased; ``std_floor`` = σ_min, default
  0); a node left by one row gets 0 (``singleton="zero"``) or its raw A (``"raw"``).
  Without a floor a node whose rows differ by a hair is blown up to unit spread (two rows
  become ±0.71 whatever their gap), which with ω = 1 outweighs the episode term; with
  σ_min a spread below it is only centred and scaled by 1/σ_min, so near-equal successors
  stay near 0 (``benchmarks/credit_signal.py`` reports the resulting ``|A|`` tail).
- Combined: ``A_t = A^E + ω · A^graph_t`` with A^E the GRPO episode advantage
  (:func:`credo.credit.grpo.episode_group_advantage`; ``episode_norm`` chooses its
  normalisation, ``"none"`` drops it).

All groups are solved together: nodes are (group, state) pairs, so one Bellman sweep is
one gather + one segment reduction over all rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from credo.credit.grpo import episode_group_advantage
from credo.credit.registry import register_estimator
from credo.credit.state_graph import (
    BELLMAN_TOL,
    bellman_values,
    check_similarity_threshold,
    state_nodes,
    suffix_discounted_sum,
)
from credo.data import RolloutForest
from credo.data.ops import segment_count, segment_mean, segment_std, segment_zscore

__all__ = ["check_choice", "episode_term", "graph", "normalise_by_node"]

EPISODE_NORMS = ("mean_std_norm", "mean_norm", "none")
STATE_NORMS = ("mean_std", "mean", "none")
SINGLETONS = ("zero", "raw")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the accepted values unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def episode_term(forest: RolloutForest, episode_norm: str, eps: float) -> torch.Tensor:
    """GRPO-style episode advantage per row → ``[N]`` float64.

    Args:
        forest: the rollouts.
        episode_norm: ``"mean_std_norm"`` ((R − μ_g)/(σ_g + eps), GRPO), ``"mean_norm"``
            (R − μ_g, Dr.GRPO) or ``"none"`` (zeros). A group of one episode: A = R.
        eps: added to σ_g.
    """
    check_choice("episode_norm", episode_norm, EPISODE_NORMS)
    if episode_norm == "none":
        return torch.zeros(forest.num_rows, dtype=torch.float64)
    ep = forest.episodes()
    adv = episode_group_advantage(
        ep.ret, ep.group, norm_by_std=(episode_norm == "mean_std_norm"), eps=eps
    )
    return forest.episode_values_to_rows(adv)


def normalise_by_node(
    values: torch.Tensor,
    node: torch.Tensor,
    num_nodes: int,
    *,
    norm: str = "mean_std",
    singleton: str = "zero",
    eps: float = 1e-6,
    std_floor: float = 0.0,
) -> torch.Tensor:
    """Normalise per-row ``values [N]`` over the rows that share a ``node [N]``.

    Args:
        values: ``[N]`` float64 values.
        node: ``[N]`` int64 node id of each row.
        num_nodes: number of node ids.
        norm: ``"mean_std"`` ((x − μ)/(σ + eps), σ unbiased), ``"mean"`` (x − μ) or
            ``"none"`` (unchanged; ``singleton`` is then ignored).
        singleton: a node with one row gets ``"zero"`` or its ``"raw"`` value.
        eps: added to σ.
        std_floor: σ_min ≥ 0 (``mean_std`` only): divide by ``max(σ, σ_min) + eps``.

    Returns:
        ``[N]`` float64.
    """
    check_choice("norm", norm, STATE_NORMS)
    check_choice("singleton", singleton, SINGLETONS)
    if not std_floor >= 0.0:
        raise ValueError(f"std_floor must be ≥ 0, got {std_floor}")
    if norm == "none":
        return values
    if norm == "mean_std" and std_floor > 0:
        centred = values - segment_mean(values, node, num_nodes)[node]
        std = segment_std(values, node, num_nodes, unbiased=True)[node]
        z = centred / (torch.clamp(std, min=std_floor) + eps)
    else:
        z = segment_zscore(values, node, num_nodes, norm_by_std=(norm == "mean_std"), eps=eps)
    single = segment_count(node, num_nodes)[node] < 2
    return torch.where(single, values if singleton == "raw" else torch.zeros_like(values), z)


def _needs(params: Mapping[str, Any]) -> set[str]:
    """The run computes the policy's state embeddings for an embedding merge."""
    return {"state_embeddings"} if params.get("similarity") == "embedding" else set()


@register_estimator("graph", needs=_needs)
def graph(
    forest: RolloutForest,
    *,
    gamma: float = 0.95,
    lam: float = 0.95,
    omega: float = 1.0,
    backup: str = "mean",
    tol: float = BELLMAN_TOL,
    max_iters: int = 10_000,
    state_norm: str = "mean_std",
    singleton: str = "zero",
    episode_norm: str = "mean_std_norm",
    similarity_threshold: float | None = None,
    similarity: str = "text",
    eps: float = 1e-6,
    std_floor: float = 0.0,
) -> torch.Tensor:
    """Trajectory-graph advantage ``A^E + ω·A^graph`` per row → ``[N]`` float32.

    Args:
        forest: the rollouts; ``state``/``next_state`` keys define the graph.
        gamma: discount γ in [0, 1], default 0.95 (γ < 1 needed for cycles to converge).
        lam: GAE λ in [0, 1], default 0.95 (λ = 0: one-step TD error; λ = 1: Monte-Carlo
            return minus V(s_t)).
        omega: weight ω of the graph advantage, default 1.0.
        backup: ``"mean"`` (default) or ``"max"`` over a node's out-edges.
        tol: Bellman iteration stops when the largest value change < tol · (1 + max |V|)
            (default 1e-15: float64's resolution).
        max_iters: at most this many Bellman sweeps (default 10 000).
        state_norm: on-state normalisation of the graph advantage over rows leaving the
            same node: ``"mean_std"`` (default), ``"mean"`` or ``"none"``.
        singleton: a node left by one row gets ``"zero"`` (default) or its ``"raw"`` A.
        episode_norm: the episode term A^E: ``"mean_std_norm"`` (default, GRPO),
            ``"mean_norm"`` (Dr.GRPO) or ``"none"``.
        similarity_threshold: None (default, exact keys) or τ in (0, 1]: merge states with
            similar observation texts (needs ``forest.observations``) or embeddings.
        similarity: what τ compares: ``"text"`` (default, difflib's ratio of the
            observations) or ``"embedding"`` (cosine of the policy's own state
            embeddings, ``forest.extras["state_embedding"]``, which the trainer computes
            when this is set; needs τ).
        eps: ε of both normalisations, default 1e-6.
        std_floor: σ_min of the on-state normalisation (``mean_std``), default 0 (none).
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    check_choice("state_norm", state_norm, STATE_NORMS)
    check_choice("singleton", singleton, SINGLETONS)
    check_similarity_threshold(similarity_threshold, forest, similarity)  # before any row
    a_e = episode_term(forest, episode_norm, eps)
    if forest.num_rows == 0:
        return torch.zeros(0, dtype=torch.float32)
    nodes = state_nodes(forest, similarity_threshold=similarity_threshold, similarity=similarity)
    v = bellman_values(
        nodes.src,
        nodes.dst,
        forest.reward,
        forest.terminal,
        nodes.num_nodes,
        gamma=gamma,
        backup=backup,
        tol=tol,
        max_iters=max_iters,
    )
    cont = (~forest.terminal).to(torch.float64)
    delta = forest.reward.to(torch.float64) + gamma * cont * v[nodes.dst] - v[nodes.src]
    a_graph = suffix_discounted_sum(delta, forest, gamma * lam)
    a_graph = normalise_by_node(
        a_graph,
        nodes.src,
        nodes.num_nodes,
        norm=state_norm,
        singleton=singleton,
        eps=eps,
        std_floor=std_floor,
    )
    return (a_e + omega * a_graph).to(torch.float32)
