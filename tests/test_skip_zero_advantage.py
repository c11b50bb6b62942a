"""``optim.skip_zero_advantage``: leaving all-zero-advantage episodes out of the update
changes neither the gradient nor the optimizer step, and is refused where it would."""

from __future__ import annotations

import pytest
import torch

from credo.data import TokenBatch
from credo.policy import HFPolicy
from credo.train.config import ConfigError, load_config
from credo.train.parts import update_context
from credo.train.update import policy_update
from test_update import _batch as _update_batch
from test_update import _policy

#: episodes whose advantages are all 0 (a GRPO group of one outcome: episodes 2 and 3),
#: and one with a 0 on one row only (episode 5: it carries a gradient, so it stays whole)
ZERO_EPISODES = (2, 3)


def _batch(seed: int = 0) -> TokenBatch:
    batch = _update_batch(seed, episodes=8)
    batch.advantages += 0.05  # no row of the other episodes at exactly 0
    for ep in ZERO_EPISODES:
        batch.advantages[batch.episode == ep] = 0.0
    batch.advantages[torch.nonzero(batch.episode == 5).flatten()[0]] = 0.0
    return batch


def _update(
    policy: HFPolicy, opt: torch.optim.Optimizer, batch: TokenBatch, overrides: list[str]
) -> dict:
    # the same steps with and without skipping: the trust region (on by default) is its own
    # test's (tests/test_update_guard.py)
    cfg = load_config("grpo", ["sft.enabled=false", "optim.max_kl=null", *overrides])
    ctx = update_context(cfg, policy, opt)
    return policy_update(ctx, batch, iteration=0, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "setting",
    [
        ["optim.minibatches=1"],
        ["optim.epochs=2", "optim.minibatches=2"],  # π_old recomputed, then several steps
        [
            "optim.minibatches=2",
            "optim.micro_batch_rows=2",
            "objective.aggregation=seq-mean-token-mean",
        ],
        [
            "optim.minibatches=2",
            "objective.params.ratio_level=sequence",
            "objective.params.dual_clip=null",
        ],
        ["optim.minibatches=2", "objective.loss=holder", "objective.params={}"],
    ],
    ids=["one-step", "epochs-minibatches", "micro-seq-mean", "sequence-ratio", "holder"],
)
def test_skipping_gives_the_same_gradient_steps(setting: list[str]) -> None:
    # plain SGD at lr 1: each parameter change is the (clipped) gradient itself
    a, b = _policy(), _policy()
    ma = _update(a, torch.optim.SGD(a.model.parameters(), lr=1.0), _batch(), setting)
    mb = _update(
        b,
        torch.optim.SGD(b.model.parameters(), lr=1.0),
        _batch(),
        [*setting, "optim.skip_zero_advantage=true"],
    )
    moved = 0.0
    for pa, pb, p0 in zip(a.model.parameters(), b.model.parameters(), _policy().model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6, rtol=1e-5)
        moved += float((pa - p0).detach().abs().sum())
    assert moved > 1e-3  # a real step, not two frozen policies
    assert ma["loss/total"] == pytest.approx(mb["loss/total"], abs=1e-6)
    assert ma["policy/grad_norm"] == pytest.approx(mb["policy/grad_norm"], rel=1e-5)
    batch = _batch()
    skipped = sum(int((batch.episode == ep).sum()) for ep in ZERO_EPISODES) / len(batch)
    assert mb["policy/skipped_rows"] == pytest.approx(skipped)
    assert 0 < skipped < 0.5 and "policy/skipped_rows" not in ma


@pytest.mark.parametrize("zero_grad_step", [True, False])
def test_a_mini_batch_with_nothing_left_steps_as_a_zero_gradient_does(
    zero_grad_step: bool,
) -> None:
    """Leaving every row out changes nothing against keeping them: with
    ``optim.zero_grad_step=true`` AdamW still moves the weights on the zero gradient (its
    first moment from the earlier step) in both; with false (the default) neither steps,
    and the optimizer's step count stays at 1."""
    runs = []
    for skip in ("false", "true"):
        pol = _policy()
        opt = torch.optim.AdamW(pol.model.parameters(), lr=1e-3)
        one_step = [
            "optim.minibatches=1",
            f"optim.skip_zero_advantage={skip}",
            f"optim.zero_grad_step={str(zero_grad_step).lower()}",
        ]
        _update(pol, opt, _batch(), one_step)
        before = [p.detach().clone() for p in pol.model.parameters()]
        flat = _batch(1)
        flat.advantages.zero_()  # every group of one outcome
        m = _update(pol, opt, flat, one_step)
        assert int(next(iter(opt.state.values()))["step"]) == (2 if zero_grad_step else 1)
        moved = any(not torch.equal(p, q) for p, q in zip(before, pol.model.parameters()))
        assert moved == zero_grad_step
        assert m["policy/zero_grad_frac"] == 1.0
        runs.append((pol, m))
    (a, _), (b, mb) = runs
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    assert mb["policy/skipped_rows"] == 1.0


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["objective.kl_coef=0.1"], "objective.kl_coef = 0.1 (must be 0)"),
        (["objective.entropy_coef=0.01"], "objective.entropy_coef = 0.01 (must be 0)"),
        (
            ["objective.loss=klpo", "objective.params={}", "rollout.aux_samples=1"],
            "objective.loss=klpo",
        ),
    ],
)
def test_skipping_is_refused_where_zero_advantage_rows_carry_a_gradient(
    overrides: list[str], named: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("grpo", ["optim.skip_zero_advantage=true", *overrides])
    message = str(e.value)
    assert named in message and "\n" not in message
    assert "Accepted: loss ppo, holder, holder_token or ppo_rapo" in message
