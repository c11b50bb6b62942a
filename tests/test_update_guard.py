"""``optim.max_kl``: a step that moves the policy too far from the sampler is undone."""

from __future__ import annotations

import copy

import pytest
import torch

from credo.engines import fsdp
from credo.train import update as upd
from credo.train.config import ConfigError, load_config
from credo.train.parts import base as parts_base
from credo.train.parts import check_sharded, trust_region, update_context
from credo.train.update import UpdateContext, policy_update
from test_update import _batch, _policy


def _ctx(overrides: list[str], policy, opt=None):  # type: ignore[no-untyped-def]
    cfg = load_config("grpo", ["sft.enabled=false", "optim.lr=0.05", *overrides])
    opt = opt or torch.optim.AdamW(policy.model.parameters(), lr=cfg.optim.lr)
    return update_context(cfg, policy, opt)


def _update(ctx: UpdateContext, seed: int = 0) -> dict:
    return policy_update(ctx, _batch(), iteration=0, generator=torch.Generator().manual_seed(seed))


def _weights(policy) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    return [p.detach().clone() for p in policy.model.parameters()]


def _k3(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """k3 as ``policy/kl_sampler_*`` reads it: r − 1 − log r, r = p / q."""
    log_r = logp - logq
    return log_r.exp() - 1 - log_r


def test_a_loose_guard_changes_nothing_and_reports_the_kl_after_the_step() -> None:
    plain, guarded = _policy(), _policy()
    m0 = _update(_ctx(["optim.epochs=2", "optim.minibatches=2", "optim.max_kl=null"], plain))
    m1 = _update(_ctx(["optim.epochs=2", "optim.minibatches=2", "optim.max_kl=1e9"], guarded))
    for a, b in zip(plain.model.parameters(), guarded.model.parameters()):
        assert torch.equal(a, b)
    assert m1["policy/steps_kept"] == 4 and m1["policy/steps_undone"] == 0
    assert m0["loss/total"] == m1["loss/total"]
    # one step on the whole batch: the KL after it, by hand, over every loss token
    one = _policy()
    m = _update(_ctx(["optim.minibatches=1", "optim.max_kl=1e9"], one))
    batch = _batch()
    lp = upd.score_batch(one, batch, temperature=1.0, micro_rows=1000)
    mask = batch.loss_mask
    want = _k3(lp[mask], torch.full_like(lp[mask], -1.0)).mean()  # the sampler's: -1.0
    assert m["policy/kl_after_step"] == pytest.approx(float(want), rel=1e-5)
    assert m["policy/kl_after_step"] > 0


def test_a_step_past_the_bound_is_undone_weights_and_optimizer_state() -> None:
    pol = _policy()
    opt = torch.optim.AdamW(pol.model.parameters(), lr=0.05)
    _update(_ctx(["optim.max_kl=null"], pol, opt))  # the optimizer has moments to restore
    weights, state = _weights(pol), copy.deepcopy(opt.state_dict())
    m = _update(_ctx(["optim.minibatches=2", "optim.max_kl=1e-12"], pol, opt), seed=1)
    assert m["policy/steps_kept"] == 0 and m["policy/steps_undone"] == 1
    assert m["policy/kl_after_step"] > 1e-12
    for p, w in zip(pol.model.parameters(), weights):
        assert torch.equal(p, w)
    after = opt.state_dict()
    for k, v in state["state"].items():
        for name, t in v.items():
            assert torch.equal(torch.as_tensor(after["state"][k][name]), torch.as_tensor(t))


def test_the_crossing_step_is_undone_and_the_rest_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KLs after the steps of 0.01, then 0.5 with max_kl 0.1: the first step is kept,
    the second undone, and the last two of 2 epochs × 2 mini-batches are never taken."""
    pol = _policy()
    after_step: list[list[torch.Tensor]] = []
    step = upd._minibatch_step

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = step(*args, **kwargs)
        after_step.append(_weights(pol))
        return out

    kls = iter([0.01, 0.5, 0.0, 0.0])
    monkeypatch.setattr(upd, "_minibatch_step", recording)
    monkeypatch.setattr(trust_region, "_kl_after_step", lambda *a, **k: next(kls))
    m = _update(_ctx(["optim.epochs=2", "optim.minibatches=2", "optim.max_kl=0.1"], pol))
    assert len(after_step) == 2  # the third and fourth steps were skipped
    assert m["policy/steps_kept"] == 1 and m["policy/steps_undone"] == 1
    assert m["policy/kl_after_step"] == 0.5
    final = _weights(pol)
    assert all(torch.equal(a, b) for a, b in zip(final, after_step[0]))
    assert not all(torch.equal(a, b) for a, b in zip(final, after_step[1]))


def test_max_kl_values_are_refused_in_one_line_and_sharded_engines_leave_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for bad in ("0", "-0.5"):
        with pytest.raises(ConfigError, match=r"optim.max_kl must be a number > 0 or null"):
            load_config("grpo", [f"optim.max_kl={bad}"])
    for bad in ("true", "x"):
        with pytest.raises(ConfigError, match=r"optim.max_kl: expected a number"):
            load_config("grpo", [f"optim.max_kl={bad}"])
    default = load_config("grpo")
    assert default.optim.max_kl == 0.2  # on by default (docs/results.md#the-default-run)
    off = load_config("grpo", ["optim.max_kl=null"])
    assert "trust_region" in _names(default) and "trust_region" not in _names(off)
    fsdp.check_config(default)  # no longer refused: left off, with one line
    assert check_sharded(off, "accelerate's FSDP") == []
    [line] = check_sharded(default, "accelerate's FSDP")
    assert line.startswith("optim.max_kl=0.2 is off with accelerate's FSDP") and "null" in line
    monkeypatch.setattr(parts_base.dp, "sharded", lambda: True)
    assert "trust_region" not in _names(default)  # the part is not built on sharded state


def _names(cfg: object) -> list[str]:
    """The parts a run with ``cfg`` builds (the registry's answer, no part named)."""
    return [spec.name for spec in parts_base._configured(cfg)]


def test_the_first_step_undone_leaves_no_optimizer_state_and_buffers_are_reused() -> None:
    """Undoing the optimizer's first step removes the state that step created (AdamW's
    next step then starts from zero moments, as if it never ran), and every later
    snapshot copies into the buffers of the first (nothing allocated per step)."""
    pol = _policy()
    opt = torch.optim.AdamW(pol.model.parameters(), lr=0.05)
    weights = _weights(pol)
    m = _update(_ctx(["optim.max_kl=1e-12"], pol, opt))
    assert m["policy/steps_undone"] == 1 and len(opt.state) == 0
    assert all(torch.equal(p, w) for p, w in zip(pol.model.parameters(), weights))
    # undone, the next step equals a fresh optimizer's first step on the same weights
    fresh = _policy()
    fresh_opt = torch.optim.AdamW(fresh.model.parameters(), lr=0.05)
    _update(_ctx(["optim.max_kl=null"], fresh, fresh_opt))
    _update(_ctx(["optim.max_kl=null"], pol, opt))
    assert all(torch.equal(a, b) for a, b in zip(pol.model.parameters(), fresh.model.parameters()))
    # the same snapshot object, stepped 4 times: its buffers stay where they were
    snap = trust_region.Snapshot()
    params = list(pol.model.parameters())
    snap.take(params, opt)
    ptrs = [b.data_ptr() for b in snap.weights] + [
        t.data_ptr() for s in snap.state.values() for t in s.values()
    ]
    for seed in range(4):
        _update(_ctx(["optim.max_kl=null"], pol, opt), seed=seed)
        before = _weights(pol), copy.deepcopy(opt.state_dict())
        snap.take(params, opt)
        _update(_ctx(["optim.max_kl=null"], pol, opt), seed=seed + 10)
        snap.restore(params, opt)
        assert all(torch.equal(p, w) for p, w in zip(params, before[0]))
        now = opt.state_dict()["state"]
        for k, v in before[1]["state"].items():
            assert all(
                torch.equal(torch.as_tensor(now[k][n]), torch.as_tensor(t)) for n, t in v.items()
            )
    assert [b.data_ptr() for b in snap.weights] + [
        t.data_ptr() for s in snap.state.values() for t in s.values()
    ] == ptrs
