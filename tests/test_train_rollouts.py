"""The branching samplers and SERO in training: λ_O = 0 is the base run, bit for bit;
the tree sampler's state is checkpointed and resumed exactly; the recipes load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from credo.train.config import ConfigError, load_config
from credo.train.loop import train
from test_train_e2e import _assert_signal, _small, _stable


def _params(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "final_policy" / "model.safetensors"))


@pytest.mark.slow
def test_sero_with_zero_weight_reproduces_the_base_run_exactly(tmp_path: Path) -> None:
    base = train(load_config("grpo", _small(tmp_path, "grpo", 3)), quiet=True)
    zero = train(
        load_config("sero", [*_small(tmp_path, "sero0", 3), "objective.oracle_coef=0"]),
        quiet=True,
    )
    on = train(load_config("sero", _small(tmp_path, "sero", 3)), quiet=True)
    _assert_signal(base.metrics)  # the base run learns: equal weights are not frozen ones
    # the oracle continuations were sampled and their loss computed ...
    assert all(r["rollout/oracle_continuations"] > 0 for r in zero.metrics)
    assert all(r["loss/oracle"] > 0 for r in zero.metrics)
    # ... yet with λ_O = 0 every parameter is bit-identical to GRPO's after 3 updates,
    # and so is every RL quantity along the way
    p0, pz, p1 = _params(base.run_dir), _params(zero.run_dir), _params(on.run_dir)
    assert p0.keys() == pz.keys()
    assert all(torch.equal(p0[k], pz[k]) for k in p0)
    same = ("loss/policy", "policy/grad_norm", "credit/adv_mean", "rollout/success_rate")
    for a, b in zip(base.metrics, zero.metrics):
        assert all(a[k] == b[k] for k in same if k in a)
    assert zero.final.success_rate == base.final.success_rate
    # λ_O = 0.1 does change them (the test can tell)
    assert any(not torch.equal(p0[k], p1[k]) for k in p0)


@pytest.mark.slow
def test_tree_sampler_state_is_checkpointed_and_resumed_exactly(tmp_path: Path) -> None:
    full = train(load_config("tsbpo", _small(tmp_path, "full", 4)), quiet=True)
    part = train(load_config("tsbpo", _small(tmp_path, "part", 2)), quiet=True)
    state = json.loads((part.run_dir / "checkpoints" / "step_2" / "state.json").read_text())
    assert state["sampler_state"]["updates"] == 2
    resumed = train(
        load_config("tsbpo", _small(tmp_path, "part", 4)), resume=part.run_dir, quiet=True
    )
    # p_root (from the fit) and the tree shapes depend on the restored state
    assert [r["rollout/tree_p_root"] for r in resumed.metrics] == [
        r["rollout/tree_p_root"] for r in full.metrics
    ]
    assert _stable(resumed.metrics) == _stable(full.metrics)
    assert full.metrics[0]["rollout/tree_branches"] > 0
    _assert_signal(full.metrics)


@pytest.mark.slow
def test_axpo_recipe_runs(tmp_path: Path) -> None:
    res = train(load_config("axpo", _small(tmp_path, "axpo", 2)), quiet=True)
    assert res.final is not None and "rollout/resampled" in res.metrics[-1]


def test_recipes_and_config_errors() -> None:
    tsbpo = load_config("tsbpo")
    assert (tsbpo.rollout.sampler, tsbpo.credit.estimator) == ("tree", "tsbpo")
    assert tsbpo.objective.aggregation == "turn-sum-active-turns"
    axpo = load_config("axpo")
    assert (axpo.rollout.sampler, axpo.credit.estimator) == ("resample", "axpo")
    sero = load_config("sero")
    assert sero.rollout.oracle_horizon > 0 and sero.objective.oracle_coef > 0
    assert sero.rollout.sampler == "group" and sero.credit.estimator == "grpo"
    with pytest.raises(ConfigError, match=r"has no parameter.*'depth'.*Accepted: allocator"):
        load_config("tsbpo", ["rollout.sampler_params={depth: 3}"])
    with pytest.raises(ConfigError, match="allocator must be one of uniform, likelihood"):
        load_config("tsbpo", ["rollout.sampler_params={allocator: best}"])
    with pytest.raises(ConfigError, match="sampler 'group' has no sampler_params"):
        load_config("grpo", ["rollout.sampler_params={budget: 1}"])
    with pytest.raises(ConfigError, match="needs oracle continuations"):
        load_config("grpo", ["objective.oracle_coef=0.5"])
    with pytest.raises(ConfigError, match="oracle_weight must be one of"):
        load_config("sero", ["objective.oracle_weight=mean"])
    with pytest.raises(ConfigError, match="on_restore_divergence must be one of"):
        load_config("grpo", ["rollout.on_restore_divergence=warn"])
    with pytest.raises(ConfigError, match="Did you mean 'tree'"):
        load_config("grpo", ["rollout.sampler=trees"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        [],  # the recipe: M = 16 auxiliary draws (kl: mc)
        [
            "objective.params={beta: 0.1, kl: topk}",
            "rollout.aux_samples=0",
            "rollout.topk_logprobs=4",
        ],
    ],
    ids=["mc", "topk"],
)
def test_klpo_trains_with_auxiliary_draws_or_the_samplers_top_k(
    tmp_path: Path, extra: list[str]
) -> None:
    one_step = "optim.minibatches=1"  # the default's later mini-batches move off the sampler
    res = train(load_config("klpo", [*_small(tmp_path, "klpo", 2), one_step, *extra]), quiet=True)
    first = res.metrics[0]
    # one update per iteration from the sampler's own weights: trainer = sampler, so the
    # estimated KL to the sampler is 0 up to float error, and the update is not
    assert abs(first["policy/sampler_kl"]) < 1e-5
    assert first["policy/grad_norm"] > 0
    assert all(torch.isfinite(torch.tensor(r["loss/total"])) for r in res.metrics)
