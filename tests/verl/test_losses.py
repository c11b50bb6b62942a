"""Policy losses through verl's ``get_policy_loss_fn`` equal credo's own losses.

verl calls a loss with ``old_log_prob``, ``log_prob``, ``advantages``, ``response_mask``,
``loss_agg_mode``, the actor config and ``rollout_is_weights``; the credo side gets the same
tensors as :class:`~credo.objectives.LossInputs` with credo's aggregation weights of the
same mode. Values and gradients must agree (float32 rounding).
"""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import ActorConfig

import credo.integrations.verl as plugin
from credo.objectives import LossInputs, aggregation_weights, get_loss

MODES = [
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
]


def _actor(**kw: float) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)


def _batch(seed: int, b: int = 7, width: int = 9, runs: bool = False) -> dict:
    """Random verl loss tensors; responses right-padded (one run per row) unless ``runs``.
    Row 2 has no token. Log-probs are < 0 (KLPO's binary KL needs 0 < p, q < 1)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (b,), generator=g)
    lengths[2] = 0
    mask = torch.arange(width)[None, :] < lengths[:, None]
    if runs:  # holes inside responses: several assistant turns per row
        mask &= torch.rand(b, width, generator=g) > 0.3
    old = -torch.nn.functional.softplus(torch.randn(b, width, generator=g)) - 0.05
    new = (old + 0.4 * torch.randn(b, width, generator=g)).clamp(max=-0.01)
    adv = torch.randn(b, width, generator=g)
    adv = torch.where(torch.rand(b, 1, generator=g) > 0.5, adv, adv.mean(1, keepdim=True))
    return {"old": old, "new": new, "adv": adv, "mask": mask}


def _via_verl(name: str, d: dict, mode: str, config: ActorConfig, is_w=None):
    lp = d["new"].clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(
        old_log_prob=d["old"],
        log_prob=lp,
        advantages=d["adv"],
        response_mask=d["mask"].float(),
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=is_w,
    )
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def _via_credo(loss_name: str, d: dict, mode: str, step: int = 0, **params):
    lp = d["new"].clone().requires_grad_(True)
    b = d["mask"].shape[0]
    episode, turn = torch.arange(b), torch.zeros(b, dtype=torch.long)
    inputs = LossInputs(
        logprobs=lp,
        old_logprobs=d["old"],
        advantages=d["adv"],
        mask=d["mask"],
        weights=aggregation_weights(d["mask"], mode, episode=episode, turn=turn),
        episode=episode,
        turn=turn,
        step=step,
    )
    loss, _ = get_loss(loss_name)(inputs, **params)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


CREDO_SIDE = {
    "credo_ppo": ("ppo", {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}),
    "credo_ppo_turn": ("ppo", {"clip_low": 0.2, "clip_high": 0.28, "ratio_level": "turn"}),
    "credo_holder": ("holder", {"clip_low": 0.2, "clip_high": 0.28}),
    "credo_holder_token": ("holder_token", {"clip_low": 0.2, "clip_high": 0.28}),
    "credo_klpo": ("klpo", {"kl": "binary"}),
    "credo_klpo_seq": ("klpo_seq", {"kl": "binary"}),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CREDO_SIDE))
@pytest.mark.parametrize("seed", [0, 1])
def test_losses_through_verl_equal_credo(name: str, mode: str, seed: int) -> None:
    d = _batch(seed)
    got, got_grad, metrics = _via_verl(name, d, mode, _actor(clip_ratio_high=0.28))
    loss_name, params = CREDO_SIDE[name]
    want, want_grad = _via_credo(loss_name, d, mode, **params)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)
    assert all(isinstance(v, float) for v in metrics.values())
    assert "actor/credo/policy/approx_kl" in metrics


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["plain", "global", "is_weights"])
def test_credo_ppo_equals_verl_vanilla(mode: str, case: str) -> None:
    d = _batch(3, runs=True)
    config_v = _actor(clip_ratio_low=0.15, clip_ratio_high=0.3, clip_ratio_c=2.5)
    config_c = _actor(clip_ratio_low=0.15, clip_ratio_high=0.3, clip_ratio_c=2.5)
    is_w = None
    if case == "global":  # this rank's share of a 2-rank global batch
        for cfg in (config_v, config_c):
            cfg.global_batch_info.update(
                dp_size=2, batch_num_tokens=80, global_batch_size=15, loss_scale_factor=12
            )
    if case == "is_weights":
        is_w = torch.rand(d["mask"].shape, generator=torch.Generator().manual_seed(9)) + 0.5
    want, want_grad, _ = _via_verl("vanilla", d, mode, config_v, is_w)
    got, got_grad, _ = _via_verl("credo_ppo", d, mode, config_c, is_w)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["credo_holder", "credo_ppo_turn", "credo_klpo"])
def test_micro_batches_add_up_with_global_batch_info(name: str) -> None:
    d = _batch(5, b=8, runs=True)
    mode = "seq-mean-token-mean"
    full, full_grad, _ = _via_verl(name, d, mode, _actor())
    tokens = int(d["mask"].sum())
    rows = int((d["mask"].sum(1) > 0).sum())
    total, grads = torch.zeros(()), []
    for part in (slice(0, 3), slice(3, 8)):
        config = _actor()
        config.global_batch_info.update(
            dp_size=1, batch_num_tokens=tokens, global_batch_size=rows, loss_scale_factor=None
        )
        piece = {k: v[part] for k, v in d.items()}
        loss, grad, _ = _via_verl(name, piece, mode, config)
        total = total + loss
        grads.append(grad)
    assert torch.allclose(total, full, rtol=1e-5, atol=1e-6)
    assert torch.allclose(torch.cat(grads), full_grad, rtol=1e-5, atol=1e-6)


def test_turn_ratio_splits_rows_into_assistant_turns() -> None:
    # one verl row holding two assistant turns = credo's turn ratio on the two turns as rows
    d = {
        "old": torch.tensor([[-1.0, -1.0, -9.0, -0.5, -0.5, -0.5]]),
        "new": torch.tensor([[-0.8, -1.1, -3.0, -0.6, -0.2, -0.4]]),
        "adv": torch.tensor([[1.0, 1.0, 0.0, -2.0, -2.0, -2.0]]),
        "mask": torch.tensor([[True, True, False, True, True, True]]),
    }
    got, got_grad, _ = _via_verl("credo_ppo_turn", d, "token-mean", _actor())
    split = {
        "old": torch.tensor([[-1.0, -1.0, 0.0], [-0.5, -0.5, -0.5]]),
        "new": torch.tensor([[-0.8, -1.1, 0.0], [-0.6, -0.2, -0.4]]),
        "adv": torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]]),
        "mask": torch.tensor([[True, True, False], [True, True, True]]),
    }
    want, want_grad = _via_credo("ppo", split, "token-mean", ratio_level="turn")
    assert torch.allclose(got, want, atol=1e-6)
    # turn 1's mean log-ratio is 0.05 → ratio e^0.05 inside [0.8, 1.2]: unclipped,
    # loss = −(2·1·e^0.05 + 3·(−2)·e^{(−0.1+0.3+0.1)/3}) / 5
    by_hand = -(2 * torch.exp(torch.tensor(0.05)) - 6 * torch.exp(torch.tensor(0.1))) / 5
    assert torch.allclose(got, by_hand, atol=1e-6)
    assert torch.allclose(got_grad[0, [0, 1, 3, 4, 5]], want_grad.flatten()[[0, 1, 3, 4, 5]])
    assert got_grad[0, 2] == 0


def test_holder_reads_the_training_step() -> None:
    d = _batch(4)
    try:
        plugin.set_training_step(250)  # linear_dec 1 → −1 over 500 steps: p = 0
        got, got_grad, metrics = _via_verl("credo_holder", d, "seq-mean-token-mean", _actor())
    finally:
        plugin.set_training_step(0)
    want, want_grad = _via_credo("holder", d, "seq-mean-token-mean", step=250)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)
    assert metrics["actor/credo/policy/holder_p"] == pytest.approx(0.0, abs=1e-7)
    step0, _, _ = _via_verl("credo_holder", d, "seq-mean-token-mean", _actor())
    assert not torch.allclose(step0, got)


def test_configure_overrides_the_actor_config() -> None:
    d = _batch(6)
    try:
        plugin.configure(losses={"credo_holder": {"schedule": "constant", "p": -1.0}})
        got, _, _ = _via_verl("credo_holder", d, "seq-mean-token-mean", _actor())
    finally:
        plugin.SETTINGS.loss_params.clear()
    want, _ = _via_credo("holder", d, "seq-mean-token-mean", schedule="constant", p=-1.0)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="shedule"):
        plugin.configure(losses={"credo_holder": {"shedule": "constant"}})
    with pytest.raises(KeyError, match="credo_holder"):
        plugin.configure(losses={"credo_hodler": {}})
