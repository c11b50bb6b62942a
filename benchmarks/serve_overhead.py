"""The policy server's overhead per request against calling the policy directly.

Same policy, same prompt, greedy decoding of the same number of tokens both ways:

- direct: ``policy.generate`` on the prompt ids the server would build;
- served: one ``chat.completions.create`` through the real ``openai`` client to
  :class:`credo.serve.PolicyServer` on 127.0.0.1 (HTTP, JSON, chat template,
  tokenisation, recording);
- the same with ``--batch`` requests at once (async client) against one direct batch.

Prints the median wall time of each (``--reps`` repetitions after one warm-up).

    python benchmarks/serve_overhead.py [--reps 20] [--batch 16] [--policy DIR]

``--policy`` takes a saved policy folder (a run's ``final_policy``, a cached warm start);
default: the built-in model as a run builds it for ``shop``, untrained (a request's cost
depends on the tokens, not on the weights; greedy decoding stops both ways at the same
token, at most ``--tokens``; the table shows how many were generated).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from _common import print_table

from credo.policy.base import SamplingParams
from credo.serve import EngineConfig, PolicyServer, render_prompt
from credo.train.config import load_config
from credo.train.run import build_run

MESSAGES = [
    {
        "role": "user",
        "content": "history : none page : home : search for products goal : buy a red shirt "
        "action :",
    }
]


def _median_s(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--policy", default=None, help="a saved policy folder")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import openai

    cfg = load_config("grpo", ["train.threads=1", "sft.enabled=false"])
    run = build_run(cfg, policy_path=args.policy)
    policy = run.policy
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.tokens)
    prompt = render_prompt(policy.tokenizer, MESSAGES).ids
    gen = torch.Generator().manual_seed(0)

    direct_one = _median_s(lambda: policy.generate([prompt], greedy, gen), args.reps)
    direct_batch = _median_s(
        lambda: policy.generate([prompt] * args.batch, greedy, gen), max(3, args.reps // 4)
    )
    engine = EngineConfig.from_sampling(greedy)
    with PolicyServer(policy, engine=engine) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", timeout=60, max_retries=0)
        n_tokens: list[int] = []

        def one() -> None:
            r = client.chat.completions.create(
                model="credo", messages=MESSAGES, max_tokens=args.tokens, temperature=0.0
            )
            n_tokens.append(r.usage.completion_tokens)

        served_one = _median_s(one, args.reps)
        client.close()

        async def many() -> None:
            c = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", timeout=60)
            try:
                await asyncio.gather(
                    *(
                        c.chat.completions.create(
                            model="credo", messages=MESSAGES, max_tokens=args.tokens
                        )
                        for _ in range(args.batch)
                    )
                )
            finally:
                await c.close()

        served_batch = _median_s(lambda: asyncio.run(many()), max(3, args.reps // 4))
        direct_tokens = len(policy.generate([prompt], greedy, gen)[0].token_ids)
    ms = 1000.0
    print_table(
        f"policy server overhead ({sum(p.numel() for p in policy.model.parameters()):,} "
        f"parameters, {len(prompt)}-token prompt, {direct_tokens} generated tokens direct / "
        f"{n_tokens[-1]} served, medians of {args.reps})",
        ["what", "direct (ms)", "served (ms)", "overhead (ms)"],
        [
            [
                "1 request",
                f"{direct_one * ms:.1f}",
                f"{served_one * ms:.1f}",
                f"{(served_one - direct_one) * ms:.1f}",
            ],
            [
                f"{args.batch} concurrent requests",
                f"{direct_batch * ms:.1f}",
                f"{served_batch * ms:.1f}",
                f"{(served_batch - direct_batch) * ms:.1f}",
            ],
        ],
    )


if __name__ == "__main__":
    main()
