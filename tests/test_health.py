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
