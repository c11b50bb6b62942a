"""SERO's oracle loss: reachability weights by hand, the loss, gradients, micro-batches."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.objectives.sero import action_logprobs, reachability_log_weights, sero_loss


def test_action_logprobs_sum_or_geometric_mean() -> None:
    lp = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -0.5, 0.0, 0.0]])
    mask = torch.tensor([[False, True, True, True], [False, True, False, False]])
    # row 0: −1 − 2 − 3 = −6, mean over 3 tokens −2; row 1: one token −0.5
    assert action_logprobs(lp, mask).tolist() == [-6.0, -0.5]
    assert action_logprobs(lp, mask, geomean=True).tolist() == [-2.0, -0.5]
    assert action_logprobs(lp, torch.zeros_like(mask), geomean=True).tolist() == [0.0, 0.0]


def test_reachability_weights_by_hand() -> None:
    # two chains, rows shuffled: chain 0 has ℓ = (−0.5, −1.0, −2.0) at k = 0, 1, 2;
    # chain 1 has ℓ = (−0.25, −4.0) at k = 0, 1
    ell = torch.tensor([-1.0, -4.0, -0.5, -0.25, -2.0], dtype=torch.float64)
    chain = torch.tensor([0, 1, 0, 1, 0])
    pos = torch.tensor([1, 1, 0, 0, 2])
    # exclusive prefix: chain 0 → (0, −0.5, −1.5), chain 1 → (0, −0.25)
    lw = reachability_log_weights(ell, chain, pos)
    torch.testing.assert_close(lw, torch.tensor([-0.5, -0.25, 0.0, 0.0, -1.5], dtype=torch.float64))
    # inclusive: chain 0 → (−0.5, −1.5, −3.5), chain 1 → (−0.25, −4.25)
    lw = reachability_log_weights(ell, chain, pos, inclusive=True)
    torch.testing.assert_close(
        lw, torch.tensor([-1.5, -4.25, -0.5, -0.25, -3.5], dtype=torch.float64)
    )
    # clipped at w_min = e^{−1}: −1.5 → −1 (exclusive); others unchanged
    lw = reachability_log_weights(ell, chain, pos, min_weight=math.exp(-1))
    torch.testing.assert_close(lw, torch.tensor([-0.5, -0.25, 0.0, 0.0, -1.0], dtype=torch.float64))
    assert reachability_log_weights(ell, chain, pos, mode="none").tolist() == [0.0] * 5
    with pytest.raises(ValueError, match="mode must be one of"):
        reachability_log_weights(ell, chain, pos, mode="sum")
    with pytest.raises(ValueError, match="min_weight must be in"):
        reachability_log_weights(ell, chain, pos, min_weight=2.0)


def test_long_products_never_underflow() -> None:
    # 400 oracle steps of probability e^{−5} each: w = e^{−1995} at the last, 0 in float64
    # if multiplied, but log w is exact
    ell = torch.full((400,), -5.0, dtype=torch.float64)
    lw = reachability_log_weights(ell, torch.zeros(400, dtype=torch.long), torch.arange(400))
    assert float(lw[-1]) == -1995.0 and bool(torch.isfinite(lw).all())


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(-8.0, 0.0), min_size=1, max_size=12),
    st.integers(1, 4),
    st.floats(0.0, 1.0),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_weight_invariants(values: list, chains: int, w_min: float, inclusive: bool, rnd) -> None:  # type: ignore[no-untyped-def]
    n = len(values)
    chain = torch.tensor([i % chains for i in range(n)])
    pos = torch.tensor([i // chains for i in range(n)])
    ell = torch.tensor(values, dtype=torch.float64)
    lw = reachability_log_weights(ell, chain, pos, inclusive=inclusive, min_weight=w_min)
    low = math.log(w_min) if w_min > 0 else -math.inf
    assert bool((lw <= 0).all()) and bool((lw >= low - 1e-12).all())
    # weights never grow along a chain (every ℓ ≤ 0)
    for c in range(chains):
        w = lw[chain == c]
        assert bool((w[1:] <= w[:-1] + 1e-12).all())
    # row order does not matter
    perm = list(range(n))
    rnd.shuffle(perm)
    p = torch.tensor(perm)
    lw_p = reachability_log_weights(ell[p], chain[p], pos[p], inclusive=inclusive, min_weight=w_min)
    torch.testing.assert_close(lw_p, lw[p])


def test_sero_loss_by_hand_and_metrics() -> None:
    # two rows of chain 0 (S = 1): log π(o_0) = −1 − 1 = −2 with w = 1, log π(o_1) = −3
    # with w = e^{−2}: L_O = −(1·(−2) + e^{−2}·(−3)) / 1 = 2 + 3e^{−2}
    lp = torch.tensor([[0.0, -1.0, -1.0], [0.0, -3.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[False, True, True], [False, True, False]])
    lw = torch.tensor([0.0, -2.0], dtype=torch.float64)
    loss, m = sero_loss(lp, mask, lw, num_chains=1, num_rows=2)
    assert float(loss) == pytest.approx(2 + 3 * math.exp(-2))
    assert float(m["loss/oracle"]) == pytest.approx(2 + 3 * math.exp(-2))
    assert float(m["oracle/nll"]) == pytest.approx(2.5)  # (2 + 3)/2 rows
    assert float(m["oracle/weight"]) == pytest.approx((1 + math.exp(-2)) / 2)


def test_sero_loss_gradient() -> None:
    torch.manual_seed(0)
    mask = torch.rand(4, 6) > 0.3
    lw = -torch.rand(4, dtype=torch.float64) * 3

    def f(lp: torch.Tensor) -> torch.Tensor:
        return sero_loss(lp, mask, lw, num_chains=2, num_rows=4)[0]

    lp = -torch.rand(4, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(f, (lp.requires_grad_(True),))
    # the gradient is −w/S on each action token and 0 elsewhere (weights carry no grad)
    lp.grad = None
    f(lp).backward()
    expected = torch.where(mask, -lw.exp()[:, None] / 2, torch.zeros(4, 6, dtype=torch.float64))
    torch.testing.assert_close(lp.grad, expected)


def test_micro_batches_add_up() -> None:
    torch.manual_seed(1)
    lp = -torch.rand(6, 5, dtype=torch.float64)
    mask = torch.rand(6, 5) > 0.2
    lw = -torch.rand(6, dtype=torch.float64)
    whole, mw = sero_loss(lp, mask, lw, num_chains=3, num_rows=6)
    parts = [
        sero_loss(lp[s], mask[s], lw[s], num_chains=3, num_rows=6)
        for s in (slice(0, 2), slice(2, 6))
    ]
    torch.testing.assert_close(parts[0][0] + parts[1][0], whole)
    for k in mw:
        torch.testing.assert_close(parts[0][1][k] + parts[1][1][k], mw[k])
