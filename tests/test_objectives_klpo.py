"""KLPO token and sequence regression: hand values, exact expectations, gradients."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from _objectives_util import make_inputs
from credo.objectives import LossInputs, aggregation_weights, get_loss, kl_binary, kl_topk

D = torch.float64
BETA = 0.1


def _inputs(lp, old, ret, extras, mode="seq-mean-token-sum") -> LossInputs:
    lp = torch.as_tensor(lp, dtype=D)
    if not lp.requires_grad:
        lp = lp.clone().requires_grad_()
    old = torch.as_tensor(old, dtype=D)
    mask = torch.ones(lp.shape, dtype=torch.bool)
    ep = torch.arange(lp.shape[0])
    turn = torch.zeros(lp.shape[0], dtype=torch.long)
    w = aggregation_weights(mask, mode, episode=ep, turn=turn)
    adv = torch.full(lp.shape, float(ret), dtype=D)
    return LossInputs(lp, old, adv, mask, w, ep, turn, extras=extras)


# one row of 2 tokens: log p(a) = (−1, −2), log q(a) = (−1.1, −1.9) -> ℓ = (0.1, −0.1);
# R = 1, β = 0.1 -> h = R − βℓ = (0.99, 1.01).
LP, OLD = [[-1.0, -2.0]], [[-1.1, -1.9]]
AUX_P = [[[-2.0, -3.0], [-1.0, -4.0]]]  # trainer log p(v_j), M = 2
AUX_Q = [[[-2.1, -2.9], [-1.2, -3.6]]]  # sampler log q(v_j)


def _aux():
    return torch.tensor(AUX_P, dtype=D, requires_grad=True)


def test_token_mc_by_hand():
    aux = _aux()
    inp = _inputs(
        LP, OLD, 1.0, {"aux_logprobs": aux, "aux_old_logprobs": torch.tensor(AUX_Q, dtype=D)}
    )
    loss, metrics = get_loss("klpo")(inp, beta=BETA)
    # C = mean_j log p(v_j) = (−2.5, −2.5); log p(a) − C = (1.5, 0.5)
    # loss = −(0.99·1.5 + 1.01·0.5) = −1.99
    assert loss.item() == pytest.approx(-1.99)
    g_lp, g_aux = torch.autograd.grad(loss, [inp.logprobs, aux])
    torch.testing.assert_close(g_lp, torch.tensor([[-0.99, -1.01]], dtype=D))  # −h
    torch.testing.assert_close(
        g_aux, torch.tensor([[[0.495, 0.495], [0.505, 0.505]]], dtype=D)
    )  # h/M
    # return coefficient Σ w h = 2.0; MC KL per token mean_j(log q − log p) = (0, 0.1)
    assert metrics["policy/return_coef"].item() == pytest.approx(2.0)
    assert metrics["policy/sampler_kl"].item() == pytest.approx(0.1)
    assert "policy/clip_frac" not in metrics


def test_token_mc_aux_mask_averages_valid_draws():
    # M = 3 draws, the third one invalid at both tokens: C = mean of the first two
    aux = torch.tensor([[[-2.0, -3.0, 9.0], [-1.0, -4.0, 9.0]]], dtype=D, requires_grad=True)
    am = torch.tensor([[[True, True, False], [True, True, False]]])
    inp = _inputs(LP, OLD, 1.0, {"aux_logprobs": aux, "aux_mask": am})
    loss, _ = get_loss("klpo")(inp, beta=BETA)
    assert loss.item() == pytest.approx(-1.99)
    am_bad = am.clone()
    am_bad[0, 1] = False
    with pytest.raises(ValueError, match="at least one valid"):
        get_loss("klpo")(
            _inputs(LP, OLD, 1.0, {"aux_logprobs": aux, "aux_mask": am_bad}), beta=BETA
        )


def test_token_binary_by_hand():
    inp = _inputs(LP, OLD, 1.0, {})
    loss, metrics = get_loss("klpo")(inp, beta=BETA, kl="binary")
    # ω = (1 − q)/(1 − p): (1 − e^−1.1)/(1 − e^−1) = 0.667129/0.632121 = 1.055382,
    #                      (1 − e^−1.9)/(1 − e^−2) = 0.850431/0.864665 = 0.983538
    om = [(1 - math.exp(-1.1)) / (1 - math.exp(-1.0)), (1 - math.exp(-1.9)) / (1 - math.exp(-2.0))]
    assert om == pytest.approx([1.055382, 0.983538], abs=1e-6)
    # loss = −Σ h ω log p(a) = 0.99·1.055382·1 + 1.01·0.983538·2 = 3.031575
    assert loss.item() == pytest.approx(0.99 * om[0] + 2 * 1.01 * om[1])
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    torch.testing.assert_close(g, torch.tensor([[-0.99 * om[0], -1.01 * om[1]]], dtype=D))
    k_bin = kl_binary(torch.tensor(OLD, dtype=D), torch.tensor(LP, dtype=D)).sum()
    assert metrics["policy/sampler_kl"].item() == pytest.approx(k_bin.item())


def test_token_topk_by_hand():
    # one token: log p(a) = −1, log q(a) = −1.1 -> h = 0.99. Head of K = 2:
    # q = (0.5, 0.3) (tail 0.2), p = (0.4, 0.3) (tail 0.3) -> ρ = 0.2/0.3 = 2/3,
    # coef = q − ρp = (0.5 − 0.266667, 0.3 − 0.2) = (0.233333, 0.1)
    p_head = torch.tensor([[[0.4, 0.3]]], dtype=D).log().requires_grad_()
    q_head = torch.tensor([[[0.5, 0.3]]], dtype=D).log()
    inp = _inputs([[-1.0]], [[-1.1]], 1.0, {"topk_logprobs": p_head, "topk_old_logprobs": q_head})
    loss, metrics = get_loss("klpo")(inp, beta=BETA, kl="topk")
    # C = 0.233333·ln 0.4 + 0.1·ln 0.3 = −0.334198; loss = −0.99·(−1 + 0.334198) = 0.659144
    c = (0.5 - 0.4 * 2 / 3) * math.log(0.4) + 0.1 * math.log(0.3)
    assert loss.item() == pytest.approx(-0.99 * (-1.0 - c))
    assert loss.item() == pytest.approx(0.659144, abs=1e-6)
    g_lp, g_head = torch.autograd.grad(loss, [inp.logprobs, p_head])
    assert g_lp.item() == pytest.approx(-0.99)
    # d loss / d log p_v = h · coef_v; and coef = −∇k_K (the KL's gradient)
    torch.testing.assert_close(g_head, torch.tensor([[[0.99 * 0.7 / 3, 0.099]]], dtype=D))
    p2 = p_head.detach().clone().requires_grad_()
    (g_k,) = torch.autograd.grad(kl_topk(q_head, p2).sum(), p2)
    torch.testing.assert_close(g_head, -0.99 * g_k)
    assert metrics["policy/sampler_kl"].item() == pytest.approx(kl_topk(q_head, p_head).item())


def test_token_mc_gradient_is_the_full_kl_gradient_in_expectation():
    # one position, vocabulary of 4, trainer logits z; M = 1 auxiliary draw v ~ q,
    # enumerated exactly: E_v[∇loss] = −h·(∇log p(a) + ∇KL(q ‖ p))
    g = torch.Generator().manual_seed(0)
    q_log = torch.log_softmax(torch.randn(4, generator=g, dtype=D), -1)
    z = torch.randn(4, generator=g, dtype=D, requires_grad=True)
    a, ret = 2, 0.7
    fn = get_loss("klpo")
    expected = torch.zeros((), dtype=D)
    for v in range(4):
        p_log = torch.log_softmax(z, -1)
        inp = _inputs(
            p_log[a].view(1, 1), q_log[a].view(1, 1), ret, {"aux_logprobs": p_log[v].view(1, 1, 1)}
        )
        expected = expected + q_log[v].exp() * fn(inp, beta=BETA)[0]
    (g_mc,) = torch.autograd.grad(expected, z)
    p_log = torch.log_softmax(z, -1)
    h = ret - BETA * (p_log[a] - q_log[a]).detach()
    full_kl = (q_log.exp() * (q_log - p_log)).sum()
    (g_full,) = torch.autograd.grad(-h * (p_log[a] + full_kl), z)
    torch.testing.assert_close(g_mc, g_full)


# --------------------------------------------------------------------------- sequence route


def test_sequence_mc_by_hand():
    aux = _aux()
    inp = _inputs(
        LP,
        OLD,
        1.0,
        {"aux_logprobs": aux, "aux_old_logprobs": torch.tensor(AUX_Q, dtype=D)},
        mode="seq-mean-token-mean",
    )
    loss, metrics = get_loss("klpo_seq")(inp, beta=BETA)
    # log q(v) − log p(v) per token: (−0.1, 0.1), (−0.2, 0.4) -> column sums (−0.3, 0.5)
    # Σℓ = 0 -> D_j = 1 − 0.1·(0 + col) = (1.03, 0.95); leave-one-out D_{−j} = (0.95, 1.03)
    # Σ_u [log p(a) − log p(v_j)]: column 0: 1 + (−1) = 0, column 1: 2 + 2 = 4
    # loss = −mean_j D_{−j}·corrected_j = −(0.95·0 + 1.03·4)/2 = −2.06
    assert loss.item() == pytest.approx(-2.06)
    g_lp, g_aux = torch.autograd.grad(loss, [inp.logprobs, aux])
    torch.testing.assert_close(g_lp, torch.tensor([[-0.99, -0.99]], dtype=D))  # −mean_j D_{−j}
    torch.testing.assert_close(g_aux, torch.tensor([[[0.475, 0.515], [0.475, 0.515]]], dtype=D))
    # D̄ = 0.99; U-statistic (D̄² − mean_j (D_j − D̄)²/(M − 1))/(2β) = (0.9801 − 0.0016)/0.2
    assert metrics["loss/klpo_regression"].item() == pytest.approx(4.8925)
    assert metrics["policy/residual"].item() == pytest.approx(0.99)


def test_sequence_mc_gradient_is_the_full_kl_gradient_in_expectation():
    # 2 positions, vocabulary of 3, M = 2 draws per position: 3^4 = 81 joint draws enumerated.
    # E[∇loss] = −D·Σ_u(∇log p(a_u) + ∇KL_u), D = R − β Σ_u (ℓ_u + KL_u)
    g = torch.Generator().manual_seed(1)
    q_log = torch.log_softmax(torch.randn(2, 3, generator=g, dtype=D), -1)
    z = torch.randn(2, 3, generator=g, dtype=D, requires_grad=True)
    actions, ret = [0, 2], 0.8
    fn = get_loss("klpo_seq")
    expected = torch.zeros((), dtype=D)
    for draws in itertools.product(range(3), repeat=4):  # (v_00, v_01, v_10, v_11)
        v = torch.tensor(draws).view(2, 2)
        p_log = torch.log_softmax(z, -1)
        prob = torch.stack([q_log[u, v[u]].exp() for u in range(2)]).prod()
        inp = _inputs(
            p_log[[0, 1], actions].view(1, 2),
            q_log[[0, 1], actions].view(1, 2),
            ret,
            {
                "aux_logprobs": p_log.gather(1, v).view(1, 2, 2),
                "aux_old_logprobs": q_log.gather(1, v).view(1, 2, 2),
            },
            mode="seq-mean-token-mean",
        )
        expected = expected + prob * fn(inp, beta=BETA)[0]
    (g_mc,) = torch.autograd.grad(expected, z)
    p_log = torch.log_softmax(z, -1)
    kl_u = (q_log.exp() * (q_log - p_log)).sum(-1)
    ell = p_log[[0, 1], actions] - q_log[[0, 1], actions]
    d = (ret - BETA * (ell + kl_u).sum()).detach()
    (g_full,) = torch.autograd.grad(-d * (p_log[[0, 1], actions] + kl_u).sum(), z)
    torch.testing.assert_close(g_mc, g_full)


def test_sequence_binary_and_topk_have_the_gradient_of_the_squared_residual():
    base = make_inputs([3, 2], [0, 1], mode="seq-mean-token-mean", seed=5)
    m = base.mask
    w_row = 1 / 2  # seq-mean-token-mean: each of the 2 rows weighs 1/2
    for kl in ("binary", "topk"):
        loss, metrics = get_loss("klpo_seq")(base, beta=BETA, kl=kl)
        lp, p_head = base.logprobs, base.extras["topk_logprobs"]
        g_loss = torch.autograd.grad(loss, [lp, p_head], allow_unused=True)
        old, q_head = base.old_logprobs, base.extras["topk_old_logprobs"]
        if kl == "binary":
            k = kl_binary(old, lp)
        else:
            k = kl_topk(q_head, p_head)
        ell = lp - old
        zero = torch.zeros_like(ell)
        resid = base.advantages[:, 0] - BETA * torch.where(m, ell + k, zero).sum(1)
        target = (w_row * resid.square() / (2 * BETA)).sum()
        g_target = torch.autograd.grad(target, [lp, p_head], allow_unused=True)
        for a, b in zip(g_loss, g_target):
            if b is None:
                assert a is None or (a == 0).all()
            else:
                torch.testing.assert_close(a, b)
        assert metrics["loss/klpo_regression"].item() == pytest.approx(target.item())


def test_no_clipping_even_for_large_ratios():
    # ℓ = 5 (ratio e⁵): the gradient is still −h = −(R − βℓ) = −(1 − 0.5)
    aux = torch.tensor([[[-3.0, -3.0]]], dtype=D, requires_grad=True)
    inp = _inputs([[-0.5]], [[-5.5]], 1.0, {"aux_logprobs": aux})
    loss, _ = get_loss("klpo")(inp, beta=BETA)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    assert g.item() == pytest.approx(-0.5)


def test_klpo_errors():
    fn, fn_seq = get_loss("klpo"), get_loss("klpo_seq")
    plain = _inputs(LP, OLD, 1.0, {})
    with pytest.raises(ValueError, match="aux_logprobs"):
        fn(plain)
    with pytest.raises(ValueError, match="topk_logprobs"):
        fn(plain, kl="topk")
    with pytest.raises(ValueError, match="unknown kl"):
        fn(plain, kl="full")
    with pytest.raises(ValueError, match="beta must be positive"):
        fn(plain, beta=0.0)
    one_draw = _inputs(
        LP,
        OLD,
        1.0,
        {"aux_logprobs": _aux()[..., :1], "aux_old_logprobs": torch.zeros(1, 2, 1, dtype=D)},
    )
    with pytest.raises(ValueError, match="M >= 2"):
        fn_seq(one_draw)
    with pytest.raises(ValueError, match=r"\[B, L, ·\]"):
        fn(_inputs(LP, OLD, 1.0, {"aux_logprobs": torch.zeros(1, 3, 2, dtype=D)}))
    with pytest.raises(ValueError, match="strictly negative"):
        fn(_inputs([[0.0, -1.0]], OLD, 1.0, {}), kl="binary")


@pytest.mark.parametrize("kl", ["mc", "binary"])
def test_sequence_regression_metric_is_finite_for_huge_advantages_in_float32(kl: str) -> None:
    """Issue 46, item 7: with advantages ≥ 1e19 in float32, D² overflowed to inf (and the
    mc U-statistic's inf − inf gave NaN); the metric is computed in float64. One row,
    seq-mean-token-mean (W = 1): D = R − β·(small terms) rounds to R in float32 and float64
    alike, so the metric is R²/(2β) (the mc variance term is 0: the D_j are equal)."""
    f32 = torch.float32
    r = float(torch.tensor(1e19, dtype=f32))  # 9.99999980506e18, R as float32 holds it
    lp = torch.tensor(LP, dtype=f32, requires_grad=True)
    extras = {
        "aux_logprobs": torch.tensor(AUX_P, dtype=f32),
        "aux_old_logprobs": torch.tensor(AUX_Q, dtype=f32),
    }
    mask = torch.ones(lp.shape, dtype=torch.bool)
    ep, turn = torch.arange(1), torch.zeros(1, dtype=torch.long)
    w = aggregation_weights(mask, "seq-mean-token-mean", episode=ep, turn=turn).to(f32)
    adv = torch.full(lp.shape, r, dtype=f32)
    inp = LossInputs(lp, torch.tensor(OLD, dtype=f32), adv, mask, w, ep, turn, extras=extras)
    _, metrics = get_loss("klpo_seq")(inp, beta=BETA, kl=kl)
    value = metrics["loss/klpo_regression"].item()
    assert math.isfinite(value) and value == pytest.approx(r * r / (2 * BETA), rel=1e-12)
    assert metrics["policy/residual"].item() == pytest.approx(r, rel=1e-6)
