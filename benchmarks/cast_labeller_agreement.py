"""How far does a privileged model's labelling agree with CAST's label rules?

Rolls out the warm start of ``--env`` (``shop`` or ``tools``, the built-in model) on
``--tasks`` training tasks, labels every action twice — by the env's hand-written rules
and by the privileged model labeller (:mod:`credo.critics.model_labeller`: ``--model``,
shown the goal and the oracle's next action, one yes/no question per error class) — and
prints the agreement: exact class, error vs ok, Cohen's kappa on error vs ok, and per rule
class the share the model labelled the same. It also prints the labelling cost.

    python benchmarks/cast_labeller_agreement.py --env tools --model smollm2-135m --tasks 8
    python benchmarks/cast_labeller_agreement.py --env shop --model runs/teacher/final_policy
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import _common  # noqa: F401  (puts the repository root on sys.path)
import torch
from _common import print_table, warm_policy

from credo.critics import label_episodes, make_labeller
from credo.envs.base import Task
from credo.train.config import load_config


def kappa(a: list[bool], b: list[bool]) -> float:
    """Cohen's kappa of two binary labellings (NaN when chance agreement is 1)."""
    n = len(a)
    observed = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    return (observed - chance) / (1 - chance) if chance < 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="tools", choices=("shop", "tools"))
    ap.add_argument("--model", default="smollm2-135m", help="the labelling model")
    ap.add_argument("--tasks", type=int, default=8, help="training tasks (8 episodes each)")
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the run")
    args = ap.parse_args()
    kwargs = "env.kwargs={difficulty: easy}"
    cfg = load_config("grpo", [f"env.name={args.env}", kwargs, "train.threads=1", *args.overrides])
    run, policy = warm_policy(cfg)
    try:
        batch = [Task.make("train", i) for i in range(args.tasks)]
        episodes = run.rollouts(policy, batch, generator=torch.Generator().manual_seed(0)).episodes
        decode = lambda ids: policy.tokenizer.decode(list(ids))  # noqa: E731
        rules = label_episodes(args.env, run.make_env, episodes, decode=decode)
        labeller = make_labeller("model", args.env, model=args.model, threshold=args.threshold)
        start = time.perf_counter()
        model = label_episodes(args.env, run.make_env, episodes, decode=decode, labeller=labeller)
        seconds = time.perf_counter() - start
    finally:
        run.close()
    pairs = [(r.error, m.error) for r, m in zip(rules, model)]
    n = len(pairs)
    exact = sum(r == m for r, m in pairs) / n
    err_r, err_m = [r != "ok" for r, _ in pairs], [m != "ok" for _, m in pairs]
    binary = sum(x == y for x, y in zip(err_r, err_m)) / n
    print_table(
        f"privileged model labeller ({args.model}) vs the rules, {args.env} easy, "
        f"{len(episodes)} episodes of the warm start",
        ["steps", "rule errors", "model errors", "same class", "error vs ok", "kappa (error vs ok)",
         "seconds per step"],
        [[n, sum(err_r), sum(err_m), f"{exact:.1%}", f"{binary:.1%}",
          f"{kappa(err_r, err_m):+.3f}", f"{seconds / n:.2f}"]],
    )  # fmt: skip
    by_rule = Counter(r for r, _ in pairs)
    same = Counter(r for r, m in pairs if r == m)
    said = Counter(m for _, m in pairs)
    print_table(
        "per rule class: steps, labelled the same by the model; the model's use of each class",
        ["class", "rule steps", "model agrees", "model steps"],
        [[c, by_rule[c], f"{same[c] / by_rule[c]:.1%}" if by_rule[c] else "—", said[c]]
         for c in sorted(set(by_rule) | set(said))],
    )  # fmt: skip


if __name__ == "__main__":
    main()
