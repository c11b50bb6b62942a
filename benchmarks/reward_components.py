"""What a run's rewards are made of, episode by episode, before credit assignment.

Recipes that add dense rewards to the env's (a KL penalty to the reference,
``objective.kl_reward_coef``; a teacher's reward, ``teacher.route`` ``row_reward`` or
``oprd``) hand the estimator one return per episode that mixes them. This diagnostic
samples one iteration of a run's policy, exactly as the run's iteration does, applies the
same rewards (:func:`credo.train.parts.kl_penalty.kl_reward_penalty_rows`, the teacher's
``Lesson.reward``) and prints, for successful and failed episodes apart, each
component's mean and spread per episode, episode length and its correlation with the
total, and how many mixed groups rank a success below a failure. A dense reward whose
spread over successes is larger than the success reward decides, on its own, which
successes the update favours.

    python benchmarks/reward_components.py runs/compare-teachers-multi/oprd-seed0
    python benchmarks/reward_components.py RUN_DIR --policy reference --tasks 32 \
        teacher.oprd.clip=1 teacher.oprd.reduce=mean

``RUN_DIR`` is a finished run whose recipe keeps a reference (``RUN_DIR/reference``);
``--policy`` picks the weights that sample: ``final_policy`` (default) or ``reference``
(the warm start); ``key=value`` overrides change the run's config (e.g. a reward setting)
for this diagnostic only.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import _common  # noqa: F401  (puts the repository root on sys.path)
import numpy as np
import torch
import yaml
from _common import print_table, sample_first_iteration

from credo.train.config import Config, apply_overrides
from credo.train.parts.kl_penalty import kl_reward_penalty_rows
from credo.train.parts.teacher import TeacherPart
from credo.train.run import build_run
from credo.train.state import TrainState


def per_episode(row_episode: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """``[E]`` sums over each episode's rows of ``values`` ``[N]``."""
    out = torch.zeros(n, dtype=torch.float64)
    return out.index_add_(0, row_episode, values.double())


def corr(a: torch.Tensor, b: torch.Tensor) -> str:
    if len(a) < 3 or float(a.std()) == 0 or float(b.std()) == 0:
        return "—"
    return f"{np.corrcoef(a.numpy(), b.numpy())[0, 1]:+.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--policy", default="final_policy", choices=["final_policy", "reference"])
    ap.add_argument("--tasks", type=int, help="groups to sample (default: the run's)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("overrides", nargs="*", help="key=value changes to the run's config")
    args = ap.parse_intermixed_args()
    data = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    cfg = Config.from_dict(apply_overrides(data, args.overrides))
    if args.tasks:
        cfg.rollout.tasks_per_iter = args.tasks
    if not (args.run_dir / "reference").is_dir():
        raise SystemExit(f"{args.run_dir}/reference does not exist: the run kept no reference")
    run = build_run(cfg, policy_path=args.run_dir / "reference")
    with tempfile.TemporaryDirectory() as tmp:
        state = TrainState.start(run, Path(tmp), run.policy, None)
        state.policy.load_weights(args.run_dir / args.policy)
        rollout, forest = sample_first_iteration(run, state, args.seed)
        kl = torch.zeros_like(forest.reward)
        if cfg.objective.kl_reward_coef > 0:
            kl = -kl_reward_penalty_rows(
                state.policy,
                state.reference,
                forest,
                beta=cfg.objective.kl_reward_coef,
                estimator=cfg.objective.kl_estimator,
                temperature=cfg.rollout.temperature,
                micro_rows=cfg.optim.micro_batch_rows,
            )
        teacher = torch.zeros_like(forest.reward)
        part = state.parts.get("teacher")
        if isinstance(part, TeacherPart):
            lesson = part.teaching.lesson(
                run.renderer, forest, rollout.episodes, state.policy.pad_id
            )
            teacher = lesson.reward(forest).reward - forest.reward
    rows_ep = forest.row_episode()
    n = int(rows_ep.max()) + 1
    env = per_episode(rows_ep, forest.reward, n)
    kl_ep, teacher_ep = per_episode(rows_ep, kl, n), per_episode(rows_ep, teacher, n)
    total = env + kl_ep + teacher_ep
    length = per_episode(rows_ep, torch.ones_like(forest.reward), n)
    success = per_episode(rows_ep, forest.success.float(), n) > 0
    group = torch.zeros(n, dtype=torch.long).index_reduce_(
        0, rows_ep, forest.group, "amax", include_self=False
    )
    table = []
    for name, m in (("successful", success), ("failed", ~success)):
        if not bool(m.any()):
            continue
        table.append([
            name,
            int(m.sum()),
            f"{length[m].mean():.1f}",
            *(f"{v[m].mean():+.3f} ± {v[m].std():.3f}" if m.sum() > 1 else f"{v[m].mean():+.3f}"
              for v in (env, kl_ep, teacher_ep, total)),
            corr(length[m], total[m]),
        ])  # fmt: skip
    mixed = below = 0
    for g in group.unique():
        s, f = total[(group == g) & success], total[(group == g) & ~success]
        if len(s) and len(f):
            mixed += 1
            below += int(s.min() < f.max())
    print_table(
        f"return components per episode: {args.run_dir} ({args.policy}), recipe {cfg.recipe}",
        ["episodes", "n", "steps", "env reward", "KL penalty", "teacher reward", "total",
         "corr(steps, total)"],
        table,
        width=160,
    )  # fmt: skip
    print(f"mixed groups: {mixed}; with a success whose total is below a failure's: {below}")


if __name__ == "__main__":
    main()
