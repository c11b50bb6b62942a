"""Where a policy goes wrong: the actions of an evaluation labelled by the env's label rule.

Success says how often a policy fails; this says how. Every action of the evaluated
episodes is replayed and labelled by the env's registered label rule
(:data:`credo.critics.labeller.LABEL_RULES`: ``shop``, ``tools``; the same privileged
rules CAST's critic learns from), and two tallies come out:

- **actions**: the share of all labelled actions in each class (``ok``, ``wrong_query``,
  ``wrong_item``, ``invalid_action``, ...);
- **first mistake**: for each failed episode, the class of its first action that is not
  ``ok`` (``none`` when every action was ``ok`` and the episode still failed, e.g. it ran
  out of turns). An episode usually fails for its first mistake: a wrong search leads to
  a wrong item, which the later counts would book as ``wrong_item``.

The failed episodes themselves come out too, each action with its label (``failures``):
the tallies say how often, these show the pattern (on ``shop/multi`` GRPO's weakest seed
re-opened an item it had found wanting, ``click[2] choose[xl] back click[2] ...``, until
its turns ran out, which no tally names).

``credo eval RUN --mistakes`` prints both tallies, ``--failures N`` the first N failed
episodes.

:func:`advantage_by_mistake` asks the question the other way round, of a credit
estimator: how much lower does it rate each kind of mistake than the right action of the
same verb (a wrong ``click`` against a right ``click``)? ``benchmarks/credit_signal.py
--by-mistake`` prints it for every estimator on one forest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from credo.critics.labeller import LABEL_RULES, LabelledStep, label_episodes
from credo.data import Episode

__all__ = [
    "advantage_by_mistake",
    "has_label_rule",
    "label_forest",
    "label_mistakes",
    "mistake_summary",
]


def has_label_rule(env_name: str) -> bool:
    """Whether env ``env_name`` has a registered label rule."""
    return env_name in LABEL_RULES


def mistake_summary(steps: Sequence[LabelledStep]) -> dict[str, Any]:
    """The two tallies of the module docstring from labelled steps (episode by episode,
    as :func:`~credo.critics.labeller.label_episodes` returns them).

    Returns:
        ``{"actions": {class: share of the labelled actions}, "failed": failed episodes,
        "first_mistake": {class: failed episodes whose first non-ok action has it},
        "failures": [{"task_id", "actions": [[action, class], ...]}, ...]}``, classes in
        decreasing order of count, zero counts left out; ``failures`` lists every failed
        episode in the order its first step comes, its actions in the order of its steps
        (turn order, as :func:`~credo.critics.labeller.label_episodes` gives them).
    """
    actions = Counter(s.error for s in steps)
    first: dict[int, str] = {}
    failures: dict[int, dict[str, Any]] = {}
    for s in steps:
        if not s.success:
            ep = failures.setdefault(s.episode, {"task_id": s.task_id, "actions": []})
            ep["actions"].append([s.action, s.error])
            if not s.ok:
                first.setdefault(s.episode, s.error)
    mistakes = Counter(first.get(e, "none") for e in failures)
    total = max(1, len(steps))
    return {
        "actions": {c: n / total for c, n in actions.most_common()},
        "failed": len(failures),
        "first_mistake": dict(mistakes.most_common()),
        "failures": list(failures.values()),
    }


def label_mistakes(
    env_name: str, make_env: Callable[[], Any], episodes: Sequence[Episode]
) -> dict[str, Any]:
    """:func:`mistake_summary` of ``episodes`` labelled by env ``env_name``'s label rule
    (replayed in fresh envs from ``make_env``)."""
    return mistake_summary(label_episodes(env_name, make_env, episodes))


def label_forest(
    env_name: str, make_env: Callable[[], Any], result: Any
) -> tuple[list[int], list[LabelledStep]]:
    """Label the actions of a sampler's output (a
    :class:`~credo.rollout.RolloutResult`) and name the forest row of each, so that a
    row's advantage meets its label.

    Returns:
        ``(rows, steps)``: ``steps[i]`` labels the action of forest row ``rows[i]``; a
        row that several branches share is labelled once per branch.

    Raises:
        ValueError: the result's episodes do not follow its forest's root-to-leaf paths.
    """
    ix = result.forest.episodes()
    episodes = [e for e in result.episodes if e.steps]  # those that failed at reset: no rows
    if len(episodes) != len(ix.leaf) or any(
        len(e.steps) != int(n) for e, n in zip(episodes, ix.length, strict=True)
    ):
        raise ValueError("the result's episodes do not follow its forest's paths")
    steps = label_episodes(env_name, make_env, episodes)
    return [int(ix.rows[int(ix.ptr[s.episode]) + s.t]) for s in steps], steps


def advantage_by_mistake(
    advantages: Sequence[float], errors: Sequence[str], verbs: Sequence[str]
) -> dict[tuple[str, str], dict[str, float]]:
    """The advantage an estimator gives each kind of action, against the right action
    of the same verb.

    For action ``i`` with label ``errors[i]`` (``"ok"`` or a mistake class) and verb
    ``verbs[i]`` (``click``, ``search``, ...), in units of σ, the standard deviation of
    all ``advantages`` (population; 1 where they are all equal), so that estimators of
    different scale compare::

        mean(v, c) = mean of A_i / σ over the actions with verb v and label c
        gap(v, c)  = mean(v, "ok") − mean(v, c)

    A credit estimator that tells a mistake from the right action gives it a large
    positive gap; GRPO, which scores whole episodes, separates them only as far as
    mistakes sit in worse episodes.

    Returns:
        ``{(verb, label): {"n", "mean", "negative", "gap"}}``: the count, the mean, the
        share of those actions with A < 0, and the gap (NaN for ``ok`` itself and for a
        verb without an ``ok`` action).
    """
    a = np.asarray(advantages, dtype=np.float64)
    if not len(a) == len(errors) == len(verbs):
        raise ValueError(
            f"advantages, errors and verbs differ in length: {len(a)}, {len(errors)}, {len(verbs)}"
        )
    sd = float(a.std()) if len(a) else 0.0
    z = a / (sd if sd > 0 else 1.0)
    cells: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(verbs, errors, strict=True)):
        cells.setdefault(key, []).append(i)
    out: dict[tuple[str, str], dict[str, float]] = {}
    for (verb, label), idx in cells.items():
        ok = cells.get((verb, "ok"))
        mean = float(z[idx].mean())
        gap = float(z[ok].mean()) - mean if ok is not None and label != "ok" else float("nan")
        out[(verb, label)] = {
            "n": float(len(idx)),
            "mean": mean,
            "negative": float((a[idx] < 0).mean()),
            "gap": gap,
        }
    return out
