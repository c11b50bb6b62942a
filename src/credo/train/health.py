"""Run health: warn when training cannot learn, and say why it probably cannot.

Two signs that a run is learning nothing, read from each iteration's metrics record
(``docs/metrics.md``):

- **no learning signal**: ``credit/zero_adv_frac`` = 1, every step's advantage is 0, so
  the policy-gradient loss and its gradient are 0. With group-relative estimators this
  happens when every episode of a group has the same return: all fail (the policy
  never succeeds), all succeed, or each task's episodes agree while tasks differ (a
  near-deterministic policy, groups too small to sample its alternatives), or the env's
  reward never varies;
- **the env rejects the model's actions**: ``rollout/invalid_rate`` ≥ 95 %.

:class:`HealthMonitor` counts consecutive iterations showing a sign and, after
``patience`` of them, emits one warning (once per sign per run) naming the likely causes
and what to change. The training loop feeds it every record
(``health.observe(record)``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HealthMonitor", "diagnose"]

#: ``rollout/invalid_rate`` at or above this counts as "the env rejects the actions".
INVALID_THRESHOLD = 0.95

#: ``credit/zero_adv_frac`` at or above this counts as "no learning signal".
ZERO_ADV_THRESHOLD = 1.0 - 1e-9


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _no_signal(record: dict[str, Any]) -> bool:
    """Every step's advantage is 0 in this record (``credit/zero_adv_frac`` = 1)."""
    return float(record.get("credit/zero_adv_frac", 0.0)) >= ZERO_ADV_THRESHOLD


def diagnose(
    record: dict[str, Any], cfg: Any = None, success_range: tuple[float, float] | None = None
) -> dict[str, str]:
    """The signs of a dead run in one metrics record, each with its likely causes.

    Args:
        record: an iteration's metrics (``credit/zero_adv_frac``, ``rollout/invalid_rate``,
            ``rollout/success_rate``).
        cfg: the run config, when known (it sharpens the causes: no warm start, a built-in
            or chat model).
        success_range: the lowest and highest ``rollout/success_rate`` over the iterations
            the sign has lasted (default: this record's alone). The causes of "all
            advantages are 0" depend on it: all failing, all succeeding, or each task's
            group of one outcome while tasks differ.

    Returns:
        ``{"zero_advantages": text, "invalid_actions": text}`` for the signs present.
    """
    out: dict[str, str] = {}
    sft_off = cfg is not None and not cfg.sft.enabled
    builtin = cfg is None or cfg.model.name is None
    success = float(record.get("rollout/success_rate", 0.0))
    lo, hi = success_range if success_range is not None else (success, success)
    if float(record.get("rollout/invalid_rate", 0.0)) >= INVALID_THRESHOLD:
        causes = [
            "step() rejects the text it receives: actions reach it detokenised, words and "
            "punctuation split by spaces (add[moss] arrives as 'add [ moss ]', unknown words "
            "dropped); parse with the spaces (`credo check-env --env ...` shows it)",
        ]
        if builtin:
            causes.append(
                "the built-in tokenizer lacks the action words: add vocabulary() (every word "
                "the env prints or accepts) or sample_action(rng)"
            )
        else:
            causes.append(
                "the chat model does not follow the action grammar: state it in "
                "action_format() and consider rollout.chat_examples"
            )
        causes.append(
            "no warm start"
            + (" (sft.enabled=false)" if sft_off else "")
            + ": an untrained model writes random words; add oracle_action() and keep "
            "sft.enabled=true"
        )
        out["invalid_actions"] = "; ".join(causes)
    if _no_signal(record):
        single = "rollout.group_size=1 with a group-relative estimator"
        if hi <= 0.0:
            out["zero_advantages"] = (
                "no episode succeeds, so every group's returns are equal (all 0): the loss "
                "and its gradient are 0. Likely causes: the policy never solves a task (no "
                "warm start"
                + (" — sft.enabled=false" if sft_off else "")
                + ", tasks too hard, actions rejected); the reward never varies (check "
                f"info['success'] and the reward on the final step); {single}. Try "
                "oracle_action() with the warm start, a partial reward for progress, or a "
                "larger rollout.group_size"
            )
        elif lo >= 1.0:
            out["zero_advantages"] = (
                "every episode succeeds, so there is nothing left to prefer: the loss and its "
                "gradient are 0. The policy solves these tasks; harder ones (the env's "
                f"difficulty, a curriculum) give a signal again. Also possible: {single}"
            )
        else:
            shown = f"{lo:.0%}" if lo == hi else f"{lo:.0%}–{hi:.0%}"
            out["zero_advantages"] = (
                f"some tasks succeed and others fail (success {shown}), but within each "
                "group every episode has the same return: the loss and its gradient are 0. "
                "The policy acts the same way on a task every time, right or wrong "
                "(policy/entropy near 0), so its groups never compare a success with a "
                "failure. Try a larger rollout.group_size or rollout.temperature, so that "
                "its rare other actions get sampled, or check that the reward depends on "
                f"the actions, not only on the task. Also possible: {single}"
            )
    return out


@dataclass
class HealthMonitor:
    """Warns once per sign when it persists for ``patience`` iterations.

    Attributes:
        cfg: the run config (sharper causes), or ``None``.
        patience: consecutive iterations a sign must last (default 3).
        warn: where warnings go (default: stderr).
        streaks: consecutive iterations each sign has lasted.
        warned: signs already reported.
        zero_adv_success: the lowest and highest training success rate over the current
            streak of all-zero advantages (``None`` outside one).
    """

    cfg: Any = None
    patience: int = 3
    warn: Callable[[str], None] = _stderr
    streaks: dict[str, int] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    zero_adv_success: tuple[float, float] | None = None

    def observe(self, record: dict[str, Any]) -> list[str]:
        """Take one iteration's record; returns (and emits) the warnings due now."""
        success = float(record.get("rollout/success_rate", 0.0))
        if _no_signal(record):  # the streak's success range decides the causes named
            lo, hi = self.zero_adv_success or (success, success)
            self.zero_adv_success = (min(lo, success), max(hi, success))
        else:
            self.zero_adv_success = None
        signs = diagnose(record, self.cfg, self.zero_adv_success)
        for sign in list(self.streaks):
            if sign not in signs:
                self.streaks[sign] = 0
        due = []
        for sign, causes in signs.items():
            self.streaks[sign] = self.streaks.get(sign, 0) + 1
            if self.streaks[sign] >= self.patience and sign not in self.warned:
                self.warned.add(sign)
                head = {
                    "zero_advantages": "all advantages are 0",
                    "invalid_actions": (
                        f"≥ {INVALID_THRESHOLD:.0%} of the actions are invalid "
                        f"({float(record.get('rollout/invalid_rate', 0.0)):.1%})"
                    ),
                }[sign]
                due.append(
                    f"warning: {head} for {self.streaks[sign]} iterations in a row (up to "
                    f"iteration {record.get('iteration', '?')}); training learns nothing like "
                    f"this. {causes}"
                )
        for message in due:
            self.warn(message)
        return due
