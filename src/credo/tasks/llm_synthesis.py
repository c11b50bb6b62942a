"""RODS's synthesiser for user envs: a chat model writes the variant, the oracle verifies it.

The rule synthesiser (:mod:`credo.tasks.synthesis`) instantiates variants through an env's
seeded generator. A user's env rarely has one, but it can usually say what defines a task
and rebuild a task from that: with ``tasks.params.synthesiser: llm`` a chat model plays
the paper's Executor on that description. The env offers two things:

* ``task_spec()``: after ``reset(task)``, the facts that define the current task as a
  JSON-able dict (``examples/custom_env.py``: ``{"secret": 6}``);
* ``reset(task)`` honours ``task.data["spec"]``: it builds the task those facts describe,
  and raises ``ValueError`` when they describe none.

The four roles (Fang et al. 2026, https://arxiv.org/abs/2606.19047, Section 3):

* **Planner**: the parent's spec, its ``task_structure()`` where the env has one, and the
  skeleton of its oracle solution (:meth:`~credo.tasks.synthesis.RuleSynthesiser.plan`).
* **Executor** (:meth:`LLMSynthesiser.execute`): the chat model is shown the parent's spec
  and asked for a new one with the same keys and kinds of values and new values
  (:data:`PROMPT`); the first JSON object of its reply is read with :func:`json.loads`
  only (model output is never evaluated); a reply without one, with other keys or other
  value types, or that the env's ``reset`` refuses, is discarded; at most ``tries``
  replies, then ``no_match``. The variant is a fresh variant-range seed with
  ``data["spec"]``.
* **Rewrite**: the env's ``reword(task, rng)`` if it has one.
* **Critique**: the env's oracle runs the variant (unsolvable, off the plan's skeleton,
  trivial or duplicate variants are rejected), as for the rules.

The chat model is any causal LM credo can load (``tasks.params.llm``: an alias such as
``smollm2-135m``, an HF folder or name), or a model behind an OpenAI-compatible server
(``llm`` an ``http(s)://`` base URL; ``llm_model`` its model name, default: the first the
server lists). A local model samples each reply with a seed drawn from the round's
generator, so a resumed run proposes the same variants; a served model samples as its
server does (the request's ``seed`` is passed, and not every server honours it).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from credo.envs.base import HELDOUT_SEED_OFFSET, VARIANT_SEED_OFFSET, Task
from credo.tasks.synthesis import Plan, RuleSynthesiser

__all__ = ["PROMPT", "Chat", "LLMSynthesiser", "first_json_object", "make_chat", "same_shape"]

#: What the executor asks the chat model (``{spec}``: the parent's spec as JSON).
PROMPT = (
    "Here is a task for an agent, as JSON:\n{spec}\n"
    "Write one new task as JSON with exactly the same keys and the same kinds of values, "
    "but different values. Reply with the JSON only."
)

#: ``chat(prompt, seed) -> reply text``: one sampled reply of a chat model.
Chat = Callable[[str, int], str]


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (``json`` only; ``None`` if there is none)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            start = text.find("{", start + 1)
            continue
        return obj if isinstance(obj, dict) else None
    return None


def same_shape(new: Any, old: Any) -> bool:
    """``new`` has ``old``'s keys (recursively) and the same JSON kinds of values (an
    integer is not a float, a bool not an integer; lists of any length)."""
    if isinstance(old, dict):
        return (
            isinstance(new, dict)
            and new.keys() == old.keys()
            and all(same_shape(new[k], old[k]) for k in old)
        )
    if isinstance(old, list):
        return isinstance(new, list) and all(
            any(same_shape(x, y) for y in old) if old else True for x in new
        )
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(new, bool) and isinstance(old, bool)
    if isinstance(old, int):
        return type(new) is int
    if isinstance(old, float):
        return isinstance(new, (int, float))
    return type(new) is type(old)


class LLMSynthesiser(RuleSynthesiser):
    """The rule synthesiser's planner, rewrite and critique, with a chat model as the
    executor (module docstring).

    Args:
        make_env: creates a fresh env with ``oracle_action()`` and ``task_spec()``.
        chat: the chat model (:func:`make_chat`).
        tries: replies asked for one proposal at most (default 8).
        min_steps: the critique's trivial bound (default 2).
        max_turns: the oracle's turn cap (default: the env's ``max_turns``, else 100).
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        chat: Chat,
        *,
        tries: int = 8,
        min_steps: int = 2,
        max_turns: int | None = None,
    ) -> None:
        super().__init__(make_env, max_turns=max_turns, tries=tries, min_steps=min_steps)
        if not callable(getattr(self.env, "task_spec", None)):
            raise ValueError(
                f"{type(self.env).__name__} has no task_spec(): the llm synthesiser shows the "
                "chat model the facts that define a task and rebuilds the task from its "
                "reply (reset honours task.data['spec']); add it, or use "
                "tasks.params.synthesiser=rules"
            )
        self.chat = chat
        self.specs: dict[str, dict[str, Any]] = {}  # the planner's spec of each parent

    def plan(self, task: Task) -> Plan:
        """The rules' plan, and the parent's spec kept for the executor."""
        plan = super().plan(task)
        self.env.reset(task, 0)
        self.specs[plan.parent] = dict(self.env.task_spec())
        return plan

    def forget(self, parent: str) -> None:
        """Drop a retired parent's spec."""
        self.specs.pop(parent, None)

    def execute(self, plan: Plan, rng: random.Random) -> Task | None:
        """A variant whose spec the chat model wrote and the env accepted, or ``None``."""
        spec = self.specs[plan.parent]
        prompt = PROMPT.format(spec=json.dumps(spec))
        for _ in range(self.tries):
            reply = self.chat(prompt, rng.randrange(2**31))
            new = first_json_object(reply)
            if new is None or new == spec or not same_shape(new, spec):
                continue
            task = Task("train", rng.randrange(VARIANT_SEED_OFFSET, HELDOUT_SEED_OFFSET),
                        {"spec": new})  # fmt: skip
            try:
                self.env.reset(task, 0)
            except ValueError:
                continue  # the env says these facts make no task
            return task
        return None


def make_chat(llm: str, *, model: str | None = None, max_new_tokens: int = 256) -> Chat:
    """A :data:`Chat` for ``llm``: an ``http(s)://`` base URL of an OpenAI-compatible
    server (``model``: its model name; default the first it lists), else a model credo
    loads (an alias, an HF folder or name), sampled at temperature 1 with the given seed."""
    if llm.startswith(("http://", "https://")):
        from openai import OpenAI

        client = OpenAI(base_url=llm, api_key="unused", timeout=120.0)
        name = model or client.models.list().data[0].id

        def served(prompt: str, seed: int) -> str:
            reply = client.chat.completions.create(
                model=name,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=max_new_tokens,
                temperature=1.0,
                seed=seed,
            )
            return reply.choices[0].message.content or ""

        return served
    import torch

    from credo.policy import HFPolicy
    from credo.policy.base import SamplingParams
    from credo.policy.models import resolve_model
    from credo.policy.tokenizer import user_message_ids

    policy = HFPolicy.from_pretrained(resolve_model(llm), device="cpu")

    def local(prompt: str, seed: int) -> str:
        gen = policy.generate(
            [user_message_ids(policy.tokenizer, prompt)],
            SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens),
            generator=torch.Generator().manual_seed(seed),
        )
        return gen[0].text if gen else ""

    return local
