"""One policy update from a token batch: epochs × mini-batches × micro-batches.

Aggregation weights are computed on each whole mini-batch, so splitting it into
micro-batches (gradient accumulation) gives the same gradient as one big batch.
Mini-batches and micro-batches are cut at episode boundaries, so losses that look at a
whole episode (sequence-level ratios, episode aggregation) always see all of it.

SERO (``objective.oracle_coef`` = λ_O, :mod:`credo.objectives.sero`): the oracle rows come
as a separate :class:`~credo.rollout.OracleBatch`, never mixed into the RL batch. Their
reachability weights are computed once, before the first optimizer step, from the frozen
policy (the policy as it is now, or the reference); the continuations are split into as
many parts as there are mini-batches (in order, no RNG), and each optimizer step adds
λ_O · L_O of its part to the RL loss before the gradient is clipped. With λ_O = 0 the
term is computed for its metrics only (no gradient, in eval mode), so the parameters
follow the base method's exactly.

With ``optim.skip_zero_advantage``, the episodes whose advantages are all exactly 0 are
left out of the π_old scoring and of the forward and backward passes. Under an
advantage-weighted loss with no KL or entropy term (the config check insists), such rows
add exactly 0 to the gradient, and the aggregation weights are still computed on the
whole mini-batch, so the step is the same up to float rounding. A mini-batch left empty
still runs one micro-batch (a zero gradient) and steps: AdamW moves the weights on its
momentum even then.
"""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from credo.data import RolloutForest, TokenBatch
from credo.engines import distributed as dp
from credo.engines import fsdp
from credo.engines.zero import Zero
from credo.objectives import (
    LossInputs,
    action_logprobs,
    aggregation_weights,
    entropy_bonus,
    get_loss,
    kl_estimate,
    kl_loss,
    reachability_log_weights,
    sero_loss,
)
from credo.objectives.health import EXTREMES, merge_extreme, ratio_extremes, sampler_kl
from credo.objectives.kl import kl_reward_penalty
from credo.objectives.klpo import sampler_extras, sampler_token_ids
from credo.objectives.rapo import rapo_extras
from credo.objectives.tis import logprob_mismatch, tis_clipped, tis_weights
from credo.policy.hf import HFPolicy
from credo.policy.lora import trainable_parameters
from credo.rollout import OracleBatch
from credo.teachers import teacher_extra_ids, teacher_loss_extras
from credo.train.config import Config

__all__ = ["UpdateContext", "kl_reward_penalty_rows", "policy_update", "score_batch"]

#: ``TokenBatch.token_extras`` key of the sampler's (the engine's) log-probs.
ENGINE_LOGPROBS = "engine_logprobs"


@dataclass
class UpdateContext:
    """What an update needs besides the batch (``engine_diffs``: the per-token
    ``log π_trainer − log π_engine`` of the rollouts, collected by the update; ``zero``:
    the DeepSpeed ZeRO engine that back-propagates and steps, :mod:`credo.engines.zero`)."""

    policy: HFPolicy
    optimizer: torch.optim.Optimizer
    cfg: Config
    ref_policy: HFPolicy | None = None
    engine_diffs: list[torch.Tensor] = field(default_factory=list)
    zero: Zero | None = None


def _episode_chunks(episode: torch.Tensor, order: torch.Tensor, pieces: int) -> list[torch.Tensor]:
    """Split row indices ``order`` (episode-contiguous) into ``pieces`` parts at episode
    boundaries, as evenly as possible by rows."""
    if pieces <= 1 or order.numel() == 0:
        return [order]
    ep = episode[order]
    boundaries = torch.nonzero(ep[1:] != ep[:-1], as_tuple=False).flatten() + 1
    cuts, target, start = [], order.numel() / pieces, 0
    for b in boundaries.tolist():
        if b - start >= target and len(cuts) < pieces - 1:
            cuts.append(b)
            start = b
    edges = [0, *cuts, order.numel()]
    return [order[a:b] for a, b in itertools.pairwise(edges) if b > a]


def _micro_chunks(
    episode: torch.Tensor,
    rows: torch.Tensor,
    size: int,
    lengths: torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> list[torch.Tensor]:
    """Consecutive chunks of at most ``size`` rows and, when ``max_tokens`` is given, at
    most ``max_tokens`` padded tokens (rows × the chunk's longest row, ``lengths`` being
    each row's length); cut at episode boundaries when possible. A single row longer
    than ``max_tokens`` still makes a chunk of its own."""
    n = rows.numel()
    if n == 0:
        return [rows]
    ep = episode[rows]
    lens = lengths[rows].tolist() if lengths is not None and max_tokens is not None else None
    chunks, start = [], 0
    while start < n:
        if lens is None:
            end = min(n, start + size)
        else:
            end, width = start + 1, lens[start]
            while end < n and end - start < size:
                w = max(width, lens[end])
                if (end - start + 1) * w > max_tokens:
                    break
                width, end = w, end + 1
        if end < n:
            back = end
            while back > start + 1 and ep[back] == ep[back - 1]:
                back -= 1
            end = back if back > start + 1 else end
        chunks.append(rows[start:end])
        start = end
    return chunks


@torch.no_grad()
def score_batch(
    policy: HFPolicy,
    batch: TokenBatch,
    *,
    temperature: float,
    micro_rows: int,
    micro_tokens: int | None = None,
) -> torch.Tensor:
    """``[B, L]`` log-probs of every token of ``batch`` under ``policy`` (no grad), in
    chunks of ``micro_rows`` rows (and at most ``micro_tokens`` padded tokens)."""
    out = torch.zeros_like(batch.old_logprobs)
    if micro_tokens is None:
        chunks = [
            torch.arange(start, min(len(batch), start + micro_rows))
            for start in range(0, len(batch), micro_rows)
        ]
    else:
        lengths = batch.attention_mask.sum(1)
        chunks = [
            c
            for c in _micro_chunks(
                torch.zeros(len(batch), dtype=torch.long),  # no episode constraint here
                torch.arange(len(batch)),
                micro_rows,
                lengths,
                micro_tokens,
            )
            if c.numel()
        ]
    for idx in chunks:
        sub = batch.index(idx).trim()
        lp = policy.score(
            sub.input_ids,
            sub.attention_mask,
            temperature=temperature,
            scored=sub.response_mask,
        ).logprobs
        out[idx, : lp.shape[1]] = lp.cpu()
    return out


def oracle_log_weights(ctx: UpdateContext, oracle: OracleBatch) -> torch.Tensor:
    """``[M]`` SERO log-weights of the oracle rows under the frozen policy (no grad)."""
    obj = ctx.cfg.objective
    frozen = ctx.ref_policy if obj.oracle_frozen == "reference" else ctx.policy
    if frozen is None:
        raise ValueError("objective.oracle_frozen=reference needs the reference policy")
    was_training = frozen.model.training
    frozen.model.eval()  # a frozen copy: no dropout, no RNG
    try:
        lp = score_batch(
            frozen,
            oracle.tokens,
            temperature=ctx.cfg.rollout.temperature,
            micro_rows=ctx.cfg.optim.micro_batch_rows,
        )
    finally:
        frozen.model.train(was_training)
    ell = action_logprobs(lp, oracle.tokens.response_mask, geomean=obj.oracle_weight == "geomean")
    return reachability_log_weights(
        ell,
        oracle.chain,
        oracle.position,
        mode=obj.oracle_weight,
        inclusive=obj.oracle_weight_inclusive,
        min_weight=obj.oracle_weight_min,
    )


def _oracle_step(
    ctx: UpdateContext,
    oracle: OracleBatch,
    log_w: torch.Tensor,
    rows: torch.Tensor,
    metrics: dict[str, float],
) -> None:
    """Add λ_O · L_O of the oracle ``rows`` to the gradients (metrics only when λ_O = 0)."""
    cfg, policy = ctx.cfg, ctx.policy
    coef = cfg.objective.oracle_coef
    if rows.numel() == 0:
        return
    num_chains = int(torch.unique(oracle.chain[rows]).numel())
    was_training = policy.model.training
    if coef == 0:
        policy.model.eval()  # metrics only: no dropout, no RNG, no gradient
    try:
        for idx in dp.my_share(_micro_chunks(oracle.chain, rows, cfg.optim.micro_batch_rows)):
            sub = oracle.tokens.index(idx).trim()
            with torch.set_grad_enabled(coef > 0):
                sc = policy.score(
                    sub.input_ids, sub.attention_mask, temperature=cfg.rollout.temperature
                )
                loss, m = sero_loss(
                    sc.logprobs,
                    sub.response_mask.to(sc.logprobs.device),
                    log_w[idx],
                    num_chains=num_chains,
                    num_rows=rows.numel(),
                )
            if coef > 0:
                (coef * loss).backward()
            for k, v in m.items():
                metrics[k] += float(v)
            metrics["loss/total"] += coef * float(loss.detach())
    finally:
        policy.model.train(was_training)


@torch.no_grad()
def kl_reward_penalty_rows(
    ctx: UpdateContext, forest: RolloutForest, *, beta: float, micro_rows: int
) -> torch.Tensor:
    """``[N]`` per-row reward penalty ``β·Σ_tokens k(π, π_ref)`` of a forest's rows,
    scored with the current policy (the sampler) and the frozen reference."""
    if ctx.ref_policy is None:
        raise RuntimeError("a KL reward penalty needs the reference policy")
    batch = forest.to_batch(torch.zeros(forest.num_rows), pad_id=ctx.policy.pad_id)
    t = ctx.cfg.rollout.temperature
    lp = score_batch(ctx.policy, batch, temperature=t, micro_rows=micro_rows)
    ref = score_batch(ctx.ref_policy, batch, temperature=t, micro_rows=micro_rows)
    kl = kl_estimate(lp, ref, ctx.cfg.objective.kl_estimator)
    penalty = kl_reward_penalty(kl, batch.response_mask, beta)
    out = torch.zeros(forest.num_rows)
    out[batch.row] = penalty
    return out


def policy_update(
    ctx: UpdateContext,
    batch: TokenBatch,
    *,
    iteration: int,
    generator: torch.Generator | None,
    oracle: OracleBatch | None = None,
) -> dict[str, float]:
    """Run the configured number of epochs/mini-batches on ``batch``; return metrics.

    Metrics are averaged over the optimizer steps: the loss's own ``loss/...`` entries
    (as the loss computed them) and ``policy/...`` entries (weighted means over the loss
    tokens), plus ``loss/kl`` (when a reference is used), ``policy/entropy`` and
    ``policy/grad_norm``; with ``oracle`` rows, SERO's ``loss/oracle``, ``oracle/nll``
    and ``oracle/weight`` (see :mod:`credo.objectives.sero`).

    Args:
        ctx: policy, optimizer, config and reference.
        batch: the RL token batch (policy rows).
        iteration: the training iteration (schedules).
        generator: RNG of the mini-batch shuffles.
        oracle: SERO's oracle rows, or ``None``.
    """
    opt_cfg = ctx.cfg.optim
    # Row order grouped by episode (so that chunks can be cut at episode boundaries).
    batch = batch.index(
        torch.argsort(batch.episode * (batch.row.max() + 1 if len(batch) else 1) + batch.row)
    )
    ctx.policy.model.train()
    batch.token_extras[ENGINE_LOGPROBS] = batch.old_logprobs  # the sampler's, kept for TIS
    ctx.engine_diffs.clear()
    sampler_lp = batch.old_logprobs  # the sampler's (kept: _prepare may rescore π_old)
    keep = (
        _carrying_rows(batch)
        if opt_cfg.skip_zero_advantage
        else torch.ones(len(batch), dtype=torch.bool)
    )
    ref_lp = _prepare(ctx, batch, keep)
    if not _single_step(ctx):  # π_old scored by _prepare (else by the loss's own forward)
        trainer_lp = batch.old_logprobs
        if not opt_cfg.recompute_old_logprobs:
            trainer_lp = _score_rows(ctx, batch, keep)
        scored = batch.loss_mask & keep[:, None]
        ctx.engine_diffs.append((trainer_lp - batch.token_extras[ENGINE_LOGPROBS])[scored])
    oracle_w = oracle_log_weights(ctx, oracle) if oracle is not None else None
    totals: dict[str, float] = defaultdict(float)
    steps, kl_steps = 0, []
    guard: dict[str, float] = {}
    # every epoch's shuffle drawn first, in order: the generator sees the same calls
    plan = []  # (the mini-batch's rows, its index in its epoch, mini-batches in the epoch)
    for _ in range(opt_cfg.epochs):
        chunks = _episode_chunks(
            batch.episode, _shuffled_rows(batch.episode, generator), opt_cfg.minibatches
        )
        plan += [(rows, i, len(chunks)) for i, rows in enumerate(chunks)]
    for mb_rows, mb_index, parts in plan:
        before = _snapshot(ctx) if opt_cfg.max_kl is not None else None
        mb = batch.index(mb_rows)
        metrics = _minibatch_step(
            ctx,
            mb,
            None if ref_lp is None else ref_lp[mb_rows],
            iteration,
            keep[mb_rows],
            oracle_part=None if oracle is None else (oracle, oracle_w, mb_index, parts),
            sampler_lp=sampler_lp[mb_rows],
        )
        kl_steps.append(metrics.pop("policy/kl_sampler", 0.0))
        for k, v in metrics.items():
            if k in EXTREMES:
                merge_extreme(totals, k, v)
            else:
                totals[k] += v
        steps += 1
        if before is not None:  # the trust-region guard: undo a step that moved too far
            guard["policy/kl_after_step"] = kl = _kl_after_step(
                ctx, mb, sampler_lp[mb_rows], keep[mb_rows]
            )
            if kl > opt_cfg.max_kl:
                _restore(ctx, before)
                guard["policy/steps_undone"] = 1.0
                break
    out = {k: v if k in EXTREMES else v / max(1, steps) for k, v in totals.items()}
    if kl_steps:  # KL to the sampler at the first optimizer step and at the last one
        out["policy/kl_sampler_first"], out["policy/kl_sampler_last"] = kl_steps[0], kl_steps[-1]
    if opt_cfg.max_kl is not None:
        kept = steps - int(guard.get("policy/steps_undone", 0.0))
        out |= {"policy/steps_undone": 0.0, **guard, "policy/steps_kept": float(kept)}
    if opt_cfg.skip_zero_advantage:
        out["policy/skipped_rows"] = 1.0 - float(keep.float().mean()) if len(batch) else 0.0
    if "policy/ratio_mean" in out:  # pooled over the steps' loss tokens
        var = out.get("policy/ratio_sq_mean", 0.0) - out["policy/ratio_mean"] ** 2
        out["policy/ratio_std"] = max(0.0, var) ** 0.5
    diffs = [d.detach().float().cpu() for d in ctx.engine_diffs]  # sampler/trainer mismatch
    return out | logprob_mismatch(torch.cat(diffs) if diffs else torch.zeros(0))


def _snapshot(ctx: UpdateContext) -> tuple[list[torch.Tensor], dict]:
    """The trainable weights and the optimizer's state, copied (to undo one step)."""
    weights = [p.detach().clone() for p in trainable_parameters(ctx.policy.model)]
    return weights, copy.deepcopy(ctx.optimizer.state_dict())


@torch.no_grad()
def _restore(ctx: UpdateContext, snapshot: tuple[list[torch.Tensor], dict]) -> None:
    weights, state = snapshot
    for p, w in zip(trainable_parameters(ctx.policy.model), weights):
        p.copy_(w)
    ctx.optimizer.load_state_dict(state)


def _kl_after_step(
    ctx: UpdateContext, mb: TokenBatch, sampler_lp: torch.Tensor, keep: torch.Tensor
) -> float:
    """The KL between the sampler and π_θ per loss token (k3 as ``policy/kl_sampler_*``
    reads it, :func:`~credo.objectives.health.sampler_kl`; token mean) on the ``keep``
    rows of the mini-batch just stepped on, with the weights after the step (no grad). Every process
    holds the whole batch and the same weights, so every rank finds the same value and
    takes the same decision."""
    rows = torch.nonzero(keep).flatten()
    if rows.numel() == 0:
        return 0.0
    sub = mb.index(rows)
    cfg = ctx.cfg
    lp = score_batch(
        ctx.policy,
        sub,
        temperature=cfg.rollout.temperature,
        micro_rows=cfg.optim.micro_batch_rows,
        micro_tokens=cfg.optim.micro_batch_tokens,
    )
    mask = sub.loss_mask
    kl = sampler_kl(lp, sampler_lp[rows], mask.float(), mask)
    return float(kl) / max(1.0, float(mask.sum()))


def _single_step(ctx: UpdateContext) -> bool:
    """One optimizer step per batch: π_old is the policy as it is now, so the step's own
    forward pass (detached) gives exactly what a separate scoring pass would, for free."""
    opt = ctx.cfg.optim
    return opt.recompute_old_logprobs and opt.epochs * opt.minibatches == 1


def _carrying_rows(batch: TokenBatch) -> torch.Tensor:
    """``[B]`` bool: the rows of the episodes with a non-zero advantage on some loss token
    (every other row adds exactly 0 to an advantage-weighted loss's gradient). Whole
    episodes, so that sequence-level ratios and episode units see all of theirs."""
    carrying = ((batch.advantages != 0) & batch.loss_mask).any(1)
    return torch.isin(batch.episode, batch.episode[carrying])


def _score_rows(
    ctx: UpdateContext, batch: TokenBatch, keep: torch.Tensor, policy: HFPolicy | None = None
) -> torch.Tensor:
    """``[B, L]``: ``batch.old_logprobs`` with the ``keep`` rows scored by ``policy``
    (default: the policy being trained)."""
    cfg = ctx.cfg
    score = {
        "temperature": cfg.rollout.temperature,
        "micro_rows": cfg.optim.micro_batch_rows,
        "micro_tokens": cfg.optim.micro_batch_tokens,
    }
    if bool(keep.all()):
        return score_batch(policy or ctx.policy, batch, **score)
    rows = torch.nonzero(keep).flatten()
    out = batch.old_logprobs.clone()
    if rows.numel():
        out[rows] = score_batch(policy or ctx.policy, batch.index(rows), **score)
    return out


def _prepare(ctx: UpdateContext, batch: TokenBatch, keep: torch.Tensor) -> torch.Tensor | None:
    """Score π_old (when several steps share the batch and the config asks to recompute
    it; in place) and the reference (when a KL loss needs it; returned), before any
    optimizer step; only the ``keep`` rows, the others keep the sampler's numbers."""
    cfg = ctx.cfg
    if cfg.optim.recompute_old_logprobs and not _single_step(ctx):
        batch.old_logprobs = _score_rows(ctx, batch, keep)
    if ctx.ref_policy is not None and cfg.objective.kl_coef > 0:
        return _score_rows(ctx, batch, keep, ctx.ref_policy)
    return None


def _shuffled_rows(episode: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Row indices with the episodes in a random order (rows of one episode together and
    in their order)."""
    episodes = torch.unique(episode)
    perm = episodes[torch.randperm(episodes.numel(), generator=generator)]
    rank = torch.empty(int(episode.max()) + 1 if episode.numel() else 0, dtype=torch.long)
    rank[perm] = torch.arange(perm.numel())
    n = episode.numel()
    return torch.argsort(rank[episode] * (n + 1) + torch.arange(n))


def _minibatch_step(
    ctx: UpdateContext,
    mb: TokenBatch,
    ref_lp: torch.Tensor | None,
    iteration: int,
    keep: torch.Tensor,
    *,
    oracle_part: tuple[OracleBatch, torch.Tensor, int, int] | None,
    sampler_lp: torch.Tensor | None = None,
) -> dict[str, float]:
    """One optimizer step on mini-batch ``mb``: the aggregation weights of the whole
    mini-batch, gradients accumulated over micro-batches of its ``keep`` rows (``[B]``
    bool; at least one episode's, so that the step is taken) plus this mini-batch's share
    of SERO's oracle rows, clipped, one step. Returns the step's metrics."""
    cfg = ctx.cfg
    obj = cfg.objective
    weights = aggregation_weights(
        mb.loss_mask, obj.aggregation, episode=mb.episode, turn=mb.turn, **obj.aggregation_params
    )
    ctx.optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, float] = defaultdict(float)
    lengths = mb.attention_mask.sum(1)
    if len(mb) and not keep.any():  # a zero gradient, but the step is still taken
        keep = mb.episode == mb.episode[0]
    chunks = _micro_chunks(
        mb.episode,
        torch.nonzero(keep).flatten(),
        cfg.optim.micro_batch_rows,
        lengths,
        cfg.optim.micro_batch_tokens,
    )
    mine = dp.my_share(chunks)  # with several processes: every N-th micro-batch
    passes = len(mine) + dp.padding(len(chunks))  # sharded: as many on every rank
    for i, idx in enumerate(mine):
        sub = mb.index(idx).trim()
        width = sub.input_ids.shape[1]
        ref = None if ref_lp is None else ref_lp[idx][:, :width]
        sampler = None if sampler_lp is None else sampler_lp[idx][:, :width]
        loss, m = _micro_loss(ctx, sub, weights[idx][:, :width], ref, iteration, sampler)
        _backward(ctx, loss, last=i == passes - 1)
        for k, v in m.items():
            if k in EXTREMES:
                merge_extreme(metrics, k, float(v))
            else:
                metrics[k] += float(v)
        metrics["loss/total"] += float(loss.detach())
    for i in range(len(mine), passes):  # zero-weight passes: as many as the other ranks
        idle = mb.index(chunks[0]).trim()
        loss = fsdp.idle_loss(ctx.policy, idle.input_ids, idle.attention_mask)
        _backward(ctx, loss, last=i == passes - 1)
    if oracle_part is not None:  # this mini-batch's share of the continuations, in order
        oracle, log_w, index, parts = oracle_part
        part = oracle.chain * parts // max(1, oracle.num_chains)
        _oracle_step(ctx, oracle, log_w, torch.nonzero(part == index).flatten(), metrics)
    dp.reduce_gradients(trainable_parameters(ctx.policy.model))  # Σ over processes
    metrics = dp.sum_metrics(metrics, merge=EXTREMES)
    # `policy/*` metrics are Σ w·x; divide by Σ w so that they read as weighted means
    # under every aggregation (the *-mean modes already have Σ w = 1).
    total_w = float((weights * mb.loss_mask)[keep].sum())
    for k in metrics:
        if k.startswith("policy/") and k not in EXTREMES and total_w > 0:
            metrics[k] /= total_w
    if ctx.zero is not None:  # DeepSpeed clips and steps (its norm: before clipping)
        grad_norm = ctx.zero.step()
        if not torch.isfinite(grad_norm):
            raise FloatingPointError(
                f"iteration {iteration}: the gradient norm is {float(grad_norm)}; DeepSpeed "
                "has taken the step. Resume from the last checkpoint with a lower optim.lr"
            )
        metrics["policy/grad_norm"] = float(grad_norm)
        return metrics
    grad_norm = fsdp.plain_norm(  # FSDP: the global norm, reduced over the shards
        torch.nn.utils.clip_grad_norm_(trainable_parameters(ctx.policy.model), cfg.optim.grad_clip)
    )
    if not torch.isfinite(grad_norm):  # stepping would write NaN into every weight
        raise FloatingPointError(
            f"iteration {iteration}: the gradient norm is {float(grad_norm)} (loss "
            f"{metrics['loss/total']:.4g}); the optimizer step was not taken. Resume from the "
            "last checkpoint with a lower optim.lr, or check the rewards and advantages"
        )
    ctx.optimizer.step()
    metrics["policy/grad_norm"] = float(grad_norm)
    return metrics


def _backward(ctx: UpdateContext, loss: torch.Tensor, *, last: bool) -> None:
    """Back-propagate one micro-batch (through DeepSpeed's engine under ZeRO; ``last``:
    this rank's last pass of the mini-batch)."""
    if ctx.zero is not None:
        ctx.zero.backward(loss, last=last)
    else:
        loss.backward()


def _micro_loss(
    ctx: UpdateContext,
    sub: TokenBatch,
    weights: torch.Tensor,
    ref_lp: torch.Tensor | None,
    iteration: int,
    sampler_lp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch, ready for ``backward``: the policy loss, plus the KL
    term to the reference and the entropy bonus when configured; with ``sampler_lp``
    (the sampler's log-probs), the health metrics of :mod:`credo.objectives.health`."""
    cfg = ctx.cfg
    obj = cfg.objective
    sampler_ids = sampler_token_ids(sub.token_extras)  # KLPO's draws and top-K head
    head_ids = teacher_extra_ids(sub.token_extras)  # a teacher's head (distillation)
    sets = [x for x in (sampler_ids, head_ids) if x is not None]
    sc = ctx.policy.score(
        sub.input_ids,
        sub.attention_mask,
        temperature=cfg.rollout.temperature,
        entropy=True,
        entropy_grad=obj.entropy_coef > 0,
        extra_ids=torch.cat(sets, -1) if len(sets) > 1 else (sets[0] if sets else None),
        scored=sub.response_mask,
    )
    dev = sc.logprobs.device
    mask = sub.loss_mask.to(dev)
    n_sampler = 0 if sampler_ids is None else sampler_ids.shape[-1]
    extra_lp = sc.extra_logprobs
    extras = sampler_extras(
        None if extra_lp is None or sampler_ids is None else extra_lp[..., :n_sampler],
        sub.token_extras,
    )
    extras.update(
        teacher_loss_extras(
            sub.token_extras,
            None if extra_lp is None or head_ids is None else extra_lp[..., n_sampler:],
            device=dev,
        )
    )
    old = sc.logprobs.detach() if _single_step(ctx) else sub.old_logprobs.to(dev)
    engine_lp = sub.token_extras.get(ENGINE_LOGPROBS)  # set by policy_update
    engine_lp = None if engine_lp is None else engine_lp.to(dev)
    if engine_lp is not None and _single_step(ctx):  # this pass is π_old: mismatch for free
        ctx.engine_diffs.append((old - engine_lp)[mask].detach())
    pg_weights = weights.to(dev)
    if obj.tis_cap is not None and engine_lp is not None:  # truncated IS on the PG term
        pg_weights = pg_weights * tis_weights(old, engine_lp, obj.tis_cap)
    extras.update(rapo_extras(sub.token_extras, device=dev))  # RAPO's two reference scorings
    inputs = LossInputs(
        logprobs=sc.logprobs,
        old_logprobs=old,
        advantages=sub.advantages.to(dev),
        mask=mask,
        weights=pg_weights,
        episode=sub.episode,
        turn=sub.turn,
        ref_logprobs=ref_lp,
        entropy=sc.entropy,
        step=iteration,
        extras=extras,
    )
    loss, metrics = get_loss(obj.loss)(inputs, **obj.params)
    w = weights.to(dev)  # the KL and entropy terms keep the plain aggregation weights
    if obj.tis_cap is not None and engine_lp is not None:  # Σ w·x: weighted means
        metrics["policy/tis_weight"] = (pg_weights * mask).sum()
        clipped = tis_clipped(old, engine_lp, obj.tis_cap)
        metrics["policy/tis_clip_frac"] = (w * (mask & clipped)).sum()
    if ref_lp is not None and obj.kl_coef > 0:
        kl = kl_estimate(sc.logprobs, ref_lp.to(dev), obj.kl_estimator)
        kl_term = kl_loss(kl, w, mask, 1.0)
        loss = loss + obj.kl_coef * kl_term
        metrics["loss/kl"] = kl_term.detach()
    if obj.entropy_coef > 0:
        loss = loss - obj.entropy_coef * entropy_bonus(sc.entropy, w, mask)
    metrics.setdefault("policy/entropy", entropy_bonus(sc.entropy.detach(), w, mask))
    if sampler_lp is not None:
        metrics["policy/kl_sampler"] = sampler_kl(sc.logprobs, sampler_lp.to(dev), w, mask)
    level = obj.params.get("ratio_level", "token")
    metrics.update(ratio_extremes(sc.logprobs, inputs.old_logprobs, mask, sub.episode, level))
    return loss, metrics
