"""CAST's critic on ``shop``: precision, recall and false-alarm rate on held-out steps of
warm-start rollouts, before (the critic at initialisation) and after training, with and
without class weighting, for several seeds.

    PYTHONPATH=src python benchmarks/cast_critic.py OUT_DIR [--seeds 0 1 2] [--source demos]

Writes ``OUT_DIR/label`` (trajectories, labels), ``OUT_DIR/critic-<variant>-<seed>`` and
``OUT_DIR/summary.json``; prints one line per run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from credo.commands.cast import critic_stage, label_stage
from credo.critics import critic_metrics, load_labels, save_trajectories, split_by_task
from credo.train.config import load_config
from credo.train.run import build_run
from credo.train.sft import collect_demonstrations
from credo.train.warmstart import warm_start
from credo.utils.atomic import write_text_atomic

CONFIG = [
    "env.name=shop",
    "sft.episodes=1000",
    "sft.steps=300",
    "sft.noisy_episodes=500",
    "sft.noisy_steps=60",
    "sft.epsilon=0.5",
    "rollout.group_size=4",
    "train.threads=1",
]


def verb_baseline(labels_path: Path, seed: int) -> dict[str, float]:
    """A context-blind baseline on the same held-out split: flag an action when most
    training steps with its verb (``search``, ``click``, ``back``, ...) are errors."""
    data = load_labels(labels_path)
    train, held = split_by_task(data, 0.25, seed=seed)

    def verb(action: str) -> str:
        return action.split("[")[0].strip()

    votes: dict[str, list[int]] = {}
    for x in train:
        votes.setdefault(verb(x.action), [0, 0])[x.ok] += 1
    flag = {v: n[0] > n[1] for v, n in votes.items()}
    return critic_metrics([flag.get(verb(x.action), True) for x in held], [not x.ok for x in held])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--variants", nargs="+", default=["weighted", "unweighted"])
    ap.add_argument(
        "--source",
        choices=("warmstart", "demos"),
        default="warmstart",
        help="label the warm start's rollouts, or ε = 0.3 noisy oracle demonstrations",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config("grpo", CONFIG)
    t0 = time.perf_counter()
    run = build_run(cfg)
    _, ws = warm_start(run)
    print(
        f"warm start: cached={ws.cached} {time.perf_counter() - t0:.0f} s ({ws.path})", flush=True
    )
    trajectories = None
    if args.source == "demos":
        demos = collect_demonstrations(
            run.make_env, run.renderer, episodes=args.tasks * 4, epsilon=0.3, seed=0
        )
        trajectories = args.out / "demos.jsonl"
        args.out.mkdir(parents=True, exist_ok=True)
        save_trajectories(trajectories, demos.episodes, decode=run.policy.tokenizer.decode)
    lab = label_stage(cfg, args.out / "label", trajectories=trajectories, tasks=args.tasks, seed=0)
    print("labels:", json.dumps({k: v for k, v in lab.items() if v}), flush=True)
    rows = []
    for seed in args.seeds:
        b = verb_baseline(args.out / "label" / "labels.jsonl", seed)
        rows.append({"seed": seed, "variant": "verb-baseline", **b})
        line = " ".join(f"{k}={b[k]:.3f}" for k in ("precision", "recall", "false_alarm"))
        print(f"seed {seed} verb baseline: {line}", flush=True)
        for variant in args.variants:
            weighting = variant == "weighted"
            t = time.perf_counter()
            m = critic_stage(
                cfg,
                args.out / f"critic-{variant}-{seed}",
                labels=args.out / "label" / "labels.jsonl",
                policy=ws.path,
                steps=args.steps,
                weighting=weighting,
                seed=seed,
            )
            rows.append({"seed": seed, "variant": variant, **m})
            keep = ("precision", "recall", "false_alarm", "false_alarm_before", "class_accuracy")
            line = " ".join(f"{k}={m['critic/' + k]:.3f}" for k in keep)
            print(f"seed {seed} {variant}: {line} ({time.perf_counter() - t:.0f} s)", flush=True)
    write_text_atomic(
        args.out / "summary.json", json.dumps({"labels": lab, "runs": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
