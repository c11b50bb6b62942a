"""The chat format: conversation structure, few-shot examples, and the action parser
(tolerant of surrounding text, strict on the grammar, failures shown back as the env's
invalid-action message). The exact text with SmolLM2's template is in test_smollm2.py."""

from __future__ import annotations

import pytest

from credo.envs import Task
from credo.envs.shop import ShopEnv
from credo.rollout.render import ChatRenderer, Turn, make_renderer, oracle_examples, strip_think


class _Tok:
    """Enough of a tokenizer for ``ChatRenderer.messages`` (no template rendering)."""

    chat_template = "{{ messages }}"


def _renderer(**kw) -> ChatRenderer:  # type: ignore[no-untyped-def]
    return ChatRenderer(_Tok(), kw.pop("history_turns", 2), ShopEnv().action_format(), **kw)


def _shop() -> ShopEnv:
    env = ShopEnv()
    env.reset(Task.make("test", 0), 0)
    return env


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        # well-formed
        ("search[red wool scarf]", "search[red wool scarf]"),
        ("click[2]", "click[2]"),
        ("choose[m]", "choose[m]"),
        ("buy", "buy"),
        ("back", "back"),
        # surrounding text, think blocks
        ("Sure! search[red wool scarf] is my action.", "search[red wool scarf]"),
        ("I will click[3] now, then buy.", "click[3]"),
        ("Action: buy", "buy"),
        ("The item fits.\nbuy", "buy"),
        ("<think>maybe click[1]?</think>\nclick[2]", "click[2]"),
        ("<THINK>hmm</THINK> back", "back"),
    ],
)
def test_actions_are_found_in_replies(reply: str, action: str) -> None:
    assert _renderer().extract_action(reply, _shop()) == action


@pytest.mark.parametrize(
    "reply",
    [
        "click(2)",  # wrong brackets
        "I want to buy it",  # 'buy' inside a sentence is not an action
        "search red wool scarf",  # no brackets
        "<think>I should search[red wool scarf]",  # cut off mid-thought: no action
        "",
    ],
)
def test_malformed_replies_become_the_envs_invalid_action_message(reply: str) -> None:
    env = _shop()
    action = _renderer().extract_action(reply, env)
    res = env.step(action)
    assert res.info["valid"] is False
    # what the model reads in its next user message
    assert res.observation.startswith(
        "invalid action : use search[...] , click[...] , choose[...] , back or buy ."
    )


def test_strict_grammar_inside_brackets() -> None:
    env = _shop()
    env.step("search[red wool scarf]")
    action = _renderer().extract_action("ok: click[two]", env)
    assert action == "click[two]"  # found, but the env's grammar rejects it
    res = env.step(action)
    assert not res.info["valid"] and res.observation.startswith("invalid action : no such result")


def test_strip_think() -> None:
    assert strip_think("<think>a</think>b<think>c</think> d") == "b d"
    assert strip_think("x <think>unfinished") == "x"


def test_conversation_has_system_window_and_current_observation() -> None:
    r = _renderer(history_turns=1, max_action_chars=10)
    history = [Turn("o1", "search[a]"), Turn("o2", "a very long rambling reply")]
    msgs = r.messages("buy a hat", history, "o3")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"] == (
        "You are an agent in a text environment.\n" + ShopEnv().action_format()
    )
    # only the last turn is in the window; its long reply is cut at 10 characters
    assert msgs[1]["content"] == "Goal: buy a hat\nObservation: o2"
    assert msgs[2]["content"] == "a very lon ..."
    assert msgs[3]["content"] == "Goal: buy a hat\nObservation: o3"
    assert [m["role"] for m in _renderer(history_turns=0).messages("g", history, "o")] == [
        "system",
        "user",
    ]


def test_few_shot_examples_come_from_the_oracle_on_training_tasks() -> None:
    examples = oracle_examples(ShopEnv, 1)
    env = ShopEnv()
    env.reset(Task.make("train", 0), 0)
    instruction, turns = examples[0]
    assert instruction == env.instruction()
    assert turns[0] == Turn("home : search for products", env.oracle_action())
    assert turns[-1].action == "buy"
    r = _renderer(
        examples=examples, system_template="{action_format}", user_template="{observation}"
    )
    msgs = r.messages("buy a hat", [], "home : search for products")
    # system, the demonstration's (user, assistant) pairs, then the episode
    assert len(msgs) == 1 + 2 * len(turns) + 1
    assert msgs[2] == {"role": "assistant", "content": turns[0].action}


def test_bad_templates_and_plain_fallback() -> None:
    with pytest.raises(ValueError, match=r"may use \{action_format\}, \{instruction\}"):
        _renderer(system_template="Goal: {goal}")
    with pytest.raises(ValueError, match="chat_template"):
        ChatRenderer(object())
    from credo.policy import build_word_tokenizer
    from credo.rollout.render import PlainRenderer

    tok = build_word_tokenizer(ShopEnv().vocabulary())
    assert isinstance(
        make_renderer(tok, builtin=True, history_turns=2, env=ShopEnv()), PlainRenderer
    )


def test_few_shot_examples_skip_tasks_where_the_env_raises() -> None:
    from examples.custom_env import GuessEnv

    from credo.rollout.render import oracle_examples

    class SometimesBroken(GuessEnv):
        def reset(self, task, seed=0):  # type: ignore[no-untyped-def]
            if task.seed % 2 == 0:
                raise RuntimeError(f"no game for task {task.seed}")
            return super().reset(task, seed)

    class AlwaysBroken(GuessEnv):
        def reset(self, task, seed=0):  # type: ignore[no-untyped-def]
            raise RuntimeError("the game server went away")

    healthy = oracle_examples(GuessEnv, 3)
    assert len(healthy) == 3  # tasks train/0, 1, 2 as before
    some = oracle_examples(SometimesBroken, 3)
    assert len(some) == 3  # odd tasks 1, 3, 5 instead
    assert [t for t, _ in some] == [t for t, _ in oracle_examples(GuessEnv, 6)[1::2]]
    with pytest.raises(ValueError, match=r"^RuntimeError: the game server went away"):
        oracle_examples(AlwaysBroken, 2)
