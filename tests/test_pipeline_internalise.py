"""SpatialCLI's internalisation rewrite on fixed trajectories (hand-written texts and
tokens), and the shop's optional ``lookup`` tool it removes."""

from __future__ import annotations

import pytest

from credo.data import Episode, Step
from credo.envs.base import Task
from credo.envs.shop import ShopEnv
from credo.pipeline.internalise import (
    InternaliseParams,
    remove_tool_calls,
    sft_rows,
    state_tool_results,
    tool_answer,
)
from credo.policy import create_tiny_policy
from credo.policy.tiny import TinyModelConfig
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.render import PLAIN_WORDS, PlainRenderer, Turn

GOAL = "buy red hat"
HOME = "home : search for products"
RESULTS = "results : 1 red hat $5 ; 2 red hat $9"
ITEM = "item : red hat $9"


def _step(obs: str, action: str, reward: float = 0.0, terminal: bool = False) -> Step:
    return Step(
        observation=obs,
        action=action,
        reward=reward,
        terminal=terminal,
        prompt_ids=[7, 7],
        response_ids=[8],
        logprobs=[-0.5],
        texts={"instruction": GOAL},
    )


def _toks(text: str) -> list[str]:
    """The words of ``text`` (the tokens the word tokenizer should give)."""
    return text.split()


def _is_tool(action: str) -> bool:
    return action == "lookup"


def _trajectory() -> Episode:
    """search → lookup (answer shown on the next page, a −0.1 tool cost) → click → buy."""
    return Episode(
        group=0,
        task_id="t/0",
        success=True,
        steps=[
            _step(HOME, "search[red hat]"),
            _step(RESULTS, "lookup", reward=-0.1),
            _step("lookup : result 2 fits . " + RESULTS, "click[2]"),
            _step(ITEM, "buy", reward=1.0, terminal=True),
        ],
    )


def test_rewrite_drops_the_call_and_its_answer() -> None:
    ep = _trajectory()
    out = remove_tool_calls(ep, _is_tool)
    assert [(s.observation, s.action) for s in out.steps] == [
        (HOME, "search[red hat]"),
        (RESULTS, "click[2]"),  # the page the call was made on, without its answer
        (ITEM, "buy"),
    ]
    assert [s.reward for s in out.steps] == [0.0, -0.1, 1.0]  # the cost moves on
    assert out.ret == pytest.approx(ep.ret) == pytest.approx(0.9)
    assert [s.terminal for s in out.steps] == [False, False, True]
    assert all(s.prompt_ids == [] and s.response_ids == [] and s.logprobs == [] for s in out.steps)
    assert out.success and out.task_id == "t/0"
    assert len(ep.steps) == 4 and ep.steps[2].observation.startswith("lookup")  # untouched


def test_rewrite_of_repeated_and_trailing_calls() -> None:
    ep = Episode(
        group=0,
        steps=[
            _step("a", "x"),
            _step("b", "lookup", reward=-0.1),
            _step("c", "lookup", reward=-0.2),
            _step("d", "y"),
            _step("e", "lookup", reward=0.5, terminal=True),
        ],
    )
    out = remove_tool_calls(ep, _is_tool)
    # y is shown the first call's page (b) and takes both costs (−0.3), then the trailing
    # call's reward (+0.5) and the terminal flag
    assert [(s.observation, s.action, s.reward, s.terminal) for s in out.steps] == [
        ("a", "x", 0.0, False),
        ("b", "y", pytest.approx(0.2), True),
    ]
    no_tools = Episode(group=0, steps=[_step("a", "x"), _step("b", "y")])
    assert [
        (s.observation, s.action, s.reward) for s in remove_tool_calls(no_tools, _is_tool).steps
    ] == [
        ("a", "x", 0.0),
        ("b", "y", 0.0),
    ]


def test_rows_are_rendered_anew_without_the_call() -> None:
    words = _toks(
        "history : none page home search for products goal buy red hat action results 1 2 5 9 "
        "$ ; item click [ ] lookup result fits ."
    )
    tok = build_word_tokenizer(words)
    rows = sft_rows(remove_tool_calls(_trajectory(), _is_tool), PlainRenderer(tok, 2))
    prompts = [tok.convert_ids_to_tokens(p) for p, _ in rows]
    responses = [tok.convert_ids_to_tokens(r) for _, r in rows]
    assert prompts[1] == _toks(
        "history : search [ red hat ] page : results : 1 red hat $ 5 ; 2 red hat $ 9 "
        "goal : buy red hat action :"
    )
    # the history window holds search and click, not the lookup
    assert prompts[2] == _toks(
        "history : search [ red hat ] ; click [ 2 ] page : item : red hat $ 9 "
        "goal : buy red hat action :"
    )
    assert prompts[0] == _toks(
        "history : none page : home : search for products goal : buy red hat action :"
    )
    assert responses == [
        ["search", "[", "red", "hat", "]", "<eos>"],
        ["click", "[", "2", "]", "<eos>"],
        ["buy", "<eos>"],
    ]
    # ids: specials 0-3, then the sorted words: ':' is 4+sorted(words).index(':')
    vocab = {w: i + 4 for i, w in enumerate(sorted(set(words)))}
    assert rows[2][1] == [vocab["buy"], tok.eos_token_id] and tok.eos_token_id == 3


def _oracle_episode(env: ShopEnv, task: Task) -> Episode:
    obs, steps = env.reset(task), []
    while True:
        action = env.oracle_action()
        res = env.step(action)
        steps.append(Step(observation=obs, action=action, reward=res.reward, terminal=res.done))
        obs = res.observation
        if res.done:
            return Episode(group=0, steps=steps, success=bool(res.info["success"]))


@pytest.mark.parametrize("difficulty", ["easy", "default"])
def test_rewritten_oracle_with_the_tool_is_the_oracle_without_it(difficulty: str) -> None:
    on, off = ShopEnv(difficulty, tools=True), ShopEnv(difficulty, tools=False)
    for i in range(20):
        task = Task.make("train", i)
        with_tool = _oracle_episode(on, task)
        assert with_tool.success and sum(s.action == "lookup" for s in with_tool.steps) >= 1
        out = remove_tool_calls(with_tool, on.is_optional_tool)
        plain = _oracle_episode(off, task)
        assert [(s.observation, s.action, s.reward) for s in out.steps] == [
            (s.observation, s.action, s.reward) for s in plain.steps
        ]


@pytest.mark.parametrize("difficulty", ["easy", "default"])
def test_stated_oracle_states_each_answer_and_acts_as_without_the_tool(difficulty: str) -> None:
    """``state``: the oracle's tool-using episode becomes the tool-free oracle's episode,
    and each step after a lookup states the lookup's answer, which names the result that
    step clicks."""
    on, off = ShopEnv(difficulty, tools=True), ShopEnv(difficulty, tools=False)
    for i in range(20):
        task = Task.make("train", i)
        with_tool = _oracle_episode(on, task)
        out = state_tool_results(with_tool, on.is_optional_tool)
        plain = _oracle_episode(off, task)
        assert [(s.observation, s.action, s.reward) for s in out.steps] == [
            (s.observation, s.action, s.reward) for s in plain.steps
        ]
        noted = [s for s in out.steps if "note" in s.texts]
        assert len(noted) == sum(s.action == "lookup" for s in with_tool.steps) >= 1
        for s in noted:  # "lookup : result k fits ." and then click[k]
            k = s.texts["note"].split()[3]
            assert s.texts["note"] == f"lookup : result {k} fits ." and s.action == f"click[{k}]"


def test_the_shop_tool() -> None:
    task = Task.make("train", 0)
    off, on = ShopEnv(), ShopEnv(tools="on")
    for env in (off, on):
        env.reset(task)
        env.step(env.oracle_action())  # search → results
    r = off.step("lookup")  # absent when off: the usual invalid action, a turn spent
    assert not r.info["valid"] and r.observation.startswith(
        "invalid action : use search[...] , click[...] , choose[...] , back or buy ."
    )
    page = on.observation()
    assert on.oracle_action() == "lookup" and on.is_optional_tool("lookup")
    assert not on.is_optional_tool("search[x]")
    r = on.step("lookup")
    assert r.info["valid"] and r.observation == f"lookup : result 3 fits . {page}"
    assert on.state_key().endswith("|lookup") and on.oracle_action() == "click[3]"
    assert on.step("click[3]").observation.startswith("item : brown wool dress $30")
    assert on._s.turn == 3  # the lookup cost a turn
    assert "lookup" in on.vocabulary() and "lookup" not in off.vocabulary()
    assert set(on.vocabulary()) - set(off.vocabulary()) == {"lookup", "fits"}
    on.reset(task)
    r = on.step("lookup")
    assert not r.info["valid"] and "lookup only on results" in r.observation
    with pytest.raises(ValueError, match="shop tools must be on or off"):
        ShopEnv(tools="maybe")


PAGE = "results : 1 red hat $70 ; 2 red hat $35"
ANSWER = "lookup : result 2 fits ."


def _shop_shape() -> Episode:
    """search -> lookup -> click[2] -> buy (success), the shop's shape."""
    steps = [
        Step("start", "search[red hat]", reward=0.0),
        Step(PAGE, "lookup", reward=-0.1),
        Step(f"{ANSWER} {PAGE}", "click[2]", reward=0.0),
        Step("item : red hat $35", "buy", reward=1.0, terminal=True),
    ]
    for s in steps:
        s.texts["instruction"] = "buy a red hat under $40"
    return Episode(group=0, steps=steps, task_id="train/1", success=True)


def _lookup(action: str) -> bool:
    return action == "lookup"


def test_tool_answer_is_what_the_call_added() -> None:
    assert tool_answer(PAGE, f"{ANSWER} {PAGE}") == ANSWER
    assert tool_answer(PAGE, "a new page") == "a new page"  # the page changed: all of it
    assert tool_answer("", "x y") == "x y"


def test_state_moves_the_answer_into_the_agents_next_turn() -> None:
    ep = _shop_shape()
    out = state_tool_results(ep, _lookup)
    assert [s.action for s in out.steps] == ["search[red hat]", "click[2]", "buy"]
    # click[2] is taken on the page without the answer, and states the answer itself
    assert out.steps[1].observation == PAGE
    assert out.steps[1].texts == {"instruction": "buy a red hat under $40", "note": ANSWER}
    assert "note" not in out.steps[0].texts and "note" not in out.steps[2].texts
    assert [s.reward for s in out.steps] == [0.0, -0.1, 1.0]  # the call's reward moves on
    assert sum(s.reward for s in out.steps) == pytest.approx(ep.ret)
    assert [s.action for s in ep.steps][1] == "lookup" and "note" not in ep.steps[2].texts
    # remove: the same steps, no note
    gone = remove_tool_calls(ep, _lookup)
    assert [s.observation for s in gone.steps] == [s.observation for s in out.steps]
    assert all("note" not in s.texts for s in gone.steps)


def test_two_calls_in_a_row_and_a_trailing_call() -> None:
    steps = [
        Step("p0", "lookup"),
        Step("a1 p0", "lookup"),
        Step("a2 a1 p0", "act"),
        Step("p3", "lookup"),  # at the end: no next observation, no answer to state
    ]
    out = state_tool_results(Episode(0, steps, success=True), _lookup)
    assert [s.action for s in out.steps] == ["act"]
    assert out.steps[0].observation == "p0" and out.steps[0].texts["note"] == "a1 a2"


def test_plain_rows_state_the_note_and_extraction_reads_the_action_back() -> None:
    words = "search [ ] red hat click buy lookup result fits . results 1 2 $70 $35 item start"
    small = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    policy = create_tiny_policy([*words.split(), *PLAIN_WORDS], small, seed=0)
    tok = policy.tokenizer
    renderer = PlainRenderer(tok, notes=True)
    rows = sft_rows(state_tool_results(_shop_shape(), _lookup), renderer)
    assert len(rows) == 3
    prompt, response = rows[1]
    history = [Turn("start", "search[red hat]")]
    assert prompt == renderer.prompt_ids("buy a red hat under $40", history, PAGE)
    assert response == renderer.response_ids(f"{ANSWER} action : click[2]")
    text = tok.decode(response[:-1])
    action = tok.decode(renderer.response_ids("click[2]")[:-1])  # as the sampler reads it
    assert renderer.extract_action(text, None) == action
    assert PlainRenderer(tok).extract_action(text, None) == text.strip()  # notes off
    assert renderer.extract_action("buy", None) == "buy"  # no note
    # a row without a note is the action alone
    assert rows[2][1] == renderer.response_ids("buy")


def test_bad_rewrite_is_one_line() -> None:
    with pytest.raises(ValueError, match="rewrite must be one of state, remove"):
        InternaliseParams(rewrite="paraphrase")
