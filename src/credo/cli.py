"""The ``credo`` command.

credo train [--recipe grpo] [--env shop] [--model NAME_OR_PATH] [key.sub=value ...]
credo train --resume RUN_DIR
credo sft [--recipe grpo] [key.sub=value ...]       the warm start alone
credo eval RUN_DIR [--episodes 500] [--greedy]
credo eval --model NAME_OR_PATH --env shop [--episodes 50] [key.sub=value ...]
credo eval --model smollm2-135m --env shop           a real pretrained LLM, zero-shot
credo play [--env shop] [--seed 0]                   play an env yourself
credo train --agent examples/openai_agent.py:run     train an OpenAI-API agent
credo serve MODEL [--port 8000]                      an OpenAI-compatible server
credo envs | credo recipes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

__all__ = ["main"]


def _overrides(args: argparse.Namespace) -> list[str]:
    out = []
    if getattr(args, "env", None):
        out.append(f"env.name={args.env}")
    if getattr(args, "model", None):
        out.append(f"model.name={args.model}")
    if getattr(args, "iterations", None) is not None:
        out.append(f"train.iterations={args.iterations}")
    if getattr(args, "seed", None) is not None:
        out.append(f"train.seed={args.seed}")
    if getattr(args, "name", None):
        out.append(f"train.name={args.name}")
    if getattr(args, "agent", None):
        out.append(f"rollout.agent={args.agent}")
    return out + list(getattr(args, "overrides", []) or [])


def _console() -> Any:
    from rich.console import Console

    return Console()


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    return t


def _fmt_eval(ev: Any) -> list[str]:
    return [
        f"{ev.success_rate:.1%}",
        f"[{ev.ci_low:.1%}, {ev.ci_high:.1%}]",
        f"{ev.mean_return:.3f}",
        f"{ev.invalid_rate:.1%}",
        f"{ev.mean_turns:.2f}",
    ]


def cmd_train(args: argparse.Namespace) -> int:
    from credo.train.config import Config, load_config
    from credo.train.loop import train

    if args.resume:
        run_dir = Path(args.resume)
        cfg_path = run_dir / "config.yaml"
        if not cfg_path.exists():
            print(f"error: {run_dir} is not a run folder (no config.yaml)", file=sys.stderr)
            return 2
        if _overrides(args):
            print(
                "error: --resume continues a run exactly as configured; drop the overrides",
                file=sys.stderr,
            )
            return 2
        cfg = Config.from_dict(yaml.safe_load(cfg_path.read_text()))
    else:
        cfg = load_config(args.recipe, _overrides(args))
    result = train(cfg, resume=Path(args.resume) if args.resume else None, quiet=args.quiet)
    console = _console()
    rows = []
    if result.warm is not None:
        rows.append(["warm start (SFT)", *_fmt_eval(result.warm)])
    if result.final is not None:
        rows.append([f"trained ({cfg.recipe})", *_fmt_eval(result.final)])
    if rows:
        episodes = (result.final or result.warm).episodes
        console.print(
            _table(
                f"held-out success on {episodes} {cfg.env.name} tasks",
                ["policy", "success", "95% CI", "return", "invalid actions", "turns"],
                rows,
            )
        )
    if result.warm is not None and result.final is not None:
        delta = result.final.success_rate - result.warm.success_rate
        console.print(f"change in held-out success: {delta:+.1%} (absolute)")
    console.print(
        f"run folder: {result.run_dir}  ({result.iterations} iterations, "
        f"{result.seconds / 60:.1f} min)"
    )
    return 130 if result.interrupted else 0


def cmd_sft(args: argparse.Namespace) -> int:
    from credo.train.commands import run_sft
    from credo.train.config import load_config

    cfg = load_config(args.recipe, _overrides(args))
    res = run_sft(cfg, episodes=args.episodes, quiet=args.quiet)
    console = _console()
    console.print(
        _table(
            f"warm start on {cfg.env.name} (held-out, {res['eval'].episodes} episodes)",
            ["policy", "success", "95% CI", "return", "invalid actions", "turns"],
            [["warm start (SFT)", *_fmt_eval(res["eval"])]],
        )
    )
    console.print(f"policy folder: {res['path']}{' (from cache)' if res['cached'] else ''}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from credo.train.commands import evaluate_target

    run_dir, overrides = args.run_dir, list(args.overrides or [])
    if run_dir is not None and "=" in run_dir and not Path(run_dir).exists():
        # `credo eval --model M key=value`: argparse gave the first override to RUN_DIR
        run_dir, overrides = None, [run_dir, *overrides]
    res = evaluate_target(
        run_dir=Path(run_dir) if run_dir else None,
        model=args.model,
        env=args.env,
        episodes=args.episodes,
        greedy=args.greedy,
        overrides=overrides,
    )
    console = _console()
    console.print(
        _table(
            f"held-out evaluation on {res['env']} ({res['eval'].episodes} episodes"
            f"{', greedy' if args.greedy else ''})",
            ["policy", "success", "95% CI", "return", "invalid actions", "turns"],
            [[res["label"], *_fmt_eval(res["eval"])]],
        )
    )
    if args.json:
        print(json.dumps(res["eval"].to_dict()))
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    from credo.envs.base import Task
    from credo.train.config import load_config
    from credo.train.run import env_factory

    cfg = load_config(args.recipe, _overrides(args))
    env = env_factory(cfg)()
    task = Task.make(args.split, args.task)
    obs = env.reset(task, 0)
    limit = getattr(env, "max_turns", None)
    print(f"task {task.id} of {cfg.env.name}" + (f" ({limit} turns at most)" if limit else ""))
    if hasattr(env, "instruction"):
        print(f"instruction: {env.instruction()}")
    if hasattr(env, "action_format"):
        print(env.action_format())
    print("(type 'hint' for the oracle's move, 'quit' to leave)")
    turn = 0
    while True:
        print(f"\n[turn {turn + 1}{f'/{limit}' if limit else ''}] {obs}")
        try:
            action = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print("\nleft the episode")
            return 0
        if action == "quit":
            return 0
        if action == "hint":
            print(env.oracle_action() if hasattr(env, "oracle_action") else "(no oracle)")
            continue
        res = env.step(action)
        turn += 1
        obs = res.observation
        if not res.info.get("valid", True):
            print("(invalid action)")
        if res.done:
            success = bool(res.info.get("success", False))
            why = (
                "solved"
                if success
                else ("turn limit reached" if limit and turn >= limit else "the env ended it")
            )
            print(
                f"\n{obs}\nepisode over after {turn} turns ({why}): reward {res.reward:.3f}, "
                f"success {success}"
            )
            return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from datetime import datetime

    from credo.train.compare import compare, summary_table_rows

    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    seeds = list(range(args.seeds)) if args.seed_list is None else args.seed_list
    extra = list(args.overrides or [])
    if args.env:
        extra.append(f"env.name={args.env}")
    if args.iterations is not None:
        extra.append(f"train.iterations={args.iterations}")
    out = Path(args.out or f"runs/compare-{datetime.now():%Y%m%d-%H%M%S}")
    console = _console()

    def on_run(recipe: str, seed: int, k: int, total: int) -> None:
        console.print(f"[{k + 1}/{total}] {recipe}, seed {seed}")

    summaries = compare(
        recipes, seeds, overrides=extra, out_dir=out, reference=args.reference, on_run=on_run
    )
    cols, rows = summary_table_rows(summaries)
    console.print(_table(f"credo compare: {len(seeds)} seeds, same tasks and budget", cols, rows))
    console.print(f"table: {out / 'compare.md'}   plot: {out / 'compare.png'}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """``credo serve MODEL [...]``: :mod:`credo.serve.cli` (imported only here)."""
    try:
        from credo.serve.cli import main as serve_main
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serve_main(list(args.serve_args), prog="credo serve")


def cmd_envs(args: argparse.Namespace) -> int:
    from credo.envs.base import ENVS, env_names

    rows = []
    for name in env_names():
        doc = (ENVS.get(name).__doc__ or "").strip().splitlines()
        rows.append([name, doc[0] if doc else ""])
    _console().print(_table("environments", ["name", "description"], rows))
    print("custom envs: --env module:Class (see examples/custom_env.py)")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from credo.train.config import load_config, recipe_names

    rows = []
    for name in recipe_names():
        if name == "base":
            continue
        cfg = load_config(name)
        rows.append(
            [
                name,
                cfg.rollout.sampler,
                cfg.credit.estimator,
                cfg.objective.loss,
                cfg.objective.aggregation,
                cfg.description,
            ]
        )
    _console().print(
        _table(
            "recipes", ["recipe", "sampler", "credit", "loss", "aggregation", "description"], rows
        )
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="credo", description="credit assignment for multi-turn RL agents"
    )
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="warm-start then train a policy with RL")
    t.add_argument("--recipe", default="grpo", help="recipe name or path to a .yaml (default grpo)")
    t.add_argument("--env", help="env name or module:Class (default from the recipe: shop)")
    t.add_argument(
        "--model",
        help="smollm2-135m (offline, `make smollm`), an HF model name or folder "
        "(default: the built-in tiny model)",
    )
    t.add_argument("--iterations", type=int, help="RL iterations (train.iterations)")
    t.add_argument("--seed", type=int, help="train.seed")
    t.add_argument("--name", help="run folder name (train.name)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run exactly")
    t.add_argument(
        "--agent",
        metavar="MODULE:FUNCTION",
        help="train an async agent written against the OpenAI API (rollout.agent; "
        "e.g. examples/openai_agent.py:run; needs the serve extra)",
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("sft", help="run (or load from cache) the warm start and evaluate it")
    s.add_argument("--recipe", default="grpo")
    s.add_argument("--env")
    s.add_argument("--model")
    s.add_argument("--seed", type=int)
    s.add_argument("--episodes", type=int, help="held-out episodes (default eval.episodes)")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("overrides", nargs="*", metavar="key.sub=value")
    s.set_defaults(func=cmd_sft)

    e = sub.add_parser("eval", help="held-out success of a run's policy or of a model")
    e.add_argument("run_dir", nargs="?", help="a run folder (its trained policy)")
    e.add_argument(
        "--model", help="evaluate a model instead of a run (e.g. smollm2-135m, zero-shot)"
    )
    e.add_argument("--env", help="env (default: the run's, else shop)")
    e.add_argument("--episodes", type=int, default=500)
    e.add_argument("--greedy", action="store_true", help="temperature 0")
    e.add_argument("--json", action="store_true", help="also print the result as JSON")
    e.add_argument("overrides", nargs="*", metavar="key.sub=value")
    e.set_defaults(func=cmd_eval)

    pl = sub.add_parser(
        "play",
        help="play an environment in the terminal",
        description="Play an env yourself. Example: credo play --env shop env.kwargs.difficulty=multi",
    )
    pl.add_argument(
        "--recipe", default="grpo", help="recipe whose env settings to use (default grpo)"
    )
    pl.add_argument("--env", help="env name or module:Class (default from the recipe: shop)")
    pl.add_argument("--task", type=int, default=0, help="task index (default 0)")
    pl.add_argument(
        "--split", default="test", choices=["train", "test"], help="task split (default test)"
    )
    pl.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    pl.set_defaults(func=cmd_play)

    c = sub.add_parser("compare", help="train several recipes on the same tasks and budget")
    c.add_argument("--recipes", required=True, help="comma-separated recipe names")
    c.add_argument("--seeds", type=int, default=3, help="number of seeds 0..N-1 (default 3)")
    c.add_argument("--seed-list", type=int, nargs="+", help="explicit seeds instead")
    c.add_argument("--env", help="env for every run")
    c.add_argument("--iterations", type=int, help="RL iterations of every run")
    c.add_argument("--reference", help="recipe defining the target success (default grpo)")
    c.add_argument("--out", help="comparison folder (default runs/compare-<time>)")
    c.add_argument("overrides", nargs="*", metavar="key.sub=value")
    c.set_defaults(func=cmd_compare)

    sv = sub.add_parser(
        "serve",
        help="serve a policy over the OpenAI chat-completions API (credo serve --help)",
        add_help=False,
    )
    sv.add_argument("serve_args", nargs=argparse.REMAINDER)
    sv.set_defaults(func=cmd_serve)

    sub.add_parser("envs", help="list environments").set_defaults(func=cmd_envs)
    sub.add_parser("recipes", help="list recipes").set_defaults(func=cmd_recipes)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # all of its options are credo.serve's, --help included
        return cmd_serve(argparse.Namespace(serve_args=argv[1:]))
    args = build_parser().parse_args(argv)
    from credo.train.config import ConfigError

    try:
        return int(args.func(args) or 0)
    except (ConfigError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
