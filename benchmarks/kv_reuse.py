"""Multi-turn KV reuse: prefill tokens and time per turn, with and without reuse.

Each setting runs the group sampler on ``shop`` with greedy decoding twice, once with
``rollout.kv_reuse`` off and once on, and checks that both runs sample the same tokens:

- ``smollm2 8`` / ``smollm2 16``: SmolLM2-135M-Instruct (the packaged GGUF) with its chat
  template and the whole episode in the prompt (``history_turns`` = the turn count), in
  episodes of 8 and 16 turns. Each turn appends the previous action and a new
  observation, so without reuse the prefill of turn t re-reads the t − 1 turns before it.
- ``built-in``: the built-in model (freshly initialised: only its cost matters here) with
  its plain format and the default window of 2 past actions, which slides every turn:
  prompts do not extend each other and reuse must fall back to full prefills.

Prints a summary (prefill tokens per episode, generated tokens/s, wall time) and, per
turn, the prefill tokens and seconds of both runs: with reuse the cost of a turn should
stop growing with the turn index. The CPU is shared: compare ratios within one run.

    python benchmarks/kv_reuse.py [--episodes 1] [--turns 8 16] [--builtin-episodes 8]
        [--max-new-tokens 16] [--threads 1] [--skip-smollm2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import print_table

from credo.envs import Task
from credo.envs.shop import ShopEnv
from credo.policy import HFPolicy, SamplingParams, create_tiny_policy
from credo.policy.tiny import TinyModelConfig
from credo.rollout import sample_groups
from credo.rollout.render import PLAIN_WORDS, ChatRenderer, PlainRenderer
from credo.rollout.sampler import SamplerContext


def timed_generate(policy: HFPolicy, log: list[dict[str, float]]) -> Callable[..., Any]:
    """``policy.generate`` that appends one record per call (= per turn: the group sampler
    advances every live episode together) to ``log``."""
    inner = policy.generate

    def generate(prompts, sampling, generator=None, sessions=None):  # type: ignore[no-untyped-def]
        before = policy.kv_stats.as_dict()
        start = time.perf_counter()
        gens = inner(prompts, sampling, generator, sessions=sessions)
        after = policy.kv_stats.as_dict()
        log.append(
            {
                "rows": len(prompts),
                "seconds": time.perf_counter() - start,
                "generated": sum(len(g.token_ids) for g in gens),
                **{k: after[k] - before[k] for k in after},
            }
        )
        return gens

    return generate


def run(
    policy: HFPolicy,
    renderer: Any,
    make_env: Callable[[], Any],
    turns: int,
    episodes: int,
    sampling: SamplingParams,
    *,
    reuse: bool,
) -> tuple[list[dict[str, float]], list[Any]]:
    """One group-sampler call of ``episodes`` tasks × 1 episode; per-turn records and the
    sampled response tokens."""
    policy.configure_kv_reuse(reuse)
    log: list[dict[str, float]] = []
    policy.generate = timed_generate(policy, log)  # type: ignore[method-assign]
    try:
        ctx = SamplerContext(
            policy=policy,
            renderer=renderer,
            make_env=make_env,
            sampling=sampling,
            max_turns=turns,
            generator=torch.Generator().manual_seed(0),
        )
        res = sample_groups(ctx, [Task.make("test", i) for i in range(episodes)], group_size=1)
    finally:
        del policy.generate
    return log, [s.response_ids for e in res.episodes for s in e.steps]


def compare(
    name: str,
    policy: HFPolicy,
    renderer: Any,
    make_env: Callable[[], Any],
    turns: int,
    episodes: int,
    sampling: SamplingParams,
    summary: list[list[Any]],
) -> None:
    off, tokens_off = run(policy, renderer, make_env, turns, episodes, sampling, reuse=False)
    on, tokens_on = run(policy, renderer, make_env, turns, episodes, sampling, reuse=True)
    same = "yes" if tokens_off == tokens_on else "NO"
    total = {}
    for label, log in (("off", off), ("on", on)):
        secs = sum(r["seconds"] for r in log)
        gen = sum(r["generated"] for r in log)
        total[label] = secs
        summary.append(
            [
                name,
                label,
                episodes,
                len(log),
                f"{sum(r['prefill_tokens'] for r in log) / episodes:.0f}",
                f"{sum(r['reused_tokens'] for r in log) / episodes:.0f}",
                f"{sum(r['prefill_seconds'] for r in log):.1f}",
                f"{secs:.1f}",
                f"{gen / secs:.1f}",
                same,
            ]
        )
    summary[-1].append(f"{total['off'] / total['on']:.2f}×")
    summary[-2].append("")
    rows = []
    for t, (a, b) in enumerate(zip(off, on), 1):
        rows.append(
            [
                t,
                int(a["rows"]),
                int(a["prefill_tokens"]),
                int(b["prefill_tokens"]),
                int(b["reused_tokens"]),
                f"{a['prefill_seconds']:.2f}",
                f"{b['prefill_seconds']:.2f}",
                f"{a['seconds']:.2f}",
                f"{b['seconds']:.2f}",
            ]
        )
    print_table(
        f"{name}: per turn (all live episodes batched)",
        [
            "turn",
            "rows",
            "prefill tok off",
            "prefill tok on",
            "reused on",
            "prefill s off",
            "prefill s on",
            "turn s off",
            "turn s on",
        ],
        rows,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=1, help="SmolLM2 episodes per setting")
    ap.add_argument("--turns", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--builtin-episodes", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-smollm2", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sampling = SamplingParams(temperature=0, max_new_tokens=args.max_new_tokens)
    summary: list[list[Any]] = []

    words = sorted({*ShopEnv().vocabulary(), *PLAIN_WORDS})
    tiny = create_tiny_policy(words, TinyModelConfig(), seed=0)
    compare(
        "built-in",
        tiny,
        PlainRenderer(tiny.tokenizer, 2),
        lambda: ShopEnv(max_turns=8),
        8,
        args.builtin_episodes,
        sampling,
        summary,
    )
    if not args.skip_smollm2:
        from credo.policy.models import MODEL_ALIASES, load_gguf, packaged_gguf

        model, tokenizer = load_gguf(packaged_gguf(MODEL_ALIASES["smollm2-135m"]))
        smol = HFPolicy(model, tokenizer)
        rules = ShopEnv().action_format()
        for turns in args.turns:
            compare(
                f"smollm2 {turns}",
                smol,
                ChatRenderer(tokenizer, turns, rules),
                lambda turns=turns: ShopEnv(max_turns=turns),
                turns,
                args.episodes,
                sampling,
                summary,
            )
    print_table(
        "KV reuse (greedy, same tasks; prefill tokens = prompt tokens fed to the model)",
        [
            "setting",
            "reuse",
            "episodes",
            "turns",
            "prefill tok/episode",
            "reused tok/episode",
            "prefill s",
            "total s",
            "generated tok/s",
            "same tokens",
            "speed-up",
        ],
        summary,
    )


if __name__ == "__main__":
    main()
