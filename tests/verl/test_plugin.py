"""The plugin inside verl: discovery, registration, verl's own advantage path, DataProto."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import credo.integrations.verl as plugin
from credo.credit import estimator_names
from verl import DataProto


def test_import_verl_alone_registers_credo() -> None:
    # a fresh process that never names credo: verl loads the "verl.plugins" entry point
    code = (
        "import sys; from verl.trainer.ppo import core_algos as c; "
        "print(sorted(k for k in c.ADV_ESTIMATOR_REGISTRY if k.startswith('credo_'))); "
        "print(sorted(k for k in c.POLICY_LOSS_REGISTRY if k.startswith('credo_')))"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VERL_USE_EXTERNAL_PLUGINS")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    estimators, losses = out.stdout.strip().splitlines()[-2:]
    assert estimators == str(sorted("credo_" + n for n in estimator_names()))
    assert losses == str(sorted(plugin.LOSSES))


def test_register_is_idempotent_and_refuses_foreign_names() -> None:
    names = plugin.register()
    assert names == plugin.register()
    assert {"credo_gigpo", "credo_graph", "credo_proas", "credo_tsbpo", "credo_graphpo"} <= set(
        names
    )
    assert {"credo_axpo", "credo_holder", "credo_klpo", "credo_ppo_turn"} <= set(names)
    saved = core_algos.ADV_ESTIMATOR_REGISTRY["credo_gigpo"]
    try:
        core_algos.ADV_ESTIMATOR_REGISTRY["credo_gigpo"] = core_algos.compute_rloo_outcome_advantage
        with pytest.raises(ValueError, match="'credo_gigpo' is taken"):
            plugin.register()
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY["credo_gigpo"] = saved


def _single_turn(seed: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    b, width = 12, 6
    lengths = torch.randint(1, width + 1, (b,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    tlr = torch.zeros(b, width)
    score = torch.randint(0, 3, (b,), generator=g).float() / 2
    tlr[torch.arange(b), lengths - 1] = score
    index = np.array([f"p{i // 4}" for i in range(b - 1)] + ["alone"], dtype=object)
    return tlr, mask, index


@pytest.mark.parametrize(("ours", "theirs"), [("credo_grpo", "grpo"), ("credo_rloo", "rloo")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_turn_credo_grpo_and_rloo_equal_verls(ours: str, theirs: str, seed: int) -> None:
    tlr, mask, index = _single_turn(seed)
    got, _ = get_adv_estimator_fn(ours)(token_level_rewards=tlr, response_mask=mask, index=index)
    want, _ = get_adv_estimator_fn(theirs)(
        token_level_rewards=tlr.clone(), response_mask=mask, index=index
    )
    assert torch.allclose(got, want, atol=1e-5)


def test_the_trainers_call_reaches_the_plugin() -> None:
    # verl's compute_advantage (ray_trainer) calls a registered estimator with exactly these
    # keywords (token_level_rewards, response_mask, config, index and, for ReMax,
    # reward_baselines); importing ray_trainer itself needs verl's serving stack (uvicorn...)
    tlr, mask, index = _single_turn(4)
    fn = get_adv_estimator_fn("credo_grpo")
    ours, _ = fn(
        token_level_rewards=tlr,
        response_mask=mask,
        config=None,
        index=index,
        reward_baselines=torch.zeros(len(index)),
    )
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=tlr.clone(), response_mask=mask, index=index
    )
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_compute_credo_advantage_reads_verl_agent_columns() -> None:
    # verl-agent names in non_tensor_batch; the same call as passing them by hand
    tlr = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    cols = {
        "uid": np.array(["u1", "u1", "u2", "u1", "u1"], dtype=object),
        "traj_uid": np.array(["A", "B", "C", "A", "B"], dtype=object),
        "anchor_obs": np.array(["s0", "s0", "s0", "s1", "s2"], dtype=object),
        "rewards": np.array([0.0, 0.0, 1.0, 1.0, 0.0], dtype=np.float32),
        "is_action_valid": np.array([True, False, True, True, True]),
    }
    d = DataProto.from_dict(
        tensors={"token_level_rewards": tlr, "response_mask": mask}, non_tensors=cols
    )
    algo = {"credo": {"gamma": 0.5, "invalid_penalty": 0.1}}
    out = plugin.compute_credo_advantage(d, "credo_gigpo", algo)
    want, _ = get_adv_estimator_fn("credo_gigpo")(
        token_level_rewards=tlr,
        response_mask=mask,
        index=cols["uid"],
        config=algo,
        traj_index=cols["traj_uid"],
        anchor_obs=cols["anchor_obs"],
        rewards=cols["rewards"],
        is_action_valid=cols["is_action_valid"],
    )
    assert torch.equal(out.batch["advantages"], want)
    # by hand (mean_norm, γ = 0.5, c = 0.1 on B0): scores A 1, 1; B 0 − 0.1, 0; C 1 (alone: μ 0).
    # μ_u1 = (1 + 1 − 0.1 + 0)/4 = 0.475. Step returns A0 0.5, A1 1, B0 −0.1, B1 0, C0 1;
    # anchor s0 in u1 = {A0, B0}: mean 0.2 → A0 +0.3, B0 −0.3; the rest alone → 0.
    expect = torch.tensor([0.525 + 0.3, -0.575 - 0.3, 1.0, 0.525, -0.475])
    assert torch.allclose(out.batch["advantages"], expect[:, None] * mask, atol=1e-6)
    with pytest.raises(ValueError, match="not a credo estimator"):
        plugin.compute_credo_advantage(d, "grpo", algo)
