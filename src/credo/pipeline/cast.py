"""CAST's stages for ``credo pipeline``: ``label``, ``critic`` and ``critique_sft``.

Each wraps a stage function of :mod:`credo.commands.cast` (``docs/cast.md``):

- ``label`` (accepts ``policy:``, ``trajectories:``; makes ``labels``, ``trajectories``):
  every action of the trajectories (or of fresh rollouts of the policy) marked ok or an
  error type from privileged information;
- ``critic`` (needs ``labels:``, accepts ``policy:``; makes ``critic``): a critic trained
  on those labels, measured on held-out tasks' steps before and after training;
- ``critique_sft`` (needs ``labels:`` and ``policy:``; makes ``policy``): SFT on the
  successful steps plus the error steps rewritten with the critic's critique and the
  oracle's action.

An ``rl`` stage that holds ``critic: STAGE`` verifies every sampled action with that
critic (``critic.path``; the stage's ``critic.on_flag`` says what a flag does).
``pipelines/cast.yaml`` chains them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from credo.commands.cast import (
    BALANCE,
    CORRECTIONS_FROM,
    critic_stage,
    critique_sft_stage,
    label_stage,
)
from credo.pipeline.registry import StageContext, StageResult, register_stage

__all__ = ["CriticParams", "CritiqueParams", "LabelParams"]


def _rows(metrics: dict[str, float]) -> list[tuple[str, Any]]:
    return [(k, round(v, 4) if isinstance(v, float) else v) for k, v in sorted(metrics.items())]


@dataclass
class LabelParams:
    """Knobs of the ``label`` stage (without ``trajectories:``, it rolls the policy out).

    Attributes:
        tasks: training tasks to roll out, ``rollout.group_size`` episodes each (default 64).
        first_task: index of the first of them (default 0).
        seed: the rollouts' sampling seed (default 0).
        labeller: who labels: ``rules`` (default: the env's hand-written label rules) or
            ``model`` (a privileged model shown the goal and the oracle's next action,
            asked one yes/no question per error class; :mod:`credo.critics.model_labeller`).
        labeller_model: the model labeller's model: an alias (``smollm2-135m``), an HF
            folder or name, or a run's policy folder (default ``None``; required with
            ``model``).
        labeller_threshold: the model labeller's smallest verdict score p(yes)/(p(yes) +
            p(no)) that makes an error label (default 0.5).
    """

    tasks: int = 64
    first_task: int = 0
    seed: int = 0
    labeller: str = "rules"
    labeller_model: str | None = None
    labeller_threshold: float = 0.5

    def __post_init__(self) -> None:
        from credo.commands.cast import LABELLERS

        if self.labeller not in LABELLERS:
            raise ValueError(
                f"labeller must be one of {', '.join(LABELLERS)}, got {self.labeller!r}"
            )
        if self.labeller == "model" and not self.labeller_model:
            raise ValueError(
                "labeller: model needs labeller_model (an alias such as smollm2-135m, an HF "
                "folder or name, or a run's policy folder)"
            )
        if not 0.0 < self.labeller_threshold <= 1.0:
            raise ValueError(f"labeller_threshold must be in (0, 1], got {self.labeller_threshold}")


@register_stage(
    "label",
    accepts=("policy", "trajectories"),
    makes=("labels", "trajectories"),
    params=LabelParams,
)
def label(ctx: StageContext) -> StageResult:
    """:func:`credo.commands.cast.label_stage` in the stage folder."""
    p: LabelParams = ctx.params
    m = label_stage(
        ctx.cfg,
        ctx.folder,
        trajectories=ctx.inputs.get("trajectories"),
        policy=ctx.inputs.get("policy"),
        tasks=p.tasks,
        first_task=p.first_task,
        seed=p.seed,
        labeller=p.labeller,
        labeller_model=p.labeller_model,
        labeller_threshold=p.labeller_threshold,
    )
    summary = {"steps": m["label/steps"], "error_rate": m["label/error_rate"]}
    return StageResult(
        {"labels": "labels.jsonl", "trajectories": "trajectories.jsonl"}, _rows(m), summary
    )


@dataclass
class CriticParams:
    """Knobs of the ``critic`` stage (:func:`credo.commands.cast.critic_stage`).

    Attributes:
        steps, batch_size, lr: the critic's optimisation (defaults 300, 32, 1e-3).
        holdout: fraction of tasks whose steps are held out for the metrics (default 0.25).
        threshold: the saved critic's flag threshold on p(error) (default 0.5).
        weighting: class-weighted cross-entropy (default true).
        seed: the head's init, the batches and the split (default 0).
    """

    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    holdout: float = 0.25
    threshold: float = 0.5
    weighting: bool = True
    seed: int = 0


@register_stage(
    "critic", needs=("labels",), accepts=("policy",), makes=("critic",), params=CriticParams
)
def critic(ctx: StageContext) -> StageResult:
    """:func:`credo.commands.cast.critic_stage` in the stage folder."""
    p: CriticParams = ctx.params
    m = critic_stage(
        ctx.cfg,
        ctx.folder,
        labels=ctx.inputs["labels"],
        policy=ctx.inputs.get("policy"),
        steps=p.steps,
        batch_size=p.batch_size,
        lr=p.lr,
        holdout=p.holdout,
        threshold=p.threshold,
        weighting=p.weighting,
        seed=p.seed,
    )
    keys = ("precision", "recall", "false_alarm", "false_alarm_before")
    return StageResult({"critic": "critic"}, _rows(m), {k: m[f"critic/{k}"] for k in keys})


@dataclass
class CritiqueParams:
    """Knobs of the ``critique_sft`` stage (:func:`credo.commands.cast.critique_sft_stage`).

    Attributes:
        steps, batch_size, lr: the SFT (defaults 200, 32, 5e-4).
        corrections_from: ``all`` (default) or ``successful`` episodes' error steps, or
            ``none`` (behaviour rows only: rejection-sampling SFT, the control).
        critique_text: corrections read the critique before the context (default true);
            false keeps the fix and drops the critique (the ablation: imitation of the
            labeller's fixes alone).
        balance: ``equal`` (default: the smaller of behaviour rows and corrections is
            repeated to the larger's size, so that neither class swamps the other) or
            ``none`` (the rows as labelled; the earlier behaviour).
        episodes: held-out tasks evaluated before and after (default ``eval.episodes``).
        trials: episodes per held-out task (default 1); with ``ks``, pass^k.
        ks: the k of pass^k, each ≤ ``trials`` (default none).
        seed: the SFT's shuffling (default 0).
    """

    steps: int = 200
    batch_size: int = 32
    lr: float = 5e-4
    corrections_from: str = "all"
    critique_text: bool = True
    balance: str = "equal"
    episodes: int | None = None
    trials: int = 1
    ks: list[int] = field(default_factory=list)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.corrections_from not in CORRECTIONS_FROM:
            raise ValueError(
                f"corrections_from must be one of {', '.join(CORRECTIONS_FROM)}, "
                f"got {self.corrections_from!r}"
            )
        if self.balance not in BALANCE:
            raise ValueError(f"balance must be one of {', '.join(BALANCE)}, got {self.balance!r}")
        if not isinstance(self.critique_text, bool):
            raise ValueError(f"critique_text must be true or false, got {self.critique_text!r}")
        if any(not isinstance(k, int) or not 1 <= k <= self.trials for k in self.ks):
            raise ValueError(f"ks must be integers in [1, trials={self.trials}], got {self.ks}")


@register_stage(
    "critique_sft", needs=("labels", "policy"), makes=("policy",), params=CritiqueParams
)
def critique_sft(ctx: StageContext) -> StageResult:
    """:func:`credo.commands.cast.critique_sft_stage` in the stage folder."""
    p: CritiqueParams = ctx.params
    m = critique_sft_stage(
        ctx.cfg,
        ctx.folder,
        labels=ctx.inputs["labels"],
        policy=ctx.inputs["policy"],
        steps=p.steps,
        batch_size=p.batch_size,
        lr=p.lr,
        corrections_from=p.corrections_from,
        critique_text=p.critique_text,
        balance=p.balance,
        eval_episodes=p.episodes,
        trials=p.trials,
        ks=tuple(p.ks),
        seed=p.seed,
    )
    # the eval stage that follows gives the summary's success column with its interval
    summary = {k.replace("eval/", "held_out_"): v for k, v in m.items() if k.startswith("eval/")}
    return StageResult({"policy": "policy"}, _rows(m), summary)
