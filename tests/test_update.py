"""The trainer's policy update: micro-batching is exact, KL/entropy terms, step counts."""

from __future__ import annotations

import copy

import pytest
import torch

from credo.data import ForestBuilder, Step
from credo.policy import HFPolicy, TinyModelConfig, create_tiny_policy
from credo.train.config import load_config
from credo.train.parts import update_context
from credo.train.update import policy_update

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _batch(seed: int = 0, episodes: int = 6):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    b = ForestBuilder()
    for ep in range(episodes):
        parent = -1
        for t in range(1 + ep % 3):
            prompt = torch.randint(4, 30, (3 + t,), generator=g).tolist()
            resp = torch.randint(4, 30, (1 + (ep + t) % 3,), generator=g).tolist()
            parent = b.add(
                ep // 2,
                parent,
                Step(
                    "o",
                    "a",
                    reward=float(ep % 2),
                    prompt_ids=prompt,
                    response_ids=resp,
                    logprobs=[-1.0] * len(resp),
                ),
            )
        b.mark_success(parent, ep % 2 == 1)
    forest = b.build()
    adv = torch.linspace(-1, 1, forest.num_rows)
    return forest.to_batch(adv)


def _policy() -> HFPolicy:
    return create_tiny_policy([f"w{i}" for i in range(40)], SMALL, seed=0)


def _run(overrides: list[str], policy: HFPolicy, ref: HFPolicy | None = None) -> dict:
    # the update's arithmetic, without the trust region (tests/test_update_guard.py)
    cfg = load_config("grpo", ["sft.enabled=false", "optim.max_kl=null", *overrides])
    # plain SGD: the parameter change is the gradient itself (Adam would amplify rounding
    # noise on near-zero gradients)
    opt = torch.optim.SGD(policy.model.parameters(), lr=1.0)
    ctx = update_context(cfg, policy, opt, ref)
    return policy_update(ctx, _batch(), iteration=0, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "episode-mean"])
def test_micro_batches_give_the_same_step(aggregation: str) -> None:
    a, b = _policy(), _policy()
    ma = _run([f"objective.aggregation={aggregation}", "optim.micro_batch_rows=1000"], a)
    mb = _run([f"objective.aggregation={aggregation}", "optim.micro_batch_rows=2"], b)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6, rtol=1e-5)
    assert ma["loss/total"] == pytest.approx(mb["loss/total"], abs=1e-6)
    assert ma["policy/entropy"] == pytest.approx(mb["policy/entropy"], rel=1e-5)


def test_kl_to_an_identical_reference_is_zero_and_entropy_bonus_changes_the_step() -> None:
    pol = _policy()
    ref = HFPolicy(copy.deepcopy(pol.model), pol.tokenizer)
    m = _run(["objective.kl_coef=0.5", "optim.minibatches=1"], pol, ref)  # one step: π = π_ref
    assert m["loss/kl"] == pytest.approx(0.0, abs=1e-7)
    plain, bonus = _policy(), _policy()
    _run([], plain)
    _run(["objective.entropy_coef=0.1"], bonus)
    diff = sum(
        (p - q).abs().sum() for p, q in zip(plain.model.parameters(), bonus.model.parameters())
    )
    assert diff > 0


def test_epochs_and_minibatches_take_that_many_steps() -> None:
    pol = _policy()
    cfg = load_config(
        "grpo", ["sft.enabled=false", "optim.max_kl=null", "optim.epochs=2", "optim.minibatches=2"]
    )
    opt = torch.optim.AdamW(pol.model.parameters(), lr=1e-3)
    policy_update(
        update_context(cfg, pol, opt),
        _batch(),
        iteration=0,
        generator=torch.Generator().manual_seed(0),
    )
    state = next(iter(opt.state.values()))
    assert int(state["step"]) == 4


def test_zero_advantages_leave_the_policy_unchanged_with_token_ratios() -> None:
    pol = _policy()
    before = [p.detach().clone() for p in pol.model.parameters()]
    cfg = load_config("grpo", ["sft.enabled=false", "optim.max_kl=null"])
    opt = torch.optim.SGD(pol.model.parameters(), lr=1.0)
    batch = _batch()
    batch.advantages.zero_()
    policy_update(
        update_context(cfg, pol, opt),
        batch,
        iteration=0,
        generator=torch.Generator().manual_seed(0),
    )
    assert all(torch.equal(a, b) for a, b in zip(before, pol.model.parameters()))


def test_kl_reward_penalty_is_beta_times_the_summed_token_kl() -> None:
    from credo.objectives import kl_estimate
    from credo.train.parts.kl_penalty import kl_reward_penalty_rows
    from credo.train.update import score_batch

    pol, ref = _policy(), create_tiny_policy([f"w{i}" for i in range(40)], SMALL, seed=1)
    penalty = {"beta": 0.3, "estimator": "k3", "temperature": 1.0, "micro_rows": 4}
    batch = _batch()
    # rebuild the forest the batch came from: one row per sequence, in order
    from credo.data import ForestBuilder, Step

    b = ForestBuilder()
    for j in range(len(batch)):
        m = batch.attention_mask[j]
        ids = batch.input_ids[j][m].tolist()
        n_resp = int(batch.response_mask[j].sum())
        b.add(
            0,
            -1,
            Step(
                "o",
                "a",
                prompt_ids=ids[:-n_resp],
                response_ids=ids[-n_resp:],
                logprobs=[0.0] * n_resp,
            ),
        )
    forest = b.build()
    pen = kl_reward_penalty_rows(pol, ref, forest, **penalty)
    fb = forest.to_batch(torch.zeros(forest.num_rows))
    lp = score_batch(pol, fb, temperature=1.0, micro_rows=100)
    lr = score_batch(ref, fb, temperature=1.0, micro_rows=100)
    want = 0.3 * (kl_estimate(lp, lr, "k3") * fb.response_mask).sum(1)
    assert torch.allclose(pen, want, atol=1e-6) and bool((pen > 0).all())
    same = HFPolicy(copy.deepcopy(pol.model), pol.tokenizer)
    assert torch.allclose(
        kl_reward_penalty_rows(pol, same, forest, **penalty),
        torch.zeros(forest.num_rows),
        atol=1e-6,
    )


@pytest.mark.parametrize("minibatches", [1, 4])
def test_hpo_p_acts_only_when_the_ratio_differs_from_one(minibatches: int) -> None:
    """Issue 38: with one optimizer step per batch every ratio is 1, and the Hölder mean of
    ones is 1 for any p, so p = 1 (arithmetic), 0 (geometric) and −1 (harmonic) take the
    same step; with the default four mini-batch steps the later steps see ratios ≠ 1 and
    p changes the update."""
    params = {}
    for p in (1.0, 0.0, -1.0):
        pol = _policy()
        _run(
            [
                "objective.loss=holder",
                f"objective.params={{schedule: constant, p: {p}}}",
                "objective.aggregation=seq-mean-token-mean",
                f"optim.minibatches={minibatches}",
            ],
            pol,
        )
        params[p] = torch.cat([q.detach().flatten() for q in pol.model.parameters()])
    gaps = [float((params[p] - params[1.0]).abs().max()) for p in (0.0, -1.0)]
    if minibatches == 1:
        assert max(gaps) < 1e-6, gaps
    else:
        assert min(gaps) > 1e-4, gaps
