"""The HF policy backend and the built-in model."""

from __future__ import annotations

import pytest
import torch

from credo.envs.shop import ShopEnv, parse_action
from credo.policy import HFPolicy, SamplingParams, TinyModelConfig, create_tiny_policy
from credo.policy.tiny import NUMBER_FREQUENCIES
from credo.rollout.render import PLAIN_WORDS, PlainRenderer, Turn

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _policy(seed: int = 0) -> HFPolicy:
    return create_tiny_policy([*ShopEnv().vocabulary(), *PLAIN_WORDS], SMALL, seed=seed)


def test_word_tokenizer_round_trips_actions() -> None:
    tok = _policy().tokenizer
    for action in ("search[red wool scarf]", "click[2]", "choose[xl]", "buy", "back"):
        ids = tok.encode(action, add_special_tokens=False)
        assert tok.unk_token_id not in ids
        assert parse_action(tok.decode(ids)) == parse_action(action)
    assert tok.decode(tok.encode("buy a red hat for at most $40", add_special_tokens=False)) == (
        "buy a red hat for at most $ 40"
    )


def test_number_tokens_get_a_value_code() -> None:
    pol = _policy()
    emb = pol.model.get_input_embeddings().weight
    vocab = pol.tokenizer.get_vocab()
    w = 2 * len(NUMBER_FREQUENCIES)
    # cos(π·0.5·v/100) decreases with v: the code orders the numbers
    assert emb[vocab["35"], 0] > emb[vocab["40"], 0] > emb[vocab["95"], 0]
    assert torch.allclose(emb[vocab["40"], :w].norm(), torch.tensor(len(NUMBER_FREQUENCIES) ** 0.5))
    # the high frequencies tell small numbers (result ranks) apart: every pair of codes of
    # 1..5 is at least one unit apart (with frequencies up to 4 only, the closest pair was 0.14 apart)
    codes = torch.stack([emb[vocab[str(k)], :w] for k in range(1, 6)])
    gaps = torch.cdist(codes, codes) + torch.eye(5) * 9
    assert gaps.min() > 1.0


def test_save_and_reload_give_the_same_model(tmp_path) -> None:
    pol = _policy()
    pol.save(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").exists()
    again = HFPolicy.from_pretrained(tmp_path / "m")
    ids = torch.tensor([[4, 5, 6, 7]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    assert torch.allclose(pol.logprobs(ids, mask), again.logprobs(ids, mask), atol=1e-6)
    assert again.stop_ids == [pol.tokenizer.eos_token_id]


def test_sampler_logprobs_match_scoring_under_padding() -> None:
    """Left-padded KV-cache sampling and right-padded scoring agree token by token."""
    pol = _policy(1)
    r = PlainRenderer(pol.tokenizer)
    prompts = [
        r.prompt_ids(
            "buy a red wool scarf in size m for at most $40", [], "home : search for products"
        ),
        r.prompt_ids("buy a hat", [Turn("x", "search[hat]")], "results : 1 red wool hat $5"),
    ]
    gen = torch.Generator().manual_seed(0)
    outs = pol.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=6), gen)
    for p, o in zip(prompts, outs):
        ids = torch.tensor([p + o.token_ids])
        lp = pol.score(ids, torch.ones_like(ids, dtype=torch.bool), temperature=0.7).logprobs
        assert torch.allclose(lp[0, len(p) :], o.logprobs, atol=1e-4)


def test_greedy_generation_does_not_depend_on_the_batch() -> None:
    pol = _policy(2)
    prompts = [[4, 5, 6], [7, 8, 9, 10, 11, 12], [13]]
    both = pol.generate(prompts, SamplingParams(temperature=0, max_new_tokens=5))
    for p, b in zip(prompts, both):
        alone = pol.generate([p], SamplingParams(temperature=0, max_new_tokens=5))[0]
        assert alone.token_ids == b.token_ids


def test_generation_stops_at_the_end_of_an_action() -> None:
    pol = _policy(3)
    eos = pol.tokenizer.eos_token_id
    calls = {"n": 0}

    def boost_eos_on_third_token(module, inputs, output):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:  # the prompt pass, then 2 one-token steps: eos is the 3rd token
            output = output.clone()
            output[..., eos] += 100.0
        return output

    handle = pol.model.lm_head.register_forward_hook(boost_eos_on_third_token)
    out = pol.generate([[4, 5]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    handle.remove()
    assert out.finished and len(out.token_ids) == 3 and out.token_ids[-1] == eos
    assert eos not in pol.tokenizer.encode(out.text, add_special_tokens=False)
    capped = pol.generate([[4, 5]], SamplingParams(temperature=0, max_new_tokens=2))[0]
    assert (len(capped.token_ids) == 2 and not capped.finished) or capped.token_ids[-1] == eos


def test_top_p_and_aux_samples() -> None:
    pol = _policy(4)
    gen = torch.Generator().manual_seed(0)
    greedy = pol.generate([[4, 5, 6]], SamplingParams(temperature=0, max_new_tokens=3))[0]
    nucleus = pol.generate([[4, 5, 6]], SamplingParams(top_p=1e-6, max_new_tokens=3), gen)[0]
    assert nucleus.token_ids == greedy.token_ids  # a vanishing nucleus keeps only the top token
    aux = pol.generate([[4, 5]], SamplingParams(max_new_tokens=3, aux_samples=5), gen)[0]
    assert aux.aux_ids is not None and aux.aux_ids.shape == (len(aux.token_ids), 5)


def test_score_gathers_extra_ids_and_entropy() -> None:
    pol = _policy(5)
    ids = torch.tensor([[4, 5, 6, 7]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    extra = torch.tensor([[[4, 5], [6, 7], [8, 9], [10, 11]]])
    out = pol.score(ids, mask, entropy=True, extra_ids=extra)
    logits = pol.model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    assert torch.allclose(out.extra_logprobs[0, 2], logp[1, [8, 9]], atol=1e-6)
    assert torch.allclose(out.entropy[0, 3], -(logp[2].exp() * logp[2]).sum(), atol=1e-5)


def test_topk_logprobs_are_the_samplers_head_and_leave_sampling_unchanged() -> None:
    pol = _policy(6)
    sp = SamplingParams(temperature=0.7, max_new_tokens=4)
    plain = pol.generate([[4, 5, 6]], sp, torch.Generator().manual_seed(3))[0]
    sp_top = SamplingParams(temperature=0.7, max_new_tokens=4, topk_logprobs=3)
    top = pol.generate([[4, 5, 6]], sp_top, torch.Generator().manual_seed(3))[0]
    assert top.token_ids == plain.token_ids  # storing the head draws no random numbers
    assert top.topk_ids is not None and top.topk_logprobs is not None
    assert top.topk_ids.shape == top.topk_logprobs.shape == (len(top.token_ids), 3)
    # the head at each position is the top 3 of the temperature-scaled distribution
    seq = [4, 5, 6, *top.token_ids]
    logits = pol.model(input_ids=torch.tensor([seq])).logits[0].float()
    logp = torch.log_softmax(logits / 0.7, -1)
    for k in range(len(top.token_ids)):
        want_lp, want_ids = logp[2 + k].topk(3)
        assert torch.equal(top.topk_ids[k], want_ids)
        assert torch.allclose(top.topk_logprobs[k], want_lp, atol=1e-5)
    assert bool((top.topk_logprobs[:, :1] >= top.topk_logprobs[:, 1:]).all())


@pytest.mark.slow
def test_saving_on_a_cpu_does_not_print_deepspeeds_accelerator_guess(tmp_path) -> None:
    """accelerate imports DeepSpeed (the ``deepspeed`` extra) inside ``save_pretrained``;
    on a machine without a GPU DeepSpeed then warned, on every run's first save, that it
    was "unable to detect" an accelerator. credo drops that one line."""
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    pytest.importorskip("accelerate")  # save_pretrained imports DeepSpeed only through it
    code = (
        "from credo.policy import create_tiny_policy\n"
        "from credo.policy.tiny import TinyModelConfig\n"
        "cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)\n"
        f"create_tiny_policy(['a', 'b'], cfg).save({str(tmp_path / 'p')!r})\n"
        "import sys; print('deepspeed' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "True"  # DeepSpeed was imported
    assert "unable to detect" not in out.stdout + out.stderr
