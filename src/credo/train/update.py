"""One policy update from a token batch: epochs × mini-batches × micro-batches.

Aggregation weights are computed on each whole mini-batch, so splitting it into
micro-batches (gradient accumulation) gives the same gradient as one big batch.
Mini-batches and micro-batches are cut at episode boundaries, so losses that look at a
whole episode (sequence-level ratios, episode aggregation) always see all of it.

What the update knows itself: the loss registry (the configured policy loss, and the
extras providers that feed it, :mod:`credo.objectives.extras`), the aggregation, the KL
term to the reference and the entropy bonus, and its :class:`~credo.engines.Engine` (how
the processes share the micro-batches and take the step). Everything else reaches it as
an :class:`UpdatePart` of :attr:`UpdateContext.parts`, built once from the config by the
run's parts (:mod:`credo.train.parts`): a part may prepare before the first step
(:meth:`UpdatePart.prepare`), reweigh the policy-gradient term
(:meth:`UpdatePart.weigh`), read each micro-batch's forward pass
(:meth:`UpdatePart.micro_metrics`), add a term of its own to each mini-batch's gradient
(:meth:`UpdatePart.step_term`: SERO's oracle rows), look at each step and stop the update
(:meth:`UpdatePart.after_step`: the trust region) and report at the end
(:meth:`UpdatePart.finish`).

With ``optim.skip_zero_advantage``, the episodes whose advantages are all exactly 0 are
left out of the π_old scoring and of the forward and backward passes. Under an
advantage-weighted loss with no KL or entropy term (the config check insists), such rows
add exactly 0 to the gradient, and the aggregation weights are still computed on the
whole mini-batch, so the step is the same up to float rounding. A mini-batch left empty
still runs one micro-batch (a zero gradient) and steps: AdamW moves the weights on its
momentum even then.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from credo.data import TokenBatch
from credo.engines import Engine
from credo.objectives import (
    LossInputs,
    aggregation_weights,
    entropy_bonus,
    extra_token_ids,
    get_loss,
    kl_estimate,
    kl_loss,
    loss_extras,
)
from credo.policy.hf import HFPolicy
from credo.policy.lora import trainable_parameters

__all__ = [
    "ENGINE_LOGPROBS",
    "LR_SCHEDULES",
    "MicroPass",
    "UpdateContext",
    "UpdatePart",
    "UpdateSettings",
    "micro_chunks",
    "policy_update",
    "scheduled_lr",
    "score_batch",
]

#: ``TokenBatch.token_extras`` key of the sampler's (the engine's) log-probs.
ENGINE_LOGPROBS = "engine_logprobs"

#: How a metric merges over micro-batches, processes and steps when it is not a sum.
Merge = Mapping[str, Callable[[float, float], float]]


def _linear(iteration: int, iterations: int) -> float:
    return 1.0 - iteration / max(1, iterations)


#: ``optim.lr_schedule``: the factor on ``optim.lr`` at iteration ``it`` (0-based) of
#: ``iterations``. ``constant``: 1 (the optimizer's learning rate is never touched).
#: ``linear``: 1 − it / iterations, from the full rate at the first iteration down to
#: 1 / iterations of it at the last (the annealing of CleanRL's PPO, ``anneal_lr``, and
#: TRL's default linear schedule without warm-up).
LR_SCHEDULES: dict[str, Callable[[int, int], float] | None] = {
    "constant": None,
    "linear": _linear,
}


def scheduled_lr(lr: float, schedule: str, iteration: int, iterations: int) -> float:
    """The learning rate of iteration ``iteration`` of ``iterations`` (:data:`LR_SCHEDULES`)."""
    factor = LR_SCHEDULES[schedule]
    return lr if factor is None else lr * factor(iteration, iterations)


@dataclass(frozen=True)
class UpdateSettings:
    """What the update reads of the config, resolved once (:meth:`from_config`)."""

    loss: str
    loss_params: Mapping[str, Any]
    aggregation: str
    aggregation_params: Mapping[str, Any]
    kl_coef: float
    kl_estimator: str
    entropy_coef: float
    temperature: float
    epochs: int
    minibatches: int
    micro_batch_rows: int
    micro_batch_tokens: int | None
    grad_clip: float
    recompute_old_logprobs: bool
    skip_zero_advantage: bool
    zero_grad_step: bool = False
    lr: float = 3e-4
    lr_schedule: str = "constant"
    iterations: int = 1

    @classmethod
    def from_config(cls, cfg: Any) -> UpdateSettings:
        """The settings of a run config (``objective``, ``optim``, the sampling
        temperature)."""
        obj, opt = cfg.objective, cfg.optim
        return cls(
            loss=obj.loss,
            loss_params=dict(obj.params),
            aggregation=obj.aggregation,
            aggregation_params=dict(obj.aggregation_params),
            kl_coef=obj.kl_coef,
            kl_estimator=obj.kl_estimator,
            entropy_coef=obj.entropy_coef,
            temperature=cfg.rollout.temperature,
            epochs=opt.epochs,
            minibatches=opt.minibatches,
            micro_batch_rows=opt.micro_batch_rows,
            micro_batch_tokens=opt.micro_batch_tokens,
            grad_clip=opt.grad_clip,
            recompute_old_logprobs=opt.recompute_old_logprobs,
            skip_zero_advantage=opt.skip_zero_advantage,
            zero_grad_step=opt.zero_grad_step,
            lr=opt.lr,
            lr_schedule=opt.lr_schedule,
            iterations=cfg.train.iterations,
        )

    @property
    def single_step(self) -> bool:
        """One optimizer step per batch: π_old is the policy as it is now, so the step's
        own forward pass (detached) gives exactly what a separate scoring pass would, for
        free."""
        return self.recompute_old_logprobs and self.epochs * self.minibatches == 1


@dataclass
class MicroPass:
    """One micro-batch's forward pass as the update's parts see it (``[B, L]`` tensors on
    the loss's device).

    Attributes:
        batch: the micro-batch.
        logprobs: log π_θ of its tokens (with grad).
        old: log π_old (the recomputed π_old, or the sampler's).
        engine: the sampler's (the generation engine's) log-probs, or ``None``.
        sampler: the sampler's log-probs as the update's caller recorded them, or ``None``.
        weights: the aggregation weights (the KL and entropy terms use them).
        pg_weights: the weights of the policy-gradient term (after :meth:`UpdatePart.weigh`).
        mask: the loss tokens.
        single_step: this pass is π_old too (:attr:`UpdateSettings.single_step`).
    """

    batch: TokenBatch
    logprobs: torch.Tensor
    old: torch.Tensor
    engine: torch.Tensor | None
    sampler: torch.Tensor | None
    weights: torch.Tensor
    pg_weights: torch.Tensor
    mask: torch.Tensor
    single_step: bool


class UpdatePart:
    """Something an update runs besides the loss (module docstring). Every method is a
    no-op here; a part overrides those it needs. ``merge`` names the metrics it reports
    that merge by their own function (a minimum, a maximum) instead of adding up."""

    merge: ClassVar[Merge] = {}

    def prepare(self, ctx: UpdateContext, batch: TokenBatch, keep: torch.Tensor) -> None:
        """Before the first step, after π_old and the reference are scored (``keep``:
        ``[B]`` bool, the rows the update scores)."""

    def before_step(self, ctx: UpdateContext) -> None:
        """Before each optimizer step."""

    def weigh(self, mp: MicroPass, pg_weights: torch.Tensor) -> torch.Tensor:
        """The policy-gradient term's weights of one micro-batch (``pg_weights`` as the
        parts before this one left them)."""
        return pg_weights

    def micro_metrics(self, mp: MicroPass, metrics: dict[str, Any]) -> None:
        """Add to one micro-batch's metrics (``Σ w·x`` sums, or ``merge``'s keys)."""

    def step_term(
        self, ctx: UpdateContext, index: int, parts: int, metrics: dict[str, float]
    ) -> None:
        """Add a term of its own to the gradient of mini-batch ``index`` of ``parts`` in
        its epoch, before the gradients are reduced and clipped."""

    def step_metrics(self, metrics: dict[str, float]) -> None:
        """Read (or take out) one optimizer step's metrics before they are averaged."""

    def after_step(
        self, ctx: UpdateContext, mb: TokenBatch, sampler_lp: torch.Tensor, keep: torch.Tensor
    ) -> bool:
        """After each optimizer step on mini-batch ``mb``; returning ``True`` ends the
        update (its remaining steps are not taken)."""
        return False

    def finish(self, ctx: UpdateContext, out: dict[str, float], steps: int) -> None:
        """Add to the update's metrics (``steps``: the optimizer steps taken)."""


@dataclass
class UpdateContext:
    """What an update needs besides the batch.

    Attributes:
        policy: the policy the optimizer updates (under FSDP the sharded trainer).
        optimizer: its optimizer.
        settings: the update's settings (:class:`UpdateSettings`).
        ref_policy: the frozen reference, when something needs one.
        engine: how the processes share the work (:class:`~credo.engines.Engine`).
        parts: the update's parts, in order (:class:`UpdatePart`).
    """

    policy: HFPolicy
    optimizer: torch.optim.Optimizer
    settings: UpdateSettings
    ref_policy: HFPolicy | None = None
    engine: Engine = field(default_factory=Engine)
    parts: list[UpdatePart] = field(default_factory=list)

    def score_rows(
        self, batch: TokenBatch, keep: torch.Tensor, policy: HFPolicy | None = None
    ) -> torch.Tensor:
        """``[B, L]``: ``batch.old_logprobs`` with the ``keep`` rows scored by ``policy``
        (default: the policy being trained)."""
        s = self.settings
        score = {
            "temperature": s.temperature,
            "micro_rows": s.micro_batch_rows,
            "micro_tokens": s.micro_batch_tokens,
        }
        if bool(keep.all()):
            return score_batch(policy or self.policy, batch, **score)
        rows = torch.nonzero(keep).flatten()
        out = batch.old_logprobs.clone()
        if rows.numel():
            out[rows] = score_batch(policy or self.policy, batch.index(rows), **score)
        return out

    @property
    def merge(self) -> dict[str, Callable[[float, float], float]]:
        """The metrics that merge by their own function, of every part."""
        return {k: f for part in self.parts for k, f in part.merge.items()}


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


def micro_chunks(
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
            for c in micro_chunks(
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


def policy_update(
    ctx: UpdateContext,
    batch: TokenBatch,
    *,
    iteration: int,
    generator: torch.Generator | None,
) -> dict[str, float]:
    """Run the configured number of epochs/mini-batches on ``batch``; return metrics.

    Metrics are averaged over the optimizer steps: the loss's own ``loss/...`` entries
    (as the loss computed them) and ``policy/...`` entries (weighted means over the loss
    tokens), plus ``loss/kl`` (when a reference is used), ``policy/entropy`` and
    ``policy/grad_norm``, and what the parts add (``docs/metrics.md``).

    Args:
        ctx: policy, optimizer, settings, reference, engine and parts.
        batch: the RL token batch (policy rows).
        iteration: the training iteration (schedules).
        generator: RNG of the mini-batch shuffles.
    """
    s = ctx.settings
    rate = None  # a constant rate is left as the optimizer has it
    if LR_SCHEDULES[s.lr_schedule] is not None:
        rate = scheduled_lr(s.lr, s.lr_schedule, iteration, s.iterations)
        for group in ctx.optimizer.param_groups:
            group["lr"] = rate
    # Row order grouped by episode (so that chunks can be cut at episode boundaries).
    batch = batch.index(
        torch.argsort(batch.episode * (batch.row.max() + 1 if len(batch) else 1) + batch.row)
    )
    ctx.policy.model.train()
    batch.token_extras[ENGINE_LOGPROBS] = batch.old_logprobs  # the sampler's, kept for TIS
    sampler_lp = batch.old_logprobs  # the sampler's (kept: _prepare may rescore π_old)
    keep = (
        _carrying_rows(batch) if s.skip_zero_advantage else torch.ones(len(batch), dtype=torch.bool)
    )
    ref_lp = _prepare(ctx, batch, keep)
    for part in ctx.parts:
        part.prepare(ctx, batch, keep)
    merge = ctx.merge
    totals: dict[str, float] = defaultdict(float)
    steps = 0
    # every epoch's shuffle drawn first, in order: the generator sees the same calls
    plan = []  # (the mini-batch's rows, its index in its epoch, mini-batches in the epoch)
    for _ in range(s.epochs):
        chunks = _episode_chunks(
            batch.episode, _shuffled_rows(batch.episode, generator), s.minibatches
        )
        plan += [(rows, i, len(chunks)) for i, rows in enumerate(chunks)]
    for mb_rows, mb_index, parts in plan:
        for part in ctx.parts:
            part.before_step(ctx)
        mb = batch.index(mb_rows)
        metrics = _minibatch_step(
            ctx,
            mb,
            None if ref_lp is None else ref_lp[mb_rows],
            iteration,
            keep[mb_rows],
            (mb_index, parts),
            merge,
            sampler_lp=sampler_lp[mb_rows],
        )
        for part in ctx.parts:
            part.step_metrics(metrics)
        for k, v in metrics.items():
            _add(totals, k, v, merge)
        steps += 1
        stop = False
        for part in ctx.parts:
            stop = part.after_step(ctx, mb, sampler_lp[mb_rows], keep[mb_rows]) or stop
        if stop:
            break
    out = {k: v if k in merge else v / max(1, steps) for k, v in totals.items()}
    if rate is not None:
        out["optim/lr"] = rate
    if s.skip_zero_advantage:
        out["policy/skipped_rows"] = 1.0 - float(keep.float().mean()) if len(batch) else 0.0
    for part in ctx.parts:
        part.finish(ctx, out, steps)
    return out


def _add(totals: dict[str, float], key: str, value: float, merge: Merge) -> None:
    """Add ``value`` into ``totals[key]``, or merge it with the key's own function (the
    first value is taken as it is)."""
    if key not in merge:
        totals[key] += value
    else:
        totals[key] = merge[key](totals[key], value) if key in totals else value


def _carrying_rows(batch: TokenBatch) -> torch.Tensor:
    """``[B]`` bool: the rows of the episodes with a non-zero advantage on some loss token
    (every other row adds exactly 0 to an advantage-weighted loss's gradient). Whole
    episodes, so that sequence-level ratios and episode units see all of theirs."""
    carrying = ((batch.advantages != 0) & batch.loss_mask).any(1)
    return torch.isin(batch.episode, batch.episode[carrying])


def _prepare(ctx: UpdateContext, batch: TokenBatch, keep: torch.Tensor) -> torch.Tensor | None:
    """Score π_old (when several steps share the batch and the config asks to recompute
    it; in place) and the reference (when a KL loss needs it; returned), before any
    optimizer step; only the ``keep`` rows, the others keep the sampler's numbers."""
    s = ctx.settings
    if s.recompute_old_logprobs and not s.single_step:
        batch.old_logprobs = ctx.score_rows(batch, keep)
    if ctx.ref_policy is not None and s.kl_coef > 0:
        return ctx.score_rows(batch, keep, ctx.ref_policy)
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
    position: tuple[int, int],
    merge: Merge,
    *,
    sampler_lp: torch.Tensor | None = None,
) -> dict[str, float]:
    """One optimizer step on mini-batch ``mb`` (``position``: its index and the
    mini-batches of its epoch): the aggregation weights of the whole mini-batch,
    gradients accumulated over micro-batches of its ``keep`` rows (``[B]`` bool; at least
    one episode's, so that the step is taken) plus the parts' own terms, clipped, one
    step. Returns the step's metrics."""
    s, engine = ctx.settings, ctx.engine
    weights = aggregation_weights(
        mb.loss_mask, s.aggregation, episode=mb.episode, turn=mb.turn, **s.aggregation_params
    )
    ctx.optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, float] = defaultdict(float)
    lengths = mb.attention_mask.sum(1)
    if len(mb) and not keep.any():  # a zero gradient, but the step is still taken
        keep = mb.episode == mb.episode[0]
    chunks = micro_chunks(
        mb.episode, torch.nonzero(keep).flatten(), s.micro_batch_rows, lengths, s.micro_batch_tokens
    )
    mine = engine.my_share(chunks)  # with several processes: every N-th micro-batch
    passes = len(mine) + engine.padding(len(chunks))  # sharded: as many on every rank
    for i, idx in enumerate(mine):
        sub = mb.index(idx).trim()
        width = sub.input_ids.shape[1]
        ref = None if ref_lp is None else ref_lp[idx][:, :width]
        sampler = None if sampler_lp is None else sampler_lp[idx][:, :width]
        loss, m = _micro_loss(ctx, sub, weights[idx][:, :width], ref, iteration, sampler)
        engine.backward(loss, last=i == passes - 1)
        for k, v in m.items():
            _add(metrics, k, float(v), merge)
        metrics["loss/total"] += float(loss.detach())
    for i in range(len(mine), passes):  # zero-weight passes: as many as the other ranks
        idle = mb.index(chunks[0]).trim()
        loss = engine.idle_loss(ctx.policy, idle.input_ids, idle.attention_mask)
        engine.backward(loss, last=i == passes - 1)
    for part in ctx.parts:  # terms of their own (SERO's oracle rows), in this step's share
        part.step_term(ctx, *position, metrics)
    params = trainable_parameters(ctx.policy.model)
    engine.reduce_gradients(params)  # Σ over processes
    metrics = engine.sum_metrics(metrics, merge=merge)
    # `policy/*` metrics are Σ w·x; divide by Σ w so that they read as weighted means
    # under every aggregation (the *-mean modes already have Σ w = 1).
    total_w = float((weights * mb.loss_mask)[keep].sum())
    for k in metrics:
        if k.startswith("policy/") and k not in merge and total_w > 0:
            metrics[k] /= total_w
    grad_norm = engine.step(
        trainable_parameters(ctx.policy.model),
        ctx.optimizer,
        s.grad_clip,
        step_on_zero=s.zero_grad_step,
    )
    if not torch.isfinite(grad_norm):
        if engine.steps_regardless:
            raise FloatingPointError(
                f"iteration {iteration}: the gradient norm is {float(grad_norm)}; DeepSpeed "
                "has taken the step. Resume from the last checkpoint with a lower optim.lr"
            )
        raise FloatingPointError(
            f"iteration {iteration}: the gradient norm is {float(grad_norm)} (loss "
            f"{metrics['loss/total']:.4g}); the optimizer step was not taken. Resume from the "
            "last checkpoint with a lower optim.lr, or check the rewards and advantages"
        )
    metrics["policy/grad_norm"] = float(grad_norm)
    # an exactly zero gradient: a step AdamW takes on its moments alone (optim.zero_grad_step)
    metrics["policy/zero_grad_frac"] = float(grad_norm == 0)
    return metrics


def _micro_loss(
    ctx: UpdateContext,
    sub: TokenBatch,
    weights: torch.Tensor,
    ref_lp: torch.Tensor | None,
    iteration: int,
    sampler_lp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch, ready for ``backward``: the policy loss (with the
    extras its providers give, :mod:`credo.objectives.extras`), plus the KL term to the
    reference and the entropy bonus when configured; the parts reweigh its
    policy-gradient term and add their metrics."""
    s = ctx.settings
    ids, sizes = extra_token_ids(sub.token_extras)  # e.g. KLPO's draws, a teacher's head
    sc = ctx.policy.score(
        sub.input_ids,
        sub.attention_mask,
        temperature=s.temperature,
        entropy=True,
        entropy_grad=s.entropy_coef > 0,
        extra_ids=ids,
        scored=sub.response_mask,
    )
    dev = sc.logprobs.device
    mask = sub.loss_mask.to(dev)
    extras = loss_extras(sub.token_extras, sc.extra_logprobs, sizes, device=dev)
    old = sc.logprobs.detach() if s.single_step else sub.old_logprobs.to(dev)
    engine_lp = sub.token_extras.get(ENGINE_LOGPROBS)  # set by policy_update
    w = weights.to(dev)  # the KL and entropy terms keep the plain aggregation weights
    mp = MicroPass(
        batch=sub,
        logprobs=sc.logprobs,
        old=old,
        engine=None if engine_lp is None else engine_lp.to(dev),
        sampler=None if sampler_lp is None else sampler_lp.to(dev),
        weights=w,
        pg_weights=w,
        mask=mask,
        single_step=s.single_step,
    )
    for part in ctx.parts:  # e.g. truncated importance sampling
        mp.pg_weights = part.weigh(mp, mp.pg_weights)
    inputs = LossInputs(
        logprobs=sc.logprobs,
        old_logprobs=old,
        advantages=sub.advantages.to(dev),
        mask=mask,
        weights=mp.pg_weights,
        episode=sub.episode,
        turn=sub.turn,
        ref_logprobs=ref_lp,
        entropy=sc.entropy,
        step=iteration,
        extras=extras,
    )
    loss, metrics = get_loss(s.loss)(inputs, **s.loss_params)
    if ref_lp is not None and s.kl_coef > 0:
        kl = kl_estimate(sc.logprobs, ref_lp.to(dev), s.kl_estimator)
        kl_term = kl_loss(kl, w, mask, 1.0)
        loss = loss + s.kl_coef * kl_term
        metrics["loss/kl"] = kl_term.detach()
    if s.entropy_coef > 0:
        loss = loss - s.entropy_coef * entropy_bonus(sc.entropy, w, mask)
    metrics.setdefault("policy/entropy", entropy_bonus(sc.entropy.detach(), w, mask))
    for part in ctx.parts:  # e.g. the health statistics, the sampler/trainer mismatch
        part.micro_metrics(mp, metrics)
    return loss, metrics
