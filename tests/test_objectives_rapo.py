"""RAPO [recon]: the profile signal, its scaling, the asymmetric weights, the loss."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from _objectives_util import make_inputs
from credo.objectives import LossInputs, aggregation_weights, get_loss
from credo.objectives.rapo import rapo_signal, rapo_signal_range, rapo_token_weights

D = torch.float64
# raw signal m = profile − plain = (0, 1, 2) on row 0; row 1 is masked garbage
PROFILE = torch.tensor([[-1.0, -1.0, -0.5], [5.0, 5.0, 5.0]], dtype=D)
PLAIN = torch.tensor([[-1.0, -2.0, -2.5], [0.0, 0.0, 0.0]], dtype=D)
MASK = torch.tensor([[True, True, True], [False, False, False]])


def test_signal_scaling_by_hand():
    # min-max over the batch's unmasked tokens: (0, 1, 2) -> (0, 0.5, 1)
    m = rapo_signal(PROFILE, PLAIN, MASK)
    torch.testing.assert_close(m, torch.tensor([[0.0, 0.5, 1.0], [0.0, 0.0, 0.0]], dtype=D))
    torch.testing.assert_close(
        rapo_signal_range(PROFILE, PLAIN, MASK), torch.tensor([0.0, 2.0], dtype=D)
    )
    # an explicit range (e.g. of the whole mini-batch) replaces the batch's own: (0, 4)
    m = rapo_signal(PROFILE, PLAIN, MASK, value_range=torch.tensor([0.0, 4.0], dtype=D))
    torch.testing.assert_close(m[0], torch.tensor([0.0, 0.25, 0.5], dtype=D))
    # constant signal -> 0
    m = rapo_signal(PLAIN + 1.0, PLAIN, MASK)
    assert (m == 0).all()


def test_row_scaling():
    profile = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 9.0]], dtype=D)
    plain = torch.zeros(2, 3, dtype=D)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # row 0: (0, 1, 3) -> (0, 1/3, 1); row 1: constant (2, 2) -> 0
    m = rapo_signal(profile, plain, mask, scale="row")
    torch.testing.assert_close(m, torch.tensor([[0.0, 1 / 3, 1.0], [0.0, 0.0, 0.0]], dtype=D))


def test_token_weights_by_hand():
    m = torch.tensor([0.0, 0.5, 1.0], dtype=D)
    # γ = 1: A > 0 -> 1 + m = (1, 1.5, 2); A < 0 -> 1/(1 + m) = (1, 2/3, 1/2); A = 0 -> 1
    torch.testing.assert_close(
        rapo_token_weights(m, torch.ones(3, dtype=D), 1.0), torch.tensor([1.0, 1.5, 2.0], dtype=D)
    )
    torch.testing.assert_close(
        rapo_token_weights(m, -torch.ones(3, dtype=D), 1.0),
        torch.tensor([1.0, 2 / 3, 0.5], dtype=D),
    )
    torch.testing.assert_close(
        rapo_token_weights(m, torch.zeros(3, dtype=D), 1.0), torch.ones(3, dtype=D)
    )
    with pytest.raises(ValueError, match="gamma"):
        rapo_token_weights(m, m, -0.5)


def _inputs(adv: float) -> LossInputs:
    # row 0: 3 tokens with ratio 1 (log π = log π_old), so each PPO token loss is −A
    lp = torch.full((2, 3), -1.0, dtype=D, requires_grad=True)
    old = torch.full((2, 3), -1.0, dtype=D)
    ep, turn = torch.tensor([0, 1]), torch.tensor([0, 0])
    w = aggregation_weights(MASK, "token-mean", episode=ep, turn=turn)
    extras = {"ref_logprobs_profile": PROFILE, "ref_logprobs_plain": PLAIN}
    return LossInputs(lp, old, torch.full((2, 3), adv, dtype=D), MASK, w, ep, turn, extras=extras)


def test_ppo_rapo_by_hand():
    # A = +1: token losses −1 weighted (1, 1.5, 2), token-mean 1/3 -> −4.5/3 = −1.5
    inp = _inputs(1.0)
    loss, metrics = get_loss("ppo_rapo")(inp, gamma=1.0)
    assert loss.item() == pytest.approx(-1.5)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    # d(−w·A·ρ)/d log π = −w·ρ/3 at ρ = 1
    torch.testing.assert_close(g[0], torch.tensor([-1 / 3, -0.5, -2 / 3], dtype=D))
    assert metrics["policy/rapo_weight"].item() == pytest.approx(1.5)
    assert metrics["policy/rapo_signal"].item() == pytest.approx(0.5)
    # A = −1: token losses +1 weighted (1, 2/3, 1/2) -> (13/6)/3
    loss, _ = get_loss("ppo_rapo")(_inputs(-1.0), gamma=1.0)
    assert loss.item() == pytest.approx((1 + 2 / 3 + 0.5) / 3)


def test_gamma_zero_is_ppo():
    inp = make_inputs([3, 2, 4], [0, 1, 1], mode="token-mean", seed=2)
    a, _ = get_loss("ppo_rapo")(inp, gamma=0.0)
    b, _ = get_loss("ppo")(inp)
    torch.testing.assert_close(a, b)


def test_micro_batch_range_makes_batch_scaling_exact():
    inp = make_inputs([3, 2, 4], [0, 1, 2], mode="token-mean", seed=6)
    whole, _ = get_loss("ppo_rapo")(inp)
    parts = []
    for rows in (torch.tensor([0]), torch.tensor([1, 2])):
        part = replace(
            inp,
            logprobs=inp.logprobs[rows],
            old_logprobs=inp.old_logprobs[rows],
            advantages=inp.advantages[rows],
            mask=inp.mask[rows],
            weights=inp.weights[rows],
            episode=inp.episode[rows],
            turn=inp.turn[rows],
            entropy=None,
            extras={k: (v[rows] if v.dim() == 2 else v) for k, v in inp.extras.items()},
        )
        parts.append(part)
    with_range = sum(get_loss("ppo_rapo")(p)[0] for p in parts)
    torch.testing.assert_close(with_range, whole)
    # without the whole-batch range each micro-batch rescales on its own: not equal
    no_range = sum(
        get_loss("ppo_rapo")(
            replace(p, extras={k: v for k, v in p.extras.items() if k != "rapo_range"})
        )[0]
        for p in parts
    )
    assert not math.isclose(no_range.item(), whole.item(), rel_tol=1e-9)


def test_ppo_rapo_errors():
    inp = _inputs(1.0)
    with pytest.raises(ValueError, match="ref_logprobs_profile"):
        get_loss("ppo_rapo")(replace(inp, extras={}))
    with pytest.raises(ValueError, match="unknown scale"):
        get_loss("ppo_rapo")(inp, scale="episode")


def test_ppo_rapo_gradcheck():
    base = make_inputs([3, 2, 4], [0, 1, 1], mode="token-mean", spread=0.02, seed=8)

    def f(lp):
        return get_loss("ppo_rapo")(replace(base, logprobs=lp), gamma=0.7)[0]

    assert torch.autograd.gradcheck(f, (base.logprobs.detach().clone().requires_grad_(),))
