"""Distillation objectives: opd, OPRD rewards, MT-SDPO, Rényi OPSD — hand values on tiny
vocabularies, masking, gradients, properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.objectives import (
    LossInputs,
    aggregation_weights,
    candidate_contexts,
    distill_row_reward,
    distill_token_reward,
    get_loss,
    mixed_target,
    mixture_logprobs,
    oprd_row_reward,
    oprd_token_reward,
    renyi_divergence,
    reverse_kl_sampled,
    reverse_kl_topk,
    select_contexts,
    verifier_agreement,
    verifier_mask,
)
from credo.objectives.oprd import combine_teachers, oprd_delta

D = torch.float64
LN2 = math.log(2.0)
# the worked 3-token example: student p, teacher q
P = [0.5, 0.25, 0.25]
Q = [0.25, 0.5, 0.25]
KL_PQ = 0.25 * LN2  # 0.5 ln(0.5/0.25) + 0.25 ln(0.25/0.5) + 0


def _log(x) -> torch.Tensor:
    return torch.tensor(x, dtype=D).log()


def _inputs(lp, old=None, *, mask=None, extras=None, mode="token-mean", adv=0.0) -> LossInputs:
    lp = torch.as_tensor(lp, dtype=D).clone().requires_grad_()
    old = lp.detach().clone() if old is None else torch.as_tensor(old, dtype=D)
    mask = torch.ones(lp.shape, dtype=torch.bool) if mask is None else torch.as_tensor(mask)
    ep = torch.arange(lp.shape[0])
    turn = torch.zeros(lp.shape[0], dtype=torch.long)
    w = aggregation_weights(mask, mode, episode=ep, turn=turn).to(D)
    a = torch.full(lp.shape, float(adv), dtype=D)
    return LossInputs(lp, old, a, mask, w, ep, turn, extras=extras or {})


# ------------------------------------------------------------------ reverse KL estimators
def test_reverse_kl_topk_by_hand() -> None:
    # full distribution (K = V): the exact KL; both tails sit at the floor
    assert reverse_kl_topk(_log(P), _log(Q)).item() == pytest.approx(KL_PQ, abs=1e-12)
    # teacher head = its top-1 token (id 1): head 0.25 ln(0.25/0.5), tail 0.75 ln(0.75/0.5)
    got = reverse_kl_topk(_log([0.25]), _log([0.5])).item()
    assert got == pytest.approx(0.75 * math.log(1.5) - 0.25 * LN2, abs=1e-12)
    assert got <= KL_PQ  # a lower bound (data processing)
    # a student log-prob of −inf contributes 0·log 0 = 0
    s = torch.tensor([float("-inf"), 0.0], dtype=D)
    assert reverse_kl_topk(s, _log([0.5, 0.5])).item() == pytest.approx(LN2)


def test_reverse_kl_sampled_by_hand() -> None:
    s, t = _log([0.5]), _log([0.25])
    assert reverse_kl_sampled(s, t, "k1").item() == pytest.approx(LN2)
    # k3 = r − 1 − log r, r = π_T/π_θ = 0.5
    assert reverse_kl_sampled(s, t, "k3").item() == pytest.approx(0.5 - 1 + LN2)
    with pytest.raises(ValueError, match="unknown kind 'k2'; valid: k1, k3"):
        reverse_kl_sampled(s, t, "k2")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-4, 4), min_size=3, max_size=5),
    st.lists(st.floats(-4, 4), min_size=5, max_size=5),
    st.integers(1, 5),
)
def test_topk_reverse_kl_is_a_lower_bound(zs: list[float], zt: list[float], k: int) -> None:
    v = len(zs)
    ps = torch.log_softmax(torch.tensor(zs, dtype=D), -1)
    pt = torch.log_softmax(torch.tensor(zt[:v], dtype=D), -1)
    exact = (ps.exp() * (ps - pt)).sum().item()
    head = pt.topk(min(k, v)).indices
    approx = reverse_kl_topk(ps[head], pt[head]).item()
    assert -1e-9 <= approx <= exact + 1e-9


def test_topk_reverse_kl_gradcheck() -> None:
    g = torch.Generator().manual_seed(0)
    t = torch.log_softmax(torch.randn(2, 5, generator=g, dtype=D), -1)[:, :3]
    z = torch.randn(2, 5, generator=g, dtype=D, requires_grad=True)

    def f(z: torch.Tensor) -> torch.Tensor:
        return reverse_kl_topk(torch.log_softmax(z, -1)[:, :3], t)

    assert torch.autograd.gradcheck(f, (z,))


# --------------------------------------------------------------------------- opd loss
def _topk_extras(student_heads, teacher_heads):
    s = torch.stack([torch.stack([_log(h) for h in row]) for row in student_heads])
    t = torch.stack([torch.stack([_log(h) for h in row]) for row in teacher_heads])
    return s.requires_grad_(), t


def test_opd_topk_loss_by_hand_and_masked_garbage() -> None:
    # one row, 3 positions; the third is masked and holds garbage in every extra
    s, t = _topk_extras([[P, Q, P]], [[Q, Q, Q]])
    with torch.no_grad():
        s[0, 2] = float("nan")
        t_bad = t.clone()
        t_bad[0, 2] = float("-inf")
    extras = {"student_topk_logprobs": s, "teacher_topk_logprobs": t_bad}
    inp = _inputs([[-1.0, -1.0, 5.0]], mask=[[True, True, False]], extras=extras)
    loss, metrics = get_loss("opd")(inp)
    # token-mean over 2 tokens: (KL(P‖Q) + KL(Q‖Q)) / 2
    assert loss.item() == pytest.approx(KL_PQ / 2, abs=1e-12)
    assert metrics["distill/reverse_kl"].item() == pytest.approx(KL_PQ / 2, abs=1e-12)
    assert metrics["distill/coverage"].item() == pytest.approx(1.0)
    loss.backward()
    assert s.grad is not None and bool(torch.isfinite(s.grad).all())
    assert bool((s.grad[0, 2] == 0).all())  # the masked token never enters
    # d/ds_v of Σ e^s (s − τ) at the full distribution (tails at the floor): e^s (s − τ + 1)/2
    want = torch.tensor(P, dtype=D) * (_log(P) - _log(Q) + 1) / 2
    torch.testing.assert_close(s.grad[0, 0], want)


def test_opd_topk_gradcheck_through_the_loss() -> None:
    g = torch.Generator().manual_seed(1)
    t = torch.log_softmax(torch.randn(2, 3, 6, generator=g, dtype=D), -1)[..., :4]
    z = torch.randn(2, 3, 6, generator=g, dtype=D, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])

    def f(z: torch.Tensor) -> torch.Tensor:
        s = torch.log_softmax(z, -1)[..., :4]
        inp = _inputs(torch.full((2, 3), -1.0), mask=mask, extras={
            "student_topk_logprobs": s, "teacher_topk_logprobs": t})  # fmt: skip
        return get_loss("opd")(inp, tail_floor=1e-9)[0]

    assert torch.autograd.gradcheck(f, (z,))


def test_opd_sampled_estimators_by_hand() -> None:
    teacher = torch.tensor([[-1.5, -1.0]], dtype=D)
    # k1, on-policy: loss = Σ w·k1·ρ with ρ = 1; k1 = (0.5, −1); token-mean → −0.25
    inp = _inputs([[-1.0, -2.0]], extras={"teacher_logprobs": teacher})
    loss, m = get_loss("opd")(inp, estimator="k1")
    assert loss.item() == pytest.approx(-0.25)
    assert m["distill/teacher_logprob"].item() == pytest.approx(-1.25)
    loss.backward()
    torch.testing.assert_close(inp.logprobs.grad, torch.tensor([[0.25, -0.5]], dtype=D))
    # k1 off-policy: the score-function surrogate is weighted by ρ = π_θ/π_old
    inp = _inputs([[-1.0, -2.0]], [[-1.2, -2.0]], extras={"teacher_logprobs": teacher})
    loss, _ = get_loss("opd")(inp, estimator="k1")
    assert loss.item() == pytest.approx((0.5 * math.exp(0.2) - 1.0) / 2)
    # k3 = r − 1 − log r, differentiated directly: d/dlp = 1 − r, r = e^{τ − lp}
    inp = _inputs([[-1.0, -2.0]], extras={"teacher_logprobs": teacher})
    loss, _ = get_loss("opd")(inp, estimator="k3")
    r = torch.tensor([math.exp(-0.5), math.exp(1.0)], dtype=D)
    assert loss.item() == pytest.approx(((r - 1 - r.log()).sum() / 2).item())
    loss.backward()
    torch.testing.assert_close(inp.logprobs.grad, ((1 - r) / 2)[None])


def test_opd_with_rl_and_row_mask() -> None:
    s, t = _topk_extras([[P, Q], [P, P]], [[Q, Q], [Q, Q]])
    extras = {"student_topk_logprobs": s, "teacher_topk_logprobs": t}
    lp, old = [[-1.0, -2.0], [-0.5, -1.5]], [[-1.1, -1.9], [-0.6, -1.5]]
    inp = _inputs(lp, old, extras=extras, adv=1.0)
    ppo, _ = get_loss("ppo")(inp)
    rl_only, _ = get_loss("opd")(inp, rl_coef=1.0, distill_coef=0.0)
    assert rl_only.item() == pytest.approx(ppo.item(), abs=1e-12)
    both, m = get_loss("opd")(inp, rl_coef=1.0, distill_coef=0.5)
    distill = (KL_PQ + 0 + 2 * KL_PQ) / 4  # token-mean over 4 tokens
    assert both.item() == pytest.approx(ppo.item() + 0.5 * distill, abs=1e-12)
    assert m["loss/policy"].item() == pytest.approx(both.item())
    assert "policy/clip_frac" in m
    # mt_sdpo is GRPO + β·KL over the same heads
    mt, _ = get_loss("mt_sdpo")(inp, beta=0.5)
    assert mt.item() == pytest.approx(both.item(), abs=1e-12)
    # rows without a teacher context contribute no distillation (weights not moved)
    extras["teacher_row_mask"] = torch.tensor([False, True])
    inp = _inputs(lp, old, extras=extras, adv=1.0)
    loss, m = get_loss("opd")(inp)
    assert loss.item() == pytest.approx(2 * KL_PQ / 4, abs=1e-12)
    assert m["distill/coverage"].item() == pytest.approx(0.5)


def test_opd_errors() -> None:
    s = torch.zeros(1, 2, 4, dtype=D)
    t = torch.zeros(1, 2, 5, dtype=D)
    inp = _inputs([[-1.0, -1.0]], extras={"student_topk_logprobs": s, "teacher_topk_logprobs": t})
    with pytest.raises(
        ValueError, match="teacher gives 5 log-probs per position but the student 4"
    ):
        get_loss("opd")(inp)
    with pytest.raises(ValueError, match=r"needs inputs.extras\['teacher_logprobs'\]"):
        get_loss("opd")(_inputs([[-1.0]]), estimator="k1")
    with pytest.raises(ValueError, match="unknown estimator 'mc'"):
        get_loss("opd")(_inputs([[-1.0]]), estimator="mc")
    with pytest.raises(ValueError, match="rl_coef must be finite and >= 0"):
        get_loss("opd")(_inputs([[-1.0]]), rl_coef=-1.0)


def test_distill_rewards_by_hand() -> None:
    s = torch.tensor([[-1.0, -2.0, 7.0], [-0.5, 3.0, 3.0]])
    t = torch.tensor([[-1.5, -1.0, float("nan")], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    r = distill_token_reward(s, t, mask, coef=2.0)
    torch.testing.assert_close(r, torch.tensor([[-1.0, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    r = distill_token_reward(s, t, mask, coef=2.0, clip=1.5)
    torch.testing.assert_close(r, torch.tensor([[-1.0, 1.5, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(distill_row_reward(s, t, mask), torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(
        distill_row_reward(s, t, mask, reduce="mean"), torch.tensor([0.25, 0.0])
    )
    with pytest.raises(ValueError, match="coef must be positive"):
        distill_token_reward(s, t, mask, coef=0.0)


# ------------------------------------------------------------------------------- OPRD
def test_oprd_rewards_by_hand() -> None:
    # two teachers, two rows of two tokens (the second row's last token is padding)
    rl = torch.tensor([[[-1.0, -1.0], [-2.0, 9.0]], [[-0.5, -3.0], [-1.0, 9.0]]])
    base = torch.tensor([[[-2.0, -1.5], [-1.0, 0.0]], [[-1.0, -1.0], [-3.0, 0.0]]])
    mask = torch.tensor([[True, True], [True, False]])
    delta = oprd_delta(rl, base, mask)
    torch.testing.assert_close(
        delta, torch.tensor([[[1.0, 0.5], [-1.0, 0.0]], [[0.5, -2.0], [2.0, 0.0]]])
    )
    acc = torch.tensor([True, True])
    # mean of the teachers, α = 2 (amplified)
    r = oprd_token_reward(rl, base, mask, acc, alpha=2.0)
    torch.testing.assert_close(r, torch.tensor([[1.5, -1.5], [1.0, 0.0]]))
    # the verifier rejects row 1: it gets nothing
    r = oprd_token_reward(rl, base, mask, torch.tensor([True, False]), alpha=2.0)
    torch.testing.assert_close(r, torch.tensor([[1.5, -1.5], [0.0, 0.0]]))
    # per-sample choice (likelihood): row 0 ← teacher 1, row 1 ← teacher 0
    r = oprd_token_reward(rl, base, mask, acc, combine="likelihood", choice=torch.tensor([1, 0]))
    torch.testing.assert_close(r, torch.tensor([[0.5, -2.0], [-1.0, 0.0]]))
    # first usable teacher; a row with no usable teacher gets nothing
    ok = torch.tensor([[False, False], [True, False]])
    r = oprd_token_reward(rl, base, mask, acc, combine="likelihood", teacher_ok=ok)
    torch.testing.assert_close(r, torch.tensor([[0.5, -2.0], [0.0, 0.0]]))
    r = oprd_token_reward(rl, base, mask, acc, teacher_ok=ok)  # mean over usable ones
    torch.testing.assert_close(r, torch.tensor([[0.5, -2.0], [0.0, 0.0]]))
    # one teacher as [B, L]; clip Δ; row sums
    r = oprd_token_reward(rl[0], base[0], mask, acc, alpha=3.0, clip=0.75)
    torch.testing.assert_close(r, torch.tensor([[2.25, 1.5], [-2.25, 0.0]]))
    torch.testing.assert_close(
        oprd_row_reward(rl[0], base[0], mask, acc), torch.tensor([1.5, -1.0])
    )
    torch.testing.assert_close(
        oprd_row_reward(rl[0], base[0], mask, acc, reduce="mean"), torch.tensor([0.75, -1.0])
    )
    d, has = combine_teachers(delta, combine="likelihood", choice=torch.tensor([-1, 1]))
    assert has.tolist() == [False, True] and d[0].abs().sum() == 0
    with pytest.raises(ValueError, match="alpha must be positive"):
        oprd_token_reward(rl, base, mask, acc, alpha=0.0)
    with pytest.raises(ValueError, match="unknown combine 'max'"):
        oprd_token_reward(rl, base, mask, acc, combine="max")
    with pytest.raises(ValueError, match="choice must hold teacher indices"):
        combine_teachers(delta, combine="likelihood", choice=torch.tensor([2, 0]))
    with pytest.raises(ValueError, match="needs teacher_ok"):
        combine_teachers(delta, combine="verifier")


def test_oprd_keeps_only_the_directions_the_verifier_supports() -> None:
    """By hand: two teachers, three rows (a success, a failure, a failure). Row shifts
    Σ_t Δ: teacher 0 (+1.5, −1.0, +0.5), teacher 1 (−1.5, +2.0, −0.25). A shift agrees
    with the verdict when it points up on a success and down on a failure."""
    rl = torch.tensor(
        [
            [[-1.0, -1.0], [-2.0, 9.0], [-1.0, -1.0]],
            [[-0.5, -3.0], [-1.0, 9.0], [-1.25, -1.0]],
        ]
    )
    base = torch.tensor(
        [
            [[-2.0, -1.5], [-1.0, 0.0], [-1.25, -1.25]],
            [[-1.0, -1.0], [-3.0, 0.0], [-1.0, -1.0]],
        ]
    )
    mask = torch.tensor([[True, True], [True, False], [True, True]])
    success = torch.tensor([True, False, False])
    delta = oprd_delta(rl, base, mask)
    torch.testing.assert_close(
        torch.where(mask[None], delta, 0.0).sum(-1),
        torch.tensor([[1.5, -1.0, 0.5], [-1.5, 2.0, -0.25]]),
    )
    agree = verifier_agreement(delta, mask, success)
    assert agree.tolist() == [[True, True, False], [False, False, True]]
    # accept: agree → every row, each with its agreeing teachers only (α = 2)
    every = verifier_mask(success, torch.ones(3, dtype=torch.bool), on="agree")
    assert every.tolist() == [True, True, True]
    r = oprd_row_reward(rl, base, mask, every, alpha=2.0, combine="verifier", teacher_ok=agree)
    torch.testing.assert_close(r, torch.tensor([3.0, -2.0, -0.5]))
    # the success is never pushed down, a failure never pushed up, whatever α
    for alpha in (1.0, 4.0, 100.0):
        r = oprd_row_reward(
            rl, base, mask, every, alpha=alpha, combine="verifier", teacher_ok=agree
        )
        assert r[0] >= 0 and bool((r[1:] <= 0).all())
    # without the filter (the mean over both teachers on every row) the success is
    # rewarded 0 and the first failure +1: the shift outranks the verifier
    r = oprd_row_reward(rl, base, mask, every, alpha=2.0)
    torch.testing.assert_close(r, torch.tensor([0.0, 1.0, 0.25]))
    # no direction (Δ = 0) does not agree; one teacher as [B, L]
    flat = verifier_agreement(torch.zeros(3, 2), mask, success)
    assert flat.tolist() == [[False, False, False]]
    with pytest.raises(ValueError, match="must be"):
        verifier_agreement(delta, mask, success[:2])


def test_the_oprd_recipe_keeps_a_sharp_teachers_shift_below_the_success_reward() -> None:
    """A sharp RL teacher gives a token it never picks log π^RL ≈ −20: summed and
    unclipped (the recipe before), one such token made a success's step reward −19.2,
    far below the success reward of 1 (on the ``shop/multi`` warm start it ranked a
    success below a failure in 16 of 17 mixed groups). The recipe clips Δ to [−1, 1]
    and takes the mean over the step's tokens: every step's reward is in [−α, α]; with
    ``accept: agree`` a success is never pushed down at all."""
    from credo.train.config import load_config

    o = load_config("oprd").teacher.oprd
    rl = torch.tensor([[-0.5, -20.5, -0.2]])  # Δ = +0.5, −20, +0.3 against the base
    base = torch.tensor([[-1.0, -0.5, -0.5]])
    mask, acc = torch.ones(1, 3, dtype=torch.bool), torch.tensor([True])
    assert (o.alpha, o.clip, o.reduce, o.accept) == (2.0, 1.0, "mean", "agree")
    before = oprd_row_reward(rl, base, mask, acc, alpha=o.alpha, reduce="sum")
    torch.testing.assert_close(before, torch.tensor([2.0 * -19.2]))
    now = oprd_row_reward(rl, base, mask, acc, alpha=o.alpha, clip=o.clip, reduce=o.reduce)
    torch.testing.assert_close(now, torch.tensor([2.0 * (0.5 - 1.0 + 0.3) / 3]))
    # accept: agree: this success's clipped shift points down (−0.2), so no teacher
    # agrees with the verifier and the step gets nothing, whatever α
    d = oprd_delta(rl, base, mask, clip=o.clip)
    ok = verifier_agreement(d, mask, torch.tensor([True]))
    assert ok.tolist() == [[False]]
    agreed = oprd_row_reward(
        rl, base, mask, acc, alpha=o.alpha, clip=o.clip, reduce=o.reduce,
        combine="verifier", teacher_ok=ok,
    )  # fmt: skip
    torch.testing.assert_close(agreed, torch.tensor([0.0]))


def test_verifier_mask_modes() -> None:
    success = torch.tensor([True, True, False, False])
    valid = torch.tensor([True, False, True, False])
    assert verifier_mask(success, valid).tolist() == [True, True, False, False]
    assert verifier_mask(success, valid, on="valid").tolist() == [True, False, True, False]
    assert verifier_mask(success, valid, on="success_and_valid").tolist() == [
        True,
        False,
        False,
        False,
    ]
    assert verifier_mask(success, valid, on="all").tolist() == [True] * 4
    with pytest.raises(ValueError, match="unknown verifier mode 'any'"):
        verifier_mask(success, valid, on="any")


# ---------------------------------------------------------------------------- MT-SDPO
def test_select_contexts_self_anchor_first() -> None:
    group = torch.tensor([0, 0, 0, 1, 1, 2, 3])
    success = torch.tensor([True, False, True, False, False, False, True])
    external = torch.tensor([1, 1, 0, 3])  # contexts 0, 1 for group 1; 2 for 0; 3 for 3
    c = select_contexts(group, success, external_group=external)
    # group 0 has verified rollouts: 0 ↔ 2 anchor on each other, 1 on the first (0);
    # group 1 has none: external context 0; group 2: nothing; group 3: its only success
    # may not anchor on itself and its group is verified, so no external either
    assert c.source.tolist() == [1, 1, 1, 2, 2, 0, 0]
    assert c.index.tolist() == [2, 0, 0, 0, 0, -1, -1]
    assert c.has_context.tolist() == [True, True, True, True, True, False, False]
    c = select_contexts(group, success, allow_self=True)
    assert c.source.tolist() == [1, 1, 1, 0, 0, 0, 1] and c.index.tolist()[6] == 6
    for seed in range(5):
        c = select_contexts(
            group, success, external_group=external, pick="random",
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        assert c.index[1].item() in (0, 2) and c.index[3].item() in (0, 1)
        assert c.index[0].item() == 2
    with pytest.raises(ValueError, match="unknown pick 'best'"):
        select_contexts(group, success, pick="best")


def test_candidate_contexts_every_verified_sibling_else_every_external() -> None:
    group = torch.tensor([0, 0, 0, 1, 1, 2, 3])
    success = torch.tensor([True, False, True, False, False, False, True])
    external = torch.tensor([1, 1, 0, 3])
    own, ext = candidate_contexts(group, success, external)
    # group 0: each of its samples reads every verified sibling (0 and 2), never itself
    assert own.nonzero().tolist() == [[0, 2], [1, 0], [1, 2], [2, 0]]
    # group 1 (no success) reads both of its external contexts; 0 and 3 have verified
    # samples, so their external contexts (2, 3) are never candidates; group 2: none
    assert ext.nonzero().tolist() == [[3, 0], [3, 1], [4, 0], [4, 1]]
    own, ext = candidate_contexts(group, success, None, allow_self=True)
    assert own[6, 6] and own[0].tolist() == [True, False, True, False, False, False, False]
    assert ext.shape == (7, 0)


def test_mixture_logprobs_by_hand() -> None:
    # row 0 reads two contexts with p(token) 0.2 and 0.6: the mixture gives 0.4;
    # row 1 reads one (0.3): exactly its log-prob; heads [C, B, 1, K] mix per id
    lp = torch.tensor([[[0.2], [0.3]], [[0.6], [0.9]]]).log()  # [C=2, B=2, L=1]
    present = torch.tensor([[True, True], [True, False]])
    out = mixture_logprobs(lp, present)
    assert torch.allclose(out.exp(), torch.tensor([[0.4], [0.3]]))
    assert out[1, 0] == lp[0, 1, 0]
    head = torch.tensor([[[[0.5, 0.5]]], [[[0.9, 0.1]]]]).log()  # [C=2, B=1, L=1, K=2]
    mixed = mixture_logprobs(head, torch.tensor([[True], [True]]))
    assert torch.allclose(mixed.exp(), torch.tensor([[[0.7, 0.3]]]))
    with pytest.raises(ValueError, match="every row needs at least one context"):
        mixture_logprobs(lp, torch.tensor([[True, False], [True, False]]))
    with pytest.raises(ValueError, match="present must be"):
        mixture_logprobs(lp, torch.ones(2, 3, dtype=torch.bool))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(0, 10_000))
def test_mixture_of_distributions_is_a_distribution(c: int, k: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(c, 3, 2, k, generator=g), -1)
    present = torch.rand(c, 3, generator=g) < 0.6
    present[0] = True
    mixed = mixture_logprobs(lp, present)
    assert torch.allclose(mixed.exp().sum(-1), torch.ones(3, 2), atol=1e-6)
    # between the smallest and the largest of the contexts it mixes
    keep = present[..., None, None]
    lo = torch.where(keep, lp, torch.inf).amin(0)
    hi = torch.where(keep, lp, -torch.inf).amax(0)
    assert bool((mixed >= lo - 1e-6).all() and (mixed <= hi + 1e-6).all())


# -------------------------------------------------------------------------- Rényi OPSD
def test_renyi_by_hand_and_rho_to_one() -> None:
    p, q = _log(P), _log(Q)
    # ρ = 2: log Σ p²/q = log(1 + 0.125 + 0.25); ρ = 1/2: −2 log Σ √(pq)
    assert renyi_divergence(p, q, 2.0).item() == pytest.approx(math.log(1.375))
    bc = 2 * math.sqrt(0.125) + 0.25
    assert renyi_divergence(p, q, 0.5).item() == pytest.approx(-2 * math.log(bc))
    assert renyi_divergence(p, q, 1.0).item() == pytest.approx(KL_PQ, abs=1e-15)
    # inside the switch the KL formula is used exactly; just outside, the log-space
    # formula agrees with it to first order in (ρ − 1)
    for rho in (1 - 1e-7, 1 + 5e-7):
        assert renyi_divergence(p, q, rho).item() == KL_PQ
    for eps in (2e-6, 1e-5, 1e-4, 1e-3):
        for rho in (1 - eps, 1 + eps):
            assert renyi_divergence(p, q, rho).item() == pytest.approx(KL_PQ, abs=5 * eps)
    assert renyi_divergence(p, p, 3.0).item() == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="rho must be positive"):
        renyi_divergence(p, q, 0.0)


def test_mixed_target_alpha_ends_and_middle() -> None:
    s, r = _log(P), _log(Q)
    torch.testing.assert_close(mixed_target(s, r, 0.0), r)
    torch.testing.assert_close(mixed_target(s, r, 1.0), s)
    # α = 1/2: the normalised geometric mean √(pq)
    g = torch.tensor([math.sqrt(a * b) for a, b in zip(P, Q)], dtype=D)
    torch.testing.assert_close(mixed_target(s, r, 0.5), (g / g.sum()).log())
    # a −inf in the ignored input cannot poison the ends
    bad = torch.tensor([float("-inf"), 0.0, 0.0], dtype=D)
    torch.testing.assert_close(mixed_target(s, bad, 1.0), s)
    with pytest.raises(
        ValueError, match="teacher gives 4 log-probs per position but the student 3"
    ):
        mixed_target(torch.zeros(2, 4, dtype=D), torch.zeros(2, 3, dtype=D), 0.5)


_dist = st.lists(st.floats(-5, 5), min_size=4, max_size=4)


@settings(max_examples=80, deadline=None)
@given(_dist, _dist, st.floats(0.1, 5.0), st.floats(0.1, 5.0))
def test_renyi_properties(zp: list[float], zq: list[float], r1: float, r2: float) -> None:
    p = torch.log_softmax(torch.tensor(zp, dtype=D), -1)
    q = torch.log_softmax(torch.tensor(zq, dtype=D), -1)
    lo, hi = sorted((r1, r2))
    d_lo, d_hi = renyi_divergence(p, q, lo).item(), renyi_divergence(p, q, hi).item()
    assert d_lo >= -1e-12 and d_hi >= -1e-12  # nonnegative
    assert d_lo <= d_hi + 1e-9  # nondecreasing in ρ
    assert abs(renyi_divergence(p, p, lo).item()) < 1e-12  # 0 for equal distributions
    if (p.exp() - q.exp()).abs().sum() > 1e-2 and lo >= 0.5:
        assert d_lo > 0  # ... and only then


def test_renyi_of_a_distribution_with_itself_is_zero_near_rho_1() -> None:
    """Found by hypothesis: at ρ = 0.99999 the rounding of p's normalisation (about 1e-16),
    divided by ρ − 1, gave D(p ‖ p) = −1.7e-11."""
    p = torch.log_softmax(torch.tensor([0.0, 0.0, 0.0, 2.0], dtype=D), -1)
    for rho in (0.99999, 1.00001, 0.999, 0.5, 2.0):
        assert renyi_divergence(p, p, rho).item() == 0.0


def test_renyi_of_close_distributions_near_rho_1_in_float32() -> None:
    """The log-space form divided a float32 logsumexp's rounding (about 1e-7) by ρ − 1:
    at ρ = 1 ± 1e-4 that is 1e-3, a thousand times D itself for a student close to its
    target. The expm1 form's error is relative to D."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 32, generator=g, dtype=D)
    p64 = torch.log_softmax(z, -1)
    q64 = torch.log_softmax(z + 1e-3 * torch.randn(64, 32, generator=g, dtype=D), -1)
    p32, q32 = p64.float(), q64.float()
    for rho in (1 - 1e-4, 1 + 1e-4, 1 - 1e-2, 1 + 1e-2, 0.91, 1.09):
        # reference: the log-space formula in float64 (its rounding, 1e-16 / |ρ − 1|,
        # is below 1e-11 here), the inputs being the float32 ones
        lse = torch.logsumexp(rho * p32.double() + (1 - rho) * q32.double(), -1)
        ref = (lse - torch.logsumexp(p32.double(), -1)) / (rho - 1)
        got = renyi_divergence(p32, q32, rho).double()
        assert ref.min() > 1e-8  # D is about 1e-7 here: close distributions
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-11)
    # the forms meet: just inside and just outside |ρ − 1| = 0.1
    for edge in (0.9, 1.1):
        a = renyi_divergence(p64, q64, edge - 1e-9)
        b = renyi_divergence(p64, q64, edge + 1e-9)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-14)


def test_renyi_gradcheck() -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.log_softmax(torch.randn(3, 4, generator=g, dtype=D), -1)
    z = torch.randn(3, 4, generator=g, dtype=D, requires_grad=True)
    for rho in (0.5, 0.95, 1.0, 1.0 + 1e-4, 2.0):  # each of the three forms
        assert torch.autograd.gradcheck(
            lambda z, rho=rho: renyi_divergence(torch.log_softmax(z, -1), q, rho), (z,)
        )


def test_renyi_opsd_loss() -> None:
    # student P and Q at two tokens; self-teacher Q, reference P; third token masked garbage
    s, t = _topk_extras([[P, Q, P]], [[Q, Q, Q]])
    ref = torch.stack([_log(P), _log(P), _log(P)])[None]
    with torch.no_grad():
        s[0, 2] = float("nan")
    extras = {"student_topk_logprobs": s, "teacher_topk_logprobs": t, "ref_topk_logprobs": ref}
    mask = [[True, True, False]]
    # α = 1, ρ = 1: KL(student ‖ self-teacher), token-mean
    loss, m = get_loss("renyi_opsd")(
        _inputs([[-1.0, -1.0, 0.0]], mask=mask, extras=extras), alpha=1.0
    )
    assert loss.item() == pytest.approx(KL_PQ / 2, abs=1e-12)
    # α = 0: the reference is the target; KL(Q ‖ P) at token 2 only
    kl_qp = 0.25 * math.log(0.5) + 0.5 * math.log(2.0)
    loss, m = get_loss("renyi_opsd")(
        _inputs([[-1.0, -1.0, 0.0]], mask=mask, extras=extras), alpha=0.0
    )
    assert loss.item() == pytest.approx(kl_qp / 2, abs=1e-12)
    assert m["distill/ref_kl"].item() == pytest.approx(kl_qp / 2, abs=1e-12)
    # ρ = 2 with α = 1: D_2(P ‖ Q) at token 1
    inp = _inputs([[-1.0, -1.0, 0.0]], mask=mask, extras=extras)
    loss, m = get_loss("renyi_opsd")(inp, alpha=1.0, rho=2.0)
    assert loss.item() == pytest.approx(math.log(1.375) / 2, abs=1e-12)
    assert m["distill/reverse_kl"].item() == pytest.approx(KL_PQ / 2, abs=1e-12)
    loss.backward()
    assert s.grad is not None and bool(torch.isfinite(s.grad).all())
    assert bool((s.grad[0, 2] == 0).all())
    extras["ref_topk_logprobs"] = torch.zeros(1, 3, 4, dtype=D)
    with pytest.raises(
        ValueError, match="teacher gives 4 log-probs per position but the student 3"
    ):
        get_loss("renyi_opsd")(_inputs([[-1.0, -1.0, 0.0]], mask=mask, extras=extras))


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("opd", {}),
        ("opd", {"estimator": "k1", "rl_coef": 1.0}),
        ("opd", {"estimator": "k3"}),
        ("mt_sdpo", {"beta": 0.3}),
        ("renyi_opsd", {"alpha": 0.3, "rho": 1.5}),
        ("renyi_opsd", {"alpha": 0.7, "rho": 0.5, "rl_coef": 0.5}),
    ],
)
def test_distill_losses_add_up_over_micro_batches(name: str, kwargs: dict) -> None:
    """Whole-batch weights: the loss and its gradient split exactly over row subsets."""
    g = torch.Generator().manual_seed(3)
    b, length, k = 4, 5, 3
    mask = torch.rand(b, length, generator=g) < 0.7
    mask[:, 0] = True
    lp = -torch.rand(b, length, generator=g, dtype=D) - 0.1
    old = lp + 0.1 * torch.randn(b, length, generator=g, dtype=D)
    z = torch.randn(b, length, 6, generator=g, dtype=D)
    ep, turn = torch.arange(b), torch.zeros(b, dtype=torch.long)
    w = aggregation_weights(mask, "token-mean", episode=ep, turn=turn).to(D)
    adv = torch.randn(b, 1, generator=g, dtype=D).expand(b, length)
    teacher = torch.log_softmax(torch.randn(b, length, 6, generator=g, dtype=D), -1)
    extras = {
        "teacher_logprobs": -torch.rand(b, length, generator=g, dtype=D),
        "teacher_topk_logprobs": teacher[..., :k],
        "ref_topk_logprobs": torch.log_softmax(torch.randn(b, length, k, generator=g, dtype=D), -1),
        "teacher_row_mask": torch.tensor([True, True, False, True]),
    }

    def run(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lp_leaf = lp[rows].clone().requires_grad_()
        z_leaf = z[rows].clone().requires_grad_()
        ex = {key: v[rows] for key, v in extras.items()}
        ex["student_topk_logprobs"] = torch.log_softmax(z_leaf, -1)[..., :k]
        inp = LossInputs(lp_leaf, old[rows], adv[rows], mask[rows], w[rows], ep[rows], turn[rows],
                         extras=ex)  # fmt: skip
        loss, _ = get_loss(name)(inp, **kwargs)
        loss.backward()
        grads = [x.grad if x.grad is not None else torch.zeros_like(x) for x in (lp_leaf, z_leaf)]
        return loss.detach(), grads[0], grads[1]

    whole = run(torch.arange(b))
    parts = [run(torch.tensor([0, 2])), run(torch.tensor([1, 3]))]
    assert (parts[0][0] + parts[1][0]).item() == pytest.approx(whole[0].item(), abs=1e-12)
    for i in (1, 2):
        torch.testing.assert_close(whole[i][[0, 2]], parts[0][i])
        torch.testing.assert_close(whole[i][[1, 3]], parts[1][i])
