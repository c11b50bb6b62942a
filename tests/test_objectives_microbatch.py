"""Every loss × every aggregation mode: micro-batches add up exactly; masked slots never matter."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _objectives_util import LOSS_CONFIGS, grads, make_inputs, subset
from credo.objectives import AGGREGATIONS, get_loss

# 3 episodes: e0 = rows 0-2, e1 = row 3, e2 = rows 4-5 (row 5 fully masked)
LENGTHS = [2, 4, 5, 3, 1, 0]
EPISODE = [0, 0, 0, 1, 2, 2]
EPISODE_SPLIT = [torch.tensor([0, 1, 2]), torch.tensor([3]), torch.tensor([4, 5])]
ROW_SPLIT = [torch.tensor([0]), torch.tensor([1, 2, 3]), torch.tensor([4, 5])]


def _whole_unit(kwargs: dict) -> bool:
    """Losses that need whole episodes in a micro-batch."""
    return kwargs.get("unit") == "episode" or kwargs.get("ratio_level") == "sequence"


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
@pytest.mark.parametrize(("name", "kwargs"), LOSS_CONFIGS)
def test_microbatches_add_up(name, kwargs, mode):
    inputs = make_inputs(LENGTHS, EPISODE, width=6, mode=mode, seed=3)
    fn = get_loss(name)
    loss, metrics = fn(inputs, **kwargs)
    full_grads = grads(loss, inputs)
    assert torch.isfinite(loss)
    splits = [EPISODE_SPLIT] if _whole_unit(kwargs) else [EPISODE_SPLIT, ROW_SPLIT]
    for split in splits:
        total = torch.zeros((), dtype=loss.dtype)
        total_metrics = {k: torch.zeros((), dtype=v.dtype) for k, v in metrics.items()}
        for rows in split:
            part_loss, part_metrics = fn(subset(inputs, rows), **kwargs)
            total = total + part_loss
            for k, v in part_metrics.items():
                total_metrics[k] = total_metrics[k] + v
        torch.testing.assert_close(total, loss, rtol=1e-10, atol=1e-12)
        for g_full, g_split in zip(full_grads, grads(total, inputs)):
            torch.testing.assert_close(g_split, g_full, rtol=1e-10, atol=1e-12)
        assert set(total_metrics) == set(metrics)
        for k in metrics:  # float32 metrics (weights × bools) add up to float32 rounding
            tol = 1e-9 if metrics[k].dtype == torch.float64 else 1e-6
            torch.testing.assert_close(total_metrics[k], metrics[k], rtol=tol, atol=tol)


def test_every_loss_reports_the_common_metrics():
    inputs = make_inputs(LENGTHS, EPISODE, width=6, seed=1)
    for name, kwargs in LOSS_CONFIGS:
        _, metrics = get_loss(name)(inputs, **kwargs)
        for key in ("loss/policy", "policy/approx_kl", "policy/ratio_mean", "policy/entropy"):
            assert key in metrics, (name, kwargs, key)
        if not name.startswith("klpo"):  # KLPO has no clipping
            assert "policy/clip_frac" in metrics
        assert all(k.startswith(("loss/", "policy/")) for k in metrics)
        assert all(v.dim() == 0 and torch.isfinite(v) for v in metrics.values())


garbage = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e6, -1e6, 0.0, 3.0])


def _poison(x: torch.Tensor, mask: torch.Tensor, values: list[float]) -> torch.Tensor:
    """``x`` with its masked slots replaced by ``values`` (cycled)."""
    m = mask if x.dim() == mask.dim() else mask[..., None].expand_as(x)
    fill = torch.tensor(values, dtype=x.dtype).repeat(x.numel() // len(values) + 1)[: x.numel()]
    return torch.where(m, x.detach(), fill.view_as(x))


@settings(max_examples=60, deadline=None)
@given(
    config=st.sampled_from(LOSS_CONFIGS),
    values=st.lists(garbage, min_size=1, max_size=5),
    seed=st.integers(0, 1000),
)
def test_masked_garbage_changes_nothing(config, values, seed):
    name, kwargs = config
    clean = make_inputs(LENGTHS, EPISODE, width=6, mode="seq-mean-token-mean", seed=seed)
    m = clean.mask
    extras = dict(clean.extras)
    for key in ("aux_logprobs", "aux_old_logprobs", "topk_logprobs", "topk_old_logprobs"):
        extras[key] = _poison(extras[key], m, values)
    for key in ("ref_logprobs_profile", "ref_logprobs_plain"):
        extras[key] = _poison(extras[key], m, values)
    extras["aux_logprobs"].requires_grad_()
    extras["topk_logprobs"].requires_grad_()
    dirty = replace(
        clean,
        logprobs=_poison(clean.logprobs, m, values).requires_grad_(),
        old_logprobs=_poison(clean.old_logprobs, m, values),
        advantages=_poison(clean.advantages, m, values),
        weights=_poison(clean.weights, m, values),
        entropy=_poison(clean.entropy, m, values),
        extras=extras,
    )
    fn = get_loss(name)
    loss_c, met_c = fn(clean, **kwargs)
    loss_d, met_d = fn(dirty, **kwargs)
    torch.testing.assert_close(loss_d, loss_c, rtol=0, atol=0)
    for g_d, g_c in zip(grads(loss_d, dirty), grads(loss_c, clean)):
        torch.testing.assert_close(g_d, g_c, rtol=0, atol=0)
    for k in met_c:
        torch.testing.assert_close(met_d[k].double(), met_c[k].double(), rtol=1e-12, atol=1e-12)
