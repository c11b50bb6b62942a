"""The rollout forest: every sampler's output, every estimator's input.

A row is one step (one turn: an action taken in a state). Rows are linked by ``parent``
pointers: a linear episode is a chain, a tree branch shares its prefix rows with its
siblings, and a group (GRPO's G rollouts of one task) is a set of roots with the same
``group`` id. Episodes are root-to-leaf paths.

Columns are 1-D tensors of length ``num_rows``:

============  ======  ==============================================================
column        dtype   meaning
============  ======  ==============================================================
group         int64   task instance the row belongs to (GRPO's prompt group)
parent        int64   row index of the previous step on this path, −1 for a first step
t             int64   depth (turn index)
state         int64   hashed canonical state in which the action was taken
next_state    int64   hashed state the action led to
reward        float32 immediate reward of this step
terminal      bool    the episode ended after this step (env said done)
source        int8    0 = policy, 1 = oracle, 2 = resample (see :data:`SOURCES`)
valid         bool    the env could parse and execute the action
success       bool    on a leaf row: its episode succeeded (False on inner rows)
============  ======  ==============================================================

Beside the columns, per-row token data (``prompt_ids``, ``response_ids``,
``old_logprobs``: the sampler's log-probs of the response tokens), the raw observation and
action texts, and ``extras``: optional named per-row tensors that samplers may add
(e.g. ``progress``) and estimators may read, ``token_extras``: optional named per-row
tensors aligned with the response tokens (e.g. KLPO's auxiliary token ids), and
``texts``: optional named per-row strings (the goal shown, a teacher's privileged text;
recorded only when a teacher asks for them, see ``SamplerContext.texts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.data.batch import TokenBatch
from credo.data.episode import Episode, Step
from credo.data.ops import hash_key, segment_mean

__all__ = ["SOURCES", "EpisodeIndex", "ForestBuilder", "RolloutForest"]

#: Names of the ``source`` codes. Oracle rows never get policy-gradient loss.
SOURCES: tuple[str, ...] = ("policy", "oracle", "resample")

_COLUMNS = (
    "group",
    "parent",
    "t",
    "state",
    "next_state",
    "reward",
    "terminal",
    "source",
    "valid",
    "success",
)


@dataclass(frozen=True)
class EpisodeIndex:
    """Root-to-leaf paths of a forest in CSR form.

    Attributes:
        leaf: ``[E]`` row index of each episode's last step.
        rows: ``[sum of lengths]`` row indices of all paths, each root → leaf, concatenated.
        ptr: ``[E+1]`` offsets: episode ``e`` is ``rows[ptr[e]:ptr[e+1]]``.
        episode_of: ``[sum of lengths]`` episode id of each entry of ``rows``.
        group: ``[E]`` group of each episode.
        ret: ``[E]`` float64, R = sum of rewards along the path (undiscounted).
        length: ``[E]`` number of steps.
        success: ``[E]`` bool.
    """

    leaf: torch.Tensor
    rows: torch.Tensor
    ptr: torch.Tensor
    episode_of: torch.Tensor
    group: torch.Tensor
    ret: torch.Tensor
    length: torch.Tensor
    success: torch.Tensor

    @property
    def num_episodes(self) -> int:
        return int(self.leaf.numel())

    def path(self, e: int) -> torch.Tensor:
        """Row indices of episode ``e``, root first."""
        return self.rows[self.ptr[e] : self.ptr[e + 1]]


@dataclass
class RolloutForest:
    """Columnar store of steps linked by parent pointers (see the module docstring)."""

    group: torch.Tensor
    parent: torch.Tensor
    t: torch.Tensor
    state: torch.Tensor
    next_state: torch.Tensor
    reward: torch.Tensor
    terminal: torch.Tensor
    source: torch.Tensor
    valid: torch.Tensor
    success: torch.Tensor
    prompt_ids: list[torch.Tensor] = field(default_factory=list)
    response_ids: list[torch.Tensor] = field(default_factory=list)
    old_logprobs: list[torch.Tensor] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    token_extras: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    _episodes: EpisodeIndex | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ basics
    def __post_init__(self) -> None:
        n = self.group.numel()
        for name in _COLUMNS:
            col = getattr(self, name)
            if col.dim() != 1 or col.numel() != n:
                raise ValueError(
                    f"column {name!r} must be 1-D with {n} rows, got shape {tuple(col.shape)}"
                )
        for name in ("prompt_ids", "response_ids", "old_logprobs", "observations", "actions"):
            lst = getattr(self, name)
            if lst and len(lst) != n:
                raise ValueError(f"{name} has {len(lst)} entries for {n} rows")
        for name, lst in self.token_extras.items():
            if len(lst) != n:
                raise ValueError(f"token extra {name!r} has {len(lst)} rows, expected {n}")
        for name, lst in self.texts.items():
            if len(lst) != n:
                raise ValueError(f"text column {name!r} has {len(lst)} rows, expected {n}")
        for name, col in self.extras.items():
            if col.shape[0] != n:
                raise ValueError(f"extra column {name!r} has {col.shape[0]} rows, expected {n}")
        if n and bool((self.parent >= torch.arange(n)).any()):
            raise ValueError("every parent must come before its child (parent[i] < i)")

    @property
    def num_rows(self) -> int:
        return int(self.group.numel())

    def __len__(self) -> int:
        return self.num_rows

    def with_rewards(self, reward: torch.Tensor) -> RolloutForest:
        """The same forest with other per-row rewards (e.g. a KL penalty or a teacher's
        dense reward subtracted before credit assignment); episode returns are
        recomputed from them.

        Args:
            reward: ``[N]`` one reward per row.
        """
        if reward.shape != self.reward.shape:
            raise ValueError(
                f"with_rewards: expected {tuple(self.reward.shape)} rewards, got "
                f"{tuple(reward.shape)}"
            )
        return dataclasses.replace(self, reward=reward, _episodes=None)

    @property
    def has_tokens(self) -> bool:
        return len(self.response_ids) == self.num_rows and self.num_rows > 0

    @classmethod
    def from_columns(cls, **kwargs: Any) -> RolloutForest:
        """Build from plain sequences; missing columns get defaults.

        Required: ``group`` and ``parent``. Defaults: ``t`` from the parent chain,
        ``state``/``next_state`` 0, ``reward`` 0, ``terminal`` = leaf, ``source`` policy,
        ``valid`` True, ``success`` False. Handy for tests and hand-worked examples.
        """
        group = torch.as_tensor(kwargs.pop("group"), dtype=torch.long)
        parent = torch.as_tensor(kwargs.pop("parent"), dtype=torch.long)
        n = group.numel()

        def col(name: str, dtype: torch.dtype, default: Any) -> torch.Tensor:
            if name in kwargs and kwargs[name] is not None:
                return torch.as_tensor(kwargs.pop(name), dtype=dtype).reshape(n)
            kwargs.pop(name, None)
            return torch.full((n,), default, dtype=dtype)

        if "t" in kwargs and kwargs["t"] is not None:
            t = torch.as_tensor(kwargs.pop("t"), dtype=torch.long)
        else:
            kwargs.pop("t", None)
            t = torch.zeros(n, dtype=torch.long)
            for i in range(n):
                t[i] = 0 if parent[i] < 0 else t[parent[i]] + 1
        has_child = torch.zeros(n, dtype=torch.bool)
        if n:
            has_child[parent[parent >= 0]] = True
        terminal = kwargs.pop("terminal", None)
        terminal = ~has_child if terminal is None else torch.as_tensor(terminal, dtype=torch.bool)
        forest = cls(
            group=group,
            parent=parent,
            t=t,
            state=col("state", torch.long, 0),
            next_state=col("next_state", torch.long, 0),
            reward=col("reward", torch.float32, 0.0),
            terminal=terminal,
            source=col("source", torch.int8, 0),
            valid=col("valid", torch.bool, True),
            success=col("success", torch.bool, False),
            prompt_ids=kwargs.pop("prompt_ids", []) or [],
            response_ids=kwargs.pop("response_ids", []) or [],
            old_logprobs=kwargs.pop("old_logprobs", []) or [],
            observations=kwargs.pop("observations", []) or [],
            actions=kwargs.pop("actions", []) or [],
            extras={k: torch.as_tensor(v) for k, v in (kwargs.pop("extras", {}) or {}).items()},
        )
        if kwargs:
            raise TypeError(f"unknown forest columns: {sorted(kwargs)}; known: {list(_COLUMNS)}")
        return forest

    # ------------------------------------------------------------- structure
    def is_leaf(self) -> torch.Tensor:
        """``[N]`` bool: rows that no other row names as parent."""
        has_child = torch.zeros(self.num_rows, dtype=torch.bool)
        has_child[self.parent[self.parent >= 0]] = True
        return ~has_child

    def num_children(self) -> torch.Tensor:
        """``[N]`` int64: number of rows whose parent is this row."""
        out = torch.zeros(self.num_rows, dtype=torch.long)
        p = self.parent[self.parent >= 0]
        return out.index_add_(0, p, torch.ones_like(p))

    def is_linear(self) -> bool:
        """True when no row has more than one child (every episode is its own chain)."""
        return bool((self.num_children() <= 1).all())

    def episodes(self) -> EpisodeIndex:
        """Root-to-leaf paths (cached). Vectorised: one pass per depth level."""
        if self._episodes is not None:
            return self._episodes
        n = self.num_rows
        leaf = torch.nonzero(self.is_leaf(), as_tuple=False).flatten()
        length = self.t[leaf] + 1 if n else torch.zeros(0, dtype=torch.long)
        e = leaf.numel()
        ptr = torch.zeros(e + 1, dtype=torch.long)
        if e:
            ptr[1:] = torch.cumsum(length, 0)
        total = int(ptr[-1].item()) if e else 0
        rows = torch.empty(total, dtype=torch.long)
        episode_of = torch.repeat_interleave(torch.arange(e), length) if e else rows.clone()
        # Walk up from every leaf at once, writing each path from its end.
        cur = leaf.clone()
        pos = ptr[1:] - 1 if e else ptr[:0]
        alive = torch.ones(e, dtype=torch.bool)
        while bool(alive.any()):
            rows[pos[alive]] = cur[alive]
            nxt = torch.where(alive, self.parent[cur.clamp(min=0)], torch.full_like(cur, -1))
            alive = nxt >= 0
            cur = nxt
            pos = pos - 1
        ret = torch.zeros(e, dtype=torch.float64)
        if e:
            ret.index_add_(0, episode_of, self.reward[rows].to(torch.float64))
        self._episodes = EpisodeIndex(
            leaf=leaf,
            rows=rows,
            ptr=ptr,
            episode_of=episode_of,
            group=self.group[leaf] if e else torch.zeros(0, dtype=torch.long),
            ret=ret,
            length=length,
            success=self.success[leaf] if e else torch.zeros(0, dtype=torch.bool),
        )
        return self._episodes

    def row_episode(self) -> torch.Tensor:
        """``[N]`` the lowest-index episode that passes through each row.

        For a linear forest this is *the* episode of each row. In a tree, a shared prefix
        row belongs to several episodes; it is attributed to the first one (used for
        loss aggregation, where each row must count once).
        """
        ep = self.episodes()
        out = torch.full((self.num_rows,), ep.num_episodes, dtype=torch.long)
        return out.scatter_reduce_(0, ep.rows, ep.episode_of, reduce="amin", include_self=True)

    def episode_values_to_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Broadcast per-episode ``values [E]`` to rows ``[N]``.

        A row shared by several episodes (a tree prefix) gets the mean over them; for a
        linear forest this is a plain broadcast.
        """
        ep = self.episodes()
        return segment_mean(values.to(torch.float64)[ep.episode_of], ep.rows, self.num_rows)

    def discounted_returns(self, gamma: float) -> torch.Tensor:
        """``[N]`` float64 return-to-go G_t = r_t + γ · mean_{children c} G_c.

        On a chain this is Σ_{k≥t} γ^{k−t} r_k. On a tree the children's returns are
        averaged (the Monte-Carlo value of the subtree below the action).
        """
        g = self.reward.to(torch.float64).clone()
        if self.num_rows == 0:
            return g
        child_sum = torch.zeros_like(g)
        nchild = self.num_children().to(torch.float64)
        for depth in range(int(self.t.max().item()), 0, -1):
            rows = torch.nonzero(self.t == depth, as_tuple=False).flatten()
            if rows.numel() == 0:
                continue
            # rows at this depth are final now: add γ·mean(child) to them first
            done = nchild[rows] > 0
            g[rows[done]] += gamma * child_sum[rows[done]] / nchild[rows[done]]
            child_sum.index_add_(0, self.parent[rows], g[rows])
        roots = torch.nonzero(self.t == 0, as_tuple=False).flatten()
        has = nchild[roots] > 0
        g[roots[has]] += gamma * child_sum[roots[has]] / nchild[roots[has]]
        return g

    # ------------------------------------------------------------ conversion
    def select(self, rows: torch.Tensor) -> RolloutForest:
        """Sub-forest of ``rows`` (sorted; must be closed under ``parent``)."""
        rows = torch.as_tensor(rows, dtype=torch.long).sort().values
        remap = torch.full((self.num_rows,), -1, dtype=torch.long)
        remap[rows] = torch.arange(rows.numel())
        par = self.parent[rows]
        new_par = torch.where(par >= 0, remap[par.clamp(min=0)], par)
        if bool(((par >= 0) & (new_par < 0)).any()):
            raise ValueError("select(): the rows must include every parent of a selected row")
        idx = rows.tolist()

        def pick(lst: list) -> list:
            return [lst[i] for i in idx] if lst else []

        return RolloutForest(
            group=self.group[rows],
            parent=new_par,
            t=self.t[rows],
            state=self.state[rows],
            next_state=self.next_state[rows],
            reward=self.reward[rows],
            terminal=self.terminal[rows],
            source=self.source[rows],
            valid=self.valid[rows],
            success=self.success[rows],
            prompt_ids=pick(self.prompt_ids),
            response_ids=pick(self.response_ids),
            old_logprobs=pick(self.old_logprobs),
            observations=pick(self.observations),
            actions=pick(self.actions),
            extras={k: v[rows] for k, v in self.extras.items()},
            token_extras={k: pick(v) for k, v in self.token_extras.items()},
            texts={k: pick(v) for k, v in self.texts.items()},
        )

    @classmethod
    def concat(cls, forests: Sequence[RolloutForest]) -> RolloutForest:
        """Stack forests; parent pointers are shifted, group ids kept as they are."""
        forests = [f for f in forests if f.num_rows]
        if not forests:
            return cls.from_columns(group=[], parent=[])
        offsets = [0]
        for f in forests[:-1]:
            offsets.append(offsets[-1] + f.num_rows)
        parent = torch.cat(
            [torch.where(f.parent >= 0, f.parent + o, f.parent) for f, o in zip(forests, offsets)]
        )

        def cat(name: str) -> torch.Tensor:
            return torch.cat([getattr(f, name) for f in forests])

        def join(name: str) -> list:
            if all(len(getattr(f, name)) == f.num_rows for f in forests):
                return [x for f in forests for x in getattr(f, name)]
            return []

        extra_names = set.intersection(*(set(f.extras) for f in forests))
        token_names = set.intersection(*(set(f.token_extras) for f in forests))
        text_names = set.intersection(*(set(f.texts) for f in forests))
        return cls(
            group=cat("group"),
            parent=parent,
            t=cat("t"),
            state=cat("state"),
            next_state=cat("next_state"),
            reward=cat("reward"),
            terminal=cat("terminal"),
            source=cat("source"),
            valid=cat("valid"),
            success=cat("success"),
            prompt_ids=join("prompt_ids"),
            response_ids=join("response_ids"),
            old_logprobs=join("old_logprobs"),
            observations=join("observations"),
            actions=join("actions"),
            extras={k: torch.cat([f.extras[k] for f in forests]) for k in sorted(extra_names)},
            token_extras={
                k: [x for f in forests for x in f.token_extras[k]] for k in sorted(token_names)
            },
            texts={k: [x for f in forests for x in f.texts[k]] for k in sorted(text_names)},
        )

    @classmethod
    def from_episodes(cls, episodes: Iterable[Episode]) -> RolloutForest:
        """One chain per episode (no sharing). Inverse of :meth:`to_episodes` for chains."""
        builder = ForestBuilder()
        for episode in episodes:
            parent = -1
            for step in episode.steps:
                parent = builder.add(episode.group, parent, step)
            if parent >= 0:
                builder.mark_success(parent, episode.success)
        return builder.build()

    def to_episodes(self) -> list[Episode]:
        """One :class:`Episode` per root-to-leaf path (shared prefix steps are copied)."""
        ep = self.episodes()
        out = []
        for e in range(ep.num_episodes):
            steps = [self.step(int(i)) for i in ep.path(e)]
            out.append(Episode(group=int(ep.group[e]), steps=steps, success=bool(ep.success[e])))
        return out

    def step(self, i: int) -> Step:
        """Row ``i`` as a :class:`Step` (state keys come back as their int64 hashes)."""
        return Step(
            observation=self.observations[i] if self.observations else "",
            action=self.actions[i] if self.actions else "",
            reward=float(self.reward[i]),
            terminal=bool(self.terminal[i]),
            valid=bool(self.valid[i]),
            state=int(self.state[i]),
            next_state=int(self.next_state[i]),
            source=SOURCES[int(self.source[i])],
            prompt_ids=self.prompt_ids[i].tolist() if self.prompt_ids else [],
            response_ids=self.response_ids[i].tolist() if self.response_ids else [],
            logprobs=self.old_logprobs[i].tolist() if self.old_logprobs else [],
            token_data={k: v[i] for k, v in self.token_extras.items()},
            texts={k: v[i] for k, v in self.texts.items()},
        )

    def to_batch(
        self,
        advantages: torch.Tensor,
        *,
        rows: torch.Tensor | None = None,
        pad_id: int = 0,
    ) -> TokenBatch:
        """Right-padded token batch for the loss.

        Args:
            advantages: ``[N]`` one advantage per row, broadcast to the row's response
                tokens.
            rows: optional subset of row indices (default: every row with tokens and a
                non-oracle source is *not* filtered — callers choose; oracle rows get a
                zero ``pg_mask`` so they never receive policy-gradient loss).
            pad_id: token id used for padding.
        """
        if not self.has_tokens:
            raise ValueError("this forest has no token data (prompt_ids/response_ids are empty)")
        if rows is None:
            rows = torch.arange(self.num_rows)
        rows = torch.as_tensor(rows, dtype=torch.long)
        idx = rows.tolist()
        lengths = [self.prompt_ids[i].numel() + self.response_ids[i].numel() for i in idx]
        width = max(lengths) if lengths else 0
        b = len(idx)
        input_ids = torch.full((b, width), pad_id, dtype=torch.long)
        attention = torch.zeros((b, width), dtype=torch.bool)
        response = torch.zeros((b, width), dtype=torch.bool)
        old_lp = torch.zeros((b, width), dtype=torch.float32)
        adv = torch.zeros((b, width), dtype=torch.float32)
        tok_extra = {}
        for name, lst in self.token_extras.items():
            sample = next((x for x in lst if x.numel()), None)
            if sample is None:
                continue
            tok_extra[name] = torch.zeros((b, width, *sample.shape[1:]), dtype=sample.dtype)
        for j, i in enumerate(idx):
            p, r = self.prompt_ids[i], self.response_ids[i]
            lp, lr = p.numel(), r.numel()
            input_ids[j, :lp] = p
            input_ids[j, lp : lp + lr] = r
            attention[j, : lp + lr] = True
            response[j, lp : lp + lr] = True
            if lr:
                old_lp[j, lp : lp + lr] = self.old_logprobs[i].to(torch.float32)
            adv[j, lp : lp + lr] = float(advantages[i])
            for name, out in tok_extra.items():
                x = self.token_extras[name][i]
                if x.numel():
                    out[j, lp : lp + x.shape[0]] = x
        episode = self.row_episode()[rows]
        return TokenBatch(
            input_ids=input_ids,
            attention_mask=attention,
            response_mask=response,
            old_logprobs=old_lp,
            advantages=adv,
            row=rows,
            episode=episode,
            turn=self.t[rows],
            group=self.group[rows],
            pg_mask=(self.source[rows] != SOURCES.index("oracle")),
            token_extras=tok_extra,
        )


class ForestBuilder:
    """Append-only builder used by samplers: ``add`` a step under a parent row."""

    def __init__(self) -> None:
        self._cols: dict[str, list] = {name: [] for name in _COLUMNS}
        self._prompt: list[torch.Tensor] = []
        self._response: list[torch.Tensor] = []
        self._logprobs: list[torch.Tensor] = []
        self._obs: list[str] = []
        self._act: list[str] = []
        self._extras: dict[str, list[float]] = {}
        self._token: dict[str, list[torch.Tensor]] = {}
        self._texts: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self._cols["group"])

    def add(self, group: int, parent: int, step: Step, **extras: float | int) -> int:
        """Append ``step`` as a child of row ``parent`` (−1 for a root); returns its row.

        ``extras`` become per-row extra columns (int values → int64, floats → float32;
        rows that do not set a column get 0).
        """
        n = len(self)
        if parent >= n:
            raise ValueError(f"parent {parent} does not exist yet (rows: {n})")
        c = self._cols
        c["group"].append(group)
        c["parent"].append(parent)
        c["t"].append(0 if parent < 0 else c["t"][parent] + 1)
        c["state"].append(_as_key(step.state))
        c["next_state"].append(_as_key(step.next_state))
        c["reward"].append(step.reward)
        c["terminal"].append(step.terminal)
        c["source"].append(SOURCES.index(step.source))
        c["valid"].append(step.valid)
        c["success"].append(False)
        self._prompt.append(torch.as_tensor(step.prompt_ids, dtype=torch.long))
        self._response.append(torch.as_tensor(step.response_ids, dtype=torch.long))
        self._logprobs.append(torch.as_tensor(step.logprobs, dtype=torch.float32))
        self._obs.append(step.observation)
        self._act.append(step.action)
        for k, v in step.token_data.items():
            self._token.setdefault(k, [torch.zeros(0)] * n).append(torch.as_tensor(v))
        for lst in self._token.values():
            if len(lst) < n + 1:
                lst.append(torch.zeros(0))
        for k, text in step.texts.items():
            self._texts.setdefault(k, [""] * n).append(str(text))
        for texts in self._texts.values():
            if len(texts) < n + 1:
                texts.append("")
        for k, v in extras.items():
            self._extras.setdefault(k, [0] * n).append(v)
        for lst in self._extras.values():
            if len(lst) < n + 1:
                lst.append(0)
        return n

    def mark_success(self, row: int, success: bool) -> None:
        """Record the outcome of the episode that ends at leaf ``row``."""
        self._cols["success"][row] = bool(success)

    def build(self) -> RolloutForest:
        c = self._cols
        return RolloutForest(
            group=torch.tensor(c["group"], dtype=torch.long),
            parent=torch.tensor(c["parent"], dtype=torch.long),
            t=torch.tensor(c["t"], dtype=torch.long),
            state=torch.tensor(c["state"], dtype=torch.long),
            next_state=torch.tensor(c["next_state"], dtype=torch.long),
            reward=torch.tensor(c["reward"], dtype=torch.float32),
            terminal=torch.tensor(c["terminal"], dtype=torch.bool),
            source=torch.tensor(c["source"], dtype=torch.int8),
            valid=torch.tensor(c["valid"], dtype=torch.bool),
            success=torch.tensor(c["success"], dtype=torch.bool),
            prompt_ids=self._prompt,
            response_ids=self._response,
            old_logprobs=self._logprobs,
            observations=self._obs,
            actions=self._act,
            extras={
                k: torch.tensor(v, dtype=torch.long)
                if all(isinstance(x, (int, bool)) for x in v)
                else torch.tensor(v, dtype=torch.float32)
                for k, v in self._extras.items()
            },
            token_extras=dict(self._token),
            texts=dict(self._texts),
        )


def _as_key(key: str | int) -> int:
    return key if isinstance(key, int) else hash_key(key)
