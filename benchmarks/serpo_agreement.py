"""SERPO: how well a judge's rubric reward agrees with the hidden truth of free text.

The tools env with ``closing=respond`` knows, for every message to the customer, the
share of the ticket's requests whose facts it states (``message_truth``); the env's own
reward never reads the message. For held-out tasks we play the oracle's episode, write
its message and corrupted versions of it (an amount dropped or changed, an item or a
colour swapped, a request left out, a message that states nothing) and score each with a
judge on a rubric; we report the AUC of the rubric reward for fully true vs not fully
true messages, Pearson's r with the truth, and the mean score per kind of message.

The judge reads the ticket (``--context instruction``) or the episode's transcript
(``--context transcript``: the ticket and the tool results, where the amounts are).
With ``--fit-steps N`` the judge is first fitted (:func:`credo.teachers.fit_judge`) on
the same kinds of messages for ``--fit-tasks`` *training* tasks, labelled with their
hidden truth, on the one-question ``fact`` rubric, and with ``--rollouts RUN`` on the
messages that run's warm start writes itself (the judge that beat chance on the policy's
messages, docs/rewards.md); ``--save DIR`` writes the fitted judge and that rubric
(``DIR/rubric.yaml``) for ``judge.model=DIR judge.rubric=DIR/rubric.yaml``.

    PYTHONPATH=src python benchmarks/serpo_agreement.py --judge smollm2-135m --tasks 20
    PYTHONPATH=src python benchmarks/serpo_agreement.py --judge builtin
    PYTHONPATH=src python benchmarks/serpo_agreement.py --judge builtin --context transcript \
        --rollouts runs/cmp-serpo/grpo-seed0 --fit-steps 3000 --save runs/judge-tools

(``builtin`` unfitted: an untrained built-in model, the chance baseline.)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import time
from collections import defaultdict
from pathlib import Path

import _common  # puts the repository root on sys.path; warm_policy
import torch

from credo.envs.base import Task
from credo.envs.tools import COLORS, ITEMS, ToolsEnv
from credo.policy.tiny import TinyModelConfig
from credo.teachers.judge import Judge
from credo.teachers.judge_fit import JudgeExample, fit_judge
from credo.teachers.judging import DEFAULT_RUBRIC, episode_transcript, judge_policy, rank_auc
from credo.teachers.rubric import Rubric, RubricItem
from credo.utils.atomic import temp_path

#: A rubric that asks about the facts against the ticket itself.
FACT_RUBRIC = Rubric(
    [
        RubricItem(
            "Does the response state the correct amount and item for what the customer "
            "asked in the context?",
            1.0,
        )
    ]
)

DIFFICULTIES = ("easy", "default", "hard")


def messages(env: ToolsEnv, rng: random.Random) -> list[tuple[str, str]]:
    """``(kind, message)``: the oracle's and corrupted versions."""
    good = env.oracle_message()
    out = [("oracle", good)]
    facts = env.message_facts()
    amounts = [f[1] for f in facts if f[0] in ("refund", "credit")]
    if amounts:
        a = amounts[0]
        out.append(("amount dropped", good.replace(f"$ {a} ", "", 1)))
        out.append(("amount wrong", good.replace(f"$ {a} ", f"$ {int(a) + 5} ", 1)))
    colors = [f[2] for f in facts if f[0] == "exchange"]
    if colors:
        other = rng.choice([c for c in COLORS if c != colors[0]])
        out.append(("colour wrong", good.replace(f" for {colors[0]} ", f" for {other} ", 1)))
    item = facts[0][2] if facts[0][0] in ("refund", "credit") else facts[0][1]
    other = rng.choice([i for i in ITEMS if i != item])
    out.append(("item swapped", good.replace(f" {item} ", f" {other} ", 1)))
    if len(facts) > 1:
        clauses = good.removeprefix("resolved : ").removesuffix(" ; bye").split(" ; ")
        out.append(("request left out", "resolved : " + " ; ".join(clauses[1:]) + " ; bye"))
    out.append(("states nothing", "resolved : your request is done ; bye"))
    return out


def hard_messages(env: ToolsEnv, rng: random.Random) -> list[tuple[str, str]]:
    """The oracle's message and its one-word corruptions (another item, colour or amount,
    drawn afresh): the contrasts a judge must read the context for."""
    good = env.oracle_message()
    out = [("oracle", good)]
    for f in env.message_facts():
        if f[0] in ("refund", "credit"):
            wrong = int(f[1]) + rng.choice([-10, -5, 5, 10])
            out.append(("amount wrong", good.replace(f"$ {f[1]} ", f"$ {wrong} ", 1)))
        if f[0] == "exchange":
            other = rng.choice([c for c in COLORS if c != f[2]])
            out.append(("colour wrong", good.replace(f" for {f[2]} ", f" for {other} ", 1)))
        item = f[2] if f[0] in ("refund", "credit") else f[1]
        other = rng.choice([i for i in ITEMS if i != item])
        out.append(("item swapped", good.replace(f" {item} ", f" {other} ", 1)))
    return out


def rows(
    split: str, n: int, context: str, seed: int, hard: int = 0
) -> list[tuple[str, str, str, float]]:
    """``(kind, message, context, truth)`` for ``n`` tasks of ``split``: the oracle plays
    each episode up to its ``respond`` call; the context is what the judge reads in
    training (:func:`episode_transcript` of the observations the oracle acted on).
    ``hard``: that many more draws per task of :func:`hard_messages`."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        env = ToolsEnv(DIFFICULTIES[i % 3], closing="respond")
        seen = [env.reset(Task.make(split, i))]
        while not (action := env.oracle_action()).startswith("respond"):
            seen.append(env.step(action).observation)
        ctx = env.instruction()
        if context == "transcript":
            ctx = episode_transcript(ctx, seen)
        msgs = messages(env, rng) + [m for _ in range(hard) for m in hard_messages(env, rng)]
        out += [(kind, m, ctx, env.message_truth(m)) for kind, m in msgs]
    return out


def policy_rows(
    run_dir: str, split: str, n: int, context: str, seed: int
) -> list[tuple[str, str, str, float]]:
    """``(kind, message, context, truth)`` of the messages a run's warm start writes on
    ``n`` tasks of ``split`` (2 episodes each; episodes that send none are left out): the
    messages RL will start from, labelled with their hidden truth."""
    import yaml

    from credo.rollout import sample_groups
    from credo.train.config import Config

    cfg = Config.from_dict(yaml.safe_load((Path(run_dir) / "config.yaml").read_text()))
    run, policy = _common.warm_policy(cfg)
    ctx = run.sampler_context(policy, generator=torch.Generator().manual_seed(seed))
    out = []
    for lo in range(0, n, 64):
        tasks = [Task.make(split, i) for i in range(lo, min(n, lo + 64))]
        for e in sample_groups(ctx, tasks, group_size=2).episodes:
            env = run.make_env()
            env.reset(tasks[e.group])
            text = env.free_text(e.steps[-1].action) if e.steps else None
            if text is None:
                continue
            c = env.instruction()
            if context == "transcript":
                c = episode_transcript(c, [st.observation for st in e.steps])
            out.append(("policy", text, c, env.message_truth(text)))
    return out


def agreement(judge: Judge, rubric: Rubric, data: list[tuple[str, str, str, float]]) -> str:
    """One line: AUC, r and the mean score per kind of message."""
    t0 = time.perf_counter()
    scores = rubric.reward(judge, [r[1] for r in data], [r[2] for r in data])
    secs = time.perf_counter() - t0
    s = (scores / sum(it.weight for it in rubric.items)).tolist()
    truth = [r[3] for r in data]
    auc = rank_auc(s, [t >= 1.0 for t in truth])
    x, y = torch.tensor(s, dtype=torch.float64), torch.tensor(truth, dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    corr = float((x * y).sum() / (x.norm() * y.norm()).clamp(min=1e-12))
    by_kind: dict[str, list[float]] = defaultdict(list)
    for r, v in zip(data, s):
        by_kind[r[0]].append(v)
    kinds = " ".join(f"{k}={sum(v) / len(v):.3f}" for k, v in by_kind.items())
    return (
        f"messages={len(data)} true={sum(t >= 1 for t in truth)} auc={auc:.3f} r={corr:.3f} "
        f"forwards={judge.cost.forwards} seconds={secs:.1f} | {kinds}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", default="smollm2-135m", help="builtin, an alias or a folder")
    ap.add_argument("--tasks", type=int, default=20, help="held-out (test) tasks")
    ap.add_argument("--context", choices=("instruction", "transcript"), default="instruction")
    ap.add_argument("--fit-steps", type=int, default=0, help="fit the judge first (0: no)")
    ap.add_argument("--fit-tasks", type=int, default=1500, help="training tasks to fit on")
    ap.add_argument(
        "--hard", type=int, default=0,
        help="more draws per training task of the oracle and its one-word corruptions",
    )  # fmt: skip
    ap.add_argument(
        "--rollouts", default=None,
        help="a run folder: also fit on its warm start's own messages on training tasks",
    )  # fmt: skip
    ap.add_argument("--rollout-tasks", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=64, help="a fitted built-in judge's width")
    ap.add_argument("--layers", type=int, default=2, help="... and its layers")
    ap.add_argument("--heads", type=int, default=4, help="... and its attention heads")
    ap.add_argument(
        "--number-code", type=float, default=0.0,
        help="... and its number-value code (0: every number its own token, so that $30 "
        "and $35 look different)",
    )  # fmt: skip
    ap.add_argument("--save", default=None, help="folder for the fitted judge and rubric")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    test = rows("test", args.tasks, args.context, args.seed)
    words = ToolsEnv(closing="respond").vocabulary()
    if not args.fit_steps:
        for name, rubric in (("default", DEFAULT_RUBRIC), ("fact", FACT_RUBRIC)):
            judge = Judge(judge_policy(args.judge, words, rubric, args.seed, "cpu"))
            line = agreement(judge, rubric, test)
            print(f"judge={args.judge} rubric={name} context={args.context} {line}")
        return
    size = TinyModelConfig(
        hidden_size=args.width, num_layers=args.layers, num_heads=args.heads,
        intermediate_size=2 * args.width, number_code=args.number_code,
    )  # fmt: skip
    judge = Judge(judge_policy(args.judge, words, FACT_RUBRIC, args.seed, "cpu", size))
    question = FACT_RUBRIC.items[0].question
    train = rows("train", args.fit_tasks, args.context, args.seed + 1, args.hard)
    own_test: list[tuple[str, str, str, float]] = []
    if args.rollouts:
        own = policy_rows(args.rollouts, "train", args.rollout_tasks, args.context, args.seed)
        print(f"warm start's messages: {len(own)} ({sum(t >= 1 for *_, t in own)} true)")
        train += own
        own_test = policy_rows(args.rollouts, "test", args.tasks, args.context, args.seed)
        print(f"before fitting, the warm start's held-out messages: "
              f"{agreement(judge, FACT_RUBRIC, own_test)}")  # fmt: skip
    examples = [JudgeExample(question, c, m, t) for _, m, c, t in train]
    print(f"before fitting: {agreement(judge, FACT_RUBRIC, test)}")
    t0 = time.perf_counter()
    chunk = max(1, args.fit_steps // 5)
    for done in range(0, args.fit_steps, chunk):
        steps = min(chunk, args.fit_steps - done)
        losses = fit_judge(judge, examples, steps=steps, lr=args.lr, batch_size=args.batch,
                           seed=args.seed + done)  # fmt: skip
        mins = (time.perf_counter() - t0) / 60
        print(f"after {done + steps} steps ({mins:.1f} min, loss {sum(losses[-50:]) / len(losses[-50:]):.3f}): "
              f"{agreement(judge, FACT_RUBRIC, test)}")  # fmt: skip
        if own_test:
            print(
                f"  the warm start's held-out messages: {agreement(judge, FACT_RUBRIC, own_test)}"
            )
    if args.save:  # written aside, then renamed into place: never half-written
        out = Path(args.save)
        tmp = temp_path(out)
        judge.policy.save(tmp)
        (tmp / "rubric.yaml").write_text(f"- question: {question!r}\n  weight: 1.0\n")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        print(f"saved: judge.model={out} judge.rubric={out / 'rubric.yaml'}")


if __name__ == "__main__":
    main()
