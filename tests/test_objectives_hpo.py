"""Hölder policy optimisation: the Hölder mean, its clipping rule, schedules, identities."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _objectives_util import make_inputs
from credo.objectives import LossInputs, aggregation_weights, get_loss
from credo.objectives.hpo import HOLDER_SCHEDULES, holder_p, log_holder_mean


def _row(ratios: list[float], adv: float, *, mode: str = "seq-mean-token-mean") -> LossInputs:
    """One row whose token ratios are ``ratios`` (old log-probs −1, new −1 + log r)."""
    n = len(ratios)
    old = torch.full((1, n), -1.0, dtype=torch.float64)
    lp = (old + torch.tensor([ratios], dtype=torch.float64).log()).requires_grad_()
    mask = torch.ones(1, n, dtype=torch.bool)
    ep, turn = torch.tensor([0]), torch.tensor([0])
    w = aggregation_weights(mask, mode, episode=ep, turn=turn)
    return LossInputs(lp, old, torch.full((1, n), adv, dtype=torch.float64), mask, w, ep, turn)


def _const(p: float) -> dict:
    return {"schedule": "constant", "p": p}


# --------------------------------------------------------------------------- the mean


def test_log_holder_mean_by_hand():
    lx = torch.tensor([[math.log(1.1), math.log(0.9)]], dtype=torch.float64)
    m = torch.ones(1, 2, dtype=torch.bool)
    seq = torch.tensor([0])

    def mean(p):
        return log_holder_mean(lx, m, p, seq, 1).exp().item()

    assert mean(1.0) == pytest.approx(1.0)  # (1.1 + 0.9)/2
    assert mean(0.0) == pytest.approx(math.sqrt(0.99))  # geometric
    assert mean(-1.0) == pytest.approx(0.99)  # harmonic: 2/(1/1.1 + 1/0.9)
    assert mean(2.0) == pytest.approx(math.sqrt((1.21 + 0.81) / 2))  # quadratic
    # p → 0 tends to the geometric mean
    assert mean(1e-4) == pytest.approx(math.sqrt(0.99), abs=1e-6)
    assert mean(-1e-4) == pytest.approx(math.sqrt(0.99), abs=1e-6)


def test_log_holder_mean_over_an_episode_of_rows():
    # episode = row 0 (ratio 2) + row 1 (ratios 4, 8); p = 1: (2 + 4 + 8)/3 = 14/3
    lx = torch.tensor([[math.log(2), 0.0], [math.log(4), math.log(8)]], dtype=torch.float64)
    m = torch.tensor([[True, False], [True, True]])
    out = log_holder_mean(lx, m, 1.0, torch.tensor([0, 0]), 1).exp()
    assert out.item() == pytest.approx(14 / 3)
    # p = −1: 3/(1/2 + 1/4 + 1/8) = 24/7
    out = log_holder_mean(lx, m, -1.0, torch.tensor([0, 0]), 1).exp()
    assert out.item() == pytest.approx(24 / 7)
    # a sequence without tokens gives 0 and no NaN gradient
    x = lx.clone().requires_grad_()
    out = log_holder_mean(
        x, torch.tensor([[True, False], [False, False]]), 2.0, torch.tensor([0, 1]), 2
    )
    assert out[1].item() == 0.0
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("p", [2.0, 0.3, 0.0, -1.5])
def test_log_holder_mean_gradcheck(p):
    g = torch.Generator().manual_seed(0)
    lx = 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    m = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]], dtype=torch.bool)
    seq = torch.tensor([0, 0, 1])
    assert torch.autograd.gradcheck(
        lambda x: log_holder_mean(x, m, p, seq, 2), (lx.clone().requires_grad_(),)
    )


# --------------------------------------------------------------------------- the loss


def test_holder_unclipped_by_hand():
    # ratios (1.1, 0.9), Ā = 2, p = 1: ρ = 1.0, loss = −2; dρ/d log r_t = r_t/2
    inp = _row([1.1, 0.9], 2.0)
    loss, metrics = get_loss("holder")(inp, **_const(1.0))
    assert loss.item() == pytest.approx(-2.0)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    torch.testing.assert_close(g, torch.tensor([[-1.1, -0.9]], dtype=torch.float64))
    assert metrics["policy/clip_frac"].item() == 0.0
    assert metrics["policy/holder_p"].item() == pytest.approx(1.0)
    # p = −1: ρ = 0.99, dρ/d log r_t = ρ² / r_t / 2 -> (0.4455, 0.5445); loss = −1.98
    inp = _row([1.1, 0.9], 2.0)
    loss, _ = get_loss("holder")(inp, **_const(-1.0))
    assert loss.item() == pytest.approx(-1.98)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    torch.testing.assert_close(g, torch.tensor([[-0.891, -1.089]], dtype=torch.float64))


@pytest.mark.parametrize(
    ("ratios", "adv", "loss", "grad", "clip"),
    [
        # ρ = (2 + 1)/2 = 1.5 > 1.2. A > 0: min(log ρ, log 1.2) -> −1.2, no gradient
        ([2.0, 1.0], 1.0, -1.2, [0.0, 0.0], 1.0),
        # A < 0: max(log ρ, clip) = log ρ -> +1.5, gradient −A·r_t/2 = (1.0, 0.5)
        ([2.0, 1.0], -1.0, 1.5, [1.0, 0.5], 1.0),
        # ρ = 0.5 < 0.8. A > 0: min keeps log ρ -> −0.5, gradient −r_t/2 = −0.25 each
        ([0.5, 0.5], 1.0, -0.5, [-0.25, -0.25], 1.0),
        # A < 0: max(log 0.5, log 0.8) = log 0.8 -> +0.8, no gradient
        ([0.5, 0.5], -1.0, 0.8, [0.0, 0.0], 1.0),
    ],
)
def test_holder_clipping_rule_by_hand(ratios, adv, loss, grad, clip):
    inp = _row(ratios, adv)
    got, metrics = get_loss("holder")(inp, **_const(1.0))
    assert got.item() == pytest.approx(loss)
    (g,) = torch.autograd.grad(got, inp.logprobs)
    torch.testing.assert_close(g, torch.tensor([grad], dtype=torch.float64))
    assert metrics["policy/clip_frac"].item() == clip  # the authors count leaving the range


def test_holder_token_clips_tokens_first():
    # ratios (2, 0.5), A = +1, p = 1. Token clip with min: (1.2, 0.5) -> mean 0.85,
    # loss −0.85; the clipped token has no gradient, the other −r/2 = −0.25.
    inp = _row([2.0, 0.5], 1.0)
    loss, metrics = get_loss("holder_token")(inp, **_const(1.0))
    assert loss.item() == pytest.approx(-0.85)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    torch.testing.assert_close(g, torch.tensor([[0.0, -0.25]], dtype=torch.float64))
    assert metrics["policy/clip_frac"].item() == 1.0  # both tokens left [0.8, 1.2]
    # the sequence-level variant sees ρ = 1.25 > 1.2 and clips the whole sequence
    seq_loss, _ = get_loss("holder")(_row([2.0, 0.5], 1.0), **_const(1.0))
    assert seq_loss.item() == pytest.approx(-1.2)
    # A = −1: max per token -> (2, 0.8), mean 1.4, loss +1.4; gradient (−A·2/2, 0) = (1, 0)
    inp = _row([2.0, 0.5], -1.0)
    loss, _ = get_loss("holder_token")(inp, **_const(1.0))
    assert loss.item() == pytest.approx(1.4)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    torch.testing.assert_close(g, torch.tensor([[1.0, 0.0]], dtype=torch.float64))


def test_sequence_clip_pushes_hardest_the_token_already_out_of_range():
    # The mechanism studies/hpo-clip-multi.yaml measured. Ratios (2, 0.9, 0.9, 0.9),
    # A = +1, p = 1: ρ = (2 + 2.7)/4 = 1.175 < 1.2, so `holder` clips nothing, and
    # d(−loss)/d log r_t = ρ · r_t^p / Σ_s r_s^p = r_t / 4: the token at ratio 2 gets
    # 0.5, each other 0.225 — the token already out of range is pushed hardest.
    # `holder_token` (and PPO's token clip) give it no gradient at all.
    inp = _row([2.0, 0.9, 0.9, 0.9], 1.0)
    loss, _ = get_loss("holder")(inp, **_const(1.0))
    assert loss.item() == pytest.approx(-1.175)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    torch.testing.assert_close(g, -torch.tensor([[0.5, 0.225, 0.225, 0.225]], dtype=torch.float64))
    inp = _row([2.0, 0.9, 0.9, 0.9], 1.0)
    loss, _ = get_loss("holder_token")(inp, **_const(1.0))
    assert loss.item() == pytest.approx(-(1.2 + 2.7) / 4)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    torch.testing.assert_close(g, -torch.tensor([[0.0, 0.225, 0.225, 0.225]], dtype=torch.float64))


def _reference(inp: LossInputs, p: float, eps: float = 0.2) -> torch.Tensor:
    """The authors' math-branch formula written out, one sequence at a time.

    mean_i max(−Ā_i ρ_i, −Ā_i clip(ρ_i)), ρ_i = (mean_t r_t^p)^(1/p) (geometric for p = 0).
    """
    out = []
    for i in range(inp.mask.shape[0]):
        r = torch.exp(inp.logprobs[i] - inp.old_logprobs[i])[inp.mask[i]]
        if r.numel() == 0:
            continue
        rho = torch.exp(torch.log(r).mean()) if p == 0 else r.pow(p).mean().pow(1 / p)
        a = inp.advantages[i][inp.mask[i]].mean()
        out.append(torch.maximum(-a * rho, -a * rho.clamp(1 - eps, 1 + eps)))
    return torch.stack(out).mean()


@pytest.mark.parametrize("p", [2.0, 1.0, 0.5, 0.0, -1.0, -2.0])
def test_holder_matches_the_power_mean_reference(p):
    inp = make_inputs(
        [3, 5, 1, 4, 0], [0, 1, 2, 3, 4], mode="seq-mean-token-mean", spread=0.4, seed=11
    )
    loss, _ = get_loss("holder")(inp, **_const(p))
    ref = _reference(inp, p)
    torch.testing.assert_close(loss, ref)
    (g,) = torch.autograd.grad(loss, inp.logprobs)
    (g_ref,) = torch.autograd.grad(ref, inp.logprobs)
    torch.testing.assert_close(g, g_ref)


def test_holder_p1_is_arithmetic_and_p0_is_gspo():
    inp = make_inputs([3, 5, 2], [0, 1, 2], mode="seq-mean-token-mean", spread=0.4, seed=2)
    # p = 0 with sequence clipping is GSPO: PPO at the sequence level, no dual clip
    hpo0, _ = get_loss("holder")(inp, **_const(0.0))
    gspo, _ = get_loss("ppo")(inp, ratio_level="sequence", dual_clip=None)
    torch.testing.assert_close(hpo0, gspo)
    # p → 0 approaches it continuously
    near0, _ = get_loss("holder")(inp, **_const(1e-5))
    torch.testing.assert_close(near0, hpo0, rtol=1e-4, atol=1e-6)
    # p = 1: the ratio metric is the arithmetic mean of the token ratios, per row
    _, metrics = get_loss("holder")(inp, **_const(1.0))
    ratios = torch.exp(inp.logprobs - inp.old_logprobs).detach()
    arith = torch.stack([ratios[i][inp.mask[i]].mean() for i in range(3)])
    assert metrics["policy/ratio_mean"].item() == pytest.approx(arith.mean().item())


def test_training_step_drives_p():
    inp = make_inputs(
        [3, 5, 2], [0, 1, 2], mode="seq-mean-token-mean", spread=0.4, seed=5, step=500
    )
    # default schedule linear_dec 1 -> −1 over 500 steps: at step 500 p = −1
    default, metrics = get_loss("holder")(inp)
    harmonic, _ = get_loss("holder")(inp, **_const(-1.0))
    torch.testing.assert_close(default, harmonic)
    assert metrics["policy/holder_p"].item() == pytest.approx(-1.0)
    start, _ = get_loss("holder")(replace(inp, step=0))
    arith, _ = get_loss("holder")(inp, **_const(1.0))
    torch.testing.assert_close(start, arith)


@pytest.mark.parametrize("name", ["holder", "holder_token"])
@pytest.mark.parametrize("p", [1.0, 0.0, -1.0, 1.7])
@pytest.mark.parametrize("unit", ["row", "episode"])
def test_holder_gradcheck(name, p, unit):
    mode = "seq-mean-token-mean" if unit == "row" else "episode-mean"
    base = make_inputs([2, 3, 1], [0, 0, 1], mode=mode, spread=0.05, seed=9)
    fn = get_loss(name)

    def f(lp):
        return fn(replace(base, logprobs=lp), unit=unit, **_const(p))[0]

    assert torch.autograd.gradcheck(f, (base.logprobs.detach().clone().requires_grad_(),))


# --------------------------------------------------------------------------- schedules

# p_max = 1, p_min = −1, S = 500; values at steps 0, 125, 250, 500 and 600 (past the end)
SCHEDULE_VALUES = {
    "linear": [-1.0, -0.5, 0.0, 1.0, 1.0],
    "linear_dec": [1.0, 0.5, 0.0, -1.0, -1.0],
    "sin": [-1.0, -math.cos(math.pi / 4), 0.0, 1.0, 1.0],  # −cos(πx)
    "cos": [1.0, math.cos(math.pi / 4), 0.0, -1.0, -1.0],  # cos(πx)
    "quad": [-1.0, -1.0 + 2 * 0.0625, -0.5, 1.0, 1.0],  # −1 + 2x²
    "quad_dec": [1.0, 1.0 - 2 * 0.0625, 0.5, -1.0, -1.0],  # 1 − 2x²
    "cubic": [-1.0, -0.125, 0.0, 1.0, 1.0],  # (2x − 1)³
    "cubic_dec": [1.0, 0.125, 0.0, -1.0, -1.0],
    "constant": [0.3] * 5,
}


@pytest.mark.parametrize("schedule", HOLDER_SCHEDULES)
def test_schedule_values(schedule):
    got = [holder_p(s, schedule=schedule, p=0.3) for s in (0, 125, 250, 500, 600)]
    assert got == pytest.approx(SCHEDULE_VALUES[schedule])


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([s for s in HOLDER_SCHEDULES if s != "constant"]),
    st.floats(-3, 3),
    st.floats(0.1, 4),
    st.integers(1, 1000),
)
def test_schedules_are_monotone_between_the_bounds(schedule, p_min, width, steps):
    p_max = p_min + width
    vals = [
        holder_p(s, schedule=schedule, p_max=p_max, p_min=p_min, schedule_steps=steps)
        for s in [*range(0, steps, max(1, steps // 50)), steps, steps + 7]
    ]
    diffs = [b - a for a, b in itertools.pairwise(vals)]
    rising = schedule in ("linear", "sin", "quad", "cubic")
    assert all(d >= -1e-12 for d in diffs) if rising else all(d <= 1e-12 for d in diffs)
    assert vals[0] == pytest.approx(p_min if rising else p_max)
    assert vals[-1] == pytest.approx(p_max if rising else p_min)


def test_errors():
    with pytest.raises(ValueError, match="unknown Hölder p schedule"):
        holder_p(0, schedule="exp")
    inp = _row([1.0, 1.0], 1.0)
    with pytest.raises(ValueError, match="unknown sequence unit"):
        get_loss("holder")(inp, unit="group")
    with pytest.raises(ValueError, match="clip bounds"):
        get_loss("holder")(inp, clip_low=1.0)


# ------------------------------------------------------------- extreme ratios (issue 17)


@pytest.mark.parametrize("name", ["holder", "holder_token"])
@pytest.mark.parametrize("adv", [-5.0, -1.0, 0.0, 1.0])
@pytest.mark.parametrize("p", [1.0, 0.0, -1.0])
@pytest.mark.parametrize("log_r", [100.0, 1000.0, -100.0])
def test_holder_is_finite_at_extreme_log_ratios_in_float32(name, adv, p, log_r):
    """float32 at log-ratio +100 gave +inf (Ā < 0) or NaN (Ā = 0) without a word; the
    Hölder log-ratio is now capped at +20 before ``exp``, like the PPO surrogate."""
    d = torch.float32
    old = torch.full((1, 3), -1.0, dtype=d)
    lp = (old + log_r).requires_grad_()
    mask = torch.ones(1, 3, dtype=torch.bool)
    ep, turn = torch.tensor([0]), torch.tensor([0])
    w = aggregation_weights(mask, "seq-mean-token-mean", episode=ep, turn=turn)
    inp = LossInputs(lp, old, torch.full((1, 3), adv, dtype=d), mask, w, ep, turn)
    loss, metrics = get_loss(name)(inp, **_const(p))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert all(torch.isfinite(v) for v in metrics.values()), metrics
    # by hand (one row, W = 1): Ā > 0 takes the clip (1.2 above, 0.8 below for Ā < 0 ...)
    if log_r > 0:
        expected = {1.0: -1.2, 0.0: 0.0}.get(adv, -adv * math.exp(20.0))
    else:  # log ρ = −100: Ā > 0 keeps it (exp ≈ 0), Ā < 0 takes max(log ρ, log 0.8)
        expected = {1.0: 0.0, 0.0: 0.0}.get(adv, -adv * 0.8)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert metrics["policy/ratio_mean"].item() == pytest.approx(
        math.exp(20.0) if log_r > 0 else 0.0, rel=1e-5, abs=1e-6
    )
