"""Generation on this CPU: credo's HF sampler against vLLM's CPU build, SmolLM2-135M.

    make vllm-check                                   # builds .venv-vllm once
    .venv-vllm/bin/python benchmarks/vllm_cpu.py      # batch 1, 8, 32; a few minutes
    .venv-vllm/bin/python benchmarks/vllm_cpu.py --batches 8 --new-tokens 64
    .venv-vllm/bin/python benchmarks/vllm_cpu.py --batches --turns 4   # multi-turn only

The same chat prompts (one short user message each, about 40 tokens with the template),
temperature 1, ``--new-tokens`` tokens at most, sampled by each engine at each batch size
(the best of ``--repeats`` timed calls; vLLM's engine is built once beforehand and that
build is timed apart). Beside it: the trainer's update cost on the same batch (one
forward and backward pass of the HF model over prompt + response, as the update pays per
micro-batch), and the largest |log p_vLLM − log p_trainer| over vLLM's tokens.

Multi-turn (``--turns`` T > 0, ``--conversations`` B): B conversations of T turns, each
turn's prompt the previous prompt + its response + a new user message (token for token,
as credo's rollouts grow a prompt), timed over all T turns; with and without KV reuse on
each engine (the HF sampler's per-session caches, ``rollout.kv_reuse``; vLLM's prefix
caching, ``engine_params.prefix_caching``). "prompt tokens computed" is what the HF
sampler prefilled (vLLM does not report it per call).

Quote ratios from one run: the machine is shared.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import torch
from _common import print_table


def _prompts(policy: Any, n: int) -> list[list[int]]:
    tok = policy.tokenizer
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Write one sentence about the number {i}."}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def _timed(fn: Callable[..., Any], repeats: int, *args: Any) -> tuple[float, Any]:
    """The best of ``repeats`` timed calls ``fn(*args)``, and the last call's result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t)
    return best, out


def _seeded(generate: Callable[..., Any], prompts: list[list[int]], sp: Any) -> Any:
    return generate(prompts, sp, torch.Generator().manual_seed(0))


def _update(policy: Any, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """One forward and backward pass of the trainer over ``ids``."""
    policy.model.zero_grad(set_to_none=True)
    policy.score(ids, mask).logprobs.sum().backward()


def _next_turn(policy: Any, prompt: list[int], response: list[int], turn: int) -> list[int]:
    """The next turn's prompt: this one, the response (closed by the stop token), a user
    message, and the assistant header."""
    stop = policy.stop_ids[0]
    closed = response if response and response[-1] in policy.stop_ids else [*response, stop]
    msg = f"\n<|im_start|>user\nNow one more sentence, number {turn}.<|im_end|>\n<|im_start|>assistant\n"
    return [*prompt, *closed, *policy.tokenizer.encode(msg, add_special_tokens=False)]


def _conversation(
    generate: Callable[..., Any],
    policy: Any,
    prompts: list[list[int]],
    sp: Any,
    turns: int,
    sessions: bool,
) -> tuple[float, int, int]:
    """Seconds, generated tokens and final prompt length (mean) of ``turns`` turns."""
    keys = list(range(len(prompts))) if sessions else None
    gen = torch.Generator().manual_seed(0)
    t, tokens = time.perf_counter(), 0
    for turn in range(turns):
        out = generate(prompts, sp, gen, keys) if keys is not None else generate(prompts, sp, gen)
        tokens += sum(len(g.token_ids) for g in out)
        if turn + 1 < turns:
            prompts = [_next_turn(policy, p, g.token_ids, turn + 1) for p, g in zip(prompts, out)]
    return time.perf_counter() - t, tokens, sum(map(len, prompts)) // len(prompts)


def _multi_turn(policy: Any, args: argparse.Namespace) -> None:
    from credo.policy.base import SamplingParams
    from credo.policy.vllm_engine import VLLMEngine, VLLMParams

    sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    prompts = _prompts(policy, args.conversations)
    rows = []
    for reuse in (False, True):
        policy.configure_kv_reuse(reuse)
        before = policy.kv_stats.prefill_tokens
        s, n, length = _conversation(policy.generate, policy, prompts, sp, args.turns, reuse)
        computed = policy.kv_stats.prefill_tokens - before
        rows.append(
            ["HF sampler", "on" if reuse else "off", f"{s:.1f}", f"{n / s:.1f}", length, computed]
        )
    policy.configure_kv_reuse(True)
    for reuse in (False, True):
        engine = VLLMEngine(
            VLLMParams(
                dtype="float32", enforce_eager=True, max_model_len=2048, prefix_caching=reuse
            )
        )
        engine.sync_weights(policy)
        s, n, length = _conversation(engine.generate, policy, prompts, sp, args.turns, False)
        engine.close()
        rows.append(["vLLM-CPU", "on" if reuse else "off", f"{s:.1f}", f"{n / s:.1f}", length, "-"])
    print_table(
        f"multi-turn on this CPU, SmolLM2-135M: {args.conversations} conversations × "
        f"{args.turns} turns, ≤ {args.new_tokens} new tokens per turn",
        [
            "engine",
            "KV reuse",
            "s (all turns)",
            "tok/s",
            "last prompt (tokens)",
            "prompt tokens computed",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--turns", type=int, default=4, help="multi-turn rows (0: none)")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the HF sampler")
    args = ap.parse_args(argv)

    from credo.policy.base import SamplingParams
    from credo.policy.hf import HFPolicy
    from credo.policy.models import resolve_model
    from credo.policy.vllm_engine import VLLMEngine, VLLMParams, vllm_problem

    problem = vllm_problem()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    policy = HFPolicy.from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32)
    if args.turns > 0:
        _multi_turn(policy, args)
    if not args.batches:
        return 0
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    engine = VLLMEngine(VLLMParams(dtype="float32", enforce_eager=True, max_model_len=1024))
    t = time.perf_counter()
    engine.sync_weights(policy)
    build = time.perf_counter() - t
    t = time.perf_counter()
    engine.sync_weights(policy)
    sync = time.perf_counter() - t
    rows = []
    for b in args.batches:
        prompts = _prompts(policy, b)
        s_hf, g_hf = _timed(_seeded, args.repeats, policy.generate, prompts, sp)
        s_vl, g_vl = _timed(_seeded, args.repeats, engine.generate, prompts, sp)
        n_hf = sum(len(g.token_ids) for g in g_hf)
        n_vl = sum(len(g.token_ids) for g in g_vl)
        worst = 0.0
        seqs = []
        for p, g in zip(prompts, g_vl):
            ids = torch.tensor([p + g.token_ids])
            with torch.no_grad():
                lp = policy.logprobs(ids, torch.ones_like(ids))[
                    0, len(p) : len(p) + len(g.token_ids)
                ]
            worst = max(worst, float((lp - g.logprobs).abs().max()))
            seqs.append(p + g.token_ids)
        width = max(map(len, seqs))
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        s_up, _ = _timed(_update, args.repeats, policy, ids, mask)
        rows.append(
            [
                b,
                f"{n_hf / s_hf:.0f}",
                f"{n_vl / s_vl:.0f}",
                f"{(n_vl / s_vl) / (n_hf / s_hf):.2f}×",
                f"{s_hf:.2f}",
                f"{s_vl:.2f}",
                f"{s_up:.2f}",
                f"{worst:.1e}",
            ]
        )
    engine.close()
    print_table(
        f"generation on this CPU, SmolLM2-135M, ≤ {args.new_tokens} new tokens "
        f"(vLLM built in {build:.1f} s, a weight sync {sync:.2f} s)",
        [
            "batch",
            "HF tok/s",
            "vLLM tok/s",
            "vLLM / HF",
            "HF s",
            "vLLM s",
            "update s (fwd+bwd)",
            "max |Δ log p|",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
