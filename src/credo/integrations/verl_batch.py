"""A verl / verl-agent rollout batch as a :class:`~credo.data.RolloutForest`, and back.

verl (https://github.com/volcengine/verl) keeps one rollout *row* per batch entry: a
response of ``L`` token positions with ``token_level_rewards [B, L]`` and
``response_mask [B, L]``, plus per-row arrays in ``non_tensor_batch``. verl-agent
(https://github.com/langfengQ/verl-agent, the GiGPO code) trains multi-turn agents with
one row per *env step* and adds the columns GiGPO needs. The mapping below takes the
names of both (all per-row, length ``B``; only the first two are required):

==================  ===============================================================
argument            meaning (verl / verl-agent name)
==================  ===============================================================
token_level_rewards ``[B, L]`` float; a row's sum is its score (verl)
response_mask       ``[B, L]`` tokens of the response (verl)
index               group of the row: the prompt / task uid (verl's ``uid``)
traj_index          trajectory id (verl-agent's ``traj_uid``); rows of one trajectory
                    are its steps, in batch order unless ``step_index`` says otherwise.
                    Absent: every row is a one-step episode (plain verl).
parent              instead of ``traj_index``: the batch position of each row's
                    previous step (−1 for a first step), for tree rollouts whose
                    shared prefix rows appear once (TSBPO, AXPO)
step_index          turn number of each row within its trajectory (optional)
anchor_obs          the observation the action was taken in (verl-agent's
                    ``anchor_obs``): str, number, tuple or numpy array; equal values
                    are the same state (GiGPO's anchor state)
next_anchor_obs     the observation each step led to (optional; see below)
rewards             immediate env reward of each step (verl-agent's ``rewards``)
dones               the env said done after this step (optional)
success             the episode ending at this row succeeded (optional)
is_action_valid     the env could parse the action (verl-agent's name; optional)
source              ``policy``/``oracle``/``resample`` or 0/1/2 (optional; AXPO)
actions             action texts (optional; ProAS ``match="edge_or_action"``)
==================  ===============================================================

Rewards. With ``rewards`` given, those are the step rewards. Otherwise the row scores
``s_b = Σ_j token_level_rewards[b, j]`` are read by ``reward_layout``:

- ``"episode"`` (default, verl-agent): every step row of a trajectory carries the
  *episode* return; it must be the same on all of them, and becomes the reward of the
  trajectory's last step (outcome reward, 0 on earlier steps). A one-step episode (plain
  verl) is the same in both layouts.
- ``"step"``: each row's score is its own step's reward.

States. ``state`` = a stable hash of ``anchor_obs`` (0 for every row when absent).
``next_state`` = ``next_anchor_obs`` when given; otherwise the anchor of the row's child
(the next step) and, for the last step of a trajectory, a shared *success* key when the
episode succeeded and a key of its own otherwise, so that successful paths reach one
final node (GraphPO's in-edges, ProAS's goal) and failures do not merge. ``success``
defaults to "episode return > 0". ``terminal`` = ``dones`` when given, else "is a last
step".

Row order. The forest lists rows parents first (depth by depth, batch order within a
depth); ``order`` maps forest rows to batch positions, and
:func:`rows_to_token_advantages` scatters per-row advantages back to verl's token layout.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from credo.data import SOURCES, RolloutForest, hash_key

__all__ = [
    "REWARD_LAYOUTS",
    "VerlForest",
    "obs_key",
    "rows_to_token_advantages",
    "verl_batch_to_forest",
]

REWARD_LAYOUTS = ("episode", "step")
_SUCCESS_KEY = hash_key("credo:verl:success")


@dataclass(frozen=True)
class VerlForest:
    """A forest built from a verl batch.

    Attributes:
        forest: the rollouts, one row per batch row.
        order: ``[B]`` int64, ``order[i]`` = batch position of forest row ``i``.
    """

    forest: RolloutForest
    order: torch.Tensor


def obs_key(obs: Any) -> int:
    """Stable int64 key of an observation (str, bytes, number, tuple/list, numpy array).

    Equal observations give equal keys in every process (no salted ``hash``); a numpy
    array's key covers its dtype, shape and bytes.
    """
    return hash_key(_canonical(obs))


def _canonical(obs: Any) -> str:
    if isinstance(obs, str):
        return "s:" + obs
    if isinstance(obs, bytes):
        return "b:" + obs.hex()
    if isinstance(obs, np.ndarray):
        arr = np.ascontiguousarray(obs)
        return f"a:{arr.dtype.str}:{arr.shape}:{arr.tobytes().hex()}"
    if isinstance(obs, torch.Tensor):
        return _canonical(obs.detach().cpu().numpy())
    if isinstance(obs, (bool, np.bool_)):
        return f"t:{bool(obs)}"
    if isinstance(obs, (int, np.integer)):
        return f"i:{int(obs)}"
    if isinstance(obs, (float, np.floating)):
        return f"f:{float(obs)!r}"
    if isinstance(obs, (tuple, list)):
        return "l:[" + ",".join(_canonical(x) for x in obs) + "]"
    if obs is None:
        return "n:"
    raise TypeError(
        f"anchor_obs entries must be str, bytes, numbers, tuples/lists or arrays; got "
        f"{type(obs).__name__}"
    )


def _dense(values: Any, name: str, b: int) -> torch.Tensor:
    """Dense int64 ids of hashable per-row values, in order of first appearance."""
    seq = _as_list(values, name, b)
    ids: dict[Any, int] = {}
    out = []
    for v in seq:
        key = _hashable(v)
        if key not in ids:
            ids[key] = len(ids)
        out.append(ids[key])
    return torch.tensor(out, dtype=torch.long)


def _hashable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("a", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, torch.Tensor):
        return _hashable(v.detach().cpu().numpy())
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _as_list(values: Any, name: str, b: int) -> list:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().tolist()
    elif isinstance(values, np.ndarray):
        values = list(values)
    else:
        values = list(values)
    if len(values) != b:
        raise ValueError(f"{name} has {len(values)} entries; the batch has {b} rows")
    return values


def _floats(values: Any, name: str, b: int) -> torch.Tensor:
    seq = _as_list(values, name, b)
    try:
        out = torch.tensor([float(x) for x in seq], dtype=torch.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must hold one number per row: {exc}") from exc
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"{name} must be finite")
    return out


def _bools(values: Any, name: str, b: int) -> torch.Tensor:
    return torch.tensor([bool(x) for x in _as_list(values, name, b)], dtype=torch.bool)


def _sources(values: Any, b: int) -> torch.Tensor:
    out = []
    for x in _as_list(values, "source", b):
        if isinstance(x, str) and x in SOURCES:
            out.append(SOURCES.index(x))
        elif not isinstance(x, str) and int(x) in range(len(SOURCES)):
            out.append(int(x))
        else:
            raise ValueError(
                f"source entries must be one of {SOURCES} or 0..{len(SOURCES) - 1}, got {x!r}"
            )
    return torch.tensor(out, dtype=torch.int8)


def _chain_parents(traj: torch.Tensor, step: torch.Tensor | None) -> torch.Tensor:
    """Parent batch position of each row when rows of a trajectory form a chain."""
    b = traj.numel()
    parent = torch.full((b,), -1, dtype=torch.long)
    rows_of: dict[int, list[int]] = {}
    for i, tr in enumerate(traj.tolist()):
        rows_of.setdefault(tr, []).append(i)
    for tr, rows in rows_of.items():
        if step is not None:
            steps = [int(step[i]) for i in rows]
            if len(set(steps)) != len(steps):
                raise ValueError(f"step_index repeats a value within trajectory #{tr}")
            rows = [i for _, i in sorted(zip(steps, rows))]
        for prev, cur in itertools.pairwise(rows):
            parent[cur] = prev
    return parent


def _depths(parent: torch.Tensor) -> torch.Tensor:
    """Depth of each row under ``parent`` (batch positions); raises on cycles."""
    b = parent.numel()
    if bool(((parent < -1) | (parent >= b)).any()):
        raise ValueError(f"parent entries must be -1 or a batch position in [0, {b})")
    depth = torch.zeros(b, dtype=torch.long)
    cur = parent.clone()
    for _ in range(b + 1):
        alive = cur >= 0
        if not bool(alive.any()):
            return depth
        depth += alive.long()
        cur = torch.where(alive, parent[cur.clamp(min=0)], cur)
    raise ValueError("parent links form a cycle")


def verl_batch_to_forest(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Sequence[Any] | np.ndarray | None = None,
    traj_index: Sequence[Any] | np.ndarray | None = None,
    parent: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    step_index: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    anchor_obs: Sequence[Any] | np.ndarray | None = None,
    next_anchor_obs: Sequence[Any] | np.ndarray | None = None,
    rewards: Sequence[float] | np.ndarray | torch.Tensor | None = None,
    dones: Sequence[bool] | np.ndarray | torch.Tensor | None = None,
    success: Sequence[bool] | np.ndarray | torch.Tensor | None = None,
    is_action_valid: Sequence[bool] | np.ndarray | torch.Tensor | None = None,
    source: Sequence[Any] | np.ndarray | None = None,
    actions: Sequence[str] | np.ndarray | None = None,
    reward_layout: str = "episode",
) -> VerlForest:
    """Build the forest of a verl batch (see the module docstring for every argument).

    Args:
        token_level_rewards: ``[B, L]`` float.
        response_mask: ``[B, L]`` (bool or 0/1).
        index .. actions: per-row arrays of length ``B`` (numpy object arrays, lists or
            tensors), all optional; ``traj_index`` and ``parent`` are exclusive.
        reward_layout: ``"episode"`` (default) or ``"step"``; ignored with ``rewards``.

    Returns:
        :class:`VerlForest` ``(forest, order)``.
    """
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            "token_level_rewards and response_mask must both be [B, L]; got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    if reward_layout not in REWARD_LAYOUTS:
        raise ValueError(f"reward_layout must be one of {REWARD_LAYOUTS}, got {reward_layout!r}")
    if traj_index is not None and parent is not None:
        raise ValueError("give either traj_index (chains) or parent (trees), not both")
    b = int(token_level_rewards.shape[0])
    group = _dense(index, "index", b) if index is not None else torch.zeros(b, dtype=torch.long)
    step = None
    if step_index is not None:
        step = torch.tensor([int(x) for x in _as_list(step_index, "step_index", b)])
    if parent is not None:
        par = torch.tensor([int(x) for x in _as_list(parent, "parent", b)], dtype=torch.long)
    elif traj_index is not None:
        par = _chain_parents(_dense(traj_index, "traj_index", b), step)
    else:
        par = torch.full((b,), -1, dtype=torch.long)
    depth = _depths(par)
    has_par = par >= 0
    if bool((group[has_par] != group[par[has_par]]).any()):
        bad = int(torch.nonzero(has_par & (group != group[par.clamp(min=0)]))[0])
        raise ValueError(
            f"row {bad} and its previous step {int(par[bad])} have different index (group) "
            "values; every step of a trajectory must belong to one group"
        )

    # Order: parents first (by depth, then batch position).
    order = torch.argsort(depth * (b + 1) + torch.arange(b), stable=True)
    pos = torch.empty(b, dtype=torch.long)
    pos[order] = torch.arange(b)
    f_parent = torch.where(par[order] >= 0, pos[par[order].clamp(min=0)], -1)
    has_child = torch.zeros(b, dtype=torch.bool)  # batch positions
    has_child[par[has_par]] = True
    leaf = ~has_child

    score = token_level_rewards.detach().to(torch.float64).sum(-1)  # as verl: unmasked
    if rewards is not None:
        reward = _floats(rewards, "rewards", b)
    elif reward_layout == "step":
        reward = score.cpu()
    else:
        reward = _episode_layout_rewards(score.cpu(), par, leaf, parent is not None)

    # Episode returns (sum along each root-to-leaf path), for the default success.
    ret = reward.clone()
    for d in range(1, int(depth.max()) + 1 if b else 0):
        rows = torch.nonzero(depth == d).flatten()
        ret[rows] += ret[par[rows]]
    if success is not None:
        succ = _bools(success, "success", b) & leaf
    else:
        succ = (ret > 0) & leaf

    if anchor_obs is not None:
        obs_list = _as_list(anchor_obs, "anchor_obs", b)
        state = torch.tensor([obs_key(o) for o in obs_list], dtype=torch.long)
    else:
        obs_list = None
        state = torch.zeros(b, dtype=torch.long)
    if next_anchor_obs is not None:
        nxt = _as_list(next_anchor_obs, "next_anchor_obs", b)
        next_state = torch.tensor([obs_key(o) for o in nxt], dtype=torch.long)
    else:
        next_state = torch.tensor(
            [hash_key(f"credo:verl:end:{i}") for i in range(b)], dtype=torch.long
        )
        next_state[succ] = _SUCCESS_KEY
        next_state[par[has_par]] = state[has_par]
    terminal = _bools(dones, "dones", b) if dones is not None else leaf.clone()
    valid = (
        _bools(is_action_valid, "is_action_valid", b)
        if is_action_valid is not None
        else torch.ones(b, dtype=torch.bool)
    )
    src = _sources(source, b) if source is not None else torch.zeros(b, dtype=torch.int8)
    observations: list[str] = []
    if obs_list is not None and all(isinstance(o, str) for o in obs_list):
        observations = [obs_list[i] for i in order.tolist()]
    action_list: list[str] = []
    if actions is not None:
        acts = _as_list(actions, "actions", b)
        action_list = [str(acts[i]) for i in order.tolist()]

    forest = RolloutForest(
        group=group[order],
        parent=f_parent,
        t=depth[order],
        state=state[order],
        next_state=next_state[order],
        reward=reward[order].to(torch.float32),
        terminal=terminal[order],
        source=src[order],
        valid=valid[order],
        success=succ[order],
        observations=observations,
        actions=action_list,
    )
    return VerlForest(forest=forest, order=order)


def _episode_layout_rewards(
    score: torch.Tensor, par: torch.Tensor, leaf: torch.Tensor, tree: bool
) -> torch.Tensor:
    """Outcome rewards from per-row episode returns: R on each last step, 0 before."""
    if tree and bool((par >= 0).any()):
        raise ValueError(
            "reward_layout='episode' is ambiguous on a tree (a shared row belongs to "
            "several episodes): pass rewards= (the step rewards) or reward_layout='step'"
        )
    has_par = par >= 0
    ref, other = score[par[has_par]], score[has_par]
    tol = 1e-5 * torch.clamp(torch.maximum(ref.abs(), other.abs()), min=1.0)
    if bool(((ref - other).abs() > tol).any()):
        bad = int(torch.nonzero(has_par)[int(torch.nonzero((ref - other).abs() > tol)[0])])
        raise ValueError(
            f"reward_layout='episode' expects every step row of a trajectory to carry the "
            f"same episode return, but row {bad} has {float(score[bad])!r} and its previous "
            f"step {float(score[par[bad]])!r}; pass rewards= or reward_layout='step'"
        )
    return torch.where(leaf, score, torch.zeros_like(score))


def rows_to_token_advantages(
    row_values: torch.Tensor, order: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Scatter per-forest-row values back to verl's token layout.

    Args:
        row_values: ``[B]`` one value per forest row.
        order: ``[B]`` batch position of each forest row (:attr:`VerlForest.order`).
        response_mask: ``[B, L]``.

    Returns:
        ``[B, L]`` float32: each row's value on its response tokens, 0 elsewhere.
    """
    b = response_mask.shape[0]
    if row_values.shape != (b,) or order.shape != (b,):
        raise ValueError(
            f"row_values and order must be [B] = [{b}], got {tuple(row_values.shape)} and "
            f"{tuple(order.shape)}"
        )
    per_row = torch.zeros(b, dtype=torch.float32)
    per_row[order] = row_values.detach().to(torch.float32).cpu()
    per_row = per_row.to(response_mask.device)
    return per_row[:, None] * response_mask.to(torch.float32)
