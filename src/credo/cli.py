"""The ``credo`` command.

credo train [--recipe grpo] [--env shop] [--model NAME_OR_PATH] [key.sub=value ...]
credo train --resume RUN_DIR [train.iterations=N]     continue (or extend) a run
credo sft [--recipe grpo] [key.sub=value ...]       the warm start alone
credo eval RUN_DIR [--episodes 500] [--greedy] [--trials 8 --k 1,2,4] [--mistakes] [--failures 5]
credo eval --model NAME_OR_PATH --env shop [--episodes 50] [key.sub=value ...]
credo play [--env shop] [--task 0] [key.sub=value ...]   play an env yourself
credo compare --recipes a,b --seeds 3 [key.sub=value ...]
credo study studies/NAME.yaml [--jobs 2]            a study file: arms x seeds, its page
credo config [--recipe R] [key.sub=value ...]       the resolved config, every key explained
credo check-env --env X                              check an env against the protocol
credo train --agent examples/openai_agent.py:run     train an OpenAI-API agent
credo serve MODEL [--port 8000]                      an OpenAI-compatible server
credo pipeline FILE [--resume] [key.sub=value ...]   staged pipelines (credo.pipeline)
credo envs | credo recipes | credo --version

``key.sub=value`` overrides may stand anywhere among the options. Every bad input ends
in one line, ``error: ...``, naming the file, key or value and what is accepted, with
exit status 2, and a failed start leaves no run folder behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import json
import re
import shutil
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml

__all__ = ["build_parser", "main"]

#: ``key.sub=value``, or ``RECIPE:key.sub=value`` (``credo compare``: that recipe only)
_OVERRIDE = re.compile(r"^(?:[A-Za-z0-9_./\-]+:)?[A-Za-z_][A-Za-z0-9_.\-]*=")


class UsageError(ValueError):
    """A bad command-line input; the message is the one line the user sees."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``error: credo train: ...``) with a
    pointer to ``--help``, exit status 2."""

    def error(self, message: str) -> typing.NoReturn:
        print(f"error: {self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


# ----------------------------------------------------------------- shared helpers
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


def _eval_table(title: str, rows: list[tuple[str, Any]]) -> Any:
    """The held-out table of ``(label, EvalResult)`` rows; a "text truth" column where
    the env knows the truth of the episodes' free text (``EvalResult.text_truth``)."""
    texts = any(ev.text_truth is not None for _, ev in rows)
    columns = ["policy", "success", "95% CI", "return", "invalid actions", "turns"]
    body = []
    for label, ev in rows:
        row = [label, f"{ev.success_rate:.1%}", f"[{ev.ci_low:.1%}, {ev.ci_high:.1%}]",
               f"{ev.mean_return:.3f}", f"{ev.invalid_rate:.1%}", f"{ev.mean_turns:.2f}"]  # fmt: skip
        if texts:
            row.append("—" if ev.text_truth is None else f"{ev.text_truth:.1%}")
        body.append(row)
    return _table(title, [*columns, "text truth"] if texts else columns, body)


def baseline_label(cfg: Any) -> str:
    """What the first row of the train table is: the warm start or the untrained policy."""
    return "warm start (SFT)" if cfg.sft.enabled else "initial policy (no warm start)"


def _positive(option: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{option} must be a whole number ≥ 1, got {value}")


# ----------------------------------------------------------------- run folders
def check_run_files(run_dir: Path) -> None:
    """Read every file ``--resume`` will read (the latest checkpoint's JSON and
    safetensors files, ``warmstart.json``, the reference policy) and fail with the file's
    name if one is empty, truncated or not what it should be."""
    from safetensors import safe_open

    from credo.train.checkpoint import latest_checkpoint

    files: list[Path] = []
    ckpt = latest_checkpoint(run_dir)
    for folder in [ckpt, run_dir / "reference"]:
        if folder is not None and folder.is_dir():
            files += sorted(p for p in folder.rglob("*") if p.suffix in (".json", ".safetensors"))
    if (run_dir / "warmstart.json").exists():
        files.append(run_dir / "warmstart.json")
    for path in files:
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            else:
                with safe_open(str(path), framework="pt") as fh:
                    for key in fh.keys():  # noqa: SIM118 (a safetensors handle)
                        fh.get_slice(key)
        except Exception as exc:
            what = "empty" if path.stat().st_size == 0 else f"unreadable ({_first_line(exc)})"
            raise UsageError(f"{path} is {what}: {_damaged_advice(run_dir, ckpt, path)}") from None


def _damaged_advice(run_dir: Path, ckpt: Path | None, path: Path) -> str:
    """What to do about a damaged file ``path`` that ``--resume`` would read. A damaged
    checkpoint is deleted whole (a checkpoint without its ``policy/`` still counts as
    one: deleting only that folder made the resume fail on the missing weights)."""
    if ckpt is not None and ckpt in path.parents:
        return (
            f"--resume needs the run's latest checkpoint intact; delete {ckpt} (the whole "
            "checkpoint) to resume from the one before it (or from the start), or start a "
            "new run"
        )
    if path.name == "warmstart.json":
        return (
            f"delete {path} to resume without the warm start's held-out result (the weights "
            "come from the checkpoint), or start a new run"
        )
    return (
        f"{path.parent} holds the run's reference policy, which a resume cannot make again; "
        "start a new run"
    )


def _run_dirs(runs_dir: Path) -> set[Path]:
    return {p for p in runs_dir.iterdir()} if runs_dir.is_dir() else set()


def _remove_failed_starts(runs_dir: Path, before: set[Path], cfg: Any) -> None:
    """Remove the run folder a failed start created: new since ``before``, holding this
    run's ``config.yaml`` and neither metrics nor a checkpoint (a concurrent run's folder
    has another config or its own progress, and is left alone)."""
    ours = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    for p in _run_dirs(runs_dir) - before:
        if not p.is_dir() or (p / "metrics.jsonl").exists() or (p / "checkpoints").exists():
            continue
        try:
            same = (p / "config.yaml").read_text() == ours
        except OSError:
            same = not any(p.iterdir())
        if same:
            shutil.rmtree(p, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


# ----------------------------------------------------------------- commands
def _resume_config(args: argparse.Namespace) -> tuple[Any, Path, bool]:
    """The config of ``--resume DIR`` (with ``train.iterations`` changed when asked) and
    whether the run is already finished at that length."""
    from credo.train.checkpoint import checkpoint_iteration, latest_checkpoint
    from credo.train.config import Config, apply_overrides
    from credo.train.finish import unfinished_reason
    from credo.train.update import LR_SCHEDULES

    run_dir = Path(args.resume)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise UsageError(f"{run_dir} is not a run folder (no config.yaml)")
    extra = _overrides(args)
    keys = {o.partition("=")[0] for o in extra}
    if keys - {"train.iterations"}:
        raise UsageError(
            "--resume continues a run as configured; only train.iterations=N (or "
            f"--iterations N) may change, to extend it (got {', '.join(sorted(keys))})"
        )
    from credo.utils.safe_yaml import read_yaml_file, yaml_problem

    try:
        data = read_yaml_file(cfg_path)
    except yaml.YAMLError as exc:
        raise UsageError(f"{cfg_path}{yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{cfg_path}: expected a mapping of config sections")
    saved = Config.from_saved(data)
    cfg = Config.from_saved(apply_overrides(data, extra))
    check_run_files(run_dir)
    done = checkpoint_iteration(latest_checkpoint(run_dir))
    if cfg.train.iterations < done:
        raise UsageError(
            f"train.iterations={cfg.train.iterations}: {run_dir} has already run {done} "
            "iterations; a run can be extended, not shortened"
        )
    annealed = LR_SCHEDULES[cfg.optim.lr_schedule] is not None
    if cfg.train.iterations != saved.train.iterations and annealed:
        raise UsageError(
            f"train.iterations={cfg.train.iterations}: {run_dir} anneals its learning rate "
            f"over {saved.train.iterations} iterations (optim.lr_schedule="
            f"{cfg.optim.lr_schedule}); only a constant-rate run can be extended"
        )
    # finished: every artefact of the run's end is complete (credo.train.finish);
    # otherwise the final evaluation and save are redone from the last checkpoint
    finished = done >= cfg.train.iterations and unfinished_reason(run_dir, done) is None
    if finished and cfg.train.iterations != saved.train.iterations:
        finished = False
    return cfg, run_dir, finished


def cmd_train(args: argparse.Namespace) -> int:
    from credo.train.config import load_config
    from credo.train.loop import train

    console = _console()
    if args.resume:
        cfg, run_dir, finished = _resume_config(args)
        if finished:
            final = json.loads((run_dir / "final_eval.json").read_text())
            console.print(
                f"{run_dir} is finished: {cfg.train.iterations} iterations, held-out success "
                f"{final.get('success_rate', float('nan')):.1%}. Nothing to resume; extend it "
                f"with: credo train --resume {run_dir} train.iterations=N "
                f"(N > {cfg.train.iterations})"
            )
            return 0
        resume: Path | None = run_dir
    else:
        cfg = load_config(args.recipe, _overrides(args))
        resume = None
    runs_dir = Path(cfg.train.runs_dir)
    before = _run_dirs(runs_dir)
    try:
        result = train(cfg, resume=resume, quiet=args.quiet)
    except Exception:
        if resume is None:
            _remove_failed_starts(runs_dir, before, cfg)
        raise
    if result.rank:  # one of several training processes: rank 0 reports
        return 130 if result.interrupted else 0
    rows = []
    if result.warm is not None:
        rows.append((baseline_label(cfg), result.warm))
    if result.final is not None:
        rows.append((f"trained ({cfg.recipe})", result.final))
    if rows:
        episodes = (result.final or result.warm).episodes
        console.print(_eval_table(f"held-out success on {episodes} {cfg.env.name} tasks", rows))
    if result.warm is not None and result.final is not None:
        delta = result.final.success_rate - result.warm.success_rate
        console.print(f"change in held-out success: {delta:+.1%} (absolute)")
    _print_by_env(console, rows)
    _print_shifted(console, result.final)
    for label, ev in ((baseline_label(cfg), result.warm), ("trained", result.final)):
        if ev is not None and getattr(ev, "errors", 0):
            console.print(
                f"[red]{label}: {ev.errors} of {ev.episodes} held-out episodes ended in an env "
                "exception (counted as failures)[/red]"
            )
    console.print(
        f"run folder: {result.run_dir}  ({result.iterations} iterations, "
        f"{result.seconds / 60:.1f} min)"
    )
    return 130 if result.interrupted else 0


def cmd_sft(args: argparse.Namespace) -> int:
    from credo.commands.sft import run_sft
    from credo.train.config import load_config

    _positive("--episodes", args.episodes)
    cfg = load_config(args.recipe, _overrides(args))
    res = run_sft(cfg, episodes=args.episodes, quiet=args.quiet)
    console = _console()
    console.print(
        _eval_table(
            f"warm start on {cfg.env.name} (held-out, {res['eval'].episodes} episodes)",
            [("warm start (SFT)", res["eval"])],
        )
    )
    console.print(f"policy folder: {res['path']}{' (from cache)' if res['cached'] else ''}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from credo.commands.evaluate import evaluate_target

    _positive("--episodes", args.episodes)
    if args.failures < 0:
        raise UsageError(f"--failures must be 0 or more (got {args.failures})")
    if args.run_dir is None and args.model is None:
        raise UsageError("give a run folder (credo eval RUN_DIR) or --model NAME_OR_PATH")
    if args.run_dir is not None:
        run_dir = Path(args.run_dir)
        if not (run_dir / "config.yaml").exists():
            raise UsageError(f"{run_dir} is not a run folder (no config.yaml)")
    else:
        from credo.train.run import model_problem

        problem = model_problem(args.model)
        if problem:
            raise UsageError(problem)
    overrides = list(args.overrides or [])
    if args.run_dir is None and not any(o.startswith("sft.enabled=") for o in overrides):
        overrides.append("sft.enabled=false")  # a model is evaluated as is: no warm start
    res = evaluate_target(
        run_dir=Path(args.run_dir) if args.run_dir else None,
        model=args.model,
        env=args.env,
        episodes=args.episodes,
        greedy=args.greedy,
        overrides=overrides,
        trials=args.trials,
        ks=_eval_ks(args),
        mistakes=args.mistakes or args.failures > 0,
    )
    console = _console()
    console.print(
        _eval_table(
            f"held-out evaluation on {res['env']} ({res['eval'].episodes} episodes"
            f"{', greedy' if args.greedy else ''})",
            [(res["label"], res["eval"])],
        )
    )
    _print_passk(console, res["eval"])
    _print_by_env(console, [("policy", res["eval"])])
    _print_mistakes(console, res["eval"])
    _print_failures(console, res["eval"], args.failures)
    if args.json:
        print(json.dumps(res["eval"].to_dict()))
    return 0


def _print_mistakes(console: Any, ev: Any) -> None:
    """``--mistakes``: each label's share of the actions, and how many failed episodes
    it began to fail (:mod:`credo.critics.mistakes`)."""
    m = ev.mistakes
    if not m:
        return
    failed = max(1, m["failed"])
    labels = list(dict.fromkeys([*m["actions"], *m["first_mistake"]]))
    rows = [
        [
            label,
            f"{m['actions'].get(label, 0.0):.1%}",
            f"{m['first_mistake'].get(label, 0)} ({m['first_mistake'].get(label, 0) / failed:.0%})",
        ]
        for label in labels
    ]
    title = f"how the actions went wrong ({m['failed']} failed episodes)"
    cols = ["label", "share of actions", "first mistake of a failed episode"]
    console.print(_table(title, cols, rows))


def _print_failures(console: Any, ev: Any, n: int) -> None:
    """``--failures N``: the first N failed episodes, one line each: its task, then every
    action, a label after each that is not ``ok``."""
    shown = ev.mistakes.get("failures", [])[:n] if ev.mistakes else []
    if not shown:
        return
    console.print(
        f"the first {len(shown)} failed episodes (actions; [label] after a mistake):",
        markup=False,
    )
    for ep in shown:
        acts = " | ".join(
            a.strip() if label == "ok" else f"{a.strip()} [{label}]" for a, label in ep["actions"]
        )
        console.print(f"{ep['task_id']}: {acts}", markup=False, highlight=False, soft_wrap=True)


def _eval_ks(args: argparse.Namespace) -> tuple[int, ...]:
    """``--k 1,2,4`` (default with ``--trials n > 1``: 1 and n)."""
    from credo.eval.passk import parse_ks

    if args.k is not None:
        return parse_ks(args.k)
    return (1, args.trials) if args.trials > 1 else ()


def _print_by_env(console: Any, rows: list[tuple[str, Any]]) -> None:
    """Held-out success per env of a mixture, one column per policy, and the weakest env
    of each (nothing for a single env)."""
    rows = [(label, ev) for label, ev in rows if getattr(ev, "by_env", None)]
    if not rows:
        return
    envs = sorted({e for _, ev in rows for e in ev.by_env})
    table = [
        [e, str(rows[0][1].by_env.get(e, {}).get("tasks", ""))]
        + [f"{ev.by_env[e]['success_rate']:.1%}" if e in ev.by_env else "—" for _, ev in rows]
        for e in envs
    ]
    cols = ["env", "tasks", *(label for label, _ in rows)]
    console.print(_table("held-out success by env", cols, table))
    for label, ev in rows:
        weak = ev.weakest_env
        console.print(f"weakest env, {label}: {weak} ({ev.by_env[weak]['success_rate']:.1%})")


def _print_shifted(console: Any, ev: Any) -> None:
    """The trained policy's held-out success on each ``eval.shifted`` setting."""
    if ev is None or not getattr(ev, "shifted", None):
        return
    rows = [
        [label, str(r["episodes"]), f"{r['success_rate']:.1%}",
         f"{r['ci_low']:.1%}–{r['ci_high']:.1%}", str(r["env_kwargs"])]
        for label, r in ev.shifted.items()
    ]  # fmt: skip
    cols = ["setting", "tasks", "trained", "95 % interval", "env options"]
    console.print(_table("held-out success on shifted settings (eval.shifted)", cols, rows))


def _print_passk(console: Any, ev: Any) -> None:
    """The pass@k / pass^k table and the per-difficulty table, when there are any."""
    if ev.pass_hat_k:
        rows = [[k, f"{ev.pass_at_k[k]:.1%}", f"{ev.pass_hat_k[k]:.1%}"] for k in ev.pass_hat_k]
        title = f"pass@k and pass^k ({ev.tasks} tasks × {ev.trials} trials)"
        console.print(_table(title, ["k", "pass@k", "pass^k"], rows))
    if ev.by_difficulty:
        ks = list(ev.pass_hat_k)
        rows = [
            [label, str(d["tasks"]), f"{d['success_rate']:.1%}"]
            + [f"{d['pass_hat_k'][k]:.1%}" for k in ks]
            for label, d in ev.by_difficulty.items()
        ]
        cols = ["difficulty", "tasks", "success", *(f"pass^{k}" for k in ks)]
        console.print(_table("by difficulty", cols, rows))


def cmd_play(args: argparse.Namespace) -> int:
    from credo.envs.base import Task
    from credo.train.config import load_config
    from credo.train.run import env_factory

    cfg = load_config(args.recipe, _overrides(args))
    env = env_factory(cfg)()
    task = Task.make(args.split, args.task)
    try:
        return _play(env, task, cfg.env.name)
    except (KeyboardInterrupt, EOFError):
        print("\nleft the episode")
        return 0
    except Exception as exc:  # the env itself failed: say so in one line, no traceback
        where = _env_frame(exc)
        print(f"error: the env raised {type(exc).__name__}: {exc}{where}", file=sys.stderr)
        return 2


def _env_frame(exc: BaseException) -> str:
    """`` [file:line in function]`` of the innermost frame of ``exc`` outside credo's own
    package. "Inside credo" is decided by the package's folder, not by a folder name, so
    a user's env kept under any folder called ``credo`` (a clone of this repository,
    say) still gets its frame shown."""
    import traceback

    package = Path(__file__).resolve().parent
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not Path(f.filename).resolve().is_relative_to(package)
    ]
    if not frames:
        return ""
    f = frames[-1]
    return f" [{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}]"


def _play(env: Any, task: Any, name: str) -> int:
    obs = env.reset(task, 0)
    limit = getattr(env, "max_turns", None)
    print(f"task {task.id} of {name}" + (f" ({limit} turns at most)" if limit else ""))
    if hasattr(env, "instruction"):
        print(f"instruction: {env.instruction()}")
    if hasattr(env, "action_format"):
        print(env.action_format())
    print("(type 'hint' for the oracle's move, 'quit' to leave)")
    turn = 0
    while True:
        print(f"\n[turn {turn + 1}{f'/{limit}' if limit else ''}] {obs}")
        action = input("> ").strip()
        if action == "quit":
            print(f"left the episode after {turn} turns")
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

    from credo.commands.compare import RunFailed, compare, summary_table_rows

    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if not recipes:
        raise UsageError("--recipes needs at least one recipe name (credo recipes lists them)")
    if args.seed_list is None:
        _positive("--seeds", args.seeds)
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

    try:
        summaries = compare(
            recipes,
            seeds,
            overrides=extra,
            out_dir=out,
            reference=args.reference,
            on_run=on_run,
            trials=args.trials,
            ks=_eval_ks(args),
            jobs=args.jobs,
        )
    except RunFailed as exc:  # a run's own error is in its log
        print(f"error: {exc}", file=sys.stderr)
        return 1
    cols, rows = summary_table_rows(summaries)
    console.print(_table(f"credo compare: {len(seeds)} seeds, same tasks and budget", cols, rows))
    console.print(f"table: {out / 'compare.md'}   plot: {out / 'compare.png'}")
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    """``credo study FILE``: :mod:`credo.commands.study`."""
    from credo.commands.compare import RunFailed, summary_table_rows
    from credo.commands.study import load_study, run_study

    _positive("--jobs", args.jobs)
    study = load_study(args.file)
    if args.overrides:
        raise UsageError(
            "credo study takes no key=value overrides: a study's settings are its file's "
            f"(got {' '.join(args.overrides)})"
        )
    console = _console()
    arms = len(study.arms or study.pipelines)
    what = "pipelines" if study.pipelines else "runs"
    records = None if args.no_records else Path(args.records or study.path.parent / "records")
    held = [] if records is None else list((records / study.name).glob("*/record.json"))
    console.print(
        f"study {study.name}: {arms} arms × {len(study.seeds)} seeds = "
        f"{arms * len(study.seeds)} {what}"
        + (
            f" ({len(held)} recorded in {held[0].parent.parent}: read if configs match)"
            if held
            else ""
        )
    )

    def on_run(arm: str, seed: int, k: int, total: int) -> None:
        console.print(f"[{k + 1}/{total}] {arm}, seed {seed}")

    out_root = Path(args.out) if args.out else Path("runs/studies")
    docs = None if args.no_docs else Path(args.docs)
    command = f"credo study {args.file}" + (f" --jobs {args.jobs}" if args.jobs > 1 else "")
    kwargs = {"out_root": out_root, "docs": docs, "jobs": args.jobs, "on_run": on_run}
    try:
        if study.pipelines:  # arms that are pipeline files (checked before they run)
            from credo.pipeline.study import run_pipeline_study

            run_pipeline_study(study, command=command, **kwargs)
            summaries = []
        else:
            summaries = run_study(study, command=command, records=records, **kwargs)
    except RunFailed as exc:  # a run's own error is in its log
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if study.pipelines:  # the stages' table, as written for the page
        console.print((out_root / study.name / "compare.md").read_text())
    else:
        cols, rows = summary_table_rows(summaries)
        console.print(_table(f"{study.title}: {len(study.seeds)} seeds", cols, rows))
    where = f"runs: {out_root / study.name}"
    console.print(where + (f"   page: {docs / study.name}.md" if docs else ""))
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
    from credo.envs.base import ENTRY_POINT_GROUP, ENV_MODULES_VAR, env_sources, resolve_env

    rows = []
    for name, source in sorted(env_sources().items()):
        try:
            doc = (resolve_env(name).__doc__ or "").strip().splitlines()
        except ValueError as exc:
            doc = [f"(cannot load: {_first_line(exc)})"]
        rows.append([name, source, doc[0] if doc else ""])
    _console().print(_table("environments", ["name", "from", "description"], rows))
    print(
        "also: --env module:Class or path/to/file.py:Class; a module's @register_env names "
        f"with --env module:name or {ENV_MODULES_VAR}=module; packages offer envs in the "
        f"'{ENTRY_POINT_GROUP}' entry-point group (see examples/custom_env.py)"
    )
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


def cmd_check_env(args: argparse.Namespace) -> int:
    from credo.commands.check_env import check_env_of
    from credo.train.config import load_config

    _positive("--tasks", args.tasks)
    cfg = load_config(args.recipe, _overrides(args))
    report = check_env_of(cfg, tasks=args.tasks)
    for name in report.passed:
        print(f"ok      {name}")
    for line in report.problems:
        print(f"FAIL    {line}")
    for line in report.errors:
        print(f"ERROR   {line}")
    for line in report.notes:
        print(f"note    {line}")
    verdict = "passes" if report.ok else "fails"
    print(f"{report.env} ({cfg.env.name}) {verdict} the env checks on {args.tasks} tasks")
    return 0 if report.ok else 1


# ----------------------------------------------------------------- credo config
def attribute_docs(cls: type) -> dict[str, str]:
    """Each field's text in the ``Attributes:`` section of a dataclass docstring, joined
    into one line (reST markup removed)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    out: dict[str, str] = {}
    inside, current = False, None
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        m = re.match(r"^    (\w+): ?(.*)$", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif line.startswith("        ") and current:
            out[current] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            inside = False
    return {k: re.sub(r":\w+:`~?([^`]+)`", r"\1", v).replace("``", "`") for k, v in out.items()}


def _dataclass_of(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return None
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _flow(value: Any) -> str:
    return (
        yaml.safe_dump(value, default_flow_style=True, width=10_000)
        .strip()
        .removesuffix("\n...")
        .removesuffix("...")
        .strip()
    )


def describe_config(cfg: Any) -> str:
    """The config as YAML (a valid recipe: ``credo train --recipe that.yaml``), every key
    preceded by a comment with its meaning and its default."""
    from credo.train.config import Config

    lines: list[str] = []

    def emit(cls: type, values: dict[str, Any], indent: str) -> None:
        docs = attribute_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            value = values.get(f.name)
            sub = _dataclass_of(hints[f.name])
            meaning = docs.get(f.name, "")
            default = _default(f)
            documented = "default" in meaning.lower() or (sub is not None and default is not None)
            note = "" if documented else f" [default: {_flow(default)}]"
            for chunk in textwrap.wrap(meaning + note, width=88 - len(indent) - 2) or []:
                lines.append(f"{indent}# {chunk}")
            if sub is not None and isinstance(value, dict):
                lines.append(f"{indent}{f.name}:")
                emit(sub, value, indent + "  ")
            else:
                lines.append(f"{indent}{f.name}: {_flow(value)}")

    data = cfg.to_dict()
    lines.append(f"# credo config: recipe {cfg.recipe!r}, resolved (recipe + overrides).")
    lines.append("# Every key with its meaning and default; this file is itself a recipe:")
    lines.append("#   credo train --recipe this.yaml")
    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        sub = _dataclass_of(hints[f.name])
        if sub is None:
            lines.append(f"{f.name}: {_flow(data[f.name])}")
            continue
        doc = inspect.cleandoc(sub.__doc__ or "").splitlines()
        lines.append("")
        lines.append(f"# {f.name}: {doc[0] if doc else ''}")
        lines.append(f"{f.name}:")
        emit(sub, data[f.name], "  ")
    return "\n".join(lines) + "\n"


def cmd_config(args: argparse.Namespace) -> int:
    from credo.train.config import load_config

    cfg = load_config(args.recipe, _overrides(args))
    sys.stdout.write(describe_config(cfg))
    return 0


# ----------------------------------------------------------------- the parser
def _version() -> str:
    try:
        from importlib.metadata import version

        return version("credo")
    except Exception:
        from credo import __version__

        return __version__


def _sub(sub: Any, name: str, help: str, examples: str, **kw: Any) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog="key.sub=value overrides may stand anywhere among the options.\n\nexamples:\n"
        + textwrap.indent(textwrap.dedent(examples).strip(), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"credo {name} [options] [key.sub=value ...]"
        + (" RUN_DIR" if name == "eval" else ""),
        **kw,
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``credo`` argument parser (overrides are collected by :func:`parse_args`)."""
    p = _Parser(
        prog="credo",
        description="credit assignment for multi-turn RL agents",
        epilog="examples:\n  credo train --iterations 20 optim.lr=1e-4\n"
        "  credo config --recipe gigpo\n  credo check-env --env mymodule:MyEnv\n"
        "`credo COMMAND --help` shows each command's options and examples.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"credo {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    recipe_help = "recipe name or path to a .yaml (default grpo; credo recipes lists them)"
    env_help = "env name or module:Class (default from the recipe: shop; credo envs lists them)"
    model_help = (
        "smollm2-135m (offline, `make smollm`), an HF model name or folder "
        "(default: the built-in tiny model)"
    )

    t = _sub(
        sub,
        "train",
        "warm-start then train a policy with RL",
        """
        credo train --iterations 20
        credo train --recipe gigpo --env mymodule:MyEnv sft.enabled=false
        credo train optim.lr=1e-4 --iterations 5 rollout.group_size=4
        credo train --resume runs/grpo-shop-20260101-120000
        credo train --resume runs/grpo-shop-20260101-120000 train.iterations=200   (extend)
        """,
    )
    t.add_argument("--recipe", default="grpo", help=recipe_help)
    t.add_argument("--env", help=env_help)
    t.add_argument("--model", help=model_help)
    t.add_argument("--iterations", type=int, help="RL iterations (train.iterations)")
    t.add_argument("--seed", type=int, help="everything random derives from it (train.seed)")
    t.add_argument("--name", help="run folder name under runs/ (train.name)")
    t.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped run exactly; with train.iterations=N, extend a finished one",
    )
    t.add_argument(
        "--agent",
        metavar="MODULE:FUNCTION",
        help="train an agent written against the OpenAI API (rollout.agent; "
        "e.g. examples/openai_agent.py:run; needs the serve extra)",
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    s = _sub(
        sub,
        "sft",
        "run (or load from cache) the warm start and evaluate it",
        """
        credo sft
        credo sft --env mymodule:MyEnv sft.steps=500 --episodes 100
        """,
    )
    s.add_argument("--recipe", default="grpo", help=recipe_help)
    s.add_argument("--env", help=env_help)
    s.add_argument("--model", help=model_help)
    s.add_argument("--seed", type=int, help="train.seed (the demonstrations and the init)")
    s.add_argument("--episodes", type=int, help="held-out episodes (default eval.episodes)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sft)

    e = _sub(
        sub,
        "eval",
        "held-out success of a run's policy or of a model",
        """
        credo eval runs/grpo-shop-20260101-120000 --episodes 200
        credo eval runs/grpo-shop-20260101-120000 --greedy rollout.temperature=0.7
        credo eval runs/grpo-shop-20260101-120000 --mistakes
        credo eval runs/grpo-shop-20260101-120000 --failures 10
        credo eval --model smollm2-135m --env shop --episodes 50
        """,
    )
    e.add_argument("run_dir", nargs="?", help="a run folder (its trained policy)")
    e.add_argument("--model", help="evaluate a model instead of a run (e.g. smollm2-135m)")
    e.add_argument("--env", help="env (default: the run's, else shop)")
    e.add_argument("--episodes", type=int, default=500, help="held-out episodes (default 500)")
    e.add_argument("--greedy", action="store_true", help="temperature 0")
    e.add_argument("--trials", type=int, default=1, help="episodes per task (default 1)")
    e.add_argument("--k", help="k values of pass@k and pass^k, e.g. 1,2,4 (each ≤ --trials)")
    e.add_argument(
        "--mistakes",
        action="store_true",
        help="label every action with the env's label rule (shop, tools) and tally how "
        "the episodes went wrong",
    )
    e.add_argument(
        "--failures",
        type=int,
        default=0,
        metavar="N",
        help="also print the first N failed episodes, each action with its label (implies "
        "--mistakes; default 0)",
    )
    e.add_argument("--json", action="store_true", help="also print the result as JSON")
    e.set_defaults(func=cmd_eval)

    pl = _sub(
        sub,
        "play",
        "play an environment in the terminal",
        """
        credo play
        credo play --env shop env.kwargs.difficulty=multi --task 3
        credo play --env mymodule:MyEnv --split train
        """,
    )
    pl.add_argument("--recipe", default="grpo", help="recipe whose env settings to use")
    pl.add_argument("--env", help=env_help)
    pl.add_argument("--task", type=int, default=0, help="task index (default 0)")
    pl.add_argument(
        "--split", default="test", choices=["train", "test"], help="task split (default test)"
    )
    pl.set_defaults(func=cmd_play)

    c = _sub(
        sub,
        "compare",
        "train several recipes on the same tasks and budget",
        """
        credo compare --recipes grpo,gigpo --seeds 3 --iterations 50
        credo compare --recipes grpo,gigpo,tsbpo --reference grpo eval.episodes=200
        credo compare --recipes grpo,opd opd:teacher.path=RUN_DIR   # RECIPE:key=value: that recipe only
        """,
    )
    c.add_argument("--recipes", required=True, help="comma-separated recipe names")
    c.add_argument("--seeds", type=int, default=3, help="number of seeds 0..N-1 (default 3)")
    c.add_argument("--seed-list", type=int, nargs="+", help="explicit seeds instead")
    c.add_argument("--env", help="env for every run")
    c.add_argument("--iterations", type=int, help="RL iterations of every run")
    c.add_argument("--reference", help="recipe defining the target success (default grpo)")
    c.add_argument("--out", help="comparison folder (default runs/compare-<time>)")
    c.add_argument("--trials", type=int, default=1, help="pass^k: episodes per held-out task")
    c.add_argument("--k", help="show held-out pass^k for these k, e.g. 1,2,4 (each ≤ --trials)")
    c.add_argument(
        "--jobs", type=int, default=1, help="runs side by side, one process each (default 1)"
    )
    c.set_defaults(func=cmd_compare)

    st = _sub(
        sub,
        "study",
        "run a study file: arms × seeds, its table, plot and page (docs/studies/)",
        """
        credo study studies/update-schedule-lights.yaml --jobs 2
        credo study studies/update-schedule-multi.yaml --no-docs --out /tmp/runs
        """,
    )
    st.add_argument("file", help="the study file (studies/NAME.yaml)")
    st.add_argument(
        "--jobs", type=int, default=1, help="runs side by side, one process each (default 1)"
    )
    st.add_argument(
        "--out",
        help="the folder of studies' runs: this one's go to OUT/NAME (default runs/studies)",
    )
    st.add_argument(
        "--docs", default="docs/studies", help="where its page goes (default docs/studies)"
    )
    st.add_argument("--no-docs", action="store_true", help="write no page, only the runs")
    st.add_argument(
        "--records",
        help="the folder of run records (a finished run's config, evaluations and metrics, "
        "small enough to commit): this study's in RECORDS/NAME; a run recorded with the "
        "same config is read, not trained, and a run to train starts from its seed's "
        "recorded warm start (default: records/ beside the study file)",
    )
    st.add_argument("--no-records", action="store_true", help="neither read nor write run records")
    st.set_defaults(func=cmd_study)

    cf = _sub(
        sub,
        "config",
        "print the resolved config, every key with its meaning and default",
        """
        credo config
        credo config --recipe gigpo optim.lr=1e-4 > my.yaml   (then: credo train --recipe my.yaml)
        """,
    )
    cf.add_argument("--recipe", default="grpo", help=recipe_help)
    cf.add_argument("--env", help=env_help)
    cf.add_argument("--model", help=model_help)
    cf.set_defaults(func=cmd_config)

    ck = _sub(
        sub,
        "check-env",
        "check an env against the protocol (types, determinism, snapshots, tokenizer)",
        """
        credo check-env --env mymodule:MyEnv
        credo check-env --env shop env.kwargs.difficulty=multi --tasks 20
        """,
    )
    ck.add_argument("--env", help=env_help)
    ck.add_argument("--recipe", default="grpo", help="recipe whose env settings to use")
    ck.add_argument("--model", help="check the round trip through this model's tokenizer")
    ck.add_argument("--tasks", type=int, default=8, help="training tasks to play (default 8)")
    ck.set_defaults(func=cmd_check_env)

    sv = _sub(
        sub,
        "serve",
        "serve a policy over the OpenAI chat-completions API (all options: credo serve --help)",
        """
        credo serve smollm2-135m --port 8000
        credo serve runs/grpo-shop-20261130/final_policy
        """,
        add_help=False,
    )
    sv.add_argument("serve_args", nargs=argparse.REMAINDER)
    sv.set_defaults(func=cmd_serve)

    pp = _sub(
        sub,
        "pipeline",
        "run a staged pipeline file (all options: credo pipeline --help)",
        "credo pipeline pipelines/spatialcli.yaml [--resume]",
        add_help=False,
    )
    pp.add_argument("pipeline_args", nargs=argparse.REMAINDER)

    en = _sub(sub, "envs", "list environments", "credo envs")
    en.set_defaults(func=cmd_envs)
    rc = _sub(sub, "recipes", "list recipes", "credo recipes")
    rc.set_defaults(func=cmd_recipes)
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; ``key.sub=value`` tokens may stand anywhere and end up in
    ``args.overrides`` (for ``eval``, the one other positional is the run folder)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    tokens = ([args.run_dir] if getattr(args, "run_dir", None) else []) + rest
    overrides, other = [], []
    for tok in tokens:
        is_override = _OVERRIDE.match(tok) and not Path(tok).exists()
        (overrides if is_override else other).append(tok)
    if args.command == "eval":
        paths = [t for t in other if not t.startswith("-")]
        other = [t for t in other if t.startswith("-")] + paths[1:]
        args.run_dir = paths[0] if paths else None
    sub = next(a for a in parser._actions if a.dest == "command").choices[args.command]
    if other:
        options = [o for a in sub._actions for o in a.option_strings]
        hints = []
        for tok in other:
            close = difflib.get_close_matches(tok.split("=")[0], options, n=1)
            if tok.startswith("-") and close:
                hints.append(f"{tok}: did you mean {close[0]}?")
        sub.error(
            f"unrecognized arguments: {' '.join(other)}"
            + (f" ({'; '.join(hints)})" if hints else "")
            + "; overrides look like key.sub=value"
        )
    if overrides and args.command in ("envs", "recipes"):
        sub.error(f"takes no overrides (got {' '.join(overrides)})")
    args.overrides = overrides
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the command; bad input ends in one ``error:`` line and exit status 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # all of its options are credo.serve's, --help included
        return cmd_serve(argparse.Namespace(serve_args=argv[1:]))
    if argv[:1] == ["pipeline"]:  # its FILE and options are credo.pipeline.cli's
        from credo.pipeline.cli import main as pipeline_main

        return pipeline_main(argv[1:])
    args = parse_args(argv)
    from credo.train.config import ConfigError
    from credo.utils.storage import StorageError, storage_problem

    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (
        ConfigError,
        UsageError,
        FileExistsError,
        FileNotFoundError,
        ValueError,
        FloatingPointError,
    ) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except Exception as exc:  # a full disk, a read-only folder: one line, not a traceback
        refused = storage_problem(exc)
        if refused is None:
            raise
        line = str(exc) if isinstance(exc, StorageError) else refused[1]
        print(f"error: {' '.join(line.split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
