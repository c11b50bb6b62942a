"""Scoring the student's rows with any :class:`~credo.policy.HFPolicy`, in micro-batches.

For each row the teacher sequence is ``teacher prompt + the student's response ids``
(the teacher prompt is the student's own unless a privileged one is given). Micro-batches
of rows are **left-padded** (positions counted from the attention mask, as
:meth:`HFPolicy.generate` does) so every response ends at the last column; the model is
asked for the logits of the last ``R + 1`` columns only (``R`` the longest response of the
micro-batch) where it supports ``logits_to_keep``, so the ``[B, L, V]`` logits of long
prompts are never materialised. Log-probs are computed in float32 from the
temperature-scaled logits (temperature 1 by default: the teacher's own distribution) and
scattered back to the student's response positions.

Everything runs under ``torch.no_grad`` with the model in eval mode (restored after);
a LoRA policy with ``adapters_disabled`` scores with its adapters off, as
:meth:`HFPolicy.score` does.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from typing import Any

import torch
import torch.nn.functional as F

from credo.policy import HFPolicy
from credo.teachers.base import TeacherCost, TeacherRows, TeacherScores

__all__ = ["FULL_MAX_VOCAB", "score_with_policy"]

#: Largest vocabulary for which a full distribution may be requested.
FULL_MAX_VOCAB = 4096


def _keep_arg(model: Any) -> str | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(type(base).forward).parameters
    return next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)


def _adapters(policy: HFPolicy) -> contextlib.AbstractContextManager[Any]:
    if getattr(policy, "adapters_disabled", False) and policy.is_peft:
        return policy.model.disable_adapter()
    return contextlib.nullcontext()


def _row_parts(rows: TeacherRows, b: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """``(teacher prompt ids, response ids [R], student positions [R])`` of row ``b``."""
    real = rows.attention_mask[b].bool()
    resp = rows.response_mask[b].bool() & real
    pos = resp.nonzero().flatten()
    ids = rows.input_ids[b]
    if pos.numel() == 0:
        start = int(real.sum())
    else:
        start = int(pos[0])
        if int(pos[-1]) - start + 1 != pos.numel():
            raise ValueError(f"teacher rows: row {b}'s response tokens are not contiguous")
    prompt = rows.prompts[b] if rows.prompts is not None else None
    if prompt is None:
        prompt = ids[:start][real[:start]].tolist()
    else:
        prompt = [int(t) for t in prompt]
    if pos.numel() and not prompt:
        raise ValueError(
            f"teacher rows: row {b} has an empty teacher prompt; the first response token "
            "needs at least one token before it"
        )
    return prompt, ids[pos], pos


@torch.no_grad()
def score_with_policy(
    policy: HFPolicy,
    rows: TeacherRows,
    *,
    topk: int = 0,
    full: bool = False,
    micro_batch: int = 16,
    temperature: float = 1.0,
) -> TeacherScores:
    """Score the student's rows with ``policy`` (module docstring).

    Args:
        policy: the teacher model.
        rows: the student's rows and optional teacher prompts.
        topk: also return the teacher's top-``topk`` ids and log-probs per response token
            (0: none; capped at the vocabulary size).
        full: return the whole distribution (ids ``0..V−1``) instead of a top-K head;
            allowed for vocabularies of at most :data:`FULL_MAX_VOCAB` tokens.
        micro_batch: rows per forward pass (default 16).
        temperature: logits are divided by it (default 1; 0 is treated as 1).

    Returns:
        :class:`TeacherScores` aligned with ``rows.input_ids``, on the CPU.
    """
    if micro_batch < 1:
        raise ValueError(f"teacher micro_batch must be >= 1, got {micro_batch}")
    if topk < 0:
        raise ValueError(f"teacher topk must be >= 0, got {topk}")
    vocab = int(policy.vocab_size)
    if full and vocab > FULL_MAX_VOCAB:
        raise ValueError(
            f"full teacher distributions are for vocabularies of at most {FULL_MAX_VOCAB} "
            f"tokens; this teacher has {vocab}: use topk instead"
        )
    t0 = time.perf_counter()
    b, length = rows.input_ids.shape
    k = vocab if full else min(int(topk), vocab)
    lp_out = torch.zeros((b, length), dtype=torch.float32)
    ids_out = torch.zeros((b, length, k), dtype=torch.long) if k else None
    top_out = torch.zeros((b, length, k), dtype=torch.float32) if k else None
    parts = [_row_parts(rows, i) for i in range(b)]
    cost = TeacherCost(rows=b, calls=1)
    keep_arg = _keep_arg(policy.model)
    temp = temperature if temperature > 0 else 1.0
    model = policy.model
    was_training = model.training
    model.eval()
    try:
        for lo in range(0, b, micro_batch):
            chunk = [i for i in range(lo, min(lo + micro_batch, b)) if parts[i][1].numel()]
            if not chunk:
                continue
            seqs = [parts[i][0] + parts[i][1].tolist() for i in chunk]
            width = max(len(s) for s in seqs)
            r_max = max(parts[i][1].numel() for i in chunk)
            ids = torch.full((len(chunk), width), policy.pad_id, dtype=torch.long)
            attn = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, s in enumerate(seqs):
                ids[j, width - len(s) :] = torch.as_tensor(s, dtype=torch.long)
                attn[j, width - len(s) :] = 1
            cost.tokens += sum(len(s) for s in seqs)
            pos_ids = (attn.cumsum(-1) - 1).clamp(min=0)
            extra = {keep_arg: r_max + 1} if keep_arg else {}
            dev = policy.device
            with _adapters(policy):
                logits = model(
                    input_ids=ids.to(dev),
                    attention_mask=attn.to(dev),
                    position_ids=pos_ids.to(dev),
                    use_cache=False,
                    **extra,
                ).logits[:, -(r_max + 1) : -1]
            if logits.shape[-1] != vocab:
                raise ValueError(
                    f"teacher model returned {logits.shape[-1]} logits per position but its "
                    f"vocabulary size is {vocab}"
                )
            logp = F.log_softmax(logits.float() / temp, dim=-1)  # [n, r_max, V]
            targets = ids[:, width - r_max :].to(dev)
            tok_lp = logp.gather(-1, targets[..., None]).squeeze(-1).cpu()
            if k:
                if full:
                    head_lp = logp.cpu()
                    head_ids = torch.arange(vocab).expand(len(chunk), r_max, vocab)
                else:
                    head_lp, head_ids = logp.topk(k, dim=-1)
                    head_lp, head_ids = head_lp.cpu(), head_ids.cpu()
            for j, i in enumerate(chunk):
                _, resp, pos = parts[i]
                n = resp.numel()
                cols = slice(r_max - n, r_max)
                lp_out[i, pos] = tok_lp[j, cols]
                if k and ids_out is not None and top_out is not None:
                    ids_out[i, pos] = head_ids[j, cols]
                    top_out[i, pos] = head_lp[j, cols]
                cost.scored += n
    finally:
        model.train(was_training)
    cost.seconds = time.perf_counter() - t0
    return TeacherScores(lp_out, ids_out, top_out, cost)
