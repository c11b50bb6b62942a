"""Token-budgeted micro-batches: how rows are cut, and that the update does not change."""

from __future__ import annotations

import copy

import pytest
import torch

from credo.envs import Task
from credo.envs.shop import ShopEnv
from credo.policy import SamplingParams, TinyModelConfig, create_tiny_policy
from credo.rollout import PlainRenderer, sample_groups
from credo.rollout.render import PLAIN_WORDS
from credo.rollout.sampler import SamplerContext
from credo.train.config import load_config
from credo.train.parts import update_context
from credo.train.update import micro_chunks, policy_update


def _ids(chunks: list[torch.Tensor]) -> list[list[int]]:
    return [c.tolist() for c in chunks]


def test_chunks_respect_rows_tokens_and_episodes() -> None:
    rows = torch.arange(5)
    episode = torch.tensor([0, 0, 1, 1, 2])
    lengths = torch.tensor([3, 5, 2, 2, 6])
    # budget 10 tokens = rows × longest row: [0,1] is 2×5 = 10; adding row 2 would be
    # 3×5 = 15. [2,3] is 2×2 = 4; adding row 4 would be 3×6 = 18. Row 4 alone is 6.
    assert _ids(micro_chunks(episode, rows, 10, lengths, 10)) == [[0, 1], [2, 3], [4]]
    # the row cap still applies, and cuts fall back to episode boundaries: with 3 rows
    # per chunk the cut after row 2 would split episode 1, so it moves back to row 2
    assert _ids(micro_chunks(episode, rows, 3)) == [[0, 1], [2, 3, 4]]
    # an episode longer than the budget is split (nothing else is possible)
    ep0 = torch.tensor([0, 0, 0, 1])
    same = torch.full((4,), 2)
    assert _ids(micro_chunks(ep0, torch.arange(4), 10, same, 4)) == [[0, 1], [2, 3]]
    # a row longer than the budget makes a chunk of its own
    assert _ids(micro_chunks(episode, rows, 10, lengths, 4)) == [[0], [1], [2, 3], [4]]


def test_token_budget_gives_the_same_update() -> None:
    """Micro-batches of at most 120 padded tokens vs one micro-batch: same parameters
    after the step (gradient accumulation with whole-mini-batch weights is exact up to
    float rounding) and the same metrics."""
    small = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    policy = create_tiny_policy([*ShopEnv().vocabulary(), *PLAIN_WORDS], small, seed=0)
    res = sample_groups(
        SamplerContext(
            policy,
            PlainRenderer(policy.tokenizer),
            ShopEnv,
            SamplingParams(max_new_tokens=4),
            3,
            generator=torch.Generator().manual_seed(0),
        ),
        [Task.make("train", i) for i in range(2)],
        group_size=3,
    )
    adv = torch.randn(res.forest.num_rows, generator=torch.Generator().manual_seed(1))
    batch = res.forest.to_batch(adv, pad_id=policy.pad_id)
    assert int(batch.attention_mask.sum(1).max()) * 2 > 120  # the budget does split it
    params, metrics = [], []
    for tokens in (None, 120):
        pol = copy.deepcopy(policy)
        cfg = load_config("grpo", [f"optim.micro_batch_tokens={tokens or 'null'}"])
        # plain SGD over the default four mini-batch steps: Adam would amplify the
        # rounding of near-zero gradient entries to the learning rate's size
        opt = torch.optim.SGD(pol.model.parameters(), lr=1.0)
        m = policy_update(
            update_context(cfg, pol, opt),
            copy.deepcopy(batch),
            iteration=0,
            generator=torch.Generator().manual_seed(0),  # the same mini-batches both times
        )
        params.append([p.detach().clone() for p in pol.model.parameters()])
        metrics.append(m)
    for a, b in zip(*params):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert metrics[0].keys() == metrics[1].keys()
    for k in metrics[0]:
        assert metrics[0][k] == pytest.approx(metrics[1][k], rel=1e-5, abs=1e-5), k
