"""PPO-clip with asymmetric bounds (ε_low ≠ ε_high) and the dual clip, by hand.

With ε_low = 0.1 and ε_high = 0.3 the clip range is [0.9, 1.3]; swapping the bounds
would give [0.7, 1.1], so every row marked "swap" below changes value under that bug.
"""

from __future__ import annotations

import math

import pytest
import torch

from credo.objectives import LossInputs, aggregation_weights, get_loss
from credo.objectives.ppo import ppo_token_loss

CLIP = dict(clip_low=0.1, clip_high=0.3)

# (ρ, A, loss with dual clip c = 3, clipped) — ℓ = max(−Aρ, −A·clip(ρ, 0.9, 1.3)),
# then for A < 0: min(ℓ, −A·c)
TABLE = [
    (0.5, 1.0, -0.5, False),  # A > 0 below the range: −0.5 > −0.9, unclipped
    (0.85, 1.0, -0.85, False),  # A > 0 below: −0.85 > −0.9
    (1.2, 1.0, -1.2, False),  # inside [0.9, 1.3] (swap: clipped at 1.1 → −1.1)
    (1.25, 2.0, -2.5, False),  # inside (swap: −2·1.1 = −2.2)
    (1.5, 1.0, -1.3, True),  # A > 0 above: −1.3 > −1.5 (swap: −1.1)
    (0.5, -1.0, 0.9, True),  # A < 0 below: max(0.5, 0.9) (swap: 0.7)
    (0.85, -1.0, 0.9, True),  # A < 0 below (swap: 0.85, unclipped)
    (0.95, -2.0, 1.9, False),  # A < 0 inside: 2·0.95
    (1.2, -1.0, 1.2, False),  # A < 0 above the lower bound: max(1.2, 1.2)
    (4.0, -1.0, 3.0, True),  # max(4, 1.3) = 4, dual clip caps at −A·3 = 3
    (4.0, -0.5, 1.5, True),  # max(2, 0.65) = 2, dual cap 0.5·3 = 1.5
    (2.0, 0.0, 0.0, False),  # A = 0: no loss, nothing clipped
]


def _columns() -> tuple[torch.Tensor, torch.Tensor]:
    rho = torch.tensor([r for r, *_ in TABLE], dtype=torch.float64)
    adv = torch.tensor([a for _, a, *_ in TABLE], dtype=torch.float64)
    return rho.log(), adv


def test_asymmetric_clip_with_dual_clip_by_hand() -> None:
    lr, adv = _columns()
    loss, clipped = ppo_token_loss(lr, adv, dual_clip=3.0, **CLIP)
    expected = torch.tensor([x for *_, x, _ in TABLE], dtype=torch.float64)
    torch.testing.assert_close(loss, expected)
    assert clipped.tolist() == [c for *_, c in TABLE]


def test_asymmetric_clip_without_dual_clip_by_hand() -> None:
    lr, adv = _columns()
    loss, clipped = ppo_token_loss(lr, adv, dual_clip=None, **CLIP)
    expected = [x for *_, x, _ in TABLE]
    expected[9], expected[10] = 4.0, 2.0  # −Aρ, no cap
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    flags = [c for *_, c in TABLE]
    flags[9] = flags[10] = False  # −Aρ is the larger term: the clip did not set them
    assert clipped.tolist() == flags


def test_gradient_is_zero_exactly_where_clipped() -> None:
    # unclipped: ℓ = −Aρ so dℓ/d log ρ = −Aρ; clipped (a bound or the dual cap): 0
    lr, adv = _columns()
    lr.requires_grad_()
    loss, _ = ppo_token_loss(lr, adv, dual_clip=3.0, **CLIP)
    (g,) = torch.autograd.grad(loss.sum(), lr)
    expected = [0.0 if c else -a * r for r, a, _, c in TABLE]
    torch.testing.assert_close(g, torch.tensor(expected, dtype=torch.float64))


def test_dual_clip_must_exceed_one() -> None:
    lr, adv = _columns()
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_token_loss(lr, adv, dual_clip=1.0)


def _one_row(rhos: list[float], adv: float) -> LossInputs:
    old = torch.full((1, len(rhos)), -1.0, dtype=torch.float64)
    lp = (old + torch.tensor([rhos], dtype=torch.float64).log()).requires_grad_()
    mask = torch.ones(1, len(rhos), dtype=torch.bool)
    ep, turn = torch.tensor([0]), torch.tensor([0])
    w = aggregation_weights(mask, "token-mean", episode=ep, turn=turn)
    return LossInputs(lp, old, torch.full(mask.shape, adv, dtype=torch.float64), mask, w, ep, turn)


@pytest.mark.parametrize(
    ("adv", "expected_loss", "clip_frac", "grad"),
    [
        # ρ = 1.2, 0.85, 1.5, 0.5 → −1.2, −0.85, −1.3 (clipped), −0.5; token-mean /4
        (1.0, (-1.2 - 0.85 - 1.3 - 0.5) / 4, 0.25, [-1.2 / 4, -0.85 / 4, 0.0, -0.5 / 4]),
        # → 1.2, 0.9 (clipped), 1.5, 0.9 (clipped)
        (-1.0, (1.2 + 0.9 + 1.5 + 0.9) / 4, 0.5, [1.2 / 4, 0.0, 1.5 / 4, 0.0]),
    ],
    ids=["positive-advantage", "negative-advantage"],
)
def test_ppo_loss_passes_asymmetric_bounds_through(
    adv: float, expected_loss: float, clip_frac: float, grad: list[float]
) -> None:
    inp = _one_row([1.2, 0.85, 1.5, 0.5], adv)
    loss, metrics = get_loss("ppo")(inp, **CLIP)
    assert loss.item() == pytest.approx(expected_loss)
    assert metrics["policy/clip_frac"].item() == pytest.approx(clip_frac)
    assert metrics["policy/ratio_mean"].item() == pytest.approx((1.2 + 0.85 + 1.5 + 0.5) / 4)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    torch.testing.assert_close(g, torch.tensor([grad], dtype=torch.float64))


def test_default_bounds_are_symmetric_point_two() -> None:
    # ρ = 1.25 > 1.2 and 0.75 < 0.8 with A = +1 and −1: clipped to 1.2 and 0.8
    lr = torch.tensor([math.log(1.25), math.log(0.75)], dtype=torch.float64)
    loss, clipped = ppo_token_loss(lr, torch.tensor([1.0, -1.0], dtype=torch.float64))
    torch.testing.assert_close(loss, torch.tensor([-1.2, 0.8], dtype=torch.float64))
    assert clipped.tolist() == [True, True]
