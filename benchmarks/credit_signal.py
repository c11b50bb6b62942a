"""How much step-level credit has to act on: a diagnostic of one policy's rollouts.

    python benchmarks/credit_signal.py --policy RUN_DIR/final_policy
    python benchmarks/credit_signal.py --policy ~/.cache/credo/warmstart/KEY/policy \\
        --difficulty multi --tasks 64
    python benchmarks/credit_signal.py --policy RUN_DIR/final_policy --env gym:credo/TextLights-v0 \\
        "env.kwargs={make_kwargs: {min_lamps: 6, max_lamps: 9, max_episode_steps: 11}}"

Samples ``--tasks`` groups of ``--group`` episodes with the policy on ``--env`` (default
``shop``; ``--difficulty`` sets ``env.kwargs.difficulty``, and ``key=value`` overrides
anything else of the run's config) on training tasks, as the trainer does, and prints,
from the same forest:

- the share of groups with mixed outcomes (GRPO's only source of signal) and the share
  of steps with a non-zero episode advantage;
- GiGPO's anchor-state step groups: the share of steps whose state recurs in their group,
  and of steps whose step advantage A^S is non-zero;
- for each step-level estimator, the share of steps whose advantage has the opposite
  sign to GRPO's (the steps where step-level credit changes the direction of the update,
  e.g. a good search inside a failed episode), and the correlation with GRPO's.

- the size of each estimator's advantages: ``|A|`` median, 99th percentile and share of
  rows above 3 (:func:`credo.credit.advantage_stats`), against GRPO's, and the share of
  invalid-action rows it pushes up (A > 0: an invalid action inside a good episode);
- ProAS's progress labels with a graph grown from this forest's successes, over the
  env's goal-relative abstract states and over the generic ones (the verb of the last
  accepted action, no goal read): its edges,
  the share of failed episodes' rows it spares (``spare=reasonable``: every on-graph
  step; ``spare=progress``: on-graph steps that also bring the state closer to a goal),
  and how much of GRPO's negative and positive advantage mass survives the shaping.

With ``--by-mistake`` (an env with a label rule: ``shop``, ``tools``), every action is
labelled as ``credo eval --mistakes`` labels it, and a last table gives, for each verb and
mistake class, how far below the right action of the same verb each estimator puts it
(the gap in units of the estimator's own standard deviation,
:func:`credo.critics.mistakes.advantage_by_mistake`; the ``ok`` rows give the right
action's mean).

``--variant NAME:key=value,...`` adds an estimator with parameters (e.g.
``graph:std_floor=0.1``, ``gigpo:invalid_penalty=0.1,invalid_anchors=split``);
``--abstract-states stage`` samples ``shop`` with its earlier page-only progress states.

Step-level credit can only beat GRPO where these shares are large: if every recurring
state's successors all succeed or all fail, the step advantages repeat the episode's.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import torch
import yaml
from _common import print_table, warm_policy

from credo.credit import advantage_stats, compute_advantages
from credo.credit.gigpo import gigpo_episode_advantage, gigpo_step_advantage
from credo.credit.proas import (
    ABSTRACTIONS,
    ProgressGraph,
    action_type,
    progress_labels,
    progress_states,
)
from credo.critics.mistakes import advantage_by_mistake, has_label_rule, label_forest
from credo.envs.base import Task
from credo.train.config import load_config

ESTIMATORS = ("gigpo", "graph", "graphpo", "tsbpo", "proas")


def parse_variant(text: str) -> tuple[str, str, dict[str, Any]]:
    """``"graph:std_floor=0.1,state_norm=mean"`` → ``(label, "graph", {...})``."""
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: expected key=value, got {item!r}")
        params[key.strip()] = yaml.safe_load(value)
    return text, name, params


def proas_rows(f: Any, base: torch.Tensor) -> list[list[str]]:
    """ProAS's labels with a graph grown from this forest's successes (update first),
    for both sources of abstract states (``abstraction``: the env's goal-relative
    ``abstract_state_key()``; ``generic``, the verb of the last accepted action) and
    both rules of what a failed episode spares (``spare``: reasonable, progress)."""
    ep = f.episodes()
    row_success = f.episode_values_to_rows(ep.success.double()) > 0.5
    failed = ~row_success
    rows = []
    for abstraction in ABSTRACTIONS:
        graph = ProgressGraph(abstraction=abstraction)
        graph.update(f)
        reasonable, progress = progress_labels(f, graph)
        states = progress_states(f, abstraction)[1]
        rows += [
            [f"{abstraction}: progress graph edges", f"{graph.num_edges}"],
            [f"{abstraction}: distinct abstract states", f"{len(states.unique())}"],
        ]
        for spare, spared in (("reasonable", reasonable), ("progress", reasonable & progress)):
            params = {"update_first": True, "spare": spare}
            state = ProgressGraph(abstraction=abstraction)
            shaped = compute_advantages("proas", f, params, state).double()
            neg = (base.clamp(max=0).abs().sum(), shaped.clamp(max=0).abs().sum())
            pos = (base.clamp(min=0).sum(), shaped.clamp(min=0).sum())
            share = float(spared[failed].float().mean()) if failed.any() else float("nan")
            label = f"{abstraction}, spare={spare}"
            rows += [
                [f"{label}: failed episodes' rows spared", f"{share:.1%}"],
                [f"{label}: GRPO negative mass kept", f"{float(neg[1] / neg[0]):.1%}"],
                [f"{label}: GRPO positive mass kept", f"{float(pos[1] / pos[0]):.1%}"],
            ]
    return rows


def mistake_rows(
    env_name: str, run: Any, res: Any, advs: dict[str, torch.Tensor], min_actions: int = 10
) -> list[list[str]]:
    """The ``--by-mistake`` table: one row per (verb, label) of the forest's labelled
    actions, one column per estimator (the ``ok`` rows: the mean advantage; the others:
    the gap below ``ok`` of the same verb; both in units of that estimator's σ). Verbs
    are read as ProAS reads them (:func:`~credo.credit.proas.action_type`). Cells with
    fewer than ``min_actions`` actions (e.g. a garbled verb) are pooled in one last row,
    whose estimator columns stay empty."""
    try:
        rows, steps = label_forest(env_name, run.make_env, res)
    except ValueError as e:
        raise SystemExit(f"--by-mistake: {e}") from None
    errors = [s.error for s in steps]
    verbs = [action_type(s.action) for s in steps]
    tables = {
        label: advantage_by_mistake(adv[rows].tolist(), errors, verbs)
        for label, adv in advs.items()
    }
    cells = sorted(tables["grpo"], key=lambda k: (k[0], k[1] != "ok", -tables["grpo"][k]["n"]))
    out, rare = [], 0
    for verb, label in cells:
        n = int(tables["grpo"][(verb, label)]["n"])
        if n < min_actions:
            rare += n
            continue
        vals = [t[(verb, label)]["mean" if label == "ok" else "gap"] for t in tables.values()]
        name = f"{verb or '(none)'}: {label}" + (" (mean)" if label == "ok" else "")
        out.append([name, str(n), *("—" if math.isnan(v) else f"{v:+.2f}" for v in vals)])
    if rare:
        out.append([f"(cells of < {min_actions} actions)", str(rare), *("" for _ in tables)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--policy", required=True, help="a policy folder (final_policy, warm start)")
    ap.add_argument("--env", default="shop", help="env name (default shop)")
    ap.add_argument("--difficulty", default=None, help="env.kwargs.difficulty")
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,...")
    ap.add_argument("--abstract-states", default=None, help="shop's abstract_states (goal, stage)")
    ap.add_argument(
        "--by-mistake", action="store_true", help="label the actions; gap of each mistake class"
    )
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = ap.parse_args()
    if args.by_mistake and not has_label_rule(args.env):
        raise SystemExit(f"--by-mistake: env {args.env!r} has no label rule (shop, tools have)")
    torch.set_num_threads(args.threads)

    cfg = load_config(
        "grpo",
        [
            f"env.name={args.env}",
            *([f"env.kwargs.difficulty={args.difficulty}"] if args.difficulty else []),
            *args.overrides,
            f"rollout.group_size={args.group}",
            f"train.threads={args.threads}",
            *(
                [f"env.kwargs.abstract_states={args.abstract_states}"]
                if args.abstract_states
                else []
            ),
        ],
    )
    run, policy = warm_policy(cfg, args.policy)
    tasks = [Task.make("train", 50_000 + i) for i in range(args.tasks)]
    res = run.rollouts(policy, tasks, generator=torch.Generator().manual_seed(args.seed))
    f = res.forest
    ep = f.episodes()
    groups = f.group[ep.leaf]
    mixed = 0
    for g in groups.unique():
        s = ep.success[groups == g]
        mixed += int(s.any() and not s.all())
    n_groups = len(groups.unique())

    a_e = gigpo_episode_advantage(f)
    a_s = gigpo_step_advantage(f)
    key = f.group.long() * (int(f.state.max()) + 1) + f.state.long()
    _, inv, counts = key.unique(return_inverse=True, return_counts=True)
    recurring = counts[inv] > 1
    n = f.num_rows
    summary = [
        ["episodes / steps", f"{len(ep.leaf)} / {n}"],
        ["success rate", f"{float(ep.success.float().mean()):.1%}"],
        ["mean steps per episode", f"{n / len(ep.leaf):.1f}"],
        ["groups with mixed outcomes", f"{mixed}/{n_groups} ({mixed / n_groups:.0%})"],
        ["steps with episode advantage ≠ 0", f"{float((a_e.abs() > 1e-9).float().mean()):.1%}"],
        ["steps whose state recurs in the group", f"{float(recurring.float().mean()):.1%}"],
        ["steps with GiGPO step advantage ≠ 0", f"{float((a_s.abs() > 1e-9).float().mean()):.1%}"],
    ]
    print_table(
        f"rollouts of {args.policy} on {args.env}"
        + (f"/{args.difficulty}" if args.difficulty else ""),
        ["quantity", "value"],
        summary,
    )

    base = compute_advantages("grpo", f, {}, None).double()
    rows = []
    # proas: its graph grown from this forest first (a fresh graph would be plain GRPO)
    runs = [("grpo", "grpo", {})]
    runs += [(e, e, {"update_first": True} if e == "proas" else {}) for e in ESTIMATORS]
    runs += [parse_variant(v) for v in args.variant]
    invalid = ~f.valid
    advs = {
        label: compute_advantages(name, f, params, None).double() for label, name, params in runs
    }
    for label, adv in advs.items():
        both = (base.abs() > 1e-9) & (adv.abs() > 1e-9)
        flip = both & (torch.sign(base) != torch.sign(adv))
        corr = torch.corrcoef(torch.stack([base, adv]))[0, 1] if base.std() > 0 else float("nan")
        st = advantage_stats(adv)
        rows.append(
            [
                label,
                f"{float((adv.abs() > 1e-9).float().mean()):.1%}",
                f"{float(flip.float().mean()):.1%}",
                f"{float(corr):.2f}",
                f"{st['credit/adv_abs_p50']:.2f}",
                f"{st['credit/adv_abs_p99']:.2f}",
                f"{st['credit/adv_abs_gt3_frac']:.1%}",
                f"{float((adv[invalid] > 1e-9).float().mean()):.1%}" if invalid.any() else "—",
            ]
        )
    print_table(
        "step-level estimators vs GRPO on the same forest",
        [
            "estimator",
            "steps with adv ≠ 0",
            "sign opposite to GRPO",
            "corr. with GRPO",
            "|A| p50",
            "|A| p99",
            "|A| > 3",
            "invalid rows with A > 0",
        ],
        rows,
    )
    if "abstract_state" in f.extras:
        print_table(
            "ProAS progress labels (graph from this forest)",
            ["quantity", "value"],
            proas_rows(f, base),
        )
    if args.by_mistake:
        print_table(
            "credit by mistake: gap below the right action of the same verb (in σ of each estimator)",
            ["verb: label", "actions", *advs],
            mistake_rows(args.env, run, res, advs),
            width=160,
        )


if __name__ == "__main__":
    main()
