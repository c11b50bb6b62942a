"""Aggregation weights: the worked example of docs/aggregation.md, invariants, errors."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _objectives_util import make_inputs  # noqa: F401  (single-threaded torch for tiny tensors)
from credo.objectives import AGGREGATIONS, aggregate, aggregation_weights, validate_aggregation

# docs/aggregation.md: episode A = rows of 2, 4, 6 tokens; episode B = one row of 3 tokens;
# padded width L = 6. N = 15 tokens, B' = 4 rows, E' = 2 episodes.
LENGTHS = [2, 4, 6, 3]
MASK = torch.tensor([[j < n for j in range(6)] for n in LENGTHS])
EPISODE = torch.tensor([0, 0, 0, 1])
TURN = torch.tensor([0, 1, 2, 0])

F = Fraction
# weight of one token of rows A1, A2, A3, B1 (the docs' table)
EXPECTED_TOKEN_WEIGHT = {
    "token-mean": [F(1, 15)] * 4,  # 1/N
    "token-sum": [F(1)] * 4,  # 1
    "seq-mean-token-mean": [F(1, 8), F(1, 16), F(1, 24), F(1, 12)],  # 1/(n_b · 4)
    "seq-mean-token-sum": [F(1, 4)] * 4,  # 1/B'
    "seq-mean-token-sum-norm": [F(1, 24)] * 4,  # 1/(B' · L) = 1/(4 · 6)
    "turn-sum-active-turns": [F(1, 4)] * 4,  # 1/(active turns)
    "episode-mean": [F(1, 24), F(1, 24), F(1, 24), F(1, 6)],  # 1/(12 · 2), 1/(3 · 2)
    "episode-mean-token-sum": [F(1, 2)] * 4,  # 1/E'
}
# aggregated loss with ℓ = +1 on A's tokens and −1 on B's: total(A) − total(B)
EXPECTED_LOSS = {
    "token-mean": 0.6,  # 12/15 − 3/15
    "token-sum": 9.0,  # 12 − 3
    "seq-mean-token-mean": 0.5,  # 3/4 − 1/4
    "seq-mean-token-sum": 2.25,  # 12/4 − 3/4
    "seq-mean-token-sum-norm": 0.375,  # 12/24 − 3/24
    "turn-sum-active-turns": 2.25,
    "episode-mean": 0.0,  # 1/2 − 1/2
    "episode-mean-token-sum": 4.5,  # 12/2 − 3/2
}


def test_every_mode_is_in_the_worked_example():
    assert set(EXPECTED_TOKEN_WEIGHT) == set(AGGREGATIONS.names())


@pytest.mark.parametrize("mode", sorted(EXPECTED_TOKEN_WEIGHT))
def test_worked_example_weights(mode):
    w = aggregation_weights(MASK, mode, episode=EPISODE, turn=TURN).double()
    for row, n in enumerate(LENGTHS):
        expect = float(EXPECTED_TOKEN_WEIGHT[mode][row])
        torch.testing.assert_close(w[row, :n], torch.full((n,), expect, dtype=torch.float64))
        assert (w[row, n:] == 0).all()  # padding never weighs
    ell = torch.tensor([1.0, 1.0, 1.0, -1.0])[:, None].expand(4, 6).clone().requires_grad_()
    got = aggregate(ell, MASK, mode, episode=EPISODE, turn=TURN)
    assert got.item() == pytest.approx(EXPECTED_LOSS[mode], abs=1e-6)
    # the gradient of Σ w·ℓ w.r.t. a token's loss is its weight (0 on padding)
    (g,) = torch.autograd.grad(got, ell)
    for row, n in enumerate(LENGTHS):
        expect = float(EXPECTED_TOKEN_WEIGHT[mode][row])
        torch.testing.assert_close(g[row, :n], torch.full((n,), expect))
        assert (g[row, n:] == 0).all()


def test_norm_knob_sets_the_constant():
    # C = 10: 1/(B' · C) = 1/40 per token
    w = aggregation_weights(MASK, "seq-mean-token-sum-norm", episode=EPISODE, turn=TURN, norm=10)
    torch.testing.assert_close(w[MASK], torch.full((15,), 1 / 40))


def test_unknown_mode_and_knob_errors():
    with pytest.raises(KeyError, match="Did you mean 'token-mean'"):
        aggregation_weights(MASK, "token_mean", episode=EPISODE, turn=TURN)
    with pytest.raises(ValueError, match="no parameter"):
        aggregation_weights(MASK, "token-mean", episode=EPISODE, turn=TURN, norm=3)
    with pytest.raises(ValueError, match="norm must be > 0"):
        aggregation_weights(MASK, "seq-mean-token-sum-norm", episode=EPISODE, turn=TURN, norm=0)
    with pytest.raises(ValueError, match="episode must be"):
        aggregation_weights(MASK, "episode-mean", episode=EPISODE[:2], turn=TURN)
    validate_aggregation("seq-mean-token-sum-norm", {"norm": 512})


def test_fully_masked_rows_are_not_active_turns():
    # rows: 2 tokens, 0 tokens, 3 tokens -> B' = 2, each token weighs 1/2
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    ep, turn = torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0])
    for mode in ("turn-sum-active-turns", "seq-mean-token-sum"):
        w = aggregation_weights(mask, mode, episode=ep, turn=turn)
        torch.testing.assert_close(w, mask.float() / 2)


@st.composite
def batches(draw):
    n_eps = draw(st.integers(1, 4))
    rows_per_ep = [draw(st.integers(1, 4)) for _ in range(n_eps)]
    episode = [e for e, r in enumerate(rows_per_ep) for _ in range(r)]
    lengths = [draw(st.integers(0, 5)) for _ in episode]
    if sum(lengths) == 0:
        lengths[0] = 1
    mask = torch.tensor([[j < n for j in range(5)] for n in lengths])
    return mask, torch.tensor(episode), torch.zeros(len(episode), dtype=torch.long)


@settings(max_examples=80, deadline=None)
@given(batches())
def test_episode_mean_weighs_episodes_equally(batch):
    mask, episode, turn = batch
    w = aggregation_weights(mask, "episode-mean", episode=episode, turn=turn).double()
    per_ep = torch.zeros(int(episode.max()) + 1, dtype=torch.float64).index_add_(
        0, episode, w.sum(1)
    )
    active = torch.zeros_like(per_ep).index_add_(0, episode, mask.sum(1).double()) > 0
    # every episode with tokens gets 1/E', whatever its number of rows or tokens
    torch.testing.assert_close(
        per_ep[active], torch.full_like(per_ep[active], 1 / int(active.sum()))
    )
    assert (per_ep[~active] == 0).all()


@settings(max_examples=80, deadline=None)
@given(batches())
def test_mean_modes_sum_to_one_and_masked_weigh_zero(batch):
    mask, episode, turn = batch
    for mode in AGGREGATIONS.names():
        w = aggregation_weights(mask, mode, episode=episode, turn=turn)
        assert (w[~mask] == 0).all()
        assert (w[mask] > 0).all()
        if "mean" in mode and "token-sum" not in mode:
            assert w.sum().item() == pytest.approx(1.0, abs=1e-5)
    # per-row sums of seq-mean-token-mean are 1/B'
    w = aggregation_weights(mask, "seq-mean-token-mean", episode=episode, turn=turn)
    active = mask.any(1)
    torch.testing.assert_close(
        w.sum(1)[active], torch.full((int(active.sum()),), 1 / int(active.sum()))
    )


def test_aggregate_ignores_garbage_in_masked_slots():
    vals = torch.full((4, 6), float("nan"))
    vals[MASK] = 2.0
    got = aggregate(vals, MASK, "token-mean", episode=EPISODE, turn=TURN)
    assert got.item() == pytest.approx(2.0)
