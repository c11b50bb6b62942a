"""Shared builders for the objectives tests: small batches, every loss configuration."""

from __future__ import annotations

from dataclasses import replace

import torch

from credo.objectives import LossInputs, aggregation_weights
from credo.objectives.rapo import rapo_signal_range

#: (loss name, kwargs) covering every loss and its main knobs.
LOSS_CONFIGS: list[tuple[str, dict]] = [
    ("ppo", {}),
    ("ppo", {"ratio_level": "turn"}),
    ("ppo", {"ratio_level": "sequence", "dual_clip": None}),
    ("holder", {}),
    ("holder", {"unit": "episode", "schedule": "constant", "p": 0.0}),
    ("holder_token", {"schedule": "constant", "p": -1.0}),
    ("holder_token", {"unit": "episode"}),
    ("klpo", {"kl": "mc"}),
    ("klpo", {"kl": "binary"}),
    ("klpo", {"kl": "topk"}),
    ("klpo_seq", {"kl": "mc"}),
    ("klpo_seq", {"kl": "binary", "unit": "episode"}),
    ("klpo_seq", {"kl": "topk"}),
    ("ppo_rapo", {"gamma": 0.5}),
    ("ppo_rapo", {"scale": "row", "ratio_level": "turn"}),
]

#: The leaf tensors a loss may differentiate through.
GRAD_KEYS = ("logprobs", "aux_logprobs", "topk_logprobs")


def make_inputs(
    lengths: list[int],
    episode: list[int],
    *,
    width: int | None = None,
    mode: str = "token-mean",
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    spread: float = 0.3,
    m_aux: int = 3,
    k_head: int = 3,
    step: int = 100,
) -> LossInputs:
    """A batch with one row per entry of ``lengths`` (unmasked tokens first).

    Log-probs are proper (< 0) and the sampler's differ by about ``spread``; every
    extra that some loss needs is included (aux draws, top-K heads, RAPO references).
    Leaves that take gradients are ``logprobs``, ``extras['aux_logprobs']`` and
    ``extras['topk_logprobs']`` (``requires_grad``).
    """
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    width = width or max(max(lengths), 1)
    mask = torch.zeros(b, width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    logprobs = -0.2 - 1.5 * torch.rand(b, width, generator=g, dtype=dtype)
    old = (logprobs + spread * rnd(b, width)).clamp(max=-0.05)
    adv = rnd(b, width).sign() * (0.5 + torch.rand(b, width, generator=g, dtype=dtype))
    # one advantage per row (the trainer broadcasts the row's advantage)
    adv = adv[:, :1].expand(b, width).clone()
    ep = torch.tensor(episode, dtype=torch.long)
    turn = torch.zeros(b, dtype=torch.long)
    for e in ep.unique():
        idx = (ep == e).nonzero().flatten()
        turn[idx] = torch.arange(idx.numel())
    aux = -0.5 - 2.0 * torch.rand(b, width, m_aux, generator=g, dtype=dtype)
    aux_old = (aux + spread * rnd(b, width, m_aux)).clamp(max=-0.05)
    # top-K heads: K probabilities summing to < 1 for both sampler and trainer
    q_head = torch.softmax(rnd(b, width, k_head + 1), -1)[..., :k_head].log()
    p_head = (q_head + 0.2 * spread * rnd(b, width, k_head)).clamp(max=-0.05)
    p_head = (
        p_head
        - torch.logsumexp(p_head, -1, keepdim=True)
        + torch.log(torch.tensor(0.8, dtype=dtype))
    )
    ref_profile = -2.0 * torch.rand(b, width, generator=g, dtype=dtype)
    ref_plain = -2.0 * torch.rand(b, width, generator=g, dtype=dtype)
    entropy = torch.rand(b, width, generator=g, dtype=dtype)
    weights = aggregation_weights(mask, mode, episode=ep, turn=turn)
    extras = {
        "aux_logprobs": aux.requires_grad_(),
        "aux_old_logprobs": aux_old,
        "topk_logprobs": p_head.detach().requires_grad_(),
        "topk_old_logprobs": q_head,
        "ref_logprobs_profile": ref_profile,
        "ref_logprobs_plain": ref_plain,
    }
    extras["rapo_range"] = rapo_signal_range(ref_profile, ref_plain, mask)
    return LossInputs(
        logprobs=logprobs.requires_grad_(),
        old_logprobs=old,
        advantages=adv,
        mask=mask,
        weights=weights,
        episode=ep,
        turn=turn,
        entropy=entropy,
        step=step,
        extras=extras,
    )


def subset(inputs: LossInputs, rows: torch.Tensor) -> LossInputs:
    """Rows ``rows`` of every per-row tensor (weights keep their whole-batch values).

    The slices stay in the autograd graph of the original leaves, so gradients of a
    micro-batch loss land on the whole-batch leaves.
    """
    b = inputs.mask.shape[0]

    extras = {
        k: (v[rows] if v.dim() >= 2 and v.shape[0] == b else v) for k, v in inputs.extras.items()
    }
    return replace(
        inputs,
        logprobs=inputs.logprobs[rows],
        old_logprobs=inputs.old_logprobs[rows],
        advantages=inputs.advantages[rows],
        mask=inputs.mask[rows],
        weights=inputs.weights[rows],
        episode=inputs.episode[rows],
        turn=inputs.turn[rows],
        entropy=None if inputs.entropy is None else inputs.entropy[rows],
        extras=extras,
    )


def leaves(inputs: LossInputs) -> list[torch.Tensor]:
    """The differentiable leaves of a batch built by :func:`make_inputs`."""
    return [inputs.logprobs, inputs.extras["aux_logprobs"], inputs.extras["topk_logprobs"]]


def grads(loss: torch.Tensor, inputs: LossInputs) -> list[torch.Tensor]:
    """Gradients of ``loss`` w.r.t. every leaf (zeros where it does not depend on one)."""
    out = torch.autograd.grad(loss, leaves(inputs), allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(out, leaves(inputs))]
