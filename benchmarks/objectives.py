"""Cost of each policy objective relative to PPO-clip, on one real rollout batch.

    python benchmarks/objectives.py                 # 16 tasks x 8 episodes of shop, 5 repeats
    python benchmarks/objectives.py --repeats 9 --threads 2

One rollout of the built-in model on ``shop`` (group sampler, with M = 16 auxiliary
draws per position stored, which KLPO needs) gives one token batch. Every objective then
runs the trainer's own update (``credo.train.update.policy_update``: scoring pass,
loss, backward, optimizer step) on that same batch, from the same weights, the
objectives interleaved in each repeat so that machine noise hits them alike; the table
gives the median seconds and the ratio to PPO-clip with token ratios. A second table
gives the rollout's cost with and without the auxiliary draws (KLPO pays it at sampling
time). A third runs PPO-clip on the same batch with the advantages of a share of the
groups set to 0 (groups of one outcome), with and without ``optim.skip_zero_advantage``.
Ratios are measured in one run; absolute seconds depend on the machine's load.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time

import _common  # noqa: F401  (puts the repository root on sys.path)
import torch
from _common import print_table

from credo.envs.base import Task
from credo.rollout import sample_groups
from credo.train.config import load_config
from credo.train.parts import update_context
from credo.train.run import build_run
from credo.train.update import policy_update

#: (label, recipe, overrides): each objective as the recipes configure it.
OBJECTIVES: list[tuple[str, str, list[str]]] = [
    ("ppo token (grpo)", "grpo", []),
    ("ppo turn", "grpo", ["objective.params={ratio_level: turn}"]),
    ("ppo sequence (GSPO)", "grpo", ["objective.params={ratio_level: sequence}"]),
    ("ppo + KL k3 (β 0.05)", "grpo", ["objective.kl_coef=0.05"]),
    ("holder (hpo)", "hpo", []),
    ("holder_token", "hpo", ["objective.loss=holder_token"]),
    ("klpo (M 16)", "klpo", []),
    ("klpo_seq", "klpo", ["objective.loss=klpo_seq", "objective.params={beta: 0.1}"]),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--zero-groups",
        type=float,
        nargs="+",
        default=[0.5, 0.9],
        help="shares of the groups whose advantages are set to 0 in the third table",
    )
    args = ap.parse_args()

    base = load_config(
        "grpo",
        [
            "sft.enabled=false",
            f"train.threads={args.threads}",
            f"rollout.tasks_per_iter={args.tasks}",
            f"rollout.group_size={args.group}",
            "rollout.aux_samples=16",
        ],
    )
    run = build_run(base)
    policy = run.policy
    tasks = [Task.make("train", i) for i in range(args.tasks)]

    def rollout(aux: int) -> tuple[float, object]:
        sampling = dataclasses.replace(run.sampling, aux_samples=aux)
        ctx = run.sampler_context(
            policy, generator=torch.Generator().manual_seed(0), sampling=sampling
        )
        t0 = time.perf_counter()
        res = sample_groups(ctx, tasks, group_size=args.group)
        return time.perf_counter() - t0, res

    roll_times: dict[int, list[float]] = {0: [], 16: []}
    result = None
    for _ in range(max(1, args.repeats // 2)):
        for aux in (0, 16):
            dt, res = rollout(aux)
            roll_times[aux].append(dt)
            if aux == 16:
                result = res
    assert result is not None
    forest = result.forest  # type: ignore[attr-defined]
    adv = torch.randn(forest.num_rows, generator=torch.Generator().manual_seed(1))
    batch = forest.to_batch(adv, pad_id=policy.pad_id)
    tokens = int(batch.response_mask.sum())

    def update_seconds(recipe: str, extra: list[str], b: object, rep: int) -> float:
        cfg = load_config(recipe, ["sft.enabled=false", *extra])
        pol = copy.deepcopy(policy)
        ref = copy.deepcopy(policy) if cfg.objective.kl_coef > 0 else None
        opt = torch.optim.AdamW(pol.model.parameters(), lr=cfg.optim.lr)
        ctx = update_context(cfg, pol, opt, ref)
        b = copy.deepcopy(b)
        t0 = time.perf_counter()
        policy_update(ctx, b, iteration=rep, generator=torch.Generator().manual_seed(rep))
        return time.perf_counter() - t0

    # the same batch with the advantages of the first share of the groups set to 0
    groups = forest.group.unique()
    flat = {}
    for share in args.zero_groups:
        a = adv.clone()
        a[torch.isin(forest.group, groups[: round(share * groups.numel())])] = 0.0
        flat[share] = forest.to_batch(a, pad_id=policy.pad_id)
    skip_cases = [(s, k) for s in args.zero_groups for k in ("false", "true")]

    times: dict[str, list[float]] = {label: [] for label, _, _ in OBJECTIVES}
    skip_times: dict[tuple[float, str], list[float]] = {c: [] for c in skip_cases}
    for rep in range(args.repeats):
        for label, recipe, extra in OBJECTIVES:
            times[label].append(update_seconds(recipe, extra, batch, rep))
        for share, skip in skip_cases:
            dt = update_seconds("grpo", [f"optim.skip_zero_advantage={skip}"], flat[share], rep)
            skip_times[share, skip].append(dt)

    ppo = statistics.median(times[OBJECTIVES[0][0]])
    rows = []
    for label, _, _ in OBJECTIVES:
        med = statistics.median(times[label])
        rows.append([label, f"{med:.3f}", f"{med / ppo:.2f}×"])
    print_table(
        f"policy update on one batch: {forest.num_rows} steps, {tokens} response tokens, "
        f"median of {args.repeats}",
        ["objective", "seconds", "vs ppo token"],
        rows,
    )
    r0, r16 = statistics.median(roll_times[0]), statistics.median(roll_times[16])
    print_table(
        f"rollout of {args.tasks}x{args.group} episodes (median of {len(roll_times[0])})",
        ["auxiliary draws M", "seconds", "vs M 0"],
        [["0", f"{r0:.2f}", "1.00×"], ["16 (klpo)", f"{r16:.2f}", f"{r16 / r0:.2f}×"]],
    )
    rows = []
    for share in args.zero_groups:
        full = statistics.median(skip_times[share, "false"])
        skipped = statistics.median(skip_times[share, "true"])
        rows.append([f"{share:.0%}", f"{full:.3f}", f"{skipped:.3f}", f"{skipped / full:.2f}×"])
    print_table(
        f"ppo token on the same batch with a share of its {groups.numel()} groups' advantages "
        f"at 0 (median of {args.repeats})",
        ["groups at 0", "seconds", "skip_zero_advantage s", "ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
