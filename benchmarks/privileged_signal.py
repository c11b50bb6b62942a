"""Can a self-teacher read its privileged text? A diagnostic of a recipe's warm start.

Rényi OPSD and MT-SDPO distil the student toward *itself* reading text the student does
not see (``teacher.privileged``: the env's ``oracle`` next action, or an ``anchor``: a
verified episode of the same task). That teacher is only worth following if the text
moves its predictions the right way. This script builds the recipe's run (its warm
start: cached, or trained), samples one iteration of rollouts, has the recipe's teacher
score the student's tokens in its privileged context, and prints the mean log-probability
of each action (summed over its tokens) under the student and under the teacher, for:

- the actions equal to the privileged text (``oracle``: the right action) and the others;
- valid and invalid actions.

A teacher that reads the text gives the right actions more probability than the student
and the wrong ones less; one that is thrown off by it gives every action less. The rows
of solved and of failed episodes (per env of a mixture) are shown apart: distilling
toward the teacher helps where it lifts the solved episodes' actions above the failed
ones' (its "teacher − student" column larger on solved rows).

    python benchmarks/privileged_signal.py --recipe renyi_opsd
    python benchmarks/privileged_signal.py --recipe renyi_opsd sft.privileged=null
    python benchmarks/privileged_signal.py --recipe mt_sdpo --seed 1
    python benchmarks/privileged_signal.py --recipe renyi_opsd --policy RUN/checkpoints/step_26/policy
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import _common  # noqa: F401  (puts the repository root on sys.path)
import torch
from _common import print_table, sample_first_iteration

from credo.train.config import load_config
from credo.train.parts.teacher import TeacherPart
from credo.train.progress import Progress
from credo.train.run import build_run
from credo.train.state import TrainState
from credo.train.warmstart import start_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="renyi_opsd")
    ap.add_argument("--env", default="shop", help="env name (default shop)")
    ap.add_argument(
        "--difficulty", default="multi", help="shop difficulty (default multi; shop only)"
    )
    ap.add_argument("--seed", type=int, default=0, help="training seed (its warm start)")
    ap.add_argument(
        "--policy",
        help="a policy folder of a run of this recipe (a checkpoint's policy, a final_policy)"
        " to measure instead of the warm start; the reference stays the warm start",
    )
    ap.add_argument("overrides", nargs="*", help="key=value overrides")
    args = ap.parse_intermixed_args()
    cfg = load_config(
        args.recipe,
        [f"env.name={args.env}",
         *([f"env.kwargs.difficulty={args.difficulty}"] if args.env == "shop" else []),
         "train.threads=1", f"train.seed={args.seed}", *args.overrides],
    )  # fmt: skip
    if cfg.teacher.privileged is None:
        raise SystemExit(f"recipe {args.recipe}: its teacher reads no privileged text")
    if args.policy and cfg.teacher.kind != "self":
        raise SystemExit(
            f"--policy needs a self-teacher (teacher.kind=self, e.g. renyi_opsd); recipe "
            f"{args.recipe}'s teacher is {cfg.teacher.kind!r}, which a student checkpoint "
            "does not carry"
        )
    run = build_run(cfg)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            progress = Progress(enabled=False)
            policy, _ = start_policy(run, Path(tmp), resuming=False, progress=progress)
            state = TrainState.start(run, Path(tmp), policy, None)
            part = state.parts.get("teacher")
            assert isinstance(part, TeacherPart)
            if args.policy:  # a self-teacher is the student's own weights: both load them
                state.policy.load_weights(args.policy)
            rollout, forest = sample_first_iteration(run, state, args.seed)
            lesson = part.teaching.lesson(
                run.renderer, forest, rollout.episodes, state.policy.pad_id
            )
            batch = forest.to_batch(torch.zeros(forest.num_rows), pad_id=state.policy.pad_id)
    finally:
        run.close()
    mask = batch.response_mask & lesson.row_mask[:, None]
    student = (batch.old_logprobs * mask).sum(1)
    teacher = (lesson.scores.logprobs * mask).sum(1)
    has = lesson.row_mask
    texts = forest.texts.get(cfg.teacher.privileged)
    groups = [("every action with a text", has)]
    if texts is not None:
        same = torch.tensor(
            [bool(t) and a.strip() == t.strip() for a, t in zip(forest.actions, texts)]
        )
        groups += [("= the privileged text", has & same), ("≠ the privileged text", has & ~same)]
    valid = forest.valid.bool()
    groups += [("valid", has & valid), ("invalid", has & ~valid)]
    # rows of solved and failed episodes, per env of a mixture: a teacher whose text helps
    # lifts the solved episodes' actions more than the failed ones' (last column)
    ep = forest.episodes()
    solved = torch.zeros(forest.num_rows, dtype=torch.bool)
    for e in range(ep.num_episodes):
        solved[ep.path(e)] = bool(ep.success[e])
    label_of = {x.group: x.steps[-1].info.get("env") for x in rollout.episodes if x.steps}
    labels = [label_of.get(int(g)) for g in forest.group]
    for label in [None, *sorted({x for x in labels if x is not None})]:
        mine = torch.tensor([label is None or x == label for x in labels])
        where_ = "" if label is None else f" ({label})"
        groups += [
            (f"solved episodes{where_}", has & mine & solved),
            (f"failed episodes{where_}", has & mine & ~solved),
        ]
    table = [
        [name, int(m.sum()), f"{student[m].mean():+.3f}", f"{teacher[m].mean():+.3f}",
         f"{(teacher - student)[m].mean():+.3f}"]
        for name, m in groups
        if bool(m.any())
    ]  # fmt: skip
    where = f"shop/{args.difficulty}" if args.env == "shop" else args.env
    print_table(
        f"log p(action): student vs its teacher reading {cfg.teacher.privileged!r} "
        f"({args.recipe}, {where}, seed {args.seed}, {args.policy or 'warm start'})",
        ["actions", "rows", "student", "teacher (privileged)", "teacher − student"],
        table,
        width=140,
    )


if __name__ == "__main__":
    main()
