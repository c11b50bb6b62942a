"""Training CAST's critic on labelled steps: class-weighted cross-entropy, held-out split
by task.

Class weights balance ok against error first, then the error classes among themselves:
with n_ok ok steps, n_c steps of error class c, N steps in all and K_e error classes
present,

    w_ok = N / (2 · n_ok),        w_c = N / (2 · K_e · n_c)   (n_c > 0; 0 if absent),

so the ok actions and the errors each carry half of the total weight (N/2 each), and
every error class present carries an equal share of the errors' half. (Balancing all K
classes equally instead would leave the ok class 1/K of the weight and bias the critic
toward flagging: on noisy shop demonstrations that gave a 91 % false-alarm rate.) With
no ok steps or no errors the weights fall back to N / (K · n_c). The loss of a batch is
``Σ_i w_{y_i} · CE(logits_i, y_i) / Σ_i w_{y_i}`` (PyTorch's weighted mean).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from credo.critics.critic import Critic
from credo.critics.labeller import LabelledStep
from credo.critics.metrics import critic_metrics
from credo.utils.finite import check_step

__all__ = ["CriticStats", "class_weights", "evaluate_critic", "split_by_task", "train_critic"]


def class_weights(counts: Sequence[int]) -> torch.Tensor:
    """``[C]`` weights from the per-class counts ``[C]`` (class 0 is ``ok``): ok vs error
    balanced, then the error classes (module docstring)."""
    n = torch.as_tensor(counts, dtype=torch.float64)
    present = n > 0
    if not bool(present.any()):
        raise ValueError("class_weights: no labelled steps")
    total = n.sum()
    w = torch.zeros_like(n)
    errors = present.clone()
    errors[0] = False
    k_err = int(errors.sum())
    if n[0] > 0 and k_err > 0:
        w[0] = total / (2 * n[0])
        w[errors] = total / (2 * k_err * n[errors])
    else:
        w[present] = total / (int(present.sum()) * n[present])
    return w.float()


def split_by_task(
    labels: Sequence[LabelledStep], holdout: float, *, seed: int = 0
) -> tuple[list[LabelledStep], list[LabelledStep]]:
    """``(train, held_out)``: a task's steps all go to one side (no leakage of a task's
    pages into both). A task is held out when the hash of ``(seed, task_id)`` falls in
    the first ``holdout`` fraction."""
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")

    def held(task_id: str) -> bool:
        h = hashlib.blake2b(f"{seed}:{task_id}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "big") / 2**64 < holdout

    train = [x for x in labels if not held(x.task_id)]
    test = [x for x in labels if held(x.task_id)]
    return train, test


@dataclass
class CriticStats:
    """What :func:`train_critic` did: ``steps``, ``final_loss``, ``seconds``, the class
    ``weights`` used and the training ``counts`` per class."""

    steps: int
    final_loss: float
    seconds: float
    weights: list[float]
    counts: list[int]


def train_critic(
    critic: Critic,
    labels: Sequence[LabelledStep],
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
    weighting: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> CriticStats:
    """Fit ``critic`` (in place) to ``labels``: AdamW, class-weighted cross-entropy
    (:func:`class_weights`; ``weighting=False``: plain mean), batches drawn without
    replacement epoch by epoch.

    Raises:
        FloatingPointError: a step's loss or gradient norm is not finite (the step is not
            taken; :func:`credo.utils.finite.check_step`).
    """
    if not labels:
        raise ValueError("train_critic: no labelled steps")
    index = {c: i for i, c in enumerate(critic.classes)}
    y_all = torch.tensor([index[x.error] for x in labels], dtype=torch.long)
    counts = torch.bincount(y_all, minlength=len(critic.classes)).tolist()
    weights = class_weights(counts) if weighting else torch.ones(len(critic.classes))
    loss_fn = torch.nn.CrossEntropyLoss(weight=weights.to(critic.head.weight.device))
    opt = torch.optim.AdamW(critic.parameters(), lr=lr)
    rng = random.Random(seed)
    order: list[int] = []
    start, loss_val = time.perf_counter(), float("nan")
    critic.train()
    for step in range(steps):
        if len(order) < batch_size:
            fresh = list(range(len(labels)))
            rng.shuffle(fresh)
            order.extend(fresh)
        idx, order = order[:batch_size], order[batch_size:]
        ids, lengths = critic.encode(
            [labels[i].context for i in idx], [labels[i].action for i in idx]
        )
        loss = loss_fn(critic(ids, lengths), y_all[idx].to(critic.head.weight.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        check_step(
            loss,
            critic.parameters(),
            1.0,
            f"critic training step {step + 1} of {steps}",
            "Lower the critic's learning rate (lr)",
        )
        opt.step()
        loss_val = float(loss.detach())
        if on_step is not None:
            on_step(step, loss_val)
    critic.eval()
    return CriticStats(steps, loss_val, time.perf_counter() - start, weights.tolist(), counts)


def evaluate_critic(
    critic: Critic, labels: Sequence[LabelledStep], *, threshold: float | None = None
) -> dict[str, float]:
    """:func:`~credo.critics.metrics.critic_metrics` of the critic's flags (``p_flag ≥
    threshold``, default the critic's) on ``labels``, plus ``class_accuracy`` (the
    predicted class is the labelled one)."""
    thr = critic.threshold if threshold is None else threshold
    if not labels:
        return critic_metrics([], []) | {"class_accuracy": 0.0}
    probs = critic.probs([x.context for x in labels], [x.action for x in labels])
    flagged = (1.0 - probs[:, 0] >= thr).tolist()
    out = critic_metrics(flagged, [not x.ok for x in labels])
    pred = probs.argmax(-1).tolist()
    hits = sum(critic.classes[p] == x.error for p, x in zip(pred, labels))
    return out | {"class_accuracy": hits / len(labels)}
