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
    (1.1, 0.5, -0.55, False),  # 0 < A < 1 inside: no dual clip for A > 0 (cap would be −1.5)
    (0.5, 0.25, -0.125, False),  # 0 < A < 1 below: −0.125 > −0.225
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


def test_default_dual_clip_is_three_and_any_c_above_one_is_accepted() -> None:
    # ρ = 5, A = −1: max(5, 1.2) = 5, capped at 3 by default; c = 1.5 caps at 1.5
    lr = torch.tensor([math.log(5.0)], dtype=torch.float64)
    adv = torch.tensor([-1.0], dtype=torch.float64)
    torch.testing.assert_close(ppo_token_loss(lr, adv)[0], torch.tensor([3.0], dtype=torch.float64))
    loss, clipped = ppo_token_loss(lr, adv, dual_clip=1.5)
    torch.testing.assert_close(loss, torch.tensor([1.5], dtype=torch.float64))
    assert clipped.tolist() == [True]


def test_log_ratio_is_clamped_to_twenty_in_the_loss_and_the_metric() -> None:
    # log ρ = ±25 is used as ±20 (exp overflows float32 beyond 88): without the dual clip,
    # A = −1, log ρ = 25 → ℓ = e²⁰; A = +1, log ρ = −25 → ℓ = max(−e⁻²⁰, −0.8) = −e⁻²⁰
    lr = torch.tensor([25.0, -25.0], dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    loss, _ = ppo_token_loss(lr, adv, dual_clip=None)
    expected = torch.tensor([math.exp(20.0), -math.exp(-20.0)], dtype=torch.float64)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    # through the loss: ratio_mean is the mean of the clamped ratios, e²⁰ and e⁻²⁰
    old = torch.zeros(1, 2, dtype=torch.float64)
    inp = _one_row([1.0, 1.0], -1.0)
    inp.logprobs = (old + lr).requires_grad_()
    inp.old_logprobs = old
    _, metrics = get_loss("ppo")(inp, dual_clip=None)
    mean = (math.exp(20.0) + math.exp(-20.0)) / 2
    assert metrics["policy/ratio_mean"].item() == pytest.approx(mean, rel=1e-12)
    assert metrics["policy/ratio_sq_mean"].item() == pytest.approx(
        (math.exp(40.0) + math.exp(-40.0)) / 2, rel=1e-12
    )
    # alone, the lower clamp: log ρ = −25 is reported as e⁻²⁰
    small = _one_row([1.0], 1.0)
    small.logprobs = torch.tensor([[-25.0]], dtype=torch.float64, requires_grad=True)
    small.old_logprobs = torch.zeros(1, 1, dtype=torch.float64)
    _, metrics = get_loss("ppo")(small, dual_clip=None)
    assert metrics["policy/ratio_mean"].item() == pytest.approx(math.exp(-20.0), rel=1e-12)


def test_ppo_loss_defaults_clip_both_sides_at_point_two() -> None:
    # ρ = 0.75 and 1.25 with A = −1: max(0.75, 0.8) = 0.8 (clipped) and 1.25; mean 1.025
    loss, metrics = get_loss("ppo")(_one_row([0.75, 1.25], -1.0))
    assert loss.item() == pytest.approx((0.8 + 1.25) / 2)
    assert metrics["policy/clip_frac"].item() == pytest.approx(0.5)
    # A = +1: −0.75 and −1.2 (clipped)
    loss, _ = get_loss("ppo")(_one_row([0.75, 1.25], 1.0))
    assert loss.item() == pytest.approx((-0.75 - 1.2) / 2)


def test_entropy_metric_ignores_garbage_on_masked_tokens() -> None:
    # two real tokens with entropy 0.5 and 1.5 (token-mean → 1.0) and a masked slot
    # holding NaN (garbage a model may leave there)
    inp = _one_row([1.0, 1.0, 1.0], 1.0)
    inp.mask = torch.tensor([[True, True, False]])
    inp.weights = aggregation_weights(inp.mask, "token-mean", episode=inp.episode, turn=inp.turn)
    inp.entropy = torch.tensor([[0.5, 1.5, float("nan")]], dtype=torch.float64)
    loss, metrics = get_loss("ppo")(inp)
    assert loss.item() == pytest.approx(-1.0)
    assert metrics["policy/entropy"].item() == pytest.approx(1.0)
    _, metrics = get_loss("ppo")(_one_row([1.0], 1.0))
    assert "policy/entropy" not in metrics  # no entropy given: no metric


def test_unknown_ratio_level_lists_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match=r"^ppo: unknown ratio_level 'segment'; valid: token, turn, sequence$"
    ):
        get_loss("ppo")(_one_row([1.0], 1.0), ratio_level="segment")
