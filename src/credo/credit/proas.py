"""ProAS: progress-aware advantage shaping over an online reference graph. [recon]

Paper: "ProAS: a progress-aware advantage-shaping framework for multi-turn agentic RL"
(title translated from the summary; Zhejiang University, Westlake University, Huawei
Noah's Ark Lab; known to credo only from a summary of the paper, no public text
found). The formulas below are credo's reconstruction from that summary
(``docs/algorithms.md#proas``).

A reference graph G over *abstract progress states* (a shop: search → results → item
page → options chosen → bought) is built from successful episodes and evolves online
(:class:`ProgressGraph`). For step t of an episode, with states s_t → s_{t+1}:

- reasonable_t = (s_t → s_{t+1}) is an edge of G (``match="edge"``), or additionally
  the step's action type was seen from s_t in successes (``match="edge_or_action"``);
- progress_t  = d_G(s_{t+1}) < d_G(s_t), d_G = BFS distance to the nearest goal node
  (∞ when unreachable or unknown; ∞ < ∞ is false).

The trajectory advantage A (GRPO, or Dr.GRPO with ``norm_by_std=False``) is shaped
asymmetrically, per episode of T steps:

- A > 0: unreasonable steps get 0 (``mask_positive``), the others A.
- A < 0: reasonable steps get 0 (``mask_negative``); with ``spare="progress"`` only the
  reasonable steps that also make progress (d_G falls) get 0, so valid steps that wander
  or back-track inside a failed episode keep their share of the penalty. The N_u
  unmasked steps share the penalty A·N_u by *Future-Drift*:
  drift_t = #{k ∈ t..T−1 : not progress_k},
  w_t = drift_t / Σ_{unmasked u} drift_u, A_t = A · N_u · w_t, so Σ_t A_t = A·N_u and
  early off-track actions get most of it. When no unmasked step has drift > 0 the
  penalty is spread uniformly (A_t = A). ``redistribute="suffix_length"`` uses
  drift_t = T − t instead; ``"none"`` keeps A_t = A on every unmasked step (mask only).
- A = 0: every step 0.

Ablation ``shaping="reward"`` shapes rewards instead of advantages [recon]: each step's
reward gets r_t + β·([progress_t] − [not reasonable_t]) (β = ``reward_coef``), and plain
GRPO runs on the shaped episode returns.

Early training [recon]: while G has fewer than ``min_graph_edges`` edges (at the start,
G is empty unless seeded), nothing would be "reasonable" and every positive advantage
would be masked, which stops learning. So shaping applies only once G has at least
``min_graph_edges`` edges; before that the result is plain GRPO (still updating G).

Online evolution [recon]: by default the steps of a batch are labelled with the graph
as it was *before* the batch, then the batch's successful episodes are merged into G
(``update_first=False``). With ``update_first=True`` the merge happens first, so every
step of a success in the batch is reasonable by construction (``mask_positive`` then
only touches self-loops, invalid actions and episodes that are not successes).

In a tree, a row shared by several episodes gets the mean of its per-episode values
(as :meth:`~credo.data.RolloutForest.episode_values_to_rows`).

The paper's ablations, as credo parameters:

==============================  ==========================================================
reward shaping                  ``shaping="reward"``
mask only                       ``redistribute="none"``
suffix-length weights           ``redistribute="suffix_length"``
G frozen                        ``frozen=True`` (on a seeded graph; an empty frozen graph
                                gives plain GRPO forever)
G pruned 40 %                   ``ProgressGraph(prune_frac=0.4)`` (state kwargs)
G seeded from demonstrations    the trainer calls :meth:`ProgressGraph.add_episodes`
G distilled from a teacher      the same with the teacher's episodes
G decayed                       ``ProgressGraph(decay=..., min_count=...)``
==============================  ==========================================================
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from credo.credit.grpo import episode_group_advantage
from credo.credit.registry import register_estimator
from credo.data import EpisodeIndex, RolloutForest
from credo.data.ops import compact_ids, hash_key, segment_mean, segment_sum

__all__ = [
    "ABSTRACTIONS",
    "ProgressGraph",
    "action_type",
    "generic_states",
    "proas",
    "progress_labels",
    "progress_states",
]

_SHAPINGS = ("advantage", "reward")
_REDISTRIBUTIONS = ("future_drift", "suffix_length", "none")
_MATCHES = ("edge", "edge_or_action")
_SPARES = ("reasonable", "progress")
_FORMAT = "credo.ProgressGraph/1"


def action_type(action: str) -> str:
    """The verb of an action text, lower-cased: the text before ``[``, first word.

    ``"search[red shoes]"`` → ``"search"``, ``"click[Buy Now]"`` → ``"click"``,
    ``"look"`` → ``"look"``, ``"go to cabinet 1"`` → ``"go"``, ``""`` → ``""``.
    """
    words = action.split("[", 1)[0].split()
    return words[0].lower() if words else ""


def generic_states(forest: RolloutForest) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s [N], s' [N])`` env-agnostic abstract states (``abstraction="generic"``).

    What any env gives: the state after a step is the verb (:func:`action_type`) of the
    last action the env accepted, i.e. the page or the tool result the observation
    shows (``search`` → results, ``click`` → an item page; ``list_orders`` → the orders);
    ``start`` before any. A step the env rejected leaves the state where it was. Nothing
    reads the goal: a step toward a wrong item moves as a step toward the right one, and
    only the graph of successful sessions tells them apart.
    """
    n = forest.num_rows
    if n and len(forest.actions) != n:
        raise ValueError("ProAS's generic states read the action texts (forest.actions): none")
    parent, valid = forest.parent.tolist(), forest.valid.tolist()
    after: list[str] = []
    s, s2 = torch.empty(n, dtype=torch.long), torch.empty(n, dtype=torch.long)
    for i in range(n):  # a row's parent is added before it (ForestBuilder)
        if parent[i] >= i:
            raise ValueError(f"row {i}'s parent {parent[i]} comes after it")
        before = "start" if parent[i] < 0 else after[parent[i]]
        after.append(action_type(forest.actions[i]) if valid[i] else before)
        s[i], s2[i] = hash_key(before), hash_key(after[i])
    return s, s2


#: Where ProAS's abstract states come from (``ProgressGraph(abstraction=...)``).
ABSTRACTIONS = ("env", "generic")


def progress_states(
    forest: RolloutForest, abstraction: str = "env"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s [N], s' [N])`` int64 abstract progress states of each row.

    ``abstraction="env"``: ``forest.extras["abstract_state"]`` /
    ``["abstract_next_state"]`` (the env's ``abstract_state_key()``, goal-relative on
    ``shop`` and ``tools``) when the sampler provides them (both or neither), else the
    ``state`` / ``next_state`` columns. ``"generic"``: :func:`generic_states`.
    """
    if abstraction == "generic":
        return generic_states(forest)
    if abstraction != "env":
        raise ValueError(f"abstraction must be one of {ABSTRACTIONS}, got {abstraction!r}")
    ex = forest.extras
    has_s, has_n = "abstract_state" in ex, "abstract_next_state" in ex
    if has_s != has_n:
        raise ValueError(
            "forest.extras must hold both 'abstract_state' and 'abstract_next_state' or "
            f"neither; got only {'abstract_state' if has_s else 'abstract_next_state'!r}"
        )
    if not has_s:
        return forest.state, forest.next_state
    s, n = ex["abstract_state"], ex["abstract_next_state"]
    for name, col in (("abstract_state", s), ("abstract_next_state", n)):
        if col.dtype.is_floating_point or col.dtype == torch.bool or col.dim() != 1:
            raise ValueError(
                f"forest.extras[{name!r}] must be a 1-D int64 tensor of hashed state keys, "
                f"got dtype {col.dtype} and shape {tuple(col.shape)}"
            )
    return s.to(torch.long), n.to(torch.long)


def _row_ids(table: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense ids of the rows of an int64 ``table [M, d]`` (lexicographic order)."""
    return compact_ids(*table.unbind(1))


def _merge(
    keys: torch.Tensor, counts: torch.Tensor, new_keys: torch.Tensor, new_counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Union of two keyed count tables (keys ``[K, d]``; rows unique and sorted after)."""
    all_keys = torch.cat([keys, new_keys])
    if all_keys.shape[0] == 0:
        return keys, counts
    ids, num = _row_ids(all_keys)
    first = torch.full((num,), all_keys.shape[0], dtype=torch.long)
    first.scatter_reduce_(0, ids, torch.arange(ids.numel()), reduce="amin")
    return all_keys[first], segment_sum(torch.cat([counts, new_counts]), ids, num)


def _member(keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``[Q]`` bool: which rows of ``query [Q, d]`` are rows of ``keys [K, d]``."""
    if keys.shape[0] == 0 or query.shape[0] == 0:
        return torch.zeros(query.shape[0], dtype=torch.bool)
    ids, num = _row_ids(torch.cat([keys, query]))
    present = torch.zeros(num, dtype=torch.bool)
    present[ids[: keys.shape[0]]] = True
    return present[ids[keys.shape[0] :]]


class ProgressGraph:
    """ProAS's reference graph G over abstract progress states (estimator state).

    Three count tables (float64 counts, so that they can decay):

    - edges: (s → s') transitions taken in successful episodes;
    - action edges: (s, action type) pairs taken in successful episodes
      (:func:`action_type` of ``forest.actions``; none when the forest has no texts);
    - goals: abstract next-states of the last rows of successful episodes.

    Only *valid* steps that *change* the abstract state are merged by default (an
    invalid action or a self-loop is never a reasonable move); see the knobs.

    The trainer builds one with ``ProgressGraph(**state_kwargs)``, may seed it with
    :meth:`add_episodes` (demonstrations, a teacher's episodes), passes it to
    :func:`proas` as ``state=`` and checkpoints :meth:`state_dict`.

    Args:
        decay: factor (0, 1] applied to every count at each :meth:`update` (online
            evolution) before the batch is merged. Default 1.0: no decay.
        min_count: after a decayed update, entries whose count fell below this are
            forgotten. Default 0.1 (an edge seen once survives 21 updates at decay 0.9).
        prune_frac: fraction [0, 1) of the *initial* graph's edges (and action edges)
            removed at random the first time :func:`proas` uses the graph (see
            :meth:`apply_initial_pruning`): the "G pruned 40 %" ablation is
            ``prune_frac=0.4`` on a graph seeded with :meth:`add_episodes`. Default 0.
        prune_seed: seed of that pruning. Default 0.
        include_self_loops: merge steps with s' = s too. Default False.
        include_invalid: merge steps whose action the env rejected too. Default False.
        abstraction: the abstract states (:func:`progress_states`): ``"env"`` (default,
            the env's ``abstract_state_key()``, goal-relative on ``shop`` and ``tools``)
            or ``"generic"`` (the verb of the last accepted action, no goal read:
            :func:`generic_states`, the paper's setting).
    """

    def __init__(
        self,
        *,
        decay: float = 1.0,
        min_count: float = 0.1,
        prune_frac: float = 0.0,
        prune_seed: int = 0,
        include_self_loops: bool = False,
        include_invalid: bool = False,
        abstraction: str = "env",
    ) -> None:
        if abstraction not in ABSTRACTIONS:
            raise ValueError(f"abstraction must be one of {ABSTRACTIONS}, got {abstraction!r}")
        self.abstraction = abstraction
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if min_count < 0.0:
            raise ValueError(f"min_count must be >= 0, got {min_count}")
        if not 0.0 <= prune_frac < 1.0:
            raise ValueError(f"prune_frac must be in [0, 1), got {prune_frac}")
        self.decay = float(decay)
        self.min_count = float(min_count)
        self.prune_frac = float(prune_frac)
        self.prune_seed = int(prune_seed)
        self.include_self_loops = bool(include_self_loops)
        self.include_invalid = bool(include_invalid)
        self.edge_keys = torch.zeros((0, 2), dtype=torch.long)  # [E, 2] (s, s'), sorted
        self.edge_count = torch.zeros(0, dtype=torch.float64)  # [E]
        self.action_keys = torch.zeros((0, 2), dtype=torch.long)  # [A, 2] (s, hash(type))
        self.action_count = torch.zeros(0, dtype=torch.float64)  # [A]
        self.goal_keys = torch.zeros((0, 1), dtype=torch.long)  # [G, 1]
        self.goal_count = torch.zeros(0, dtype=torch.float64)  # [G]
        self.type_names: dict[int, str] = {}  # hash(type) -> type
        self.num_updates = 0
        self.pruned = False
        self._dist: tuple[torch.Tensor, torch.Tensor] | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def num_edges(self) -> int:
        return int(self.edge_keys.shape[0])

    @property
    def num_action_edges(self) -> int:
        return int(self.action_keys.shape[0])

    @property
    def num_goals(self) -> int:
        return int(self.goal_keys.shape[0])

    def __repr__(self) -> str:
        return (
            f"ProgressGraph(edges={self.num_edges}, action_edges={self.num_action_edges}, "
            f"goals={self.num_goals}, updates={self.num_updates})"
        )

    # --------------------------------------------------------------- building
    def add_episodes(self, forest: RolloutForest, *, only_successful: bool = True) -> None:
        """Merge the transitions of ``forest``'s episodes (no decay).

        For seeding G from demonstrations or from a teacher's episodes. Each row on a
        merged root-to-leaf path counts once even if several merged episodes share it.

        Args:
            forest: the episodes (any forest).
            only_successful: merge only successful episodes (default). With False every
                episode's transitions are merged, but goals still come only from
                successful ones.
        """
        self._add(forest, only_successful=only_successful)

    def update(self, forest: RolloutForest) -> None:
        """One step of online evolution: decay, merge the successes of ``forest``, forget.

        Counts are multiplied by ``decay``, every successful episode's transitions are
        merged, then entries below ``min_count`` are dropped (only when ``decay < 1``).
        """
        if self.decay < 1.0:
            self.edge_count = self.edge_count * self.decay
            self.action_count = self.action_count * self.decay
            self.goal_count = self.goal_count * self.decay
        self._add(forest, only_successful=True)
        if self.decay < 1.0:
            self._keep(
                self.edge_count >= self.min_count,
                self.action_count >= self.min_count,
                self.goal_count >= self.min_count,
            )
        self.num_updates += 1

    def _add(self, forest: RolloutForest, *, only_successful: bool) -> None:
        n = forest.num_rows
        if n == 0:
            return
        s, s2 = progress_states(forest, self.abstraction)
        ep = forest.episodes()
        on_path = torch.zeros(n, dtype=torch.bool)
        chosen = (
            ep.success[ep.episode_of]
            if only_successful
            else torch.ones(ep.rows.numel(), dtype=torch.bool)
        )
        on_path[ep.rows[chosen]] = True
        take = on_path
        if not self.include_invalid:
            take &= forest.valid
        if not self.include_self_loops:
            take &= s != s2
        rows = torch.nonzero(take, as_tuple=False).flatten()
        ones = torch.ones(rows.numel(), dtype=torch.float64)
        self.edge_keys, self.edge_count = _merge(
            self.edge_keys, self.edge_count, torch.stack([s[rows], s2[rows]], 1), ones
        )
        if forest.actions:
            types = [action_type(forest.actions[i]) for i in rows.tolist()]
            hashes = [hash_key(x) for x in types]
            self.type_names.update(zip(hashes, types))
            new = torch.stack([s[rows], torch.tensor(hashes, dtype=torch.long).reshape(-1)], 1)
            self.action_keys, self.action_count = _merge(
                self.action_keys, self.action_count, new, ones
            )
        goal_rows = ep.leaf[ep.success]
        self.goal_keys, self.goal_count = _merge(
            self.goal_keys,
            self.goal_count,
            s2[goal_rows].reshape(-1, 1),
            torch.ones(goal_rows.numel(), dtype=torch.float64),
        )
        self._dist = None

    def _keep(self, edges: torch.Tensor, actions: torch.Tensor, goals: torch.Tensor) -> None:
        self.edge_keys, self.edge_count = self.edge_keys[edges], self.edge_count[edges]
        self.action_keys, self.action_count = self.action_keys[actions], self.action_count[actions]
        self.goal_keys, self.goal_count = self.goal_keys[goals], self.goal_count[goals]
        used = set(self.action_keys[:, 1].tolist())
        self.type_names = {h: t for h, t in self.type_names.items() if h in used}
        self._dist = None

    def prune(self, frac: float, seed: int = 0) -> None:
        """Remove ``round(frac · E)`` edges and ``round(frac · A)`` action edges at random.

        Deterministic for a seed: edges are drawn by ``torch.randperm`` with a generator
        seeded by ``seed`` over the sorted edge list. Goals are kept.

        Args:
            frac: fraction in [0, 1] of each table to remove.
            seed: random seed.
        """
        if not 0.0 <= frac <= 1.0:
            raise ValueError(f"prune fraction must be in [0, 1], got {frac}")
        gen = torch.Generator().manual_seed(int(seed))

        def keep_mask(size: int) -> torch.Tensor:
            drop = torch.randperm(size, generator=gen)[: round(frac * size)]
            mask = torch.ones(size, dtype=torch.bool)
            mask[drop] = False
            return mask

        edges = keep_mask(self.num_edges)
        actions = keep_mask(self.num_action_edges)
        self._keep(edges, actions, torch.ones(self.num_goals, dtype=torch.bool))

    def apply_initial_pruning(self) -> None:
        """Prune ``prune_frac`` of the graph once, the first time it is used (idempotent).

        :func:`proas` calls this before labelling; the trainer seeds G (if at all)
        before the first call, so the seeded graph is what gets pruned. An empty graph
        has nothing to prune; the ``pruned`` flag is set anyway (and checkpointed), so
        pruning never happens twice, e.g. after a resume. With ``prune_frac = 0``
        nothing happens.
        """
        if not self.pruned and self.prune_frac > 0.0:
            self.prune(self.prune_frac, self.prune_seed)
            self.pruned = True

    # ---------------------------------------------------------------- queries
    def has_edges(self, s: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        """``[N]`` bool: (s_i → s2_i) is an edge of G (``s``, ``s2``: ``[N]`` int64)."""
        return _member(self.edge_keys, torch.stack([s.long(), s2.long()], 1))

    def has_actions(self, s: torch.Tensor, types: list[str]) -> torch.Tensor:
        """``[N]`` bool: action type ``types[i]`` was taken from ``s[i]`` in successes."""
        hashes = torch.tensor([hash_key(x) for x in types], dtype=torch.long).reshape(-1)
        return _member(self.action_keys, torch.stack([s.long(), hashes], 1))

    def distance(self, keys: torch.Tensor) -> torch.Tensor:
        """``[N]`` float64 d_G(key) to the nearest goal (BFS over edges; ∞ if none)."""
        nodes, dist = self._distances()
        keys = keys.long()
        if nodes.numel() == 0:
            return torch.full(keys.shape, math.inf, dtype=torch.float64)
        idx = torch.searchsorted(nodes, keys).clamp(max=nodes.numel() - 1)
        return torch.where(nodes[idx] == keys, dist[idx], torch.full_like(dist[idx], math.inf))

    def _distances(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Sorted node keys ``[V]`` and their distances ``[V]`` (cached until G changes)."""
        if self._dist is not None:
            return self._dist
        nodes = torch.unique(torch.cat([self.edge_keys.flatten(), self.goal_keys.flatten()]))
        dist = torch.full((nodes.numel(),), math.inf, dtype=torch.float64)
        dist[torch.searchsorted(nodes, self.goal_keys.flatten().contiguous())] = 0.0
        src = torch.searchsorted(nodes, self.edge_keys[:, 0].contiguous())
        dst = torch.searchsorted(nodes, self.edge_keys[:, 1].contiguous())
        # Unit-weight Bellman-Ford from the goals backwards: after k sweeps every node
        # within k steps of a goal has its BFS distance; at most V sweeps.
        for _ in range(nodes.numel()):
            new = dist.scatter_reduce(0, src, dist[dst] + 1.0, reduce="amin", include_self=True)
            if torch.equal(new, dist):
                break
            dist = new
        self._dist = (nodes, dist)
        return self._dist

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable contents (counts, goals, flags; not the constructor knobs)."""
        return {
            "format": _FORMAT,
            "edges": [
                [a, b, c] for (a, b), c in zip(self.edge_keys.tolist(), self.edge_count.tolist())
            ],
            "action_edges": [
                [a, self.type_names[h], c]
                for (a, h), c in zip(self.action_keys.tolist(), self.action_count.tolist())
            ],
            "goals": [[g, c] for (g,), c in zip(self.goal_keys.tolist(), self.goal_count.tolist())],
            "num_updates": self.num_updates,
            "pruned": self.pruned,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (also after a JSON round trip)."""
        if state.get("format") != _FORMAT:
            raise ValueError(
                f"not a ProgressGraph state (format {state.get('format')!r}, expected {_FORMAT!r})"
            )

        def table(rows: list, width: int) -> tuple[torch.Tensor, torch.Tensor]:
            keys = torch.tensor([r[:width] for r in rows], dtype=torch.long).reshape(-1, width)
            counts = torch.tensor([float(r[width]) for r in rows], dtype=torch.float64)
            return _merge(keys[:0], counts[:0], keys, counts)

        self.edge_keys, self.edge_count = table(state["edges"], 2)
        names = {hash_key(str(r[1])): str(r[1]) for r in state["action_edges"]}
        self.type_names = names
        self.action_keys, self.action_count = table(
            [[r[0], hash_key(str(r[1])), r[2]] for r in state["action_edges"]], 2
        )
        self.goal_keys, self.goal_count = table(state["goals"], 1)
        self.num_updates = int(state["num_updates"])
        self.pruned = bool(state["pruned"])
        self._dist = None


def progress_labels(
    forest: RolloutForest, graph: ProgressGraph, *, match: str = "edge"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``(reasonable [N] bool, progress [N] bool)`` against ``graph``.

    Args:
        forest: the rows to label (abstract states from :func:`progress_states`).
        graph: the reference graph.
        match: ``"edge"`` (default): reasonable iff (s → s') is an edge of G;
            ``"edge_or_action"``: also when the row's action type was seen from s in
            successes (needs ``forest.actions``).
    """
    if match not in _MATCHES:
        raise ValueError(f"match must be one of {_MATCHES}, got {match!r}")
    s, s2 = progress_states(forest, graph.abstraction)
    reasonable = graph.has_edges(s, s2)
    if match == "edge_or_action" and forest.num_rows:
        if not forest.actions:
            raise ValueError("match='edge_or_action' needs the action texts (forest.actions)")
        reasonable |= graph.has_actions(s, [action_type(a) for a in forest.actions])
    progress = graph.distance(s2) < graph.distance(s)
    return reasonable, progress


def _suffix_count(flags: torch.Tensor, episode_of: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    """Per entry of a CSR path list: number of True ``flags`` from it to its path's end."""
    x = flags.to(torch.long)
    incl = torch.cumsum(x, 0)
    start = (incl - x)[ptr[:-1]]  # exclusive prefix at each path's first entry
    total = incl[ptr[1:] - 1] - start
    before = incl - x - start[episode_of]
    return total[episode_of] - before


@register_estimator("proas", state=ProgressGraph)
def proas(
    forest: RolloutForest,
    *,
    state: ProgressGraph | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    shaping: Literal["advantage", "reward"] = "advantage",
    mask_positive: bool = True,
    mask_negative: bool = True,
    redistribute: Literal["future_drift", "suffix_length", "none"] = "future_drift",
    match: Literal["edge", "edge_or_action"] = "edge",
    spare: Literal["reasonable", "progress"] = "reasonable",
    min_graph_edges: int = 1,
    reward_coef: float = 0.1,
    frozen: bool = False,
    update_first: bool = False,
) -> torch.Tensor:
    """ProAS advantages → ``[N]`` float32 (see the module docstring for the formulas).

    Args:
        forest: the rollouts (``[N]`` rows; abstract states from ``extras`` if present).
        state: the :class:`ProgressGraph` kept across iterations (the trainer passes
            it); ``None`` uses a fresh empty graph (so: plain GRPO for this call,
            unless ``update_first`` fills it with the batch's successes first).
        norm_by_std: base advantage GRPO (True, default) or Dr.GRPO (False).
        eps: added to the group std.
        shaping: ``"advantage"`` (default, ProAS) or ``"reward"`` (ablation: shaped
            step rewards, then plain GRPO).
        mask_positive: A > 0: unreasonable steps get 0. Default True.
        mask_negative: A < 0: reasonable steps get 0. Default True.
        redistribute: how the remaining negative advantage is spread over unmasked
            steps: ``"future_drift"`` (default), ``"suffix_length"`` or ``"none"``.
        match: ``"edge"`` (default) or ``"edge_or_action"``, see :func:`progress_labels`.
        spare: which steps of an episode with A < 0 ``mask_negative`` spares:
            ``"reasonable"`` (default, the paper's rule as reconstructed) or
            ``"progress"`` (reasonable *and* progress: a valid step that does not bring
            the state closer to a goal of G is penalised like an unreasonable one).
        min_graph_edges: shaping applies only when G has at least this many edges;
            below, plain GRPO. Default 1 (only an empty graph disables shaping).
        reward_coef: β of ``shaping="reward"``. Default 0.1.
        frozen: never merge this batch into G (the "G frozen" ablation). Default False.
        update_first: merge the batch's successes into G before labelling (default
            False: label with the graph from previous iterations, then merge).
    """
    if shaping not in _SHAPINGS:
        raise ValueError(f"shaping must be one of {_SHAPINGS}, got {shaping!r}")
    if redistribute not in _REDISTRIBUTIONS:
        raise ValueError(f"redistribute must be one of {_REDISTRIBUTIONS}, got {redistribute!r}")
    if match not in _MATCHES:
        raise ValueError(f"match must be one of {_MATCHES}, got {match!r}")
    if spare not in _SPARES:
        raise ValueError(f"spare must be one of {_SPARES}, got {spare!r}")
    if min_graph_edges < 0:
        raise ValueError(f"min_graph_edges must be >= 0, got {min_graph_edges}")
    if state is not None and not isinstance(state, ProgressGraph):
        raise TypeError(f"proas state must be a ProgressGraph, got {type(state).__name__}")
    graph = state if state is not None else ProgressGraph()
    graph.apply_initial_pruning()
    if update_first and not frozen:
        graph.update(forest)

    n = forest.num_rows
    ep = forest.episodes()
    active = n > 0 and graph.num_edges >= min_graph_edges
    if active:
        reasonable, progress = progress_labels(forest, graph, match=match)
    else:
        reasonable = torch.ones(n, dtype=torch.bool)
        progress = torch.zeros(n, dtype=torch.bool)

    if shaping == "reward" or not active:
        ret = ep.ret
        if active:
            bonus = reward_coef * (progress.double() - (~reasonable).double())
            ret = ret + segment_sum(bonus[ep.rows], ep.episode_of, ep.num_episodes)
        adv = episode_group_advantage(ret, ep.group, norm_by_std=norm_by_std, eps=eps)
        out = forest.episode_values_to_rows(adv)
    else:
        adv = episode_group_advantage(ep.ret, ep.group, norm_by_std=norm_by_std, eps=eps)
        spared = reasonable & progress if spare == "progress" else reasonable
        out = _shape(
            adv, ep, reasonable, spared, progress, mask_positive, mask_negative, redistribute, n
        )

    if not update_first and not frozen:
        graph.update(forest)
    return out.to(torch.float32)


def _shape(
    adv: torch.Tensor,
    ep: EpisodeIndex,
    reasonable: torch.Tensor,
    spared: torch.Tensor,
    progress: torch.Tensor,
    mask_positive: bool,
    mask_negative: bool,
    redistribute: str,
    n: int,
) -> torch.Tensor:
    """Asymmetric masking + redistribution per (episode, step) entry → row means ``[N]``.

    ``reasonable`` rows keep a positive advantage; ``spared`` rows lose a negative one.
    """
    e = ep.num_episodes
    eo = ep.episode_of
    a = adv[eo]  # [entries] the episode's advantage
    reas = reasonable[ep.rows]
    pos, neg = a > 0, a < 0
    masked = torch.zeros_like(reas)
    if mask_positive:
        masked |= pos & ~reas
    if mask_negative:
        masked |= neg & spared[ep.rows]
    unmasked = ~masked
    value = torch.where(unmasked, a, torch.zeros_like(a))
    if redistribute != "none":
        if redistribute == "future_drift":
            drift = _suffix_count(~progress[ep.rows], eo, ep.ptr).to(torch.float64)
        else:  # suffix_length: T − t
            position = torch.arange(eo.numel()) - ep.ptr[eo]
            drift = (ep.length[eo] - position).to(torch.float64)
        w = torch.where(unmasked, drift, torch.zeros_like(drift))
        total = segment_sum(w, eo, e)  # Σ_unmasked drift
        n_unmasked = segment_sum(unmasked.to(torch.float64), eo, e)
        share = a * n_unmasked[eo] * w / total[eo].clamp(min=1.0)
        drifting = neg & unmasked & (total[eo] > 0)
        value = torch.where(drifting, share, value)
    return segment_mean(value, ep.rows, n)
