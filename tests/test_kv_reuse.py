"""Multi-turn KV reuse on the built-in model: the session store, the batched prefill of
rows with cached prefixes of different lengths, and the group sampler's sessions.

Reuse must never change what is sampled: every test compares against the same calls
without sessions (greedy and seeded sampling give the same tokens, log-probs agree within
1e-5), and a prompt that does not extend its session's tokens must fall back to the very
same full prefill (bit-identical).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.envs import Task
from credo.envs.shop import ShopEnv
from credo.policy import HFPolicy, SamplingParams, SessionPolicy, create_tiny_policy
from credo.policy.kvcache import (
    KVEntry,
    KVSessions,
    cache_layers,
    row_entry,
    shared_prefix,
    stack_caches,
)
from credo.policy.tiny import TinyModelConfig
from credo.rollout import PlainRenderer, sample_groups
from credo.rollout.render import PLAIN_WORDS
from credo.rollout.sampler import SamplerContext

WORDS = [f"w{i}" for i in range(60)]
SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)
GREEDY = SamplingParams(temperature=0, max_new_tokens=6)


def _policy(seed: int = 0) -> HFPolicy:
    return create_tiny_policy(WORDS, SMALL, seed=seed)


def _entry(n: int, first: int = 0) -> KVEntry:
    """An entry of ``n`` tokens, 1 layer, 2 heads, head dim 4, float32: 64·n bytes."""
    k = torch.arange(2 * n * 4, dtype=torch.float32).reshape(2, n, 4)
    return KVEntry(list(range(first, first + n)), [(k, -k)])


# ------------------------------------------------------------------ pure parts
def test_shared_prefix_examples() -> None:
    assert shared_prefix([1, 2, 3, 4], [1, 2, 5]) == 2
    assert shared_prefix([1, 2], [1, 2, 3]) == 2
    assert shared_prefix([], [1]) == 0
    assert shared_prefix([7], [8]) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=12), st.lists(st.integers(0, 5), max_size=12))
def test_shared_prefix_is_the_longest_common_prefix(a: list[int], b: list[int]) -> None:
    c = shared_prefix(a, b)
    assert a[:c] == b[:c]
    assert c == min(len(a), len(b)) or a[c] != b[c]
    assert shared_prefix(a, a + b) == len(a)


def test_store_reuses_only_long_enough_prefixes_and_never_the_whole_prompt() -> None:
    store = KVSessions(budget_bytes=10_000, min_prefix=3)
    store.put("s", _entry(6))  # ids 0..5
    assert store.nbytes == 64 * 6 and "s" in store
    c, entry = store.take("s", [0, 1, 2, 3, 9, 9])
    assert c == 4 and entry is not None and "s" not in store and store.nbytes == 0
    store.put("s", _entry(6))
    assert store.take("s", [0, 1, 2, 3, 4, 5])[0] == 5  # the last prompt token is fed
    store.put("s", _entry(6))
    assert store.take("s", [0, 1, 9, 9]) == (0, None)  # 2 < min_prefix: full prefill
    assert store.take("unknown", [0, 1, 2, 3]) == (0, None)
    assert store.stats.lookups == 4 and store.stats.hits == 2
    assert store.stats.reused_tokens == 9


def test_store_evicts_least_recently_used_within_its_budget() -> None:
    store = KVSessions(budget_bytes=500, min_prefix=1)
    store.put("a", _entry(4))  # 256 bytes
    store.put("b", _entry(3))  # 192 → 448
    store.put("c", _entry(2))  # 128 → 576 > 500: "a" goes
    assert "a" not in store and len(store) == 2 and store.nbytes == 320
    store.put("b", _entry(3))  # refreshed: "c" is now the oldest
    store.put("d", _entry(3))  # 512 > 500: "c" goes
    assert sorted(k for k in ("a", "b", "c", "d") if k in store) == ["b", "d"]
    assert store.nbytes == 384 and store.stats.evictions == 2
    store.put("e", _entry(8))  # 512 bytes alone exceed the budget: not kept
    assert "e" not in store and store.stats.evictions == 3
    store.end(["b", "zzz"])
    assert len(store) == 1 and store.nbytes == 192
    store.clear()
    assert len(store) == 0 and store.nbytes == 0


def test_stack_caches_right_aligns_prefixes_and_row_entry_reads_them_back() -> None:
    a, b = _entry(5), _entry(3, first=10)
    layers, mask = stack_caches([(4, a), (0, None), (2, b)], a.layers)
    keys, values = layers[0]
    assert keys.shape == (3, 2, 4, 4) and mask.tolist() == [
        [1, 1, 1, 1],
        [0, 0, 0, 0],
        [0, 0, 1, 1],
    ]
    assert torch.equal(keys[0], a.layers[0][0][:, :4])
    assert torch.equal(keys[2, :, 2:], b.layers[0][0][:, :2])
    assert torch.equal(values[2, :, 2:], -b.layers[0][0][:, :2])
    assert not keys[1].any() and not keys[2, :, :2].any()
    back = row_entry([(keys[2], values[2])], mask[2], [10, 11])
    assert back.ids == [10, 11] and torch.equal(back.layers[0][0], b.layers[0][0][:, :2])


# ----------------------------------------------------------- the policy's path
def _conversation(
    policy: HFPolicy,
    starts: list[list[int]],
    turns: int,
    sampling: SamplingParams,
    *,
    reuse: bool,
    rewrite: bool = False,
    seed: int = 0,
    lengths: list[list[int]] | None = None,
) -> list[list[tuple[list[int], torch.Tensor]]]:
    """``turns`` generations per row; turn t+1's prompt is turn t's prompt + response +
    a few observation tokens (append-only), or that with its first token replaced by the
    turn index (``rewrite``: an earlier part of the conversation changes every turn).
    ``lengths`` receives each turn's prompt lengths."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [list(p) for p in starts]
    keys = [f"row{i}" for i in range(len(starts))]
    out = []
    for t in range(turns):
        if lengths is not None:
            lengths.append([len(p) for p in prompts])
        gens = policy.generate(prompts, sampling, gen, sessions=keys if reuse else None)
        out.append([(g.token_ids, g.logprobs) for g in gens])
        for i, g in enumerate(gens):
            obs = [3 + (7 * i + t + j) % 50 for j in range(2 + (i + t) % 4)]
            prompts[i] = prompts[i] + g.token_ids + obs
            if rewrite:
                prompts[i][0] = 53 + t  # never a first token of STARTS
    return out


def _assert_same(a: list, b: list, *, exact: bool = False) -> None:  # type: ignore[type-arg]
    for turn_a, turn_b in zip(a, b, strict=True):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(turn_a, turn_b, strict=True):
            assert ids_a == ids_b
            if exact:
                assert torch.equal(lp_a, lp_b)
            else:
                torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=0)


STARTS = [
    [3 + (5 * j) % 50 for j in range(20)],
    [3 + (3 * j + 1) % 50 for j in range(27)],
    [3 + (11 * j + 2) % 50 for j in range(17)],
]


def test_append_only_conversation_reuses_and_matches_a_full_prefill() -> None:
    policy = _policy()
    assert isinstance(policy, SessionPolicy) and policy.kv_reuse
    plain = _conversation(policy, STARTS, 4, GREEDY, reuse=False)
    before = policy.kv_stats.prefill_tokens
    lengths: list[list[int]] = []
    reused = _conversation(policy, STARTS, 4, GREEDY, reuse=True, lengths=lengths)
    _assert_same(plain, reused)
    s = policy.kv_stats
    assert s.hits == 3 * 3  # every row, every turn after the first
    # a session holds its prompt and the response tokens the model read: all but the
    # last sampled one (the batch's longest response decides how many were fed)
    expected = 0
    for t in range(1, 4):
        fed = max(len(ids) for ids, _ in plain[t - 1]) - 1
        expected += sum(n + min(len(ids), fed) for n, (ids, _) in zip(lengths[t - 1], plain[t - 1]))
    assert s.reused_tokens == expected
    assert s.prefill_tokens - before == sum(map(sum, lengths)) - expected
    assert policy.kv_sessions is not None and len(policy.kv_sessions) == 3
    policy.end_sessions(["row0", "row1", "row2"])
    assert len(policy.kv_sessions) == 0 and policy.kv_sessions.nbytes == 0


def test_seeded_sampling_draws_the_same_tokens_with_reuse() -> None:
    policy = _policy(seed=1)
    sp = SamplingParams(temperature=1.0, max_new_tokens=5, topk_logprobs=3)
    plain = _conversation(policy, STARTS, 3, sp, reuse=False, seed=7)
    reused = _conversation(policy, STARTS, 3, sp, reuse=True, seed=7)
    _assert_same(plain, reused)
    assert policy.kv_stats.hits == 6


def test_a_rewritten_conversation_falls_back_to_the_same_full_prefill() -> None:
    policy = _policy()
    plain = _conversation(policy, STARTS, 3, GREEDY, reuse=False, rewrite=True)
    reused = _conversation(policy, STARTS, 3, GREEDY, reuse=True, rewrite=True)
    _assert_same(plain, reused, exact=True)  # no reuse at all: bit-identical
    assert policy.kv_stats.lookups == 9 and policy.kv_stats.hits == 0


def test_mixed_batch_of_hits_misses_and_new_sessions() -> None:
    policy = _policy()
    long = [3 + (5 * j) % 50 for j in range(30)]
    other = [3 + (3 * j) % 50 for j in range(22)]
    first = policy.generate([long, other], GREEDY, sessions=["a", "b"])
    nxt = [
        long + first[0].token_ids + [4, 5],  # extends: hit
        [9, *other[1:], *first[1].token_ids, 6],  # rewrites its first token: miss
        [7, 8, 9, 10, 11],  # a new session
    ]
    with_reuse = policy.generate(nxt, GREEDY, sessions=["a", "b", "c"])
    assert policy.kv_stats.hits == 1
    assert policy.kv_stats.reused_tokens == len(long) + len(first[0].token_ids) - 1
    alone = [policy.generate([p], GREEDY)[0] for p in nxt]
    for g, a in zip(with_reuse, alone):
        assert g.token_ids == a.token_ids
        torch.testing.assert_close(g.logprobs, a.logprobs, atol=1e-5, rtol=0)


def test_budget_evictions_fall_back_and_stay_exact() -> None:
    policy = _policy()
    # 1 KiB per token (2 layers × keys and values × 64 × 4 bytes); sessions of 22 to 45
    # tokens: one or two fit, the others are evicted and fall back to a full prefill
    policy.configure_kv_reuse(budget_mb=0.06)
    plain = _conversation(policy, STARTS, 3, GREEDY, reuse=False)
    reused = _conversation(policy, STARTS, 3, GREEDY, reuse=True)
    _assert_same(plain, reused)
    s = policy.kv_stats
    assert s.evictions > 0 and 0 < s.hits < 6
    assert policy.kv_sessions is not None and policy.kv_sessions.nbytes <= 0.06 * 2**20
    policy.configure_kv_reuse(enabled=False)
    assert not policy.kv_reuse
    again = _conversation(policy, STARTS, 3, GREEDY, reuse=True)
    _assert_same(plain, again, exact=True)


def test_changed_weights_drop_the_cached_sessions() -> None:
    policy = _policy()
    prompt = STARTS[0]
    first = policy.generate([prompt], GREEDY, sessions=["s"])[0]
    with torch.no_grad():
        policy.model.get_input_embeddings().weight.mul_(1.5)  # as an optimizer step would
    nxt = prompt + first.token_ids + [4, 5, 6]
    after = policy.generate([nxt], GREEDY, sessions=["s"])[0]
    assert policy.kv_stats.hits == 0  # stale keys/values were not reused
    fresh = policy.generate([nxt], GREEDY)[0]
    assert after.token_ids == fresh.token_ids and torch.equal(after.logprobs, fresh.logprobs)


def test_a_sliding_window_model_switches_reuse_off() -> None:
    from transformers import MistralConfig, MistralForCausalLM

    tiny = _policy()
    config = MistralConfig(
        vocab_size=len(tiny.tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        sliding_window=8,
        pad_token_id=tiny.pad_id,
        eos_token_id=tiny.tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    policy = HFPolicy(MistralForCausalLM(config), tiny.tokenizer)
    plain = _conversation(policy, STARTS, 2, GREEDY, reuse=False)
    reused = _conversation(policy, STARTS, 2, GREEDY, reuse=True)
    _assert_same(plain, reused, exact=True)
    assert not policy.kv_reuse and "sliding" in (policy.kv_off_reason or "")
    assert policy.kv_stats.hits == 0


def test_cache_layers_reads_a_plain_dynamic_cache() -> None:
    from transformers import DynamicCache

    k = torch.zeros(1, 2, 3, 4)
    assert cache_layers(DynamicCache([(k, k)])) is not None
    assert cache_layers(object()) is None


# --------------------------------------------------------- the group sampler
def _shop_run(history_turns: int, reuse: bool) -> tuple[list, HFPolicy]:  # type: ignore[type-arg]
    words = sorted({*ShopEnv().vocabulary(), *PLAIN_WORDS})
    policy = create_tiny_policy(words, SMALL, seed=0)
    policy.configure_kv_reuse(reuse)
    ctx = SamplerContext(
        policy=policy,
        renderer=PlainRenderer(policy.tokenizer, history_turns),
        make_env=ShopEnv,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
        max_turns=4,
        generator=torch.Generator().manual_seed(0),
    )
    res = sample_groups(ctx, [Task.make("train", i) for i in range(2)], group_size=2)
    steps = [(s.prompt_ids, s.response_ids, s.logprobs) for e in res.episodes for s in e.steps]
    return steps, policy


def test_group_sampler_frees_sessions_and_the_plain_window_falls_back() -> None:
    off, _ = _shop_run(2, reuse=False)
    on, policy = _shop_run(2, reuse=True)
    assert policy.kv_stats.lookups > 0
    # the plain format starts with the sliding window of past actions: nothing to reuse,
    # so the built-in default run samples exactly as without sessions
    assert policy.kv_stats.hits == 0
    assert off == on
    assert policy.kv_sessions is not None and len(policy.kv_sessions) == 0


def test_group_sampler_with_a_growing_plain_history_matches() -> None:
    off, _ = _shop_run(10, reuse=False)
    on, policy = _shop_run(10, reuse=True)
    assert len(off) == len(on) and len(policy.kv_sessions or []) == 0
    assert policy.kv_stats.hits > 0  # the window did not slide: past actions stay in front
    for (p_a, r_a, lp_a), (p_b, r_b, lp_b) in zip(off, on):
        assert p_a == p_b and r_a == r_b
        torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5, rtol=0)
