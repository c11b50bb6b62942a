"""The token batch that policy losses consume."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

__all__ = ["TokenBatch"]


@dataclass
class TokenBatch:
    """Right-padded prompt+response sequences, one per forest row.

    Shapes: ``B`` rows, ``L`` the longest prompt+response. Log-probs are aligned with the
    tokens they score: ``old_logprobs[b, j]`` is log q(input_ids[b, j] | input_ids[b, :j]).

    Attributes:
        input_ids: ``[B, L]`` int64 prompt then response, then padding.
        attention_mask: ``[B, L]`` bool, real tokens.
        response_mask: ``[B, L]`` bool, response tokens (the ones the loss scores).
        old_logprobs: ``[B, L]`` float32 sampler log-probs (0 outside the response).
        advantages: ``[B, L]`` float32 the row's advantage on each response token.
        row: ``[B]`` forest row of each sequence.
        episode: ``[B]`` episode each row is attributed to (``RolloutForest.row_episode``).
        turn: ``[B]`` turn index ``t``.
        group: ``[B]`` group id.
        pg_mask: ``[B]`` bool, rows that may receive policy-gradient loss (not oracle).
        token_extras: per-token tensors ``[B, L, ...]`` at the response positions (zero
            elsewhere), e.g. KLPO's ``aux_ids`` and ``aux_old_logprobs``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    row: torch.Tensor
    episode: torch.Tensor
    turn: torch.Tensor
    group: torch.Tensor
    pg_mask: torch.Tensor
    token_extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def index(self, idx: torch.Tensor | slice) -> TokenBatch:
        """Rows ``idx`` of every field (for mini- and micro-batches)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        extras = {k: v[idx] for k, v in out.pop("token_extras").items()}
        return TokenBatch(**{k: v[idx] for k, v in out.items()}, token_extras=extras)

    def trim(self) -> TokenBatch:
        """Drop trailing all-padding columns (after selecting a subset of rows)."""
        width = int(self.attention_mask.sum(1).max().item()) if len(self) else 0
        out = {}
        for f in fields(self):
            if f.name == "token_extras":
                continue
            v = getattr(self, f.name)
            out[f.name] = v[:, :width] if v.dim() == 2 else v
        extras = {k: v[:, :width] for k, v in self.token_extras.items()}
        return TokenBatch(**out, token_extras=extras)

    @property
    def loss_mask(self) -> torch.Tensor:
        """``[B, L]`` bool: response tokens of rows that get policy-gradient loss."""
        return self.response_mask & self.pg_mask[:, None]
