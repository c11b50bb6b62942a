"""Random rollout forests for the credit tests (hypothesis strategies) and forest shuffling.

- :func:`forests`: groups of linear or tree-shaped rollouts whose states come from a small
  alphabet, so states repeat within a group, paths merge and cycles appear; some
  episodes are truncated (a non-terminal leaf). Observation texts come with near-duplicate
  spellings so that similarity merging has something to merge.
- :func:`permute_forest`: the same forest with its rows in another order (parents still
  first), parent pointers and every per-row list remapped.
- :func:`random_topological_order`: such an order, interleaving groups and episodes.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from credo.data import RolloutForest

__all__ = ["TEXTS", "forests", "permute_forest", "random_topological_order", "relabel_groups"]

#: observation text of state key k: pairs of near-duplicates (similarity ≥ 0.9)
TEXTS = (
    "you are in the kitchen. a red key lies on the table",
    "you are in the kitchen. a red key lies on the table.",
    "you are in the hall. the door to the north is locked",
    "you are in the hall. the door to the north is locked!",
    "the cellar is dark and quiet",
    "the cellar is dark and quiet..",
    "an empty corridor",
    "a garden full of roses and a small fountain",
)


@st.composite
def forests(
    draw: st.DrawFn,
    *,
    max_groups: int = 3,
    max_episodes: int = 4,
    max_len: int = 5,
    num_states: int = 4,
    tree: bool | None = None,
    rewards: tuple[float, ...] = (0.0, 0.0, 0.5, 1.0, -1.0),
    tokens: bool = False,
) -> RolloutForest:
    """A random forest (see the module docstring).

    Args:
        max_groups / max_episodes / max_len: size limits (episodes per group, steps added
            per root or branch).
        num_states: size of the state alphabet per group (≤ len(TEXTS)).
        tree: True = branches may start from any non-terminal row, False = linear
            episodes only, None = hypothesis chooses.
        rewards: the rewards a step may get.
        tokens: add prompt/response token ids (random lengths) for token-length tests.
    """
    if tree is None:
        tree = draw(st.booleans())
    n_groups = draw(st.integers(1, max_groups))
    group_ids = draw(
        st.lists(st.integers(-50, 50), min_size=n_groups, max_size=n_groups, unique=True)
    )
    cols: dict[str, list] = {
        k: []
        for k in ("group", "parent", "state", "next_state", "reward", "terminal", "valid", "obs")
    }
    resp: list[torch.Tensor] = []
    state_st = st.integers(0, num_states - 1)
    for g in group_ids:
        first = len(cols["group"])
        start = draw(state_st)  # the task's initial state, shared by the group's roots
        for _ in range(draw(st.integers(1, max_episodes))):
            open_rows = [i for i in range(first, len(cols["group"])) if not cols["terminal"][i]]
            if tree and open_rows and draw(st.booleans()):
                parent = draw(st.sampled_from(open_rows))
                state = cols["next_state"][parent]
            else:
                parent, state = -1, start
            steps = draw(st.integers(1, max_len))
            for k in range(steps):
                nxt = draw(state_st)
                cols["group"].append(g)
                cols["parent"].append(parent)
                cols["state"].append(state)
                cols["next_state"].append(nxt)
                cols["reward"].append(draw(st.sampled_from(rewards)))
                cols["terminal"].append(k == steps - 1 and draw(st.integers(0, 3)) > 0)
                cols["valid"].append(draw(st.integers(0, 4)) > 0)
                cols["obs"].append(TEXTS[state % len(TEXTS)])
                if tokens:
                    resp.append(torch.arange(draw(st.integers(1, 6))))
                parent, state = len(cols["group"]) - 1, nxt
    n = len(cols["group"])
    return RolloutForest.from_columns(
        group=cols["group"],
        parent=cols["parent"],
        state=cols["state"],
        next_state=cols["next_state"],
        reward=cols["reward"],
        terminal=cols["terminal"],
        valid=cols["valid"],
        observations=cols["obs"],
        prompt_ids=[torch.zeros(2, dtype=torch.long)] * n if tokens else [],
        response_ids=resp,
        old_logprobs=[torch.zeros(r.numel()) for r in resp],
    )


def random_topological_order(forest: RolloutForest, seed: int) -> torch.Tensor:
    """A random order of the rows in which every parent precedes its children.

    Rows are sorted by (depth, random key): parents have smaller depth, and rows of
    different groups and episodes interleave freely.
    """
    gen = torch.Generator().manual_seed(seed)
    key = torch.rand(forest.num_rows, generator=gen)
    return torch.tensor(
        sorted(range(forest.num_rows), key=lambda i: (int(forest.t[i]), float(key[i]))),
        dtype=torch.long,
    )


def permute_forest(forest: RolloutForest, order: torch.Tensor) -> RolloutForest:
    """Row ``j`` of the result is row ``order[j]`` of ``forest`` (parents must come first)."""
    order = torch.as_tensor(order, dtype=torch.long)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    par = forest.parent[order]
    idx = order.tolist()

    def pick(lst: list) -> list:
        return [lst[i] for i in idx] if lst else []

    return RolloutForest(
        group=forest.group[order],
        parent=torch.where(par >= 0, inverse[par.clamp(min=0)], par),
        t=forest.t[order],
        state=forest.state[order],
        next_state=forest.next_state[order],
        reward=forest.reward[order],
        terminal=forest.terminal[order],
        source=forest.source[order],
        valid=forest.valid[order],
        success=forest.success[order],
        prompt_ids=pick(forest.prompt_ids),
        response_ids=pick(forest.response_ids),
        old_logprobs=pick(forest.old_logprobs),
        observations=pick(forest.observations),
        actions=pick(forest.actions),
        extras={k: v[order] for k, v in forest.extras.items()},
    )


def relabel_groups(forest: RolloutForest, offset: int) -> RolloutForest:
    """The same forest with ``offset`` added to every group id."""
    out = permute_forest(forest, torch.arange(forest.num_rows))
    out.group = out.group + offset
    return out
