"""OPRD: weak-to-strong on-policy reverse distillation as a dense reward. [recon]

Reconstruction from the summary (docs/algorithms.md#oprd; no public code). A (possibly weaker)
teacher comes as a pair: its RL-trained policy π_T^RL and the base it was trained from,
π_T^base. On the *student's* own rollouts, both score the sampled tokens; the teacher's
policy shift

    Δ_t = log π_T^RL(y_t | x, y<t) − log π_T^base(y_t | x, y<t)

says which tokens RL taught the teacher to prefer — a direction that transfers to a
stronger student even when the teacher's absolute log-probs do not. The dense reward is
``α·Δ_t`` (α > 1 allowed: the shift is amplified), given only on rows the verifier
accepts (success, validity, or both: :func:`verifier_mask`); the student keeps a KL to its
own reference (the trainer's ordinary KL penalty, :func:`credo.objectives.kl_reward_penalty`).

**Directions the verifier supports** (:func:`verifier_agreement`). The paper amplifies
only the teacher guidance the verifier agrees with. A teacher's shift on a step has a
direction, the sign of ``Σ_t Δ_t``: RL made that step more likely (``+``) or less likely
(``−``). On a step of a verified success the supported direction is ``+``, on a step of a
verified failure ``−``. ``accept: agree`` rewards every step with the teachers whose
direction agrees with its episode's verdict, and no other: a success is never pushed down
by a teacher that happens to dislike it, and a failure is pushed down only by a teacher
that moved away from it, so an amplified shift (α > 1) cannot reorder the verifier's
ranking of successes above failures.

Several teachers ``i = 1..T`` combine per sample (:func:`combine_teachers`): ``mean``
over the teachers the caller marks usable for that sample (``teacher_ok [T, B]``; all
when not given), ``verifier``: the mean over the teachers whose direction agrees with the
verifier on that sample (``teacher_ok`` = :func:`verifier_agreement`; none agreeing: no
reward), or ``likelihood``: one teacher per sample, ``choice [B]`` (the caller's pick, e.g.
the teacher most likely to have produced the sample; or the first usable one).

Every knob is exposed: ``alpha``, ``clip`` (clamp Δ to ``[−clip, clip]`` before scaling),
``combine``, ``on`` (which rows the verifier accepts), ``reduce`` (per-row sum or mean).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "COMBINE_MODES",
    "VERIFIER_MODES",
    "combine_teachers",
    "oprd_delta",
    "oprd_row_reward",
    "oprd_token_reward",
    "verifier_agreement",
    "verifier_mask",
]

COMBINE_MODES = ("mean", "verifier", "likelihood")
VERIFIER_MODES = ("success", "valid", "success_and_valid", "all", "agree")


def verifier_mask(
    success: torch.Tensor, valid: torch.Tensor, *, on: str = "success"
) -> torch.Tensor:
    """``[B]`` bool: the rows the verifier accepts.

    Args:
        success: ``[B]`` bool, the row's episode succeeded (broadcast from its episode).
        valid: ``[B]`` bool, the row's action was valid.
        on: ``success`` (default), ``valid``, ``success_and_valid``, ``all``, or
            ``agree`` (every row: each teacher is then kept or dropped per row by
            :func:`verifier_agreement`).
    """
    if success.shape != valid.shape:
        raise ValueError(
            f"verifier_mask: success {list(success.shape)} and valid {list(valid.shape)} "
            "must both be [B]"
        )
    if on == "success":
        return success.bool().clone()
    if on == "valid":
        return valid.bool().clone()
    if on == "success_and_valid":
        return success.bool() & valid.bool()
    if on in ("all", "agree"):
        return torch.ones_like(success, dtype=torch.bool)
    raise ValueError(f"OPRD: unknown verifier mode {on!r}; valid: {', '.join(VERIFIER_MODES)}")


def _stack(x: torch.Tensor) -> torch.Tensor:
    return x[None] if x.dim() == 2 else x


def oprd_delta(
    rl_logprobs: torch.Tensor,
    base_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = None,
) -> torch.Tensor:
    """The teachers' policy shifts ``Δ = log π_T^RL − log π_T^base``, 0 off the mask.

    Args:
        rl_logprobs: ``[T, B, L]`` (or ``[B, L]`` for one teacher) RL teachers' log-probs
            of the student's sampled tokens.
        base_logprobs: same shape, the matching base teachers' log-probs.
        mask: ``[B, L]`` bool, response tokens.
        clip: clamp Δ to ``[−clip, clip]`` (default ``None``).

    Returns:
        ``[T, B, L]`` detached.
    """
    rl, base = _stack(rl_logprobs), _stack(base_logprobs)
    if rl.shape != base.shape or rl.dim() != 3 or rl.shape[1:] != mask.shape:
        raise ValueError(
            "OPRD: rl_logprobs and base_logprobs must both be [T, B, L] (or [B, L]) with "
            f"[B, L] = {list(mask.shape)}; got {list(rl_logprobs.shape)} and "
            f"{list(base_logprobs.shape)}"
        )
    if clip is not None and not clip > 0:
        raise ValueError(f"OPRD: clip must be > 0 or None, got {clip}")
    keep = mask.bool()[None].expand_as(rl)
    zero = torch.zeros((), dtype=rl.dtype, device=rl.device)
    d = torch.where(keep, rl.detach(), zero) - torch.where(keep, base.detach().to(rl.dtype), zero)
    if clip is not None:
        d = d.clamp(-clip, clip)
    return d


def verifier_agreement(
    delta: torch.Tensor, mask: torch.Tensor, success: torch.Tensor
) -> torch.Tensor:
    """``[T, B]`` bool: teacher ``i``'s shift on row ``b`` points the way the verifier's
    verdict does, ``sign(Σ_t Δ_{i,b,t}) = +1`` on a row of a successful episode and ``−1``
    on a row of a failed one (a zero shift has no direction and does not agree).

    Args:
        delta: ``[T, B, L]`` (or ``[B, L]``) shifts (:func:`oprd_delta`, clipped or not).
        mask: ``[B, L]`` bool, response tokens.
        success: ``[B]`` bool, the verdict on each row's episode.
    """
    d = _stack(delta)
    if d.shape[1:] != mask.shape or success.shape != mask.shape[:1]:
        raise ValueError(
            f"OPRD: delta {list(delta.shape)}, mask {list(mask.shape)} and success "
            f"{list(success.shape)} must be [T, B, L], [B, L] and [B]"
        )
    shift = torch.where(mask.bool()[None], d, torch.zeros_like(d)).sum(-1)
    verdict = torch.where(success.bool(), 1.0, -1.0).to(shift.dtype).to(shift.device)
    return shift * verdict[None] > 0


def combine_teachers(
    delta: torch.Tensor,
    *,
    combine: str = "mean",
    teacher_ok: torch.Tensor | None = None,
    choice: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine per-teacher shifts into one per sample.

    Args:
        delta: ``[T, B, L]`` shifts (:func:`oprd_delta`).
        combine: ``mean`` (default: over the usable teachers of each sample),
            ``verifier`` (the same mean, over the teachers that agree with the verifier:
            ``teacher_ok`` is then required, :func:`verifier_agreement`) or
            ``likelihood`` (one teacher per sample).
        teacher_ok: ``[T, B]`` bool, teacher ``i`` may teach sample ``b`` (default: all).
        choice: ``[B]`` int64 teacher index per sample for ``likelihood`` (−1: none);
            default the first usable teacher (``teacher_ok``), none if there is no usable
            one.

    Returns:
        ``(delta [B, L], has_teacher [B] bool)``; rows without a teacher get 0.
    """
    n_t, b = delta.shape[:2]
    ok = torch.ones((n_t, b), dtype=torch.bool, device=delta.device)
    if teacher_ok is not None:
        if teacher_ok.shape != (n_t, b):
            raise ValueError(
                f"OPRD: teacher_ok must be [T, B] = [{n_t}, {b}], got {list(teacher_ok.shape)}"
            )
        ok = teacher_ok.bool().to(delta.device)
    if combine == "verifier" and teacher_ok is None:
        raise ValueError("OPRD: combine='verifier' needs teacher_ok (verifier_agreement)")
    if combine in ("mean", "verifier"):
        n = ok.sum(0)
        w = ok.to(delta.dtype) / n.clamp(min=1).to(delta.dtype)
        return (w[..., None] * delta).sum(0), n > 0
    if combine == "likelihood":
        if choice is None:
            first = ok.to(torch.int64).argmax(0)
            choice = torch.where(ok.any(0), first, torch.full_like(first, -1))
        if choice.shape != (b,):
            raise ValueError(f"OPRD: choice must be [B] = [{b}], got {list(choice.shape)}")
        choice = choice.long().to(delta.device)
        if bool(((choice < -1) | (choice >= n_t)).any()):
            raise ValueError(f"OPRD: choice must hold teacher indices in [-1, {n_t - 1}]")
        has = choice >= 0
        idx = choice.clamp(min=0)[None, :, None].expand(1, b, delta.shape[2])
        picked = delta.gather(0, idx).squeeze(0)
        return torch.where(has[:, None], picked, torch.zeros_like(picked)), has
    raise ValueError(f"OPRD: unknown combine {combine!r}; valid: {', '.join(COMBINE_MODES)}")


def oprd_token_reward(
    rl_logprobs: torch.Tensor,
    base_logprobs: torch.Tensor,
    mask: torch.Tensor,
    accepted: torch.Tensor,
    *,
    alpha: float = 1.0,
    combine: str = "mean",
    teacher_ok: torch.Tensor | None = None,
    choice: torch.Tensor | None = None,
    clip: float | None = None,
) -> torch.Tensor:
    """Dense OPRD reward ``α·Δ_t`` on accepted rows → ``[B, L]`` (detached).

    Args:
        rl_logprobs, base_logprobs: ``[T, B, L]`` or ``[B, L]`` (:func:`oprd_delta`).
        mask: ``[B, L]`` bool, response tokens.
        accepted: ``[B]`` bool, rows the verifier accepts (:func:`verifier_mask`); the
            others get 0.
        alpha: the scale α (default 1.0; any positive value, α > 1 amplifies).
        combine, teacher_ok, choice: how teachers combine (:func:`combine_teachers`).
        clip: clamp Δ before scaling (default ``None``).
    """
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"OPRD: alpha must be positive and finite, got {alpha}")
    if accepted.shape != mask.shape[:1]:
        raise ValueError(
            f"OPRD: accepted must be [B] = [{mask.shape[0]}], got {list(accepted.shape)}"
        )
    delta = oprd_delta(rl_logprobs, base_logprobs, mask, clip=clip)
    d, has = combine_teachers(delta, combine=combine, teacher_ok=teacher_ok, choice=choice)
    rows = (accepted.bool().to(d.device) & has)[:, None] & mask.bool()
    return torch.where(rows, alpha * d, torch.zeros_like(d))


def oprd_row_reward(
    rl_logprobs: torch.Tensor,
    base_logprobs: torch.Tensor,
    mask: torch.Tensor,
    accepted: torch.Tensor,
    *,
    reduce: str = "sum",
    **kwargs: object,
) -> torch.Tensor:
    """:func:`oprd_token_reward` reduced per row → ``[B]``: ``sum`` (default) or ``mean``
    over the row's masked tokens (0 for a row without any)."""
    r = oprd_token_reward(rl_logprobs, base_logprobs, mask, accepted, **kwargs)  # type: ignore[arg-type]
    if reduce == "sum":
        return r.sum(1)
    if reduce == "mean":
        return r.sum(1) / mask.sum(1).clamp(min=1).to(r.dtype)
    raise ValueError(f"OPRD: unknown reduce {reduce!r}; valid: sum, mean")
