"""Advantages through verl's registry equal credo's own estimators on the same rollouts.

Each case draws a forest, writes it as a shuffled verl batch, calls
``verl.trainer.ppo.core_algos.get_adv_estimator_fn("credo_<name>")`` on it and compares
the token advantages with ``credo.credit.compute_advantages(name, forest)`` broadcast to the
same tokens (float32 rounding).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl_batches import forest_to_verl, token_view

import credit_forests
import credit_forests_b
import credo.integrations.verl as plugin
from credo.credit import compute_advantages
from credo.credit.proas import ProgressGraph
from credo.data import RolloutForest

SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
ATOL = 1e-5


def _texts(k: int) -> str:
    return credit_forests.TEXTS[k % len(credit_forests.TEXTS)]


def _keys(k: int) -> str:
    return f"state {k}"


def _no_extras(forest: RolloutForest) -> RolloutForest:
    """The forest as the plugin sees it: no sampler extras (abstract states)."""
    return dataclasses.replace(forest, extras={}, _episodes=None)


def _check(name: str, forest: RolloutForest, params: dict, anchor_of, seed: int, route: str):
    kw, pos = forest_to_verl(forest, anchor_of, seed=seed, route=route)
    adv, ret = get_adv_estimator_fn(f"credo_{name}")(**kw, config={"credo": params})
    want = token_view(
        compute_advantages(name, _no_extras(forest), params), pos, kw["response_mask"]
    )
    assert adv.shape == kw["response_mask"].shape and adv.dtype == torch.float32
    assert torch.allclose(adv, want, atol=ATOL), (adv - want).abs().max()
    assert torch.equal(adv, ret)


CASES_A = [
    ("gigpo", {}),
    ("gigpo", {"mode": "mean_std_norm", "gamma": 0.9}),
    ("gigpo", {"similarity_threshold": 0.9}),
    ("gigpo", {"episode_stats": "episodes", "invalid_penalty": 0.1}),
    ("graph", {}),
    ("graph", {"backup": "max", "lam": 0.5, "similarity_threshold": 0.9}),
    ("graphpo", {}),
    ("graphpo", {"value": "bellman", "lam": 1.0}),
    ("tsbpo", {}),
    ("tsbpo", {"norm_by_std": True, "only_child": "zero"}),
    ("grpo", {}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("return", {}),
]


@pytest.mark.parametrize(("name", "params"), CASES_A)
@SETTINGS
@given(forest=credit_forests.forests(), seed=st.integers(0, 10**6))
def test_trees_and_chains_match(name: str, params: dict, forest: RolloutForest, seed: int) -> None:
    _check(name, forest, params, _texts, seed, "parent")


@pytest.mark.parametrize(("name", "params"), [c for c in CASES_A if c[0] in ("gigpo", "graph")])
@SETTINGS
@given(forest=credit_forests.forests(tree=False), seed=st.integers(0, 10**6))
def test_chains_by_trajectory_id_match(
    name: str, params: dict, forest: RolloutForest, seed: int
) -> None:
    _check(name, forest, params, _texts, seed, "traj")


@pytest.mark.parametrize(
    ("name", "params", "resample"),
    [
        ("axpo", {}, True),
        ("axpo", {"norm_by_std": False, "recovery_coef": 0.5}, True),
        ("tsbpo", {"omega": 0.5}, False),
        ("graphpo", {"length": "steps"}, False),
    ],
)
@SETTINGS
@given(data=st.data(), seed=st.integers(0, 10**6))
def test_other_shapes_match(name: str, params: dict, resample: bool, data, seed: int) -> None:
    forest = data.draw(credit_forests_b.forests(resample=resample))
    _check(name, forest, params, _keys, seed, "parent")


@SETTINGS
@given(
    f1=credit_forests_b.forests(min_rows=4),
    f2=credit_forests_b.forests(min_rows=4),
    seed=st.integers(0, 10**6),
)
def test_proas_keeps_its_graph_across_batches(
    f1: RolloutForest, f2: RolloutForest, seed: int
) -> None:
    plugin.SETTINGS.states.clear()
    graph = ProgressGraph()
    for forest in (f1, f2):
        kw, pos = forest_to_verl(forest, _keys, seed=seed, route="parent")
        adv, _ = get_adv_estimator_fn("credo_proas")(**kw, config=None)
        want = compute_advantages("proas", _no_extras(forest), state=graph)
        assert torch.allclose(adv, token_view(want, pos, kw["response_mask"]), atol=ATOL)
    kept = plugin.estimator_state("credo_proas")  # same graph, keys hashed from the anchors
    assert (kept.num_edges, kept.num_goals, kept.num_updates) == (
        graph.num_edges,
        graph.num_goals,
        graph.num_updates,
    )
    assert torch.equal(kept.edge_count.sort().values, graph.edge_count.sort().values)
    plugin.SETTINGS.states.clear()


def test_knobs_from_configure_and_from_an_omegaconf_algorithm_section() -> None:
    # two groups of chains; states 0/1 repeat so that anchor groups form
    forest = RolloutForest.from_columns(
        group=[0, 0, 0, 0, 0, 1, 1],
        parent=[-1, 0, -1, 2, 3, -1, -1],
        state=[0, 1, 0, 1, 2, 0, 0],
        next_state=[1, 2, 1, 2, 3, 1, 2],
        reward=[0.0, 1.0, 0.0, 0.0, 0.5, 1.0, 0.0],
        observations=[_texts(k) for k in (0, 1, 0, 1, 2, 0, 0)],
    )
    kw, pos = forest_to_verl(forest, _texts, seed=0, route="traj")
    fn = get_adv_estimator_fn("credo_gigpo")
    want = compute_advantages("gigpo", forest, {"gamma": 0.5, "omega": 2.0})
    try:
        plugin.configure(estimators={"credo_gigpo": {"gamma": 0.5, "omega": 3.0}})
        algo = OmegaConf.create(
            {"gamma": 1.0, "adv_estimator": "credo_gigpo", "credo": {"omega": 2.0}}
        )
        adv, _ = fn(**kw, config=algo)  # the run config's knob wins over configure()
    finally:
        plugin.SETTINGS.estimator_params.clear()
    assert torch.allclose(adv, token_view(want, pos, kw["response_mask"]), atol=ATOL)
    with pytest.raises(ValueError, match="omgea"):
        fn(**kw, config={"credo": {"omgea": 1.0}})
    with pytest.raises(KeyError, match="credo_gigpo"):
        plugin.configure(estimators={"credo_gipgo": {}})
