"""The verl plugin's verl-free parts: batch → forest mapping, turn splitting, loss weights.

The parity checks against the real verl live in tests/verl (``make verl-check``).
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import torch

from credo.credit import compute_advantages
from credo.data import hash_key
from credo.integrations.verl_batch import obs_key, rows_to_token_advantages, verl_batch_to_forest
from credo.integrations.verl_loss import (
    credo_policy_loss,
    pack_turns,
    split_turns,
    verl_aggregation_weights,
)
from credo.objectives import LossInputs, get_loss


def test_import_guard_names_the_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verl", None)
    monkeypatch.delitem(sys.modules, "credo.integrations.verl", raising=False)
    with pytest.raises(ImportError) as info:
        importlib.import_module("credo.integrations.verl")
    msg = str(info.value)
    assert "needs verl" in msg and "pip install" in msg and "\n" not in msg


def _agent_batch() -> dict:
    """verl-agent layout: group u1 = trajectories A and B (2 steps each), group u2 =
    trajectory C (1 step); each trajectory's steps in batch order, trajectories interleaved.
    Every step row carries its episode return on its last response token."""
    # batch rows: 0 = B0, 1 = B1, 2 = A0, 3 = C0, 4 = A1
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    ret = [0.0, 0.0, 1.0, 1.0, 1.0]
    tlr = torch.zeros(5, 3)
    for b in range(5):
        tlr[b, int(mask[b].sum()) - 1] = ret[b]
    return {
        "token_level_rewards": tlr,
        "response_mask": mask,
        "index": np.array(["u1", "u1", "u1", "u2", "u1"], dtype=object),
        "traj_index": np.array(["B", "B", "A", "C", "A"], dtype=object),
        "anchor_obs": np.array(["s0", "s2", "s0", "s0", "s1"], dtype=object),
    }


def test_agent_layout_becomes_chains_with_outcome_rewards() -> None:
    vf = verl_batch_to_forest(**_agent_batch())
    f, order = vf.forest, vf.order
    # depth 0 first (batch order B0, A0, C0), then depth 1 (B1, A1)
    assert order.tolist() == [0, 2, 3, 1, 4]
    assert f.parent.tolist() == [-1, -1, -1, 0, 1]
    assert f.t.tolist() == [0, 0, 0, 1, 1]
    assert f.group.tolist() == [0, 0, 1, 0, 0]
    # "episode" layout: the return sits on each trajectory's last step
    assert f.reward.tolist() == [0.0, 0.0, 1.0, 0.0, 1.0]
    assert f.terminal.tolist() == [False, False, True, True, True]
    assert f.success.tolist() == [False, False, True, False, True]
    s = {k: obs_key(k) for k in ("s0", "s1", "s2")}
    assert f.state.tolist() == [s["s0"], s["s0"], s["s0"], s["s2"], s["s1"]]
    # next state: the child's anchor; last steps: the shared success key or their own key
    success_key = hash_key("credo:verl:success")
    end_b1 = hash_key("credo:verl:end:1")  # B1 is batch row 1
    assert f.next_state.tolist() == [s["s2"], s["s1"], success_key, end_b1, success_key]


def test_gigpo_through_the_mapping_matches_hand_numbers() -> None:
    # γ = 0.5. Episode term (mean over the group's step rows, mean_norm): A rows 1 − 0.5,
    # B rows 0 − 0.5; C alone in u2: μ = 0 → 1. Step returns: A0 = 0.5, A1 = 1, B0 = B1 = 0;
    # anchor s0 in u1 = {A0, B0}, mean 0.25 → ±0.25; s1, s2 and C0's s0 (other group) alone → 0.
    batch = _agent_batch()
    vf = verl_batch_to_forest(**batch)
    adv = compute_advantages("gigpo", vf.forest, {"gamma": 0.5})
    tok = rows_to_token_advantages(adv, vf.order, batch["response_mask"])
    expect = torch.tensor([-0.75, -0.5, 0.75, 1.0, 0.5])  # B0, B1, A0, C0, A1
    assert torch.allclose(tok, expect[:, None] * batch["response_mask"], atol=1e-6)


def test_step_rewards_and_step_layout() -> None:
    batch = _agent_batch()
    rewards = [0.5, 0.0, 0.0, 1.0, 1.0]  # B0, B1, A0, C0, A1
    f = verl_batch_to_forest(**batch, rewards=rewards).forest
    assert f.reward.tolist() == [0.5, 0.0, 1.0, 0.0, 1.0]
    # B's return is 0.5 > 0 now: B1 is a success too
    assert f.success.tolist() == [False, False, True, True, True]
    step = verl_batch_to_forest(**batch, reward_layout="step").forest
    assert step.reward.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]


def test_episode_layout_rejects_unequal_returns() -> None:
    batch = _agent_batch()
    batch["token_level_rewards"][4, 0] = 0.25  # A1 no longer carries A0's return
    with pytest.raises(ValueError, match=r"same episode return.*rewards= or reward_layout"):
        verl_batch_to_forest(**batch)


def test_single_turn_rows_are_one_step_episodes() -> None:
    tlr = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    mask = torch.ones(2, 2).repeat(2, 1)
    vf = verl_batch_to_forest(tlr, mask, index=[7, 7, 7, 9])
    assert vf.forest.parent.tolist() == [-1] * 4
    adv = compute_advantages("grpo", vf.forest)
    r = torch.tensor([1.0, 0.0, 1.0])
    z = (r - r.mean()) / (r.std() + 1e-6)
    assert torch.allclose(adv, torch.cat([z, torch.tensor([3.0])]), atol=1e-6)


def test_parent_links_and_step_index() -> None:
    tlr, mask = torch.zeros(4, 2), torch.ones(4, 2)
    # tree: row 2 is the root, rows 0 and 3 its children, row 1 under row 3
    f = verl_batch_to_forest(tlr, mask, parent=[2, 3, -1, 2], rewards=[1, 2, 0, 0]).forest
    assert f.parent.tolist() == [-1, 0, 0, 2]
    assert f.reward.tolist() == [0.0, 1.0, 0.0, 2.0]
    vf = verl_batch_to_forest(tlr, mask, traj_index=[0, 0, 0, 0], step_index=[2, 0, 3, 1])
    assert vf.order.tolist() == [1, 3, 0, 2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"traj_index": [0, 0, 1], "index": [0, 1, 1]}, "different index"),
        ({"parent": [1, 0, -1]}, "cycle"),
        ({"parent": [-1, 5, 0]}, "batch position"),
        ({"parent": [-1, 0, 0], "traj_index": [0, 0, 0]}, "not both"),
        ({"traj_index": [0, 0, 1], "step_index": [1, 1, 0]}, "repeats"),
        ({"index": [0, 1]}, "2 entries; the batch has 3"),
        ({"source": ["policy", "teacher", "oracle"]}, "source entries"),
        ({"parent": [-1, 0, 0]}, "ambiguous on a tree"),
        ({"reward_layout": "turn"}, "reward_layout must be"),
    ],
)
def test_bad_batches_raise_one_clear_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        verl_batch_to_forest(torch.zeros(3, 2), torch.ones(3, 2), **kwargs)


def test_obs_keys_are_stable_and_typed() -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert obs_key(a) == obs_key(a.copy())
    assert obs_key(a) != obs_key(a.reshape(3, 2))
    assert obs_key(a) != obs_key(a.astype(np.int64))
    assert obs_key("1") != obs_key(1)
    assert obs_key((1, "x")) == obs_key([1, "x"])
    with pytest.raises(TypeError, match="anchor_obs entries"):
        obs_key(object())


def test_split_turns_packs_each_run() -> None:
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    s = split_turns(mask)
    assert s.row.tolist() == [0, 0, 2]
    assert s.turn.tolist() == [0, 1, 0]
    assert s.valid.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    x = torch.arange(15.0).reshape(3, 5)
    assert pack_turns(x, s, fill=-1).tolist() == [
        [0, 1, -1, -1],
        [3, -1, -1, -1],
        [11, 12, 13, 14],
    ]


def test_verl_weights_hand_numbers() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    m = mask.float()
    # 4 tokens, 2 rows with tokens, width 4
    assert torch.allclose(verl_aggregation_weights(mask, "token-mean"), m / 4)
    assert torch.allclose(verl_aggregation_weights(mask, "token-sum"), m)
    assert torch.allclose(verl_aggregation_weights(mask, "seq-mean-token-sum"), m / 2)
    assert torch.allclose(verl_aggregation_weights(mask, "seq-mean-token-sum-norm"), m / 8)
    w = verl_aggregation_weights(mask, "seq-mean-token-mean")
    assert torch.allclose(w[0], torch.tensor([1 / 6, 1 / 6, 1 / 6, 0]))
    assert torch.allclose(w[1], torch.tensor([0.5, 0, 0, 0]))
    # global batch info: 2 ranks, 10 tokens / 5 sequences in the global batch
    g = verl_aggregation_weights(mask, "token-mean", dp_size=2, batch_num_tokens=10)
    assert torch.allclose(g, m * 2 / 10)
    g = verl_aggregation_weights(
        mask, "seq-mean-token-sum-norm", dp_size=2, global_batch_size=5, loss_scale_factor=8
    )
    assert torch.allclose(g, m * 2 / 5 / 8)
    with pytest.raises(ValueError, match="dp_size > 1 needs the global batch_num_tokens"):
        verl_aggregation_weights(mask, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="unknown verl loss_agg_mode"):
        verl_aggregation_weights(mask, "episode-mean")


def test_turn_loss_equals_ppo_on_the_split_rows() -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    old = -torch.rand(2, 6, generator=g) - 0.1
    lp = (old + 0.3 * torch.randn(2, 6, generator=g)).requires_grad_(True)
    adv = torch.randn(2, 6, generator=g)
    w = verl_aggregation_weights(mask, "token-mean")
    loss, _ = credo_policy_loss(
        "ppo",
        {"ratio_level": "turn"},
        old_log_prob=old,
        log_prob=lp,
        advantages=adv,
        response_mask=mask,
        weights=w,
        turns=True,
    )
    (grad,) = torch.autograd.grad(loss, lp)
    # by hand: the three runs as three rows
    runs = [(0, [0, 1]), (0, [3, 4, 5]), (1, [0, 1, 2, 3])]
    lp2 = lp.detach().clone().requires_grad_(True)
    rows = []
    for r, cols in runs:
        pad = 4 - len(cols)
        rows.append([lp2[r, c] for c in cols] + [torch.zeros(())] * pad)
    split = {
        "logprobs": torch.stack([torch.stack(x) for x in rows]),
        "old_logprobs": torch.tensor(
            [[old[r, c] for c in cols] + [0.0] * (4 - len(cols)) for r, cols in runs]
        ),
        "advantages": torch.tensor(
            [[adv[r, c] for c in cols] + [0.0] * (4 - len(cols)) for r, cols in runs]
        ),
        "mask": torch.tensor([[True] * len(cols) + [False] * (4 - len(cols)) for _, cols in runs]),
    }
    inputs = LossInputs(
        **split,
        weights=split["mask"].float() / 9,
        episode=torch.tensor([0, 0, 1]),
        turn=torch.tensor([0, 1, 0]),
    )
    want, _ = get_loss("ppo")(inputs, ratio_level="turn")
    (want_grad,) = torch.autograd.grad(want, lp2)
    assert torch.allclose(loss, want, atol=1e-6)
    assert torch.allclose(grad, want_grad, atol=1e-6)
