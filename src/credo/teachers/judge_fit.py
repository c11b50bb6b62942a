"""Fitting a judge: teach a causal LM's verdict token from labelled responses.

A judge scores a response by its probability of "yes" against "no"
(:class:`~credo.teachers.judge.Judge`): ``s = σ(d)``, with the verdict log-odds
``d = logsumexp_{v∈Y} z_v − logsumexp_{v∈N} z_v`` of the next-token logits after the
judge's prompt. A small judge whose verdicts are noise (the packaged SmolLM2-135M on
facts it has to check against the context: AUC ≈ 0.5, docs/rewards.md) becomes useful
once fitted on responses whose verdict is known: per example ``(question, context,
response, y)`` with ``y ∈ [0, 1]`` the loss is the binary cross-entropy of the
verdict::

    L = −[y·log σ(d) + (1 − y)·log(1 − σ(d))]    (mean over the batch)

The loss reads only the verdict's two sets of logits, after the judge's own prompt
(every weight of the model is trained), so the fitted model is scored exactly as before
(:meth:`Judge.scores`). Labels come from
where the truth is known: in credo's ``tools`` env, the hidden truth of messages on
*training* tasks (``benchmarks/serpo_agreement.py --fit-steps``); the judge is then
measured and used on held-out tasks it never saw.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from credo.teachers.judge import Judge
from credo.utils.finite import check_step

__all__ = ["JudgeExample", "fit_judge", "verdict_loss"]


@dataclass(frozen=True)
class JudgeExample:
    """One labelled verdict.

    Attributes:
        question: the rubric item asked.
        context: what the judge reads beside the response (e.g. the task, a transcript).
        response: the text judged.
        label: the verdict's truth in [0, 1] (1: "yes").
    """

    question: str
    context: str
    response: str
    label: float


def verdict_loss(margins: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean binary cross-entropy of verdict log-odds ``[N]`` against labels ``[N]``
    in [0, 1] (module docstring)."""
    if margins.shape != labels.shape:
        raise ValueError(f"verdict_loss: margins {tuple(margins.shape)} vs labels "
                         f"{tuple(labels.shape)}")  # fmt: skip
    return F.binary_cross_entropy_with_logits(margins, labels.to(margins.dtype))


def fit_judge(
    judge: Judge,
    examples: Sequence[JudgeExample],
    *,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 32,
    seed: int = 0,
) -> list[float]:
    """Fit ``judge``'s model on ``examples`` with Adam for ``steps`` batches drawn with
    replacement; returns each step's loss. The judge's cache is emptied (its verdicts
    changed).

    Raises:
        FloatingPointError: a step's loss or gradient norm is not finite (the step is not
            taken; :func:`credo.utils.finite.check_step`).
    """
    if steps < 0 or batch_size < 1 or not examples:
        raise ValueError(
            f"fit_judge needs examples, steps ≥ 0 and batch_size ≥ 1; got {len(examples)} "
            f"examples, steps={steps}, batch_size={batch_size}"
        )
    for ex in examples:
        if not 0.0 <= ex.label <= 1.0:
            raise ValueError(f"judge example labels must be in [0, 1], got {ex.label}")
    rng = random.Random(seed)
    prompts = [judge.prompt_ids(ex.question, ex.response, ex.context) for ex in examples]
    labels = torch.tensor([ex.label for ex in examples], dtype=torch.float32)
    model = judge.policy.model
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    was_training = model.training
    model.train()
    losses: list[float] = []
    try:
        for step in range(steps):
            idx = [rng.randrange(len(prompts)) for _ in range(batch_size)]
            margins = judge.margins([prompts[i] for i in idx])
            loss = verdict_loss(margins, labels[idx].to(margins.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            check_step(
                loss,
                model.parameters(),
                float("inf"),  # measured, not clipped
                f"judge fitting step {step + 1} of {steps}",
                "Lower the learning rate (lr)",
            )
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        model.train(was_training)
    judge.clear_cache()
    return losses
