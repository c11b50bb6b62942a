"""KL estimators: exact enumeration over small vocabularies, top-K / binary gaps, uses."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _objectives_util import make_inputs  # noqa: F401  (single-threaded torch for tiny tensors)
from credo.objectives import (
    kl_binary,
    kl_diagnostics,
    kl_estimate,
    kl_loss,
    kl_reward_penalty,
    kl_topk,
)

D = torch.float64


def _exact_expectation(pi_logits, ref_logits, kind):
    """E_{x~π}[k(x)] by enumerating the vocabulary, and the exact KL(π ‖ π_ref)."""
    lp = torch.log_softmax(pi_logits, -1)
    lr = torch.log_softmax(ref_logits, -1)
    k = kl_estimate(lp, lr, kind)
    return (lp.exp() * k).sum(-1), (lp.exp() * (lp - lr)).sum(-1)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.integers(0, 10_000), st.floats(0.05, 2.0))
def test_k1_and_k3_are_unbiased_by_enumeration(vocab, seed, scale):
    g = torch.Generator().manual_seed(seed)
    pi = torch.randn(vocab, generator=g, dtype=D) * scale
    ref = torch.randn(vocab, generator=g, dtype=D) * scale
    for kind in ("k1", "k3"):
        expect, kl = _exact_expectation(pi, ref, kind)
        torch.testing.assert_close(expect, kl)
    # k3 is non-negative token by token
    k3 = kl_estimate(torch.log_softmax(pi, -1), torch.log_softmax(ref, -1), "k3")
    assert (k3 >= 0).all()


def test_k2_bias_is_third_order():
    # E[k2] − KL = O(δ³) for π_ref = π·e^{δ·u}: the bias shrinks ~8x when δ halves
    g = torch.Generator().manual_seed(0)
    pi, u = torch.randn(6, generator=g, dtype=D), torch.randn(6, generator=g, dtype=D)
    biases = []
    for delta in (0.2, 0.1, 0.05):
        e2, kl = _exact_expectation(pi, pi + delta * u, "k2")
        biases.append(abs((e2 - kl).item()))
    assert biases[0] / biases[1] == pytest.approx(8.0, rel=0.15)
    assert biases[1] / biases[2] == pytest.approx(8.0, rel=0.15)


def test_binary_by_hand():
    # q = 0.5, p = 0.25: 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5(0.693147 − 0.405465)
    got = kl_binary(torch.tensor(math.log(0.5), dtype=D), torch.tensor(math.log(0.25), dtype=D))
    assert got.item() == pytest.approx(0.5 * (math.log(2) + math.log(0.5 / 0.75)))
    assert got.item() == pytest.approx(0.143841, abs=1e-6)


Q = torch.tensor([0.5, 0.3, 0.1, 0.1], dtype=D)
P = torch.tensor([0.4, 0.4, 0.15, 0.05], dtype=D)


def test_topk_by_hand():
    # head = tokens 0, 1: 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) = 0.111572 − 0.086305;
    # tails q = 0.2, p = 0.2: 0.2 ln 1 = 0
    got = kl_topk(Q[:2].log(), P[:2].log())
    assert got.item() == pytest.approx(0.5 * math.log(1.25) + 0.3 * math.log(0.75))
    assert got.item() == pytest.approx(0.025267, abs=1e-6)


def test_diagnostics_by_hand():
    # exact KL adds the tail tokens: 0.1 ln(0.1/0.15) + 0.1 ln(0.1/0.05) = 0.028768
    # tail conditionals q(·|tail) = (0.5, 0.5), p(·|tail) = (0.75, 0.25):
    # KL = 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25) = 0.143841; gap = q_tail · 0.143841 = 0.028768
    d = kl_diagnostics(Q.log(), P.log(), torch.tensor(0), k=2)
    assert d["kl"].item() == pytest.approx(0.025267 + 0.028768, abs=1e-6)
    assert d["k_topk"].item() == pytest.approx(0.025267, abs=1e-6)
    assert d["gap_topk"].item() == pytest.approx(0.2 * 0.143841, abs=1e-6)
    assert d["q_tail"].item() == pytest.approx(0.2)
    # binary with a = token 0: q_a = 0.5, p_a = 0.4;
    # the rest: q(·|¬a) = (.6, .2, .2), p(·|¬a) = (.4/.6, .15/.6, .05/.6)
    k_bin = 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.6)
    assert d["k_bin"].item() == pytest.approx(k_bin)
    rest_q, rest_p = [0.6, 0.2, 0.2], [0.4 / 0.6, 0.15 / 0.6, 0.05 / 0.6]
    cond = sum(a * math.log(a / b) for a, b in zip(rest_q, rest_p))
    assert d["gap_bin"].item() == pytest.approx(0.5 * cond)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 12), st.integers(1, 14), st.integers(0, 10_000), st.floats(0.1, 3.0))
def test_gaps_equal_exact_kl_minus_approximations(vocab, k, seed, scale):
    g = torch.Generator().manual_seed(seed)
    q_logits = torch.randn(3, vocab, generator=g, dtype=D) * scale
    p_logits = torch.randn(3, vocab, generator=g, dtype=D) * scale
    action = torch.randint(0, vocab, (3,), generator=g)
    d = kl_diagnostics(q_logits, p_logits, action, k=k, tail_floor=1e-12)
    p_tail = 1 - torch.softmax(p_logits, -1).gather(
        -1, torch.log_softmax(q_logits, -1).topk(min(k, vocab), -1).indices
    ).sum(-1)
    active = (d["q_tail"] > 1e-9) & (p_tail > 1e-9)  # tails above the floor
    torch.testing.assert_close(d["gap_topk"][active], (d["kl"] - d["k_topk"])[active])
    torch.testing.assert_close(d["gap_bin"], d["kl"] - d["k_bin"])
    # both approximations are lower bounds; the gaps are non-negative
    assert (d["gap_topk"] >= 0).all() and (d["gap_bin"] >= -1e-12).all()
    if k >= vocab:  # the head is the whole vocabulary: k_K is exact
        torch.testing.assert_close(d["k_topk"], d["kl"])
        assert (d["gap_topk"] == 0).all()


def test_topk_handles_zero_sampler_probability_and_gradient():
    q = torch.tensor([math.log(0.6), float("-inf")], dtype=D)  # q = (0.6, 0), tail 0.4
    p = torch.tensor([math.log(0.5), math.log(0.1)], dtype=D, requires_grad=True)  # tail 0.4
    got = kl_topk(q, p)
    assert got.item() == pytest.approx(0.6 * math.log(0.6 / 0.5))
    (g,) = torch.autograd.grad(got, p)
    # d/d log p_v of [Σ q log(q/p) + q_tail log(q_tail/p_tail)] = −q_v + q_tail p_v / p_tail
    torch.testing.assert_close(g, torch.tensor([-0.6 + 0.5, 0.1], dtype=D))


def test_penalty_and_loss_helpers_by_hand():
    k = torch.tensor([[0.1, 0.2, float("nan")], [0.3, float("inf"), 0.0]], dtype=D)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # β Σ_tokens k per row: 0.5·(0.1 + 0.2) = 0.15 ; 0.5·0.3 = 0.15
    torch.testing.assert_close(kl_reward_penalty(k, mask, 0.5), torch.tensor([0.15, 0.15], dtype=D))
    w = torch.tensor([[0.25, 0.25, 9.0], [0.5, 9.0, 9.0]], dtype=D)
    # β Σ w k = 2·(0.025 + 0.05 + 0.15) = 0.45
    assert kl_loss(k, w, mask, 2.0).item() == pytest.approx(0.45)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        kl_loss(k, w, mask, -1.0)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(k, k, "k4")
    with pytest.raises(ValueError, match="tail_floor"):
        kl_topk(Q[:2].log(), P[:2].log(), tail_floor=0.0)


def test_topk_and_binary_gradcheck():
    g = torch.Generator().manual_seed(3)
    q = torch.log_softmax(torch.randn(2, 6, generator=g, dtype=D), -1)[:, :3]
    p = torch.log_softmax(torch.randn(2, 6, generator=g, dtype=D), -1)[:, :3]
    assert torch.autograd.gradcheck(lambda x: kl_topk(q, x), (p.clone().requires_grad_(),))
    assert torch.autograd.gradcheck(
        lambda x: kl_binary(q[:, 0], x), (p[:, 0].clone().requires_grad_(),)
    )
