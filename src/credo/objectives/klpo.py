"""KLPO: single-rollout, critic-free policy optimisation with the KL anchored at the sampler.

Zhang et al. (Princeton), code and report https://github.com/yifanzhang-pro/KLPO
(``klpo/loss.py``, ``docs/algorithms.md``). [code]

Sampler q (the policy that produced the data: ``inputs.old_logprobs``), trainer p
(``inputs.logprobs``). For each response token ``a_u``: ``ℓ_u = log p(a_u) − log q(a_u)``.
``R`` is the sequence's reward, passed as ``inputs.advantages``: **the trainer passes raw
returns**, broadcast to the tokens (no group centring, no std scaling — KLPO needs none).
No importance ratio, no clipping, no critic, no length normalisation.

**Token route** (``klpo``, the paper's default, Figure 1)::

    loss = −Σ_tokens w · sg(R − β ℓ_u) · [log p(a_u) − C_u]

where ``C_u`` centres the score with the conditional KL's gradient, by estimator ``kl``:

- ``mc`` (default): ``C_u = mean_j log p(v_j)`` over ``M`` auxiliary tokens ``v_j ~ q``
  drawn i.i.d. *with replacement* at the visited prefix, independently of the rollout
  (the sampler stores their ids; the trainer gathers its log-probs of them into
  ``inputs.extras["aux_logprobs"]`` ``[B, L, M]``). Any ``M ≥ 1`` (default 16 in the
  authors' launchers). Duplicates are valid; do not deduplicate.
- ``binary``: ``log p(a_u) − C_u`` is replaced by ``sg(ω_u)·log p(a_u)``,
  ``ω = (1−q(a))/(1−p(a))`` (the gradient of ``ℓ + k_bin``). Needs nothing extra.
- ``topk``: ``C_u = Σ_head sg(q_v − ρ p_v) log p_v``, ``ρ = q_tail/p_tail`` (tails clamped
  at ``tail_floor``), from ``extras["topk_old_logprobs"]`` (the sampler's K head log-probs)
  and ``extras["topk_logprobs"]`` (the trainer's log-probs of the same ids), ``[B, L, K]``.

With weights ``w = 1/#responses`` on every token — ``seq-mean-token-sum`` when one row is
a whole response, ``episode-mean-token-sum`` when a response is a multi-turn episode —
this is the authors' ``−mean_responses Σ_tokens``. Every row is independent, so any
micro-batch split is exact.

**Sequence route** (``klpo_seq``, the paper's Figure 4 alternative): one residual per
sequence (``unit="row"`` or ``"episode"``; R = the masked mean of its token advantages,
i.e. the return the trainer broadcast):

- ``mc`` (default; needs ``M ≥ 2`` and the sampler's log-probs of the draws,
  ``extras["aux_old_logprobs"]``): ``D_j = R − β Σ_u (ℓ_u + log q(v_{u,j}) − log p(v_{u,j}))``
  per column ``j``; leave-one-out ``D_{−j} = mean_{l≠j} D_l``;
  ``loss_i = −mean_j sg(D_{−j}) · Σ_u [log p(a_u) − log p(v_{u,j})]``. Reported
  regression loss: the unbiased U-statistic ``(D̄² − Var_j(D)/(M−1)) / (2β)``.
- ``binary``: ``D = R − β Σ_u (ℓ_u + k_bin,u)``; ``loss_i = −sg(D) Σ_u sg(ω_u) log p(a_u)``.
- ``topk``: ``D = R − β Σ_u (ℓ_u + k_K,u)``; ``loss_i = −sg(D) Σ_u [log p(a_u) + k_K,u]``
  (differentiating the floored k_K).

Each has the sample gradient of ``D²/(2β)`` (MC: in expectation over the draws). The
sequence losses are summed with weights ``W_i = Σ_{tokens of i} w``: use
``seq-mean-token-mean`` (``unit="row"``) or ``episode-mean`` (``unit="episode"``) for
the authors' mean over responses; with ``unit="episode"`` keep episodes whole in
micro-batches. Defaults: β = 0.1, one rollout per prompt, temperature 1.

Optional ``extras["aux_mask"]`` ``[B, L, M]`` bool marks valid draws (e.g. fewer than M
at some positions): the token route averages over the valid ones (each loss token needs
at least one); the sequence route needs all M draws at every loss token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from credo.objectives.extras import register_extras
from credo.objectives.hpo import sequence_ids
from credo.objectives.inputs import LossInputs
from credo.objectives.kl import _log1mexp, kl_binary, kl_topk
from credo.objectives.metrics import masked_weights, policy_metrics
from credo.objectives.ratios import token_log_ratio
from credo.objectives.registry import register_loss

__all__ = ["KLPO_ESTIMATORS", "klpo", "klpo_seq"]

KLPO_ESTIMATORS = ("mc", "binary", "topk")


def _needs_sampler_draws(min_aux: int) -> Callable[[Mapping[str, Any], Any], str | None]:
    """The config requirement of ``klpo`` (``min_aux`` = 1) and ``klpo_seq`` (2): the
    sampler must store the tokens the chosen KL estimator reads."""

    def requires(params: Mapping[str, Any], rollout: Any) -> str | None:
        kl = params.get("kl", "mc")
        if kl == "topk" and rollout.topk_logprobs < 1:
            return (
                "objective.params.kl=topk needs the sampler's top-K log-probs: set "
                "rollout.topk_logprobs=K (docs/algorithms.md#klpo uses K = 16)"
            )
        if kl == "mc" and rollout.aux_samples < min_aux:
            name = "klpo" if min_aux == 1 else "klpo_seq"
            return (
                f"objective.loss={name} with kl=mc needs auxiliary draws: set "
                "rollout.aux_samples=M (recipe klpo: 16; klpo_seq needs M ≥ 2)"
            )
        return None

    return requires


#: The sampler's per-token sets KLPO scores with the trainer: auxiliary draws, top-K head.
SAMPLER_SETS = ("aux", "topk")


def sampler_token_ids(token_extras: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """``[B, L, M + K]``: the token ids whose trainer log-probs KLPO needs besides the
    sampled ones (the sampler's auxiliary draws, then its top-K head), gathered in the
    same scoring pass; ``None`` when the batch has neither."""
    sets = [token_extras[f"{n}_ids"] for n in SAMPLER_SETS if f"{n}_ids" in token_extras]
    return torch.cat(sets, -1) if sets else None


def sampler_extras(
    extra_logprobs: torch.Tensor | None, token_extras: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Split the trainer's log-probs of :func:`sampler_token_ids` back into KLPO's
    :class:`~credo.objectives.inputs.LossInputs` extras: ``aux_logprobs`` /
    ``aux_old_logprobs`` and ``topk_logprobs`` / ``topk_old_logprobs``."""
    out: dict[str, torch.Tensor] = {}
    start = 0
    for n in SAMPLER_SETS:
        if f"{n}_ids" not in token_extras:
            continue
        assert extra_logprobs is not None
        size = token_extras[f"{n}_ids"].shape[-1]
        out[f"{n}_logprobs"] = extra_logprobs[..., start : start + size]
        out[f"{n}_old_logprobs"] = token_extras[f"{n}_old_logprobs"].to(extra_logprobs.device)
        start += size
    return out


#: The update gathers the trainer's log-probs of the sampler's sets in its own forward pass.
register_extras(
    "sampler",
    ids=sampler_token_ids,
    extras=lambda token_extras, logprobs, device: sampler_extras(logprobs, token_extras),
)


def _check_common(inputs: LossInputs, beta: float, kl: str) -> None:
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"KLPO: beta must be positive and finite, got {beta}")
    if kl not in KLPO_ESTIMATORS:
        raise ValueError(f"KLPO: unknown kl {kl!r}; valid: {', '.join(KLPO_ESTIMATORS)}")


def _extra(inputs: LossInputs, key: str, why: str) -> torch.Tensor:
    x = inputs.extras.get(key)
    if x is None:
        raise ValueError(f"KLPO {why} needs inputs.extras[{key!r}] ([B, L, M] or [B, L, K])")
    if x.dim() != 3 or x.shape[:2] != inputs.mask.shape:
        raise ValueError(
            f"KLPO: inputs.extras[{key!r}] must be [B, L, ·] with [B, L] = "
            f"{list(inputs.mask.shape)}, got {list(x.shape)}"
        )
    return x


def _masked3(x: torch.Tensor, keep: torch.Tensor, fill: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(keep, x.to(dtype), torch.full((), fill, dtype=dtype, device=x.device))


def _aux_valid(inputs: LossInputs, aux: torch.Tensor) -> torch.Tensor:
    """``[B, L, M]`` bool: draws that count (``aux_mask`` if given) at loss tokens."""
    valid = inputs.mask[..., None].expand_as(aux)
    am = inputs.extras.get("aux_mask")
    if am is not None:
        if am.shape != aux.shape:
            raise ValueError(
                f"KLPO: extras['aux_mask'] must match aux_logprobs {list(aux.shape)}, "
                f"got {list(am.shape)}"
            )
        valid = valid & am.bool()
    return valid


def _binary_parts(
    cur: torch.Tensor, beh: torch.Tensor, m: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k_bin, ℓ + k_bin, ω)`` per token, detached, 0 on masked tokens."""
    bad = m & ((cur.detach() >= 0) | (beh >= 0))
    if bool(bad.any()):
        raise ValueError(
            "KLPO binary KL needs strictly negative log-probs (0 < p, q < 1) on loss tokens; "
            "compute log-softmax in float32 or float64"
        )
    lp = torch.where(m, cur.detach(), torch.full_like(cur, -1.0))
    lq = torch.where(m, beh, torch.full_like(beh, -1.0))
    lpc, lqc = _log1mexp(lp), _log1mexp(lq)
    k_bin = kl_binary(lq, lp)
    ell_plus_k = -torch.expm1(lq) * (lp - lq + lqc - lpc)  # = ℓ + k_bin, stable near q = 1
    omega = torch.exp(lqc - lpc)
    zero = torch.zeros_like(lp)
    return (
        torch.where(m, k_bin, zero),
        torch.where(m, ell_plus_k, zero),
        torch.where(m, omega, zero),
    )


def _topk_inputs(inputs: LossInputs, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    p_head = _extra(inputs, "topk_logprobs", "kl='topk'")
    q_head = _extra(inputs, "topk_old_logprobs", "kl='topk'")
    if p_head.shape != q_head.shape:
        raise ValueError(
            f"KLPO: topk_logprobs {list(p_head.shape)} and topk_old_logprobs "
            f"{list(q_head.shape)} must have the same shape"
        )
    keep = inputs.mask[..., None].expand_as(p_head)
    p_head = _masked3(p_head, keep, float("-inf"), dtype)
    q_head = _masked3(q_head.detach(), keep, float("-inf"), dtype)
    return p_head, q_head


def _prepare(
    inputs: LossInputs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mask, w, ℓ, log p(a), log q(a), R)``, all ``[B, L]`` and 0 on masked tokens.

    ``ℓ`` and ``log p(a)`` keep the gradient; ``w``, ``log q(a)`` and ``R`` are constants.
    """
    m = inputs.mask
    w = masked_weights(inputs.weights, m)
    ell = token_log_ratio(inputs.logprobs, inputs.old_logprobs, m)
    dtype = ell.dtype
    zero = torch.zeros((), dtype=dtype, device=ell.device)
    cur = torch.where(m, inputs.logprobs, zero)
    beh = torch.where(m, inputs.old_logprobs.detach().to(dtype), zero)
    ret = torch.where(m, inputs.advantages.detach().to(dtype), zero)
    return m, w, ell, cur, beh, ret


@register_loss("klpo", requires=_needs_sampler_draws(min_aux=1))
def klpo(
    inputs: LossInputs,
    *,
    beta: float = 0.1,
    kl: str = "mc",
    tail_floor: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KLPO token regression: ``−Σ w · sg(R − βℓ) · [log p(a) − C]``.

    Args:
        inputs: the batch. ``logprobs`` (trainer p, with grad), ``old_logprobs`` (sampler
            q), ``advantages`` (raw return R per token), ``mask``, ``weights`` ``[B, L]``;
            ``extras`` by estimator: ``mc``: ``aux_logprobs`` ``[B, L, M]`` (trainer
            log-probs of the M auxiliary draws, with grad), optional ``aux_old_logprobs``
            (sampler log-probs of the draws, for the ``policy/sampler_kl`` metric) and
            ``aux_mask``; ``topk``: ``topk_logprobs`` and ``topk_old_logprobs``
            ``[B, L, K]``; ``binary``: nothing.
        beta: β, the KL coefficient (default 0.1).
        kl: ``mc`` (default), ``binary`` or ``topk``.
        tail_floor: floor of the top-K tail masses (default 1e-6; ``topk`` only).

    Returns:
        ``(loss, metrics)``: ``loss/policy``, ``policy/approx_kl`` (token k3 of the
        sampler–trainer ratio), ``policy/ratio_mean``, ``policy/ratio_sq_mean``,
        ``policy/return_coef`` (``Σ w·(R − βℓ)``), ``policy/sampler_kl`` (``Σ w·k`` with
        the estimator's per-token KL(q ‖ p); for ``mc`` only with ``aux_old_logprobs``),
        ``policy/entropy`` if given. No clipping, so no clip fraction.
    """
    _check_common(inputs, beta, kl)
    m, w, ell, cur, beh, ret = _prepare(inputs)
    h = (ret - beta * ell).detach()
    kl_tok: torch.Tensor | None = None
    if kl == "mc":
        aux = _extra(inputs, "aux_logprobs", "kl='mc'")
        valid = _aux_valid(inputs, aux)
        n_valid = valid.sum(-1)
        if bool((m & (n_valid == 0)).any()):
            raise ValueError("KLPO mc: every loss token needs at least one valid auxiliary draw")
        p_aux = _masked3(aux, valid, 0.0, ell.dtype)
        corr = p_aux.sum(-1) / n_valid.clamp(min=1).to(ell.dtype)
        term = cur - corr
        if "aux_old_logprobs" in inputs.extras:  # only for the sampler-KL metric
            q_aux = _masked3(_extra(inputs, "aux_old_logprobs", "mc"), valid, 0.0, ell.dtype)
            kl_tok = (q_aux - p_aux.detach()).sum(-1) / n_valid.clamp(min=1).to(ell.dtype)
    elif kl == "binary":
        kl_tok, _, omega = _binary_parts(cur, beh, m)
        term = omega * cur
    else:
        p_head, q_head = _topk_inputs(inputs, ell.dtype)
        with torch.no_grad():
            q, p = q_head.exp(), p_head.detach().exp()
            q_tail = (1.0 - q.sum(-1)).clamp(min=tail_floor)
            p_tail = (1.0 - p.sum(-1)).clamp(min=tail_floor)
            coef = q - (q_tail / p_tail)[..., None] * p
            kl_tok = kl_topk(q_head, p_head.detach(), tail_floor=tail_floor)
        safe_p_head = torch.where(torch.isneginf(p_head), torch.zeros_like(p_head), p_head)
        term = cur - (coef * safe_p_head).sum(-1)
    term = torch.where(m, term, torch.zeros_like(term))
    loss = -(w * h * term).sum()
    metrics = policy_metrics(
        loss=loss, weights=w, token_log_ratio=ell, entropy=inputs.entropy, mask=m
    )
    metrics["policy/return_coef"] = (w * h).sum()
    if kl_tok is not None:
        metrics["policy/sampler_kl"] = (w * torch.where(m, kl_tok, torch.zeros_like(kl_tok))).sum()
    return loss, metrics


def _u_statistic(resid: torch.Tensor, beta: float) -> torch.Tensor:
    """``(D̄² − Var_j(D)/(M−1)) / (2β)`` per sequence from the ``[num, M]`` residuals
    ``D_j``, in float64: it is a reported number, not a gradient, and squaring residuals
    of 1e19 (advantages that large) overflows float32 to inf, and inf − inf is NaN."""
    d = resid.double()
    d_bar = d.mean(-1)
    centred = d - d_bar[:, None]
    return (d_bar.square() - centred.square().mean(-1) / (d.shape[-1] - 1)) / (2 * beta)


@register_loss("klpo_seq", requires=_needs_sampler_draws(min_aux=2))
def klpo_seq(
    inputs: LossInputs,
    *,
    beta: float = 0.1,
    kl: str = "mc",
    tail_floor: float = 1e-6,
    unit: str = "row",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KLPO sequence regression: the sample gradient of ``Σ_i W_i · D_i² / (2β)``.

    Args:
        inputs: as for :func:`klpo`; ``mc`` needs ``extras["aux_logprobs"]`` and
            ``extras["aux_old_logprobs"]`` ``[B, L, M]`` with ``M ≥ 2`` (all draws valid).
        beta: β (default 0.1).
        kl: ``mc`` (default, leave-one-out over the M draws), ``binary`` or ``topk``.
        tail_floor: floor of the top-K tail masses (default 1e-6; ``topk`` only).
        unit: ``row`` (default) or ``episode``: what one residual ``D`` covers.

    Returns:
        ``(loss, metrics)``: ``loss/policy`` (the backward surrogate),
        ``loss/klpo_regression`` (``Σ W_i D_i²/(2β)``; for ``mc`` the unbiased
        U-statistic, which can be negative), ``policy/residual`` (``Σ W_i D_i``),
        ``policy/sampler_kl``, ``policy/approx_kl``, ``policy/ratio_mean``,
        ``policy/ratio_sq_mean``, ``policy/entropy`` if given.
    """
    _check_common(inputs, beta, kl)
    m, w, ell, cur, beh, ret = _prepare(inputs)
    dtype = ell.dtype
    seq, num = sequence_ids(unit, inputs.episode)

    def seg(x: torch.Tensor) -> torch.Tensor:  # sum rows [B, ...] into sequences [num, ...]
        out = torch.zeros((num, *x.shape[1:]), dtype=x.dtype, device=x.device)
        return out.index_add(0, seq, x)

    count = seg(m.sum(1).to(dtype))
    ret_seq = seg(ret.sum(1)) / count.clamp(min=1)
    weight = seg(w.sum(1).to(dtype))
    ell_sum = seg(ell.detach().sum(1))
    if kl == "mc":
        aux = _extra(inputs, "aux_logprobs", "klpo_seq kl='mc'")
        q_aux = _extra(inputs, "aux_old_logprobs", "klpo_seq kl='mc'")
        n_draws = aux.shape[-1]
        if n_draws < 2:
            raise ValueError(
                f"KLPO sequence mc needs M >= 2 draws for leave-one-out, got {n_draws}"
            )
        valid = _aux_valid(inputs, aux)
        if bool((m[..., None] & ~valid).any()):
            raise ValueError("KLPO sequence mc needs all M draws valid at every loss token")
        p_aux = _masked3(aux, valid, 0.0, dtype)
        q_aux = _masked3(q_aux.detach(), valid, 0.0, dtype)
        kl_tok = (q_aux - p_aux.detach()).mean(-1)
        with torch.no_grad():
            col = seg((q_aux - p_aux.detach()).sum(1))  # [num, M]
            resid = ret_seq[:, None] - beta * (ell_sum[:, None] + col)  # D_j
            d_bar = resid.mean(-1)
            centred = resid - d_bar[:, None]
            other = d_bar[:, None] - centred / (n_draws - 1)  # D_{−j}
            regression = _u_statistic(resid, beta)
        corrected = seg(cur.sum(1))[:, None] - seg(p_aux.sum(1))  # [num, M]
        loss_seq = -(other * corrected).mean(-1)
        d_report = d_bar
    else:
        if kl == "binary":
            kl_tok, ell_plus_k, omega = _binary_parts(cur, beh, m)
            score = seg((omega * cur).sum(1))
        else:
            p_head, q_head = _topk_inputs(inputs, dtype)
            k_tok = kl_topk(q_head, p_head, tail_floor=tail_floor)
            k_tok = torch.where(m, k_tok, torch.zeros_like(k_tok))
            kl_tok = k_tok.detach()
            ell_plus_k = ell.detach() + kl_tok
            score = seg((cur + k_tok).sum(1))
        with torch.no_grad():
            d_report = ret_seq - beta * seg(ell_plus_k.sum(1))
            regression = d_report.double().square() / (2 * beta)  # float64: see _u_statistic
        loss_seq = -d_report * score
    loss = (weight * loss_seq).sum()
    metrics = policy_metrics(
        loss=loss, weights=w, token_log_ratio=ell, entropy=inputs.entropy, mask=m
    )
    metrics["loss/klpo_regression"] = (weight.double() * regression).sum()
    metrics["policy/residual"] = (weight * d_report).sum()
    metrics["policy/sampler_kl"] = (w * torch.where(m, kl_tok, torch.zeros_like(kl_tok))).sum()
    return loss, metrics
