"""CAST's privileged-model labeller: a language model, shown what only the labeller may
know, labels each action (``label.labeller: model``; the rule labeller is ``rules``).

CAST labels past trajectories with a privileged (LLM) labeller. credo's rule labellers
(:mod:`~credo.critics.shop_rules`, :mod:`~credo.critics.tools_rules`) judge from the
env's state and oracle by hand-written rules; this one asks a model instead, so it
needs no rules, for any env that has an oracle. For each action, in the replayed state
it was taken in, the model reads

- the **privileged facts**: the goal (the env's ``instruction()``) and the action the
  env's oracle would take now (``oracle_action()``), and
- the step's context (the prompt the policy saw) and the action,

and answers one yes/no question per error class that the env can show
(:data:`ENV_CLASSES`; every class for other envs). Each answer is scored, as SERPO's
judge scores a rubric item, from the model's verdict-token probabilities, never a
sampled text (:class:`~credo.teachers.judge.Judge`): ``s_c = p_yes / (p_yes + p_no)``.
The label is the class with the largest ``s_c`` when it reaches ``threshold``, else
``ok``; an action equal to the oracle's is ``ok`` without asking (the oracle is
privileged, and never wrong by construction); the fix is the oracle's action. The
questions are :data:`QUESTIONS`.

Any causal LM can label: the packaged SmolLM2-135M-Instruct (``smollm2-135m``), an HF
folder or name, or a finished run's policy folder (a teacher). How far its labels agree
with the rules is measured by ``benchmarks/cast_labeller_agreement.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from credo.critics.labels import CLASSES, OK, StepLabel
from credo.teachers.rubric import Scorer

__all__ = ["ENV_CLASSES", "QUESTIONS", "ModelLabeller", "privileged_facts"]

#: The question asked for each error class (about ``Response``: the action).
QUESTIONS: dict[str, str] = {
    "invalid_action": "Is the action invalid here, so that the environment rejects it?",
    "wrong_query": "Does the action search for words other than the goal's?",
    "wrong_item": "Does the action open or buy an item that cannot satisfy the goal?",
    "wrong_size": "Does the action choose a size other than the goal's?",
    "premature_buy": "Does the action buy before the goal's size is chosen?",
    "unnecessary_backtrack": "Does the action go back although progress was possible here?",
    "unnecessary_step": "Is the action a valid step that does nothing toward the goal?",
    "wrong_tool": "Does the action call the wrong tool, or one the store rules forbid?",
    "wrong_argument": "Does the action use the wrong customer, order, amount or variant?",
    "premature_close": "Does the action close the ticket while requests are still open?",
}

#: The error classes each built-in env can show (the rules' classes); other envs: all.
ENV_CLASSES: dict[str, tuple[str, ...]] = {
    "shop": CLASSES[
        1 : CLASSES.index("unnecessary_step") + 1
    ],  # invalid_action .. unnecessary_step
    "tools": (
        "invalid_action",
        "unnecessary_step",
        "wrong_tool",
        "wrong_argument",
        "premature_close",
    ),
}


def privileged_facts(env: Any) -> tuple[str, str]:
    """``(goal, oracle action)`` in ``env``'s current state (``""`` where it has none);
    the oracle is asked without stepping the env."""
    goal = str(env.instruction()) if hasattr(env, "instruction") else ""
    oracle = str(env.oracle_action()) if hasattr(env, "oracle_action") else ""
    return goal, oracle


class ModelLabeller:
    """Labels an action by a model's yes/no verdicts (module docstring).

    Args:
        judge: scores ``(question, response, context)`` triples in [0, 1] (a
            :class:`~credo.teachers.judge.Judge` over the labelling model).
        classes: the error classes asked about (default: every class but ``ok``).
        threshold: the smallest score that makes an error label (default 0.5).
    """

    def __init__(
        self, judge: Scorer, classes: Sequence[str] | None = None, threshold: float = 0.5
    ) -> None:
        chosen = tuple(classes) if classes is not None else tuple(c for c in CLASSES if c != OK)
        unknown = [c for c in chosen if c not in QUESTIONS]
        if unknown or not chosen:
            raise ValueError(
                f"the model labeller asks about error classes of {', '.join(QUESTIONS)}; "
                f"got {list(chosen)}"
            )
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"the model labeller's threshold must be in (0, 1], got {threshold}")
        self.judge = judge
        self.classes = chosen
        self.threshold = threshold

    def __call__(self, env: Any, action: str, context: str) -> StepLabel:
        """The label of ``action`` in ``env``'s current state (the env is not stepped)."""
        goal, oracle = privileged_facts(env)
        if oracle and action.strip() == oracle.strip():
            return StepLabel(OK, "the oracle's own action", oracle)
        facts = f"Goal: {goal}. The correct next action is: {oracle}. The agent saw: {context}"
        questions = [QUESTIONS[c] for c in self.classes]
        scores = self.judge.scores(questions, [action] * len(questions), [facts] * len(questions))
        best = int(torch.argmax(scores))
        score = float(scores[best])
        if score < self.threshold:
            return StepLabel(
                OK, f"no error class reaches {self.threshold:g} (max {score:.2f})", oracle
            )
        error = self.classes[best]
        return StepLabel(error, f"model: p(yes) {score:.2f} that {QUESTIONS[error]}", oracle)
