"""MT-SDPO: verified multi-teacher self-distillation on top of GRPO. [recon]

Reconstruction from the summary (docs/algorithms.md#mt-sdpo; no public code)::

    L = L_GRPO + β Σ_t KL(π_θ(·|x, y<t) ‖ sg π_EMA(·|x, c*, y<t))

The teacher is an EMA copy of the student (:class:`credo.teachers.EMATeacher`) that reads
a teacher context ``c*`` the student never sees: a trajectory whose answer the verifier
accepts, with the answer itself stripped by a sanitiser
(:mod:`credo.teachers.sanitise`). ``c*`` is chosen per sample by
:func:`select_contexts`: **self-anchor first** — another verified rollout of the same
group (same task, this iteration); **external teachers only when the group has none**
(their verified contexts: a pool of domain teachers' verified trajectories of the same
task, :class:`credo.teachers.pool.TeacherPool`, and the student's own earlier ones,
:class:`credo.teachers.ContextCache`). Samples with neither get the GRPO term only.

**Aggregation** (``teacher.aggregate: all``): every candidate context of a sample
(:func:`candidate_contexts`: all its verified siblings, else every eligible external
context) is read in turn, and the target is the mean of the teacher's distributions,
``π_EMA(·|x, C, y<t) = (1/|C|) Σ_{c∈C} π_EMA(·|x, c, y<t)`` (:func:`mixture_logprobs`;
[recon]: the summary says all correct feedback is aggregated, not how).

The KL is over the full distribution (tiny vocabularies: ``K = V``) or the EMA teacher's
top-K head plus a tail bucket, computed by :func:`credo.objectives.opd.reverse_kl_topk`.
Extras: ``teacher_topk_logprobs`` / ``student_topk_logprobs`` ``[B, L, K]`` and
``teacher_row_mask`` ``[B]`` (the rows that got a context), as for ``opd``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from credo.objectives.inputs import LossInputs
from credo.objectives.opd import opd
from credo.objectives.registry import needs_teacher, register_loss

__all__ = [
    "ANCHOR_SOURCES",
    "ContextChoice",
    "candidate_contexts",
    "mixture_logprobs",
    "mt_sdpo",
    "select_contexts",
]

#: Codes of :attr:`ContextChoice.source`.
ANCHOR_SOURCES = ("none", "self", "external")


@register_loss("mt_sdpo", teacher=needs_teacher("mt_sdpo", privileged=("anchor",)))
def mt_sdpo(
    inputs: LossInputs,
    *,
    beta: float = 0.1,
    rl_coef: float = 1.0,
    tail_floor: float = 1e-6,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``rl_coef·L_GRPO + β·Σ w·KL_K(π_θ ‖ sg π_EMA(·|c*))`` [recon].

    Args:
        inputs: the batch with ``advantages`` (GRPO's), ``teacher_topk_logprobs`` and
            ``student_topk_logprobs`` ``[B, L, K]`` (the EMA teacher's head in context c*
            and the student's log-probs of the same ids; ``K = V`` for the full KL) and
            ``teacher_row_mask`` ``[B]`` (rows with a context).
        beta: β, the distillation weight (default 0.1; ≥ 0).
        rl_coef: weight of the GRPO (PPO-clip) term (default 1.0).
        tail_floor: floor of the top-K tails (default 1e-6).
        clip_low, clip_high, dual_clip, ratio_level: the PPO knobs (defaults as ``ppo``).

    Returns:
        ``(loss, metrics)`` as :func:`credo.objectives.opd.opd` (``loss/distill``,
        ``distill/reverse_kl``, ``distill/coverage`` and the ``ppo`` metrics).
    """
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"mt_sdpo: beta must be finite and >= 0, got {beta}")
    return opd(
        inputs,
        estimator="topk",
        distill_coef=beta,
        rl_coef=rl_coef,
        tail_floor=tail_floor,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        ratio_level=ratio_level,
    )


@dataclass(frozen=True)
class ContextChoice:
    """Which teacher context each sample distils from.

    Attributes:
        source: ``[N]`` int64: 0 none, 1 self-anchor (a verified rollout of the same
            group), 2 external (see :data:`ANCHOR_SOURCES`).
        index: ``[N]`` int64: the sample index of the anchor (source 1), the external
            context's index (source 2), or −1.
    """

    source: torch.Tensor
    index: torch.Tensor

    @property
    def has_context(self) -> torch.Tensor:
        """``[N]`` bool: samples with a context (the ``teacher_row_mask`` of their rows)."""
        return self.source > 0


def select_contexts(
    group: torch.Tensor,
    success: torch.Tensor,
    *,
    external_group: torch.Tensor | None = None,
    allow_self: bool = False,
    pick: str = "first",
    generator: torch.Generator | None = None,
) -> ContextChoice:
    """Choose a verified teacher context per sample: self-anchor first, then external.

    Args:
        group: ``[N]`` int64 group (task) id of each sample (episode).
        success: ``[N]`` bool, the verifier accepts the sample.
        external_group: ``[M]`` int64 group id each external verified context belongs to
            (e.g. from a cache of teachers' verified trajectories), or ``None``.
        allow_self: a verified sample may anchor on itself (default false: it needs
            another verified rollout of its group, else it gets no context — the group
            has a verified rollout, so no external context either).
        pick: among several candidates, ``first`` (lowest index; default) or ``random``
            (uniform, with ``generator``).
        generator: the random source for ``pick="random"``.

    Returns:
        :class:`ContextChoice`. External contexts are used only for samples whose group
        has no verified sample at all.
    """
    if pick not in ("first", "random"):
        raise ValueError(f"select_contexts: unknown pick {pick!r}; valid: first, random")
    own, ext = candidate_contexts(group, success, external_group, allow_self=allow_self)
    n = own.shape[0]
    source = torch.zeros(n, dtype=torch.long)
    index = torch.full((n,), -1, dtype=torch.long)
    has_self = own.any(1)
    if bool(has_self.any()):
        index = torch.where(has_self, _pick(own, pick, generator), index)
        source = torch.where(has_self, torch.ones_like(source), source)
    use_ext = ext.any(1)
    if bool(use_ext.any()):
        index = torch.where(use_ext, _pick(ext, pick, generator), index)
        source = torch.where(use_ext, torch.full_like(source, 2), source)
    return ContextChoice(source, index)


def candidate_contexts(
    group: torch.Tensor,
    success: torch.Tensor,
    external_group: torch.Tensor | None = None,
    *,
    allow_self: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every verified context each sample may read: self-anchors first, then external.

    A sample's candidates are its group's *other* verified samples (itself too with
    ``allow_self``); only a sample whose group has no verified sample at all may read
    external contexts, and then every external context of its group is a candidate.

    Args:
        group: ``[N]`` int64 group (task) id of each sample.
        success: ``[N]`` bool, the verifier accepts the sample.
        external_group: ``[M]`` int64 group id of each external context, or ``None``.
        allow_self: a verified sample is a candidate for itself (default false).

    Returns:
        ``(own [N, N], external [N, M])`` bool: ``own[i, j]`` sample j anchors sample i,
        ``external[i, m]`` external context m does. A row has candidates in at most one
        of the two.
    """
    if group.dim() != 1 or success.shape != group.shape:
        raise ValueError(
            f"select_contexts: group and success must both be [N], got {list(group.shape)} "
            f"and {list(success.shape)}"
        )
    n = group.shape[0]
    grp = group.long()
    ok = success.bool()
    same = grp[:, None] == grp[None, :]  # [N, N]
    own = same & ok[None, :]
    group_has_verified = own.any(1)
    if not allow_self:
        own = own & ~torch.eye(n, dtype=torch.bool)
    if external_group is None or not external_group.numel():
        return own, torch.zeros(n, 0, dtype=torch.bool)
    ext = (external_group.long()[None, :] == grp[:, None]) & ~group_has_verified[:, None]
    return own, ext


def mixture_logprobs(logprobs: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """``log((1/C_b) Σ_{c present} p_c)``: the mean of the teacher's distributions over a
    sample's contexts (MT-SDPO's aggregation of every verified context's feedback).

    Args:
        logprobs: ``[C, B, ...]`` the teacher's log-probs under context slot c of row b
            (log-probs of the sampled tokens ``[C, B, L]`` or of a shared head
            ``[C, B, L, K]``: every slot must score the same ids).
        present: ``[C, B]`` bool, row b has a context in slot c (every row at least one).

    Returns:
        ``[B, ...]`` the log-probs of the mixture (a row with one context: that context's
        log-probs exactly).
    """
    if present.dim() != 2 or tuple(present.shape) != tuple(logprobs.shape[:2]):
        raise ValueError(
            f"mixture_logprobs: present must be [C, B] = {list(logprobs.shape[:2])}, got "
            f"{list(present.shape)}"
        )
    count = present.sum(0)
    if bool((count == 0).any()):
        raise ValueError("mixture_logprobs: every row needs at least one context")
    shape = (*present.shape, *([1] * (logprobs.dim() - 2)))
    keep = present.reshape(shape)
    x = torch.where(keep, logprobs, torch.full_like(logprobs, float("-inf")))
    out = torch.logsumexp(x, dim=0) - count.to(logprobs.dtype).log().reshape(shape[1:])
    single = (count == 1).reshape(shape[1:])
    first = torch.where(keep, logprobs, torch.zeros_like(logprobs)).sum(0)
    return torch.where(single, first, out)


def _pick(cand: torch.Tensor, pick: str, generator: torch.Generator | None) -> torch.Tensor:
    """Per row of ``cand [N, M]`` bool: the first (or a uniformly random) true column."""
    if pick == "first":
        return cand.to(torch.int64).argmax(1)
    noise = torch.rand(cand.shape, generator=generator)
    return torch.where(cand, noise, torch.full_like(noise, -1.0)).argmax(1)
