"""The decision a pretrained model's warm start gets wrong on ``shop``: which item to open.

    python benchmarks/llm_item_choice.py                   # SmolLM2, 400 SFT steps, 2 cores
    python benchmarks/llm_item_choice.py --steps 100 --every 25 --tasks 100
    python benchmarks/llm_item_choice.py --model ~/.cache/credo/warmstart/KEY/policy --steps 0

On ``shop`` (``default`` difficulty) a search for the goal's title returns the goal's
item among products with the same title priced over the budget (``price_distractors``:
2), so opening the right one means comparing prices with the budget. Every other step
of an episode (the search words, the size, ``buy``) is copied from the goal. This script
runs credo's warm start (the clean oracle demonstrations, in the chat format and the
config of ``benchmarks/llm_learns.py``, loss on the assistant tokens only) and, every
``--every`` steps, puts the model on the results page of held-out tasks after the
oracle's search and scores the replies ``click[1]`` .. ``click[5]`` (the sum of each
reply's token log-probs, normalised over the five):

* ``P(right item)``: the mean probability of the right reply, the success rate of
  sampling at temperature 1 when every other step is right (chance: 1/3);
* ``argmax right``: how often the right reply is the most likely (greedy decoding);
* ``P(k)`` for the first three ranks: a model that does not read the prices gives every
  task the same distribution over the ranks, and the right item's rank is uniform;
* ``cheapest-title rule``: the share of tasks where the cheapest result with the goal's
  exact title is the right item (1.0 here: the distractors are over the budget).

Printed: one table row per probe, and the minutes spent. Extra ``key=value`` arguments
are credo overrides (e.g. ``model.device=cuda``), as in ``llm_learns.py``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import torch
from _common import print_table

RANKS = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias, folder or hub name")
    ap.add_argument(
        "--steps", type=int, default=400, help="SFT steps (default 400; 0: only probe the model)"
    )
    ap.add_argument("--every", type=int, default=50, help="probe every N steps (default 50)")
    ap.add_argument("--tasks", type=int, default=150, help="held-out tasks probed (150)")
    ap.add_argument("--lr", type=float, default=1e-4, help="peak SFT learning rate (1e-4)")
    ap.add_argument("--batch", type=int, default=8, help="SFT rows per step (8)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (2)")
    ap.add_argument("overrides", nargs="*", help="credo overrides: key=value")
    args = ap.parse_args(argv)
    if args.steps < 0 or args.every < 1 or args.tasks < 1:
        ap.error(
            "--steps must be at least 0 (0: probe the model as given), --every and --tasks at least 1"
        )
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        ap.error(f"overrides are key=value, got {bad[0]!r}")
    return args


def results_pages(run: Any, tasks: int) -> list[tuple[list[int], int, bool]]:
    """For each held-out task: the prompt on the results page after the oracle's search,
    the right item's rank (1-based), and whether the cheapest result carrying the goal's
    exact title is that item."""
    from credo.envs.base import Task
    from credo.rollout.render import Turn

    pages = []
    for i in range(tasks):
        env = run.make_env()
        first = env.reset(Task.make("test", i))
        search = env.oracle_action()
        page = env.step(search).observation
        click = env.oracle_action()
        if not click.startswith("click["):
            raise SystemExit(f"test task {i}: the oracle's second action is {click!r}, not a click")
        rank = int(click[len("click[") : -1])
        prompt = run.renderer.prompt_ids(env.instruction(), [Turn(first, search)], page)
        pages.append((prompt, rank, _cheapest_title_is(page, search, rank)))
    return pages


def _cheapest_title_is(page: str, search: str, rank: int) -> bool:
    """The cheapest result titled exactly as the oracle's search words is ``rank``."""
    title = search[len("search[") : -1]
    best: tuple[float, int] | None = None
    for k, entry in enumerate(page.split(":", 1)[1].split(";"), start=1):
        words = entry.split()
        name, price = " ".join(words[1:-1]), float(words[-1].lstrip("$"))
        if name == title and (best is None or price < best[0]):
            best = (price, k)
    return best is not None and best[1] == rank


@torch.no_grad()
def probe(policy: Any, renderer: Any, pages: list[tuple[list[int], int, bool]]) -> dict[str, Any]:
    """Probabilities of the replies ``click[1..5]`` on every page (normalised over the
    five), averaged: the right one's, the greedy accuracy, and those of ranks 1–3."""
    from credo.train.sft import pad_rows

    policy.model.eval()
    replies = [renderer.response_ids(f"click[{k}]") for k in range(1, RANKS + 1)]
    right, argmax_right, per_rank = 0.0, 0, [0.0] * RANKS
    for prompt, rank, _ in pages:
        ids, attn, target = pad_rows([(prompt, r) for r in replies], policy.pad_id)
        lp = policy.score(ids, attn, scored=target).logprobs  # [5, L], 0 off the replies
        totals = (lp * target.to(lp.device)).sum(dim=1)  # each reply's log-probability
        p = torch.softmax(totals.double(), dim=0)
        right += float(p[rank - 1])
        argmax_right += int(int(p.argmax()) == rank - 1)
        for k in range(RANKS):
            per_rank[k] += float(p[k])
    policy.model.train()
    n = len(pages)
    return {
        "p_right": right / n,
        "argmax_right": argmax_right / n,
        "p_rank": [v / n for v in per_rank],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import llm_learns

    from credo.train.config import ConfigError, load_config
    from credo.train.run import build_run
    from credo.train.sft import collect_demonstrations, sft_train

    base = llm_learns.parse_args(["--model", args.model, "--threads", str(args.threads)])
    try:
        cfg = load_config("grpo", [*llm_learns.base_overrides(base), *args.overrides])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    run = build_run(cfg)
    try:
        pages = results_pages(run, args.tasks)
        rule = sum(c for _, _, c in pages) / len(pages)
        rows: list[tuple[list[int], list[int]]] = []
        if args.steps:
            demos = collect_demonstrations(
                run.make_env, run.renderer, episodes=cfg.sft.episodes, epsilon=0.0,
                seed=cfg.train.seed,
            )  # fmt: skip
            rows = demos.rows()
            clicks = sum(
                1 for e in demos.episodes for s in e.steps if s.action.startswith("click[")
            )
            print(f"{len(rows)} demonstration rows ({clicks} clicks)", flush=True)
        print(
            f"{args.tasks} held-out results pages; the cheapest-title rule is right on "
            f"{100 * rule:.0f} % of them",
            flush=True,
        )
        table: list[list[str]] = []
        losses: list[float] = []

        def record(step: int, loss: float) -> None:
            r = probe(run.policy, run.renderer, pages)
            ranks = " ".join(f"{v:.2f}" for v in r["p_rank"][:3])
            row = [str(step), f"{r['p_right']:.3f}", f"{r['argmax_right']:.3f}", ranks]
            row += [
                "—" if math.isnan(loss) else f"{loss:.4f}",
                f"{(time.perf_counter() - start) / 60:.1f}",
            ]
            table.append(row)
            print("  ".join(row), flush=True)

        torch.manual_seed(cfg.train.seed)
        record(0, float("nan"))

        def on_step(step: int, loss: float) -> None:
            losses.append(loss)
            if (step + 1) % args.every == 0 or step + 1 == args.steps:
                window = losses[-args.every :]
                record(step + 1, sum(window) / len(window))

        if args.steps:
            sft_train(
                run.policy, rows, steps=args.steps, batch_size=args.batch, lr=args.lr,
                seed=cfg.train.seed, on_step=on_step,
            )  # fmt: skip
    finally:
        run.close()
    print_table(
        f"{args.model}: the item opened on {args.tasks} held-out "
        f"shop/{cfg.env.kwargs.get('difficulty', 'default')} results pages, "
        f"along SFT (lr {args.lr:g}, {args.batch} rows per step)",
        ["SFT step", "P(right item)", "argmax right", "P(rank 1 2 3)", "SFT loss", "minutes"],
        table,
        width=132,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
