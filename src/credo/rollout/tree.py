"""Tree sampler for TSBPO: roots, then branches restarted from env snapshots. [recon]

TSBPO ("tree-structured branch policy optimisation", ``docs/algorithms.md#tsbpo``;
known to credo only from a summary of the paper) samples each task as a physical tree:
a budget of B env-episodes (leaves) per task is split between N_root independent root
episodes and B − N_root branches, each restarted from an env snapshot at a chosen node
and run to the end. A branch shares its prefix: its rows hang under the prefix's rows
(parent pointers) and its first prompt is the prefix episode's prompt at that depth, so
the prefix's tokens are generated once. A tree of B leaves therefore costs fewer
generated tokens than B independent episodes.

Nodes. A *node* is a row i at depth t ≥ 1 (the state s_t in which its action was
taken); branching at i re-samples the action at depth t from s_t, so the new path is a
sibling of row i and adds exactly one leaf. Every tree has exactly B leaves: when a
tree has no node to branch at (all its roots ended after one step) or a restore diverges
under ``on_restore_divergence=skip``, the branch becomes one more root.

Allocators (``allocator``):

- ``uniform`` (the control): N_root = round(``root_fraction`` · B) (at least 1), and
  branch nodes drawn uniformly at random from the tree's nodes, without replacement
  until every node has one, then again.
- ``likelihood`` [recon]: a logistic model of success, p(x) = σ(wᵀφ(x)), with features
  φ of a node (:data:`FEATURES`: 1, d, d², progress before the action, fraction of
  invalid actions before it; d = t / max_turns), fitted to the trees seen so far
  (:class:`LikelihoodAllocator`: online Bayesian logistic regression, Laplace
  approximation, forgetting factor ``fit_decay``, prior precision ``fit_l2``). Each row
  of a finished tree is one example with target = the fraction of successful leaves
  below it and weight = their number. Branches go where p(1 − p) is largest ("risky"
  nodes, whose outcome is least certain): greedily, a node that already has j branches
  this round counts p(1 − p)/(1 + j), ties broken at random. The split uses the same
  fit: with p₀ = p(root), N_root is the smallest n ≥ ``min_roots`` whose roots alone
  have mixed outcomes with probability 1 − p₀ⁿ − (1 − p₀)ⁿ ≥ ``mix_target``, capped at
  ``max_root_fraction`` · B (so some budget always goes to branches). Before any data
  p = ½ everywhere: random nodes, N_root = ``min_roots``-ish.

Branches are placed in ``rounds`` rounds (default 1); each round chooses among all nodes
of the trees so far (so later rounds may branch a branch). Within a round all branches of
all tasks advance together, one batched ``generate`` call per turn, as the roots do.
The model is updated once per iteration, after the trees are complete (the trainer keeps
it as sampler state and saves it in checkpoints).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from credo.data import RolloutForest
from credo.data.ops import segment_count
from credo.envs.base import Task
from credo.rollout.branch import try_restore
from credo.rollout.group import (
    RolloutResult,
    Trajectory,
    run_episodes,
    start_runners,
    trajectories_to_forest,
)
from credo.rollout.sampler import SamplerContext, register_sampler

__all__ = [
    "ALLOCATORS",
    "FEATURES",
    "LikelihoodAllocator",
    "TreeParams",
    "choose_nodes",
    "likelihood_root_count",
    "node_features",
    "sample_trees",
    "uniform_root_count",
]

#: Accepted ``allocator`` names.
ALLOCATORS = ("uniform", "likelihood")
#: The likelihood allocator's node features, in column order.
FEATURES = ("bias", "depth", "depth^2", "progress", "invalid_frac")


@dataclass
class TreeParams:
    """Knobs of the tree sampler (``rollout.sampler_params`` with ``sampler: tree``).

    The budget B (leaves per task) is ``rollout.group_size``.

    Attributes:
        allocator: ``"likelihood"`` (default) or ``"uniform"`` (see the module doc).
        root_fraction: the uniform allocator's share of roots, N_root = round(f · B),
            at least 1 (default 0.5).
        min_roots: the likelihood allocator's fewest roots per tree (default 2).
        max_root_fraction: the likelihood allocator's most roots, as a share of B
            (default 0.75; at least ``min_roots``).
        mix_target: the likelihood split's target probability that the roots alone
            have mixed outcomes (default 0.7).
        rounds: branching rounds per iteration (default 1).
        fit_decay: forgetting factor of the success model per iteration, in (0, 1]
            (default 0.9; 1 = never forget).
        fit_l2: prior precision of the success model's weights (default 1.0).
    """

    allocator: str = "likelihood"
    root_fraction: float = 0.5
    min_roots: int = 2
    max_root_fraction: float = 0.75
    mix_target: float = 0.7
    rounds: int = 1
    fit_decay: float = 0.9
    fit_l2: float = 1.0

    def __post_init__(self) -> None:
        if self.allocator not in ALLOCATORS:
            raise ValueError(
                f"tree allocator must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}"
            )
        for name in ("root_fraction", "max_root_fraction", "mix_target"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"tree {name} must be in (0, 1], got {v}")
        if self.min_roots < 1:
            raise ValueError(f"tree min_roots must be ≥ 1, got {self.min_roots}")
        if self.rounds < 1:
            raise ValueError(f"tree rounds must be ≥ 1, got {self.rounds}")
        if not 0 < self.fit_decay <= 1:
            raise ValueError(f"tree fit_decay must be in (0, 1], got {self.fit_decay}")
        if not self.fit_l2 > 0:
            raise ValueError(f"tree fit_l2 must be > 0, got {self.fit_l2}")


def node_features(forest: RolloutForest, max_turns: int) -> torch.Tensor:
    """``[N, 5]`` float64 features φ of each row's state (columns :data:`FEATURES`).

    Args:
        forest: the rows; ``extras["progress"]`` (progress after a step) is used when
            present, else the progress feature is 0.
        max_turns: T, the turn cap; depth d = t / T.

    Row i's state is the one its action was taken in, so "progress" is its parent's
    progress after the parent's step (0 at a root) and "invalid_frac" is the share of
    invalid actions among its ancestors (0 at a root).
    """
    n = forest.num_rows
    t = forest.t.to(torch.float64)
    d = t / max(1, max_turns)
    parent = forest.parent
    has_parent = parent >= 0
    progress = torch.zeros(n, dtype=torch.float64)
    if "progress" in forest.extras and n:
        prog = forest.extras["progress"].to(torch.float64)
        progress = torch.where(has_parent, prog[parent.clamp(min=0)], progress)
    invalid = torch.zeros(n, dtype=torch.float64)
    bad = (~forest.valid).to(torch.float64)
    for depth in range(1, int(forest.t.max()) + 1 if n else 0):  # parents are final first
        rows = torch.nonzero(forest.t == depth, as_tuple=False).flatten()
        invalid[rows] = invalid[parent[rows]] + bad[parent[rows]]
    frac = invalid / t.clamp(min=1)
    return torch.stack([torch.ones(n, dtype=torch.float64), d, d * d, progress, frac], 1)


class LikelihoodAllocator:
    """Online Bayesian logistic regression of success on node features. [recon]

    The weights have a Gaussian posterior N(m, P⁻¹) (Laplace approximation). Each
    :meth:`update` first forgets, P ← γ·P + (1 − γ)·λ·I (γ = ``decay``, λ = ``l2``: with
    no data the prior stays N(0, λ⁻¹I)), then moves to the MAP of the prior times the
    new data's likelihood by Newton's method,

        w* = argmin ½(w − m)ᵀP(w − m) + Σᵢ nᵢ·[softplus(zᵢ) − yᵢ zᵢ],  zᵢ = φᵢᵀw,

    and sets m ← w*, P ← P + Σᵢ nᵢ pᵢ(1 − pᵢ) φᵢφᵢᵀ (the Hessian at w*). Soft targets
    yᵢ ∈ [0, 1] with weights nᵢ are the same as nᵢ examples of which nᵢyᵢ succeeded.

    Args:
        decay: γ in (0, 1] (default 0.9).
        l2: λ > 0 (default 1.0).
        newton_steps: most Newton iterations per update (default 25).
        num_features: length of φ (default 5, :data:`FEATURES`).

    This object is the tree sampler's state: the trainer saves :meth:`state_dict` in
    checkpoints (plain floats, exact through JSON) and restores it on ``--resume``.
    """

    def __init__(
        self, decay: float = 0.9, l2: float = 1.0, newton_steps: int = 25, num_features: int = 5
    ) -> None:
        self.decay, self.l2, self.newton_steps = decay, l2, newton_steps
        self.mean = torch.zeros(num_features, dtype=torch.float64)
        self.precision = l2 * torch.eye(num_features, dtype=torch.float64)
        self.updates = 0
        self.examples = 0.0

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """``[N]`` float64 p = σ(φᵀm) for ``features [N, F]``."""
        return torch.sigmoid(features.to(torch.float64) @ self.mean)

    def update(self, features: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> None:
        """Add examples ``features [N, F]`` with soft targets ``target [N]`` in [0, 1] and
        weights ``weight [N]`` ≥ 0 (see the class doc)."""
        x = features.to(torch.float64)
        y = target.to(torch.float64)
        n = weight.to(torch.float64)
        f = self.mean.numel()
        eye = torch.eye(f, dtype=torch.float64)
        prior = self.decay * self.precision + (1 - self.decay) * self.l2 * eye
        m0 = self.mean
        w = m0.clone()
        for _ in range(self.newton_steps):
            p = torch.sigmoid(x @ w)
            grad = prior @ (w - m0) + x.T @ (n * (p - y))
            hess = prior + x.T @ (x * (n * p * (1 - p))[:, None])
            step = torch.linalg.solve(hess, grad)
            w = w - step
            if float(step.abs().max()) < 1e-10:
                break
        p = torch.sigmoid(x @ w)
        self.precision = prior + x.T @ (x * (n * p * (1 - p))[:, None])
        self.mean = w
        self.updates += 1
        self.examples += float(n.sum())

    def state_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean.tolist(),
            "precision": self.precision.tolist(),
            "updates": self.updates,
            "examples": self.examples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = torch.tensor(state["mean"], dtype=torch.float64)
        self.precision = torch.tensor(state["precision"], dtype=torch.float64)
        self.updates = int(state["updates"])
        self.examples = float(state["examples"])


def uniform_root_count(budget: int, root_fraction: float) -> int:
    """N_root = round(``root_fraction`` · B), clamped to [1, B] (halves round up)."""
    return max(1, min(budget, math.floor(root_fraction * budget + 0.5)))


def likelihood_root_count(
    budget: int, p_root: float, *, min_roots: int, max_root_fraction: float, mix_target: float
) -> int:
    """The smallest n in [lo, hi] with 1 − p₀ⁿ − (1 − p₀)ⁿ ≥ ``mix_target``, else hi.

    lo = min(``min_roots``, B); hi = max(lo, ⌊``max_root_fraction`` · B⌋).
    """
    lo = min(min_roots, budget)
    hi = max(lo, math.floor(max_root_fraction * budget))
    for n in range(lo, hi + 1):
        if 1 - p_root**n - (1 - p_root) ** n >= mix_target:
            return n
    return hi


def choose_nodes(scores: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """Greedy picks of ``k`` nodes with diminishing returns → ``[k]`` node indices.

    Pick j at node i is worth ``scores[i] / (1 + j)``; the ``k`` best (node, j) pairs are
    taken, ties broken by a random order of the nodes. Equal scores therefore spread
    the picks over all nodes before any node gets a second one. ``[0]`` when there are no
    nodes.

    Args:
        scores: ``[n]`` non-negative node scores (p(1 − p), or ones for uniform).
        k: number of picks.
        generator: RNG of the tie-break.
    """
    n = scores.numel()
    if n == 0 or k <= 0:
        return torch.zeros(0, dtype=torch.long)
    value = scores.to(torch.float64)[:, None] / (1 + torch.arange(k, dtype=torch.float64))
    tie = torch.randperm(n, generator=generator)  # random rank of each node among equals
    node = torch.arange(n)[:, None].expand(n, k).reshape(-1)
    j = torch.arange(k)[None, :].expand(n, k).reshape(-1)
    value = value.reshape(-1)
    # sort by (value desc, tie asc): stable sort on the secondary key first
    order = torch.argsort(tie[node] * k + j, stable=True)
    order = order[torch.argsort(-value[order], stable=True)]
    return node[order[:k]]


def _tree_state(params: TreeParams) -> LikelihoodAllocator | None:
    """The likelihood allocator's model, kept across iterations (``None`` for
    ``uniform``)."""
    if params.allocator == "likelihood":
        return LikelihoodAllocator(params.fit_decay, params.fit_l2)
    return None


@register_sampler("tree", params=TreeParams, state=_tree_state, branches=True)
def sample_trees(
    ctx: SamplerContext,
    tasks: Sequence[Task],
    *,
    group_size: int,
    params: TreeParams | None = None,
    state: LikelihoodAllocator | None = None,
) -> RolloutResult:
    """One tree of ``group_size`` leaves per task (see the module docstring).

    Args:
        ctx: policy, renderer, env factory, sampling, turn cap (of every path, counted
            from its root), the policy's RNG and ``ctx.choices``, the RNG of the node
            choices.
        tasks: the tasks; task ``i`` is group ``i``.
        group_size: B, leaves (env-episodes) per task (≥ 1).
        params: the knobs (default :class:`TreeParams` ()).
        state: the likelihood allocator's model, updated in place with this
            iteration's trees (default: a fresh one, for ``allocator="likelihood"``).

    Returns:
        The trees as one forest (``episodes`` lists every root-to-leaf path); ``stats``
        has ``rollout/tree_roots`` (roots per tree), ``rollout/tree_branches`` (branches
        in all), ``rollout/tree_branch_depth`` (mean depth of the branch points) and,
        for the likelihood allocator, ``rollout/tree_p_root``.
    """
    budget, max_turns, make_env = group_size, ctx.max_turns, ctx.make_env
    params = params or TreeParams()
    if budget < 1:
        raise ValueError(f"tree budget must be ≥ 1, got {budget}")
    start = time.perf_counter()
    likelihood = params.allocator == "likelihood"
    if likelihood and state is None:
        state = _tree_state(params)
    stats: dict[str, float] = {}
    if likelihood:
        root_phi = torch.zeros(1, len(FEATURES), dtype=torch.float64)
        root_phi[0, 0] = 1.0
        p_root = float(state.predict(root_phi)[0])
        n_root = likelihood_root_count(
            budget,
            p_root,
            min_roots=params.min_roots,
            max_root_fraction=params.max_root_fraction,
            mix_target=params.mix_target,
        )
        stats["rollout/tree_p_root"] = p_root
    else:
        n_root = uniform_root_count(budget, params.root_fraction)

    totals = [0, 0]  # env steps, generated tokens

    def run(runners: list) -> None:
        steps, tokens = run_episodes(runners, ctx)
        totals[0] += steps
        totals[1] += tokens

    roots = start_runners(make_env, tasks, n_root, env_seed=ctx.env_seed, keep_snapshots=True)
    trajectories = [Trajectory(r.episode, runner=r) for r in roots]
    run(roots)

    n_branch = budget - n_root
    per_round = [
        n_branch // params.rounds + (1 if i < n_branch % params.rounds else 0)
        for i in range(params.rounds)
    ]
    extra_roots = branches = 0
    depth_sum = 0.0
    for k in per_round:
        if k == 0:
            continue
        forest, owner = trajectories_to_forest(trajectories)
        eligible = (forest.t >= 1) & (forest.t < max_turns)
        if likelihood:
            p = state.predict(node_features(forest, max_turns))
            scores = p * (1 - p)
        else:
            scores = torch.ones(forest.num_rows, dtype=torch.float64)
        new_runners = []
        for g, task in enumerate(tasks):
            nodes = torch.nonzero(eligible & (forest.group == g), as_tuple=False).flatten()
            picks = nodes[choose_nodes(scores[nodes], k, ctx.choices)].tolist()
            fresh = k - len(picks)
            for row in picks:
                src = int(owner[row])
                depth = int(forest.t[row])
                runner = try_restore(
                    make_env,
                    trajectories[src],
                    depth,
                    on_divergence=ctx.on_divergence,
                    stats=stats,
                    env_seed=ctx.env_seed,
                )
                if runner is None:
                    fresh += 1
                    continue
                trajectories.append(Trajectory(runner.episode, src, depth, runner))
                new_runners.append(runner)
                branches += 1
                depth_sum += depth
            if fresh:
                more = start_runners(
                    make_env, [task], fresh, env_seed=ctx.env_seed, keep_snapshots=True, groups=[g]
                )
                trajectories.extend(Trajectory(r.episode, runner=r) for r in more)
                new_runners.extend(more)
                extra_roots += fresh
        run(new_runners)

    forest, _ = trajectories_to_forest(trajectories)
    if likelihood and forest.num_rows:
        ep = forest.episodes()
        target = forest.episode_values_to_rows(ep.success.to(torch.float64))
        weight = segment_count(ep.rows, forest.num_rows)
        state.update(node_features(forest, max_turns), target, weight)
    stats["rollout/tree_roots"] = float(n_root + extra_roots / max(1, len(tasks)))
    stats["rollout/tree_branches"] = float(branches)
    stats["rollout/tree_branch_depth"] = depth_sum / max(1, branches)
    return RolloutResult(
        forest=forest,
        episodes=[tr.episode for tr in trajectories],
        env_steps=totals[0],
        generated_tokens=totals[1],
        seconds=time.perf_counter() - start,
        stats=stats,
        trajectories=trajectories,
    )
