"""Run health warnings (credo.train.health): a run that learns nothing says so, and why."""

from __future__ import annotations

from credo.train.config import load_config
from credo.train.health import HealthMonitor, diagnose


def _rec(it: int, *, zero: float = 0.3, invalid: float = 0.1, success: float = 0.5) -> dict:
    return {
        "iteration": it,
        "credit/zero_adv_frac": zero,
        "rollout/invalid_rate": invalid,
        "rollout/success_rate": success,
    }


def test_healthy_records_give_no_signs() -> None:
    assert diagnose(_rec(0)) == {}
    assert diagnose(_rec(0, invalid=0.949, zero=0.999)) == {}


def test_signs_name_their_causes() -> None:
    cfg = load_config("grpo", ["sft.enabled=false"])
    signs = diagnose(_rec(0, zero=1.0, invalid=0.95, success=0.0), cfg)
    assert set(signs) == {"zero_advantages", "invalid_actions"}
    assert "no episode succeeds" in signs["zero_advantages"]
    assert "sft.enabled=false" in signs["zero_advantages"]
    assert "add [ moss ]" in signs["invalid_actions"]
    assert "vocabulary()" in signs["invalid_actions"]
    assert "every episode succeeds" in diagnose(_rec(0, zero=1.0, success=1.0))["zero_advantages"]


def test_warns_once_after_patience_consecutive_iterations() -> None:
    said: list[str] = []
    mon = HealthMonitor(patience=3, warn=said.append)
    assert mon.observe(_rec(0, zero=1.0, success=0.0)) == []
    assert mon.observe(_rec(1, zero=1.0, success=0.0)) == []
    assert mon.observe(_rec(2)) == []  # a healthy iteration breaks the streak
    assert mon.observe(_rec(3, zero=1.0, success=0.0)) == []
    assert mon.observe(_rec(4, zero=1.0, success=0.0)) == []
    due = mon.observe(_rec(5, zero=1.0, success=0.0))
    assert len(due) == 1 and due[0].startswith("warning: all advantages are 0 for 3 iterations")
    assert "up to iteration 5" in due[0]
    assert said == due
    assert mon.observe(_rec(6, zero=1.0, success=0.0)) == []  # once per sign per run
    for it in range(7, 10):
        out = mon.observe(_rec(it, invalid=0.99))
    assert len(out) == 1 and "99.0%" in out[0] and "invalid" in out[0]
    assert len(said) == 2


def test_the_zero_advantage_causes_follow_the_streaks_outcomes() -> None:
    """Measured on SmolLM2 (2026-12-02): success 0.75, 0.75, 1.0 with every group of one
    outcome. The warning read only the last record and said "every episode succeeds",
    with the causes of a policy that never succeeds."""
    said: list[str] = []
    mon = HealthMonitor(patience=3, warn=said.append)
    for it, success in enumerate((0.75, 0.75, 1.0)):
        mon.observe(_rec(it, zero=1.0, success=success))
    assert len(said) == 1
    assert "every episode succeeds" not in said[0]
    assert "success 75%–100%" in said[0] and "within each group" in said[0]
    assert "rollout.group_size or rollout.temperature" in said[0]
    assert "never solves" not in said[0]
    # all succeed for the whole streak: nothing left to prefer, harder tasks
    mon = HealthMonitor(patience=2, warn=said.append)
    mon.observe(_rec(0, zero=1.0, success=1.0))
    (msg,) = mon.observe(_rec(1, zero=1.0, success=1.0))
    assert "every episode succeeds" in msg and "harder" in msg and "never solves" not in msg
    # a healthy iteration resets the range: 0.0 then (break) 0.0, 0.0 is all-fail
    mon = HealthMonitor(patience=2, warn=said.append)
    mon.observe(_rec(0, zero=1.0, success=1.0))
    mon.observe(_rec(1))
    mon.observe(_rec(2, zero=1.0, success=0.0))
    (msg,) = mon.observe(_rec(3, zero=1.0, success=0.0))
    assert "no episode succeeds" in msg and "never solves" in msg
    # one record and no range: that record's outcome
    assert "success 50%" in diagnose(_rec(0, zero=1.0, success=0.5))["zero_advantages"]
