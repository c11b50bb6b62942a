"""Run health: warn when training cannot learn or is going wrong, and say why.

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
and what to change.

It also watches for a run that *was* learning and is going wrong, long before those
thresholds (a run drifted from 0.7 % to 34.7 % invalid actions in 100 iterations, a bare
``]`` repeated to the turn limit, without a word):

- **trends**: the ``window``-iteration moving average of ``rollout/invalid_rate`` rising
  :data:`INVALID_RISE` (absolute) above its lowest so far, or of ``policy/entropy``
  rising to :data:`ENTROPY_RISE_FACTOR` × its lowest and at least
  :data:`ENTROPY_RISE_NATS` above it;
- **a repeated degenerate action**: one action text making up at least
  :data:`REPEAT_SHARE` of an iteration's actions, at least :data:`REPEAT_INVALID` of its
  occurrences rejected by the env, for ``patience`` iterations
  (``rollout/top_action*``);
- **a metric that is not a number** (NaN or infinite ``policy/entropy``, say), at once;
- **a skipped iteration** (``rollout/skipped``: no episode had a single step, e.g. every
  agent of an agent run failed before calling the model), at once: the weights did not
  change, and a run where every iteration is so trains nothing.

Each warns once per run. The checks read the records only (a few numbers per
iteration): they are deterministic, change no metric and no training step. The training
loop feeds every record (``health.observe(record)``); a resumed run first replays the
records before its checkpoint silently (:meth:`HealthMonitor.replay`), so a run warns the
same whether or not it was interrupted.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HealthMonitor", "diagnose"]

#: ``rollout/invalid_rate`` at or above this counts as "the env rejects the actions".
INVALID_THRESHOLD = 0.95

#: ``credit/zero_adv_frac`` at or above this counts as "no learning signal".
ZERO_ADV_THRESHOLD = 1.0 - 1e-9

#: Iterations averaged by the trend checks.
TREND_WINDOW = 5
#: A rise of the averaged ``rollout/invalid_rate`` above its lowest that warns (absolute).
INVALID_RISE = 0.15
#: The averaged ``policy/entropy`` warns at this multiple of its lowest ...
ENTROPY_RISE_FACTOR = 2.0
#: ... when it is also this many nats per token above it.
ENTROPY_RISE_NATS = 0.5
#: Share of an iteration's actions one action text must reach to count as repeated.
REPEAT_SHARE = 0.2
#: Share of the repeated action's occurrences the env must reject to count as degenerate.
REPEAT_INVALID = 0.9


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
    """Warns once per sign when it persists for ``patience`` iterations, and once per run
    when a run goes wrong (a trend, a repeated degenerate action, a metric that is not a
    number; module docstring).

    Attributes:
        cfg: the run config (sharper causes), or ``None``.
        patience: consecutive iterations a sign must last (default 3).
        warn: where warnings go (default: stderr).
        streaks: consecutive iterations each sign has lasted.
        warned: signs already reported.
        zero_adv_success: the lowest and highest training success rate over the current
            streak of all-zero advantages (``None`` outside one).
        window: iterations averaged by the trend checks (default :data:`TREND_WINDOW`).
        recent: per watched metric, its last ``window`` ``(iteration, value)`` pairs.
        lowest: per watched metric, its lowest moving average so far and the iteration
            that average ended at.
        repeat_streak: consecutive iterations with a repeated degenerate action.
    """

    cfg: Any = None
    patience: int = 3
    warn: Callable[[str], None] = _stderr
    streaks: dict[str, int] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    zero_adv_success: tuple[float, float] | None = None
    window: int = TREND_WINDOW
    recent: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)
    lowest: dict[str, tuple[float, int]] = field(default_factory=dict)
    repeat_streak: int = 0

    def replay(self, records: Iterable[dict[str, Any]]) -> None:
        """Take the records of iterations already run (a resumed run's) without warning:
        their warnings were given when they ran; their trends carry on."""
        say, self.warn = self.warn, lambda _: None
        try:
            for record in records:
                self.observe(record)
        finally:
            self.warn = say

    def observe(self, record: dict[str, Any]) -> list[str]:
        """Take one iteration's record; returns (and emits) the warnings due now."""
        due = self._signs(record) + self._going_wrong(record) + self._skipped(record)
        for message in due:
            self.warn(message)
        return due

    def _signs(self, record: dict[str, Any]) -> list[str]:
        """The warnings of the signs of a run that learns nothing (module docstring)."""
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
        return due

    def _skipped(self, record: dict[str, Any]) -> list[str]:
        """The warning of the first iteration skipped for want of steps (once a run:
        later ones show in ``rollout/skipped``)."""
        if not record.get("rollout/skipped"):
            return []
        it = record.get("iteration", "?")
        failed = int(float(record.get("rollout/env_errors", 0)))
        return self._once(
            "skipped",
            f"warning: iteration {it} had no step to train on and was skipped (the weights "
            f"did not change): none of its episodes got a reply from the model ({failed} "
            "failed; their errors are logged above). With an agent (--agent), check that it "
            "calls the model through the client it is given before it can fail; every "
            "later skipped iteration counts in rollout/skipped",
        )

    # ---------------------------------------------------------------- going wrong
    def _once(self, sign: str, message: str | None) -> list[str]:
        if message is None or sign in self.warned:
            return []
        self.warned.add(sign)
        return [message]

    def _going_wrong(self, record: dict[str, Any]) -> list[str]:
        """The warnings of a run going wrong (module docstring): non-finite metrics,
        rising invalid-action rate or entropy, a repeated degenerate action."""
        it = int(record.get("iteration", 0))
        due: list[str] = []
        for key, value in record.items():
            if isinstance(value, float) and not math.isfinite(value):
                due += self._once(f"nonfinite:{key}", _nonfinite_message(key, value, it))
        invalid = self._trend("rollout/invalid_rate", record, it)
        if invalid is not None:
            (now, first, last), (low, low_at) = invalid
            if now - low >= INVALID_RISE:
                due += self._once(
                    "invalid_rising",
                    _invalid_rising_message(now, first, last, low, low_at, record, self.cfg),
                )
        entropy = self._trend("policy/entropy", record, it)
        if entropy is not None:
            (now, first, last), (low, low_at) = entropy
            if now >= ENTROPY_RISE_FACTOR * low and now - low >= ENTROPY_RISE_NATS:
                due += self._once(
                    "entropy_rising",
                    _entropy_rising_message(now, first, last, low, low_at, self.cfg),
                )
        share = record.get("rollout/top_action_share")
        rejected = record.get("rollout/top_action_invalid")
        degenerate = (
            isinstance(share, (int, float))
            and isinstance(rejected, (int, float))
            and share >= REPEAT_SHARE
            and rejected >= REPEAT_INVALID
        )
        self.repeat_streak = self.repeat_streak + 1 if degenerate else 0
        if degenerate and self.repeat_streak >= self.patience:
            due += self._once(
                "repeated_action", _repeated_message(record, self.repeat_streak, self.cfg)
            )
        return due

    def _trend(
        self, key: str, record: dict[str, Any], it: int
    ) -> tuple[tuple[float, int, int], tuple[float, int]] | None:
        """``((moving average, its first and last iteration), (lowest moving average so
        far, the last iteration of its window))`` of ``key``, once ``window`` finite
        values have been seen; ``None`` before (or when the record lacks the key)."""
        value = record.get(key)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        recent = self.recent.setdefault(key, deque(maxlen=self.window))
        recent.append((it, float(value)))
        if len(recent) < self.window:
            return None
        now = sum(v for _, v in recent) / len(recent)
        low = self.lowest.get(key)
        if low is None or now < low[0]:
            low = self.lowest[key] = (now, it)
        return (now, recent[0][0], it), low


def _setting(cfg: Any, section: str, name: str, default: Any = None) -> Any:
    return getattr(getattr(cfg, section, None), name, default) if cfg is not None else default


def _nonfinite_message(key: str, value: float, it: int) -> str:
    if key == "policy/entropy":
        causes = (
            "the policy's logits hold inf or NaN at some loss token: half precision "
            "overflowing (model.dtype=float32 avoids it) or weights diverging (lower "
            "optim.lr; a tighter optim.max_kl bounds each step)"
        )
    else:
        causes = (
            "a value it averages is not finite: an env reward or advantage out of range "
            "(credit/adv_abs_max, rollout/return_mean), or logits overflowing in half "
            "precision (model.dtype=float32)"
        )
    return (
        f"warning: {key} is {value} at iteration {it}: a metric that is not a number hides "
        f"what the run does. Likely causes: {causes}"
    )


def _window(first: int, last: int) -> str:
    return f"iterations {first}–{last}"


def _invalid_rising_message(
    now: float, first: int, last: int, low: float, low_at: int, record: dict[str, Any], cfg: Any
) -> str:
    top = record.get("rollout/top_action")
    rejected = record.get("rollout/top_action_invalid", 0.0)
    most = (
        f"; the most frequent action of iteration {last} is {top!r} "
        f"({record.get('rollout/top_action_share', 0.0):.1%} of the actions, "
        f"{rejected:.0%} of them invalid)"
        if isinstance(top, str) and isinstance(rejected, (int, float)) and rejected >= 0.5
        else ""
    )
    causes = []
    if not _setting(cfg, "rollout", "invalid_penalty", 0.0):
        causes.append(
            "an invalid action costs nothing beyond a failed episode "
            "(rollout.invalid_penalty=0), so nothing pushes its probability down while the "
            "failed episodes' other actions are pushed down and their probability moves "
            "onto it: set rollout.invalid_penalty, e.g. 0.1"
        )
    causes.append(
        "updates too large for the policy: lower optim.lr or optim.epochs, or bound each "
        "step tighter with optim.max_kl (default 0.2)"
    )
    if not _setting(cfg, "objective", "kl_coef", 0.0):
        causes.append(
            "nothing holds the policy near its warm start, whose actions were valid "
            "(objective.kl_coef=0): try objective.kl_coef=0.05"
        )
    return (
        f"warning: the invalid-action rate is rising: {now:.1%} on average over "
        f"{_window(first, last)}, up from {low:.1%} (its lowest {last - first + 1}-iteration "
        f"average, up to iteration {low_at}){most}. The policy is drifting into actions the "
        f"env rejects. Likely causes: {'; '.join(causes)}"
    )


def _entropy_rising_message(
    now: float, first: int, last: int, low: float, low_at: int, cfg: Any
) -> str:
    causes = [
        "updates too large for the policy: lower optim.lr or optim.epochs, or bound each "
        "step tighter with optim.max_kl (default 0.2)"
    ]
    bonus = _setting(cfg, "objective", "entropy_coef", 0.0)
    if bonus:
        causes.append(
            f"the entropy bonus outweighs the task (objective.entropy_coef={bonus:g}): lower it"
        )
    temperature = _setting(cfg, "rollout", "temperature", 1.0)
    if temperature > 1:
        causes.append(
            f"sampling above temperature 1 (rollout.temperature={temperature:g}) trains the "
            "policy on its own flattened distribution"
        )
    causes.append(
        "advantages without signal (credit/zero_adv_frac near 1) leave only noise to follow"
    )
    return (
        f"warning: the policy's entropy is rising: {now:.3g} nats per token on average over "
        f"{_window(first, last)}, up from {low:.3g} (its lowest {last - first + 1}-iteration "
        f"average, up to iteration {low_at}). The policy is getting more random, not more "
        f"decided. Likely causes: {'; '.join(causes)}"
    )


def _repeated_message(record: dict[str, Any], streak: int, cfg: Any) -> str:
    it = record.get("iteration", "?")
    causes = []
    if not _setting(cfg, "rollout", "invalid_penalty", 0.0):
        causes.append(
            "it costs nothing beyond a failed episode (rollout.invalid_penalty=0), so "
            "updates that push the failed episodes' other actions down move probability "
            "onto it: set rollout.invalid_penalty, e.g. 0.1"
        )
    causes.append(
        "updates too large (lower optim.lr or optim.max_kl), or nothing holding the policy "
        "near its warm start (objective.kl_coef)"
    )
    causes.append(
        "actions cut short by rollout.max_new_tokens "
        f"({_setting(cfg, 'rollout', 'max_new_tokens', None) or 'default'}): a cut action "
        "can end in a lone bracket"
    )
    return (
        f"warning: the policy repeats an action the env rejects: "
        f"{record.get('rollout/top_action')!r} is "
        f"{record.get('rollout/top_action_share', 0.0):.1%} of the actions of iteration {it} "
        f"({record.get('rollout/top_action_invalid', 0.0):.0%} of them invalid), "
        f"{streak} iterations in a row. Likely causes: {'; '.join(causes)}"
    )
