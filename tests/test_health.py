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
    # on the way, at iteration 8, the jump from 10 % also showed as a rising trend
    assert len(said) == 3 and said[1].startswith("warning: the invalid-action rate is rising")


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


# ------------------------------------------------------------ a run going wrong (issue 46)
def _series(key: str, values: list[float], **extra: object) -> list[dict]:
    return [{"iteration": it, key: v, **extra} for it, v in enumerate(values)]


def test_a_slowly_rising_invalid_rate_warns_long_before_95_percent() -> None:
    """Issue 46, item 8: a user's run climbed from 0.7 % to 34.7 % invalid actions over
    100 iterations without a word (the sign fires only at ≥ 95 %). Here: 0.7 % for 10
    iterations, then 0.4 points more per iteration. The 5-iteration average at iteration
    ``i`` ≥ 13 is 0.7 % + 0.4·(i − 11) %, first ≥ 15 points above its lowest (0.7 %, the
    window ending at iteration 4: later equal averages are not lower) at i = 49."""
    values = [0.007 if it < 10 else 0.007 + 0.004 * (it - 9) for it in range(100)]
    said: list[str] = []
    mon = HealthMonitor(load_config("grpo"), warn=said.append)
    fired = [
        it for it, rec in enumerate(_series("rollout/invalid_rate", values)) if mon.observe(rec)
    ]
    assert fired == [49]
    (msg,) = said
    assert msg.startswith(
        "warning: the invalid-action rate is rising: 15.9% on average over iterations "
        "45–49, up from 0.7% (its lowest 5-iteration average, up to iteration 4)."
    )
    assert "rollout.invalid_penalty" in msg and "objective.kl_coef" in msg
    # the causes follow the config: with a penalty and a KL term, those are not named
    mon = HealthMonitor(
        load_config("grpo", ["rollout.invalid_penalty=0.1", "objective.kl_coef=0.05"]),
        warn=said.append,
    )
    for rec in _series("rollout/invalid_rate", values):
        mon.observe(rec)
    assert "rollout.invalid_penalty" not in said[-1] and "kl_coef" not in said[-1]
    assert "optim.max_kl" in said[-1]


def test_a_noisy_but_level_invalid_rate_or_a_falling_entropy_says_nothing() -> None:
    import random

    rng = random.Random(0)
    said: list[str] = []
    mon = HealthMonitor(warn=said.append)
    for it in range(300):
        mon.observe(
            {
                "iteration": it,
                "rollout/invalid_rate": rng.uniform(0.05, 0.15),
                "policy/entropy": 1.5 * 0.99**it + rng.uniform(0.0, 0.05),
                "rollout/top_action": "search [ shoes ]",
                "rollout/top_action_share": 0.6,  # a valid action repeated is no sign
                "rollout/top_action_invalid": 0.0,
            }
        )
    assert said == []


def test_a_rising_entropy_warns() -> None:
    # 0.2 nats for 5 iterations, then +0.06 a step: the 5-average at i ≥ 8 is
    # 0.2 + 0.06·(i − 6); it must reach 2 × 0.2 and 0.2 + 0.5: first at i = 15 (0.74)
    values = [0.2 if it < 5 else 0.2 + 0.06 * (it - 4) for it in range(40)]
    said: list[str] = []
    mon = HealthMonitor(load_config("grpo", ["objective.entropy_coef=0.01"]), warn=said.append)
    fired = [it for it, rec in enumerate(_series("policy/entropy", values)) if mon.observe(rec)]
    assert fired == [15]
    assert said[0].startswith(
        "warning: the policy's entropy is rising: 0.74 nats per token on average over "
        "iterations 11–15, up from 0.2 (its lowest 5-iteration average, up to iteration 4)."
    )
    assert "objective.entropy_coef=0.01" in said[0]


def test_a_repeated_degenerate_action_warns_after_patience() -> None:
    said: list[str] = []
    mon = HealthMonitor(load_config("grpo"), patience=3, warn=said.append)
    bracket = {"rollout/top_action": "]", "rollout/top_action_invalid": 1.0}
    shares = [0.25, 0.3, 0.1, 0.25, 0.26, 0.347]  # iteration 2 breaks the streak
    for it, share in enumerate(shares):
        mon.observe({"iteration": it, "rollout/top_action_share": share, **bracket})
    (msg,) = said
    assert msg.startswith(
        "warning: the policy repeats an action the env rejects: ']' is 34.7% of the actions "
        "of iteration 5 (100% of them invalid), 3 iterations in a row."
    )
    assert "rollout.invalid_penalty" in msg and "rollout.max_new_tokens" in msg


def test_a_metric_that_is_not_a_number_warns_at_once_and_once() -> None:
    """Issue 46, item 7: a NaN entropy gave a NaN metric silently."""
    said: list[str] = []
    mon = HealthMonitor(warn=said.append)
    mon.observe({"iteration": 0, "policy/entropy": 1.0})
    mon.observe({"iteration": 1, "policy/entropy": float("nan"), "loss/total": float("inf")})
    mon.observe({"iteration": 2, "policy/entropy": float("nan")})
    assert len(said) == 2
    assert said[0].startswith("warning: policy/entropy is nan at iteration 1:")
    assert "logits hold inf or NaN" in said[0] and "model.dtype=float32" in said[0]
    assert said[1].startswith("warning: loss/total is inf at iteration 1:")


def test_a_resumed_run_warns_as_an_uninterrupted_one() -> None:
    values = [0.007 if it < 10 else 0.007 + 0.004 * (it - 9) for it in range(100)]
    records = _series("rollout/invalid_rate", values)
    whole: list[str] = []
    mon = HealthMonitor(warn=whole.append)
    for rec in records:
        mon.observe(rec)
    for cut in (3, 30, 49, 50, 80):  # killed after `cut` iterations, then resumed
        resumed: list[str] = []
        mon = HealthMonitor(warn=resumed.append)
        mon.replay(records[:cut])
        for rec in records[cut:]:
            mon.observe(rec)
        assert resumed == (whole if cut <= 49 else []), cut


def test_the_top_action_metrics_by_hand() -> None:
    from credo.data import Episode, RolloutForest, Step
    from credo.rollout import split_oracle
    from credo.train.iteration import top_action

    def ep(group: int, *actions: tuple[str, bool], source: str = "policy") -> Episode:
        return Episode(group, [Step("o", a, valid=v, source=source) for a, v in actions])

    episodes = [
        ep(0, ("click [ 2 ]", True), (" ] ", False), ("]", False)),
        ep(1, ("]", True), ("buy", True)),
        ep(2, ("]", True), source="oracle"),  # the oracle's actions are not the policy's
    ]
    rl_rows, _ = split_oracle(RolloutForest.from_episodes(episodes))
    # policy actions: click [ 2 ], ], ], ], buy → "]" 3 of 5, 2 of its 3 invalid
    assert top_action(rl_rows) == {
        "rollout/top_action": "]",
        "rollout/top_action_share": 0.6,
        "rollout/top_action_invalid": 2 / 3,
    }
    assert top_action(RolloutForest.from_episodes([])) == {}


def test_mixed_groups_count_the_groups_whose_returns_differ() -> None:
    """``rollout/mixed_groups``: group 0 mixes returns 1 and 0 (informative), group 1 is
    all 1, group 2 has returns 0.5 and 0.5 reached by different step rewards (uniform),
    group 3 mixes 0.5 and 0.25: two informative groups of four."""
    from credo.data import Episode, Step
    from credo.train.iteration import mixed_groups

    def ep(group: int, *rewards: float) -> Episode:
        steps = [Step(observation="o", action="a", reward=r) for r in rewards]
        return Episode(group=group, steps=steps, success=sum(rewards) == 1)

    eps = [ep(0, 1.0), ep(0, 0.0), ep(1, 1.0), ep(1, 0.5, 0.5), ep(2, 0.5), ep(2, 0.25, 0.25)]
    eps += [ep(3, 0.5), ep(3, 0.25)]
    assert mixed_groups(eps) == 2
    assert mixed_groups([]) == 0 and mixed_groups([ep(5, 1.0)]) == 0
