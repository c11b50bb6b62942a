"""CAST's stages on a run's config: label → critic → critique-enriched SFT (and the
online verification that ``critic.path`` turns on, :mod:`credo.critics.verify`).

Each stage is a plain function ``stage(cfg, out_dir, **inputs) -> metrics``: it reads its
inputs (a trajectories or labels file, a policy or critic folder), writes its outputs
into ``out_dir`` atomically (files via temp + rename, folders written under a temporary
name and renamed) and returns a flat ``{name: float}`` metrics dict, which it also writes
to ``out_dir/<stage>_metrics.json``. A pipeline registers them as its ``label`` and
``critic`` stages (see ``docs/cast.md``); nothing here keeps state between calls.

===================  =====================================  ============================
stage                inputs                                 writes
===================  =====================================  ============================
:func:`label_stage`  a trajectories JSONL, or a policy      ``trajectories.jsonl``,
                     folder to roll out (default: the       ``labels.jsonl``,
                     config's warm start)                   ``label_metrics.json``
:func:`critic_stage` ``labels.jsonl``; optional policy       ``critic/`` (the critic
                     folder whose trunk the critic starts   folder), ``critic_metrics.
                     from                                   json``
:func:`critique_sft  ``labels.jsonl`` and the policy        ``policy/``,
_stage`              folder to fine-tune                    ``critique_sft_metrics.json``
===================  =====================================  ============================
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from credo.critics import (
    BALANCE,
    CLASSES,
    CORRECTIONS_FROM,
    LABELLERS,
    critic_from_policy,
    critique_examples,
    critique_rows,
    evaluate_critic,
    label_counts,
    label_episodes,
    load_labels,
    load_trajectories,
    make_labeller,
    new_critic,
    save_labels,
    save_trajectories,
    split_by_task,
    train_critic,
)
from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.train.config import Config
from credo.train.run import build_run
from credo.train.sft import sft_train
from credo.utils.atomic import write_text_atomic

__all__ = [
    "BALANCE",
    "CORRECTIONS_FROM",
    "LABELLERS",
    "critic_stage",
    "critique_sft_stage",
    "label_stage",
]


def _write_metrics(out_dir: Path, name: str, metrics: dict[str, Any]) -> None:
    write_text_atomic(out_dir / f"{name}_metrics.json", json.dumps(metrics, indent=1))


def _decode(tokenizer: Any) -> Any:
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def label_stage(
    cfg: Config,
    out_dir: str | Path,
    *,
    trajectories: str | Path | None = None,
    policy: str | Path | None = None,
    tasks: int = 64,
    first_task: int = 0,
    seed: int = 0,
    labeller: str = "rules",
    labeller_model: str | None = None,
    labeller_threshold: float = 0.5,
) -> dict[str, float]:
    """Label every action of stored trajectories (or of fresh rollouts) from privileged
    information (:func:`credo.critics.label_episodes`).

    Args:
        cfg: the run config (``env`` picks the env and its label rules; the rollouts use
            its sampler and ``rollout.group_size``).
        out_dir: where ``trajectories.jsonl``, ``labels.jsonl`` and
            ``label_metrics.json`` go (created if missing).
        trajectories: a trajectories JSONL (:mod:`credo.critics.trajectories`) to label;
            ``None``: roll out ``policy`` on training tasks ``first_task ..
            first_task + tasks − 1`` first.
        policy: the policy folder to roll out; ``None``: the config's warm start
            (trained, or loaded from the warm-start cache; ``sft.enabled=false``: the
            model as built).
        tasks: tasks to roll out (``rollout.group_size`` episodes each).
        first_task: index of the first training task.
        seed: the sampling seed of the rollouts.
        labeller: who labels: ``rules`` (the env's label rules) or ``model`` (a
            privileged model, :mod:`credo.critics.model_labeller`).
        labeller_model: the model labeller's model (an alias, an HF folder or name, or
            a run's policy folder).
        labeller_threshold: the model labeller's smallest verdict score for an error.

    Returns:
        ``label/steps``, ``label/errors``, ``label/error_rate``, ``label/episodes``,
        ``label/success_rate`` and ``label/n_<class>`` per class.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    who = make_labeller(
        labeller,
        cfg.env.name,
        model=labeller_model,
        threshold=labeller_threshold,
        device="cpu" if cfg.model.device == "auto" else cfg.model.device,
    )
    run = build_run(cfg, policy_path=Path(policy) if policy is not None else None)
    try:
        decode = _decode(run.policy.tokenizer)
        if trajectories is not None:
            episodes = load_trajectories(trajectories)
        else:
            pol = run.policy
            if policy is None and cfg.sft.enabled:
                from credo.train.warmstart import warm_start

                pol, _ = warm_start(run)
            batch = [Task.make("train", first_task + i) for i in range(tasks)]
            result = run.rollouts(pol, batch, generator=torch.Generator().manual_seed(seed))
            episodes = result.episodes
        save_trajectories(out / "trajectories.jsonl", episodes, decode=decode)
        renderer = run.renderer
        labels = label_episodes(
            cfg.env.name,
            run.make_env,
            episodes,
            decode=decode,
            render=lambda i, h, o: decode(renderer.prompt_ids(i, h, o)),
            labeller=who,
        )
    finally:
        run.close()
    save_labels(out / "labels.jsonl", labels)
    counts = label_counts(labels)
    errors = sum(n for c, n in counts.items() if c != "ok")
    metrics: dict[str, float] = {
        "label/steps": float(len(labels)),
        "label/errors": float(errors),
        "label/error_rate": errors / len(labels) if labels else 0.0,
        "label/episodes": float(len(episodes)),
        "label/success_rate": sum(e.success for e in episodes) / max(1, len(episodes)),
        **{f"label/n_{c}": float(n) for c, n in counts.items()},
    }
    _write_metrics(out, "label", metrics)
    return metrics


def critic_stage(
    cfg: Config,
    out_dir: str | Path,
    *,
    labels: str | Path,
    policy: str | Path | None = None,
    steps: int = 300,
    batch_size: int = 32,
    lr: float = 1e-3,
    holdout: float = 0.25,
    threshold: float = 0.5,
    weighting: bool = True,
    seed: int = 0,
) -> dict[str, float]:
    """Train a critic on labelled steps and measure it on held-out tasks' steps.

    Args:
        cfg: the run config (with ``policy=None`` the critic is a fresh built-in model of
            ``model.tiny``'s size over the config's built-in tokenizer).
        out_dir: where the ``critic/`` folder and ``critic_metrics.json`` go.
        labels: a ``labels.jsonl`` written by :func:`label_stage`.
        policy: a policy folder (Llama architecture) whose decoder the critic's trunk
            starts from (its tokenizer too); ``None``: a fresh trunk.
        steps, batch_size, lr: the critic's optimisation (:func:`credo.critics.
            train_critic`).
        holdout: fraction of tasks whose steps are held out for the metrics
            (:func:`credo.critics.split_by_task`).
        threshold: the saved critic's flag threshold.
        weighting: class-weighted cross-entropy (default) or plain.
        seed: the head's init, the batches and the split.

    Returns:
        ``critic/precision``, ``critic/recall``, ``critic/false_alarm``,
        ``critic/accuracy``, ``critic/class_accuracy`` on the held-out steps after
        training, the same with ``_before`` for the critic at initialisation,
        ``critic/train_steps``, ``critic/heldout_steps``, ``critic/heldout_errors``,
        ``critic/final_loss``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = load_labels(labels)
    train, held = split_by_task(data, holdout, seed=seed)
    if not train:
        raise ValueError(f"{labels}: no labelled steps left for training after the hold-out")
    if policy is not None:
        critic = critic_from_policy(
            HFPolicy.from_pretrained(policy), seed=seed, threshold=threshold
        )
    else:
        run = build_run(cfg)
        critic = new_critic(run.policy.tokenizer, cfg.model.tiny, seed=seed, threshold=threshold)
        run.close()
    before = evaluate_critic(critic, held)
    stats = train_critic(
        critic, train, steps=steps, batch_size=batch_size, lr=lr, seed=seed, weighting=weighting
    )
    after = evaluate_critic(critic, held)
    critic.save(out / "critic")
    keys = ("precision", "recall", "false_alarm", "accuracy", "class_accuracy")
    metrics: dict[str, float] = {
        **{f"critic/{k}": after[k] for k in keys},
        **{f"critic/{k}_before": before[k] for k in keys},
        "critic/train_steps": float(len(train)),
        "critic/heldout_steps": float(len(held)),
        "critic/heldout_errors": after["tp"] + after["fn"],
        "critic/final_loss": stats.final_loss,
        "critic/seconds": stats.seconds,
    }
    _write_metrics(out, "critic", metrics | {"class_weights": dict(zip(CLASSES, stats.weights))})
    return metrics


def critique_sft_stage(
    cfg: Config,
    out_dir: str | Path,
    *,
    labels: str | Path,
    policy: str | Path,
    steps: int = 200,
    batch_size: int = 32,
    lr: float = 5e-4,
    corrections_from: str = "all",
    critique_text: bool = True,
    balance: str = "none",
    eval_episodes: int | None = None,
    trials: int = 1,
    ks: tuple[int, ...] = (),
    seed: int = 0,
) -> dict[str, float]:
    """Fine-tune ``policy`` on critique-enriched rows (:mod:`credo.critics.critique_sft`)
    with :func:`credo.train.sft.sft_train`, save it, and evaluate it held-out.

    Args:
        cfg: the run config (env, renderer, evaluation settings).
        out_dir: where ``policy/`` and ``critique_sft_metrics.json`` go.
        labels: ``labels.jsonl`` from :func:`label_stage`.
        policy: the policy folder to fine-tune.
        steps, batch_size, lr: the SFT.
        corrections_from: ``all`` (default) or ``successful`` episodes' error steps, or
            ``none`` (behaviour rows only).
        critique_text: corrections read the critique (default); false: the fix alone
            (the ablation without critiques).
        balance: ``none`` (default here) or ``equal`` (:func:`~credo.critics.
            critique_sft.balance_rows`: the smaller class repeated to the larger's size).
        eval_episodes: held-out tasks (default ``eval.episodes``; 0 skips evaluation).
        trials, ks: episodes per task and the k of pass^k (:meth:`Run.evaluate`).
        seed: the SFT's shuffling.

    Returns:
        ``sft/rows``, ``sft/behaviour_rows``, ``sft/correction_rows``, ``sft/final_loss``
        and, when evaluated, ``eval/success_rate_before``, ``eval/success_rate`` and
        ``eval/pass^k`` for each k.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = load_labels(labels)
    run = build_run(cfg, policy_path=Path(policy))
    try:
        tok = run.policy.tokenizer
        rows = critique_rows(
            data,
            lambda text: tok.encode(text, add_special_tokens=False),
            run.renderer.response_ids,
            corrections_from=corrections_from,
            critique_text=critique_text,
            balance=balance,
        )
        good = sum(1 for x in data if x.ok and x.success)
        plain = critique_examples(
            data, corrections_from=corrections_from, critique_text=critique_text
        )
        n = cfg.eval.episodes if eval_episodes is None else eval_episodes
        metrics: dict[str, float] = {
            "sft/rows": float(len(rows)),
            "sft/behaviour_rows": float(good),
            "sft/correction_rows": float(len(plain) - good),
        }
        if n > 0:
            metrics["eval/success_rate_before"] = run.evaluate(episodes=n).success_rate
        stats = sft_train(run.policy, rows, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
        metrics["sft/final_loss"] = stats.final_loss
        tmp = out / f".policy.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        run.policy.save(tmp)
        shutil.rmtree(out / "policy", ignore_errors=True)
        os.replace(tmp, out / "policy")
        if n > 0:
            res = run.evaluate(episodes=n, trials=trials, ks=ks)
            metrics["eval/success_rate"] = res.success_rate
            metrics.update({f"eval/pass^{k}": float(v) for k, v in res.pass_hat_k.items()})
    finally:
        run.close()
    _write_metrics(out, "critique_sft", metrics)
    return metrics
