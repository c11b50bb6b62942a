"""Hypothesis strategies and helpers for the ProAS / TSBPO / AXPO property tests."""

from __future__ import annotations

import random

import torch
from hypothesis import strategies as st

from credo.data import RolloutForest

ACTIONS = ("search[shoes]", "click[item 1]", "click[buy]", "look", "go to desk 1")


@st.composite
def forests(
    draw: st.DrawFn,
    *,
    min_rows: int = 0,
    max_rows: int = 14,
    max_groups: int = 3,
    num_states: int = 4,
    resample: bool = False,
    linear: bool = False,
    rewards: tuple[float, ...] = (0.0, 1.0, 0.5),
) -> RolloutForest:
    """Random forests: trees, chains and merges (states drawn from a small set).

    Rows are appended one at a time, each under a random earlier row of its group or as
    a new root, so ``parent[i] < i`` holds (``linear``: only under a row that has no
    child yet, so every episode is its own chain). Success is set on leaves only; with
    ``resample`` some rows get ``source = 2``. Action texts and abstract states are
    attached (the abstract state is the state modulo 3, so different states merge).
    """
    n = draw(st.integers(min_rows, max_rows))
    group: list[int] = []
    parent: list[int] = []
    for i in range(n):
        g = draw(st.integers(0, max_groups - 1))
        candidates = [-1] + [j for j in range(i) if group[j] == g and not (linear and j in parent)]
        group.append(g)
        parent.append(draw(st.sampled_from(candidates)))
    ints = st.integers(0, num_states - 1)
    state = draw(st.lists(ints, min_size=n, max_size=n))
    next_state = draw(st.lists(ints, min_size=n, max_size=n))
    reward = draw(st.lists(st.sampled_from(rewards), min_size=n, max_size=n))
    valid = draw(st.lists(st.sampled_from([True, True, False]), min_size=n, max_size=n))
    leaf = [True] * n
    for p in parent:
        if p >= 0:
            leaf[p] = False
    flips = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    success = [f and leaf[i] for i, f in enumerate(flips)]
    source = (
        draw(st.lists(st.sampled_from([0, 0, 2]), min_size=n, max_size=n)) if resample else None
    )
    actions = draw(st.lists(st.sampled_from(ACTIONS), min_size=n, max_size=n))
    return RolloutForest.from_columns(
        group=group,
        parent=parent,
        state=state,
        next_state=next_state,
        reward=reward,
        valid=valid,
        success=success,
        source=source,
        actions=actions,
        extras={
            "abstract_state": torch.tensor(state, dtype=torch.long) % 3,
            "abstract_next_state": torch.tensor(next_state, dtype=torch.long) % 3,
        },
    )


def topological_shuffle(forest: RolloutForest, rng: random.Random) -> torch.Tensor:
    """A random order of the rows in which every parent comes before its children.

    Returns ``order [N]``: ``order[k]`` is the old index of the new row ``k``.
    """
    parent = forest.parent.tolist()
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)
    ready = list(children.get(-1, []))
    order = []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(i)
        ready.extend(children.get(i, []))
    return torch.tensor(order, dtype=torch.long)


def reorder(forest: RolloutForest, order: torch.Tensor) -> RolloutForest:
    """The same forest with its rows in ``order`` (from :func:`topological_shuffle`)."""
    new_index = torch.empty_like(order)
    new_index[order] = torch.arange(order.numel())
    par = forest.parent[order]
    parent = torch.where(par >= 0, new_index[par.clamp(min=0)], par)
    idx = order.tolist()
    return RolloutForest.from_columns(
        group=forest.group[order],
        parent=parent,
        state=forest.state[order],
        next_state=forest.next_state[order],
        reward=forest.reward[order],
        terminal=forest.terminal[order],
        source=forest.source[order],
        valid=forest.valid[order],
        success=forest.success[order],
        actions=[forest.actions[i] for i in idx] if forest.actions else [],
        extras={k: v[order] for k, v in forest.extras.items()},
    )


def group_rows(forest: RolloutForest, g: int) -> torch.Tensor:
    return torch.nonzero(forest.group == g, as_tuple=False).flatten()
