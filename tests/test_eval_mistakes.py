"""``credo eval --mistakes``: every action of an evaluation labelled by the env's label
rule, and how the failed episodes began to fail (hand-worked tallies)."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.cli import main
from credo.critics.labeller import LabelledStep, label_episodes
from credo.critics.mistakes import (
    advantage_by_mistake,
    has_label_rule,
    label_forest,
    label_mistakes,
    mistake_summary,
)
from credo.envs.base import Task
from credo.envs.shop import ShopEnv
from credo.eval.evaluate import evaluate
from credo.policy import SamplingParams, build_word_tokenizer
from credo.rollout import PlainRenderer
from credo.rollout.render import PLAIN_WORDS
from credo.train.config import load_config
from credo.train.run import build_run
from test_eval_text_truth import FixedAction


def _step(episode: int, error: str, success: bool) -> LabelledStep:
    return LabelledStep(f"test/{episode}", episode, 0, "", "a", error, "", "", success)


def test_summary_by_hand() -> None:
    steps = [
        _step(0, "ok", False),
        _step(0, "wrong_query", False),
        _step(0, "wrong_item", False),
        _step(1, "ok", True),
        _step(1, "ok", True),
        _step(2, "ok", False),
        _step(2, "ok", False),
    ]
    got = mistake_summary(steps)
    # 7 actions: 5 ok, one wrong query, one wrong item
    assert got["actions"] == pytest.approx({"ok": 5 / 7, "wrong_query": 1 / 7, "wrong_item": 1 / 7})
    # two failed episodes: episode 0 began with the wrong query (not the wrong item that
    # followed from it), episode 2 made no labelled mistake
    assert got["failed"] == 2
    assert got["first_mistake"] == {"wrong_query": 1, "none": 1}
    # the two failed episodes themselves, each action with its label; the success is not
    assert got["failures"] == [
        {"task_id": "test/0", "actions": [["a", "ok"], ["a", "wrong_query"], ["a", "wrong_item"]]},
        {"task_id": "test/2", "actions": [["a", "ok"], ["a", "ok"]]},
    ]
    assert mistake_summary([]) == {"actions": {}, "failed": 0, "first_mistake": {}, "failures": []}


def test_advantage_by_mistake_by_hand() -> None:
    # advantages 3, 1, -1, 1, -4: mean 0, population variance 28/5, sigma = sqrt(5.6)
    sigma = 5.6**0.5
    got = advantage_by_mistake(
        [3.0, 1.0, -1.0, 1.0, -4.0],
        ["ok", "wrong_item", "wrong_item", "ok", "unnecessary_backtrack"],
        ["click", "click", "click", "search", "back"],
    )
    assert set(got) == {
        ("click", "ok"),
        ("click", "wrong_item"),
        ("search", "ok"),
        ("back", "unnecessary_backtrack"),
    }
    ok_click, wrong = got[("click", "ok")], got[("click", "wrong_item")]
    assert ok_click["n"] == 1 and ok_click["mean"] == pytest.approx(3 / sigma)
    assert ok_click["negative"] == 0.0 and math.isnan(ok_click["gap"])  # ok has no gap
    # the two wrong clicks average 0 (one of them below 0); the right click sits 3 / sigma above
    assert wrong["n"] == 2 and wrong["mean"] == pytest.approx(0.0)
    assert wrong["negative"] == 0.5 and wrong["gap"] == pytest.approx(3 / sigma)
    assert got[("search", "ok")]["mean"] == pytest.approx(1 / sigma)
    back = got[("back", "unnecessary_backtrack")]  # no right 'back' to compare with
    assert back["mean"] == pytest.approx(-4 / sigma) and back["negative"] == 1.0
    assert math.isnan(back["gap"])
    # equal advantages: sigma 0 is read as 1, and nothing separates the two
    flat = advantage_by_mistake([0.5, 0.5], ["ok", "wrong_item"], ["click", "click"])
    assert flat[("click", "wrong_item")]["gap"] == 0.0
    assert flat[("click", "wrong_item")]["mean"] == 0.5
    with pytest.raises(ValueError, match="differ in length: 2, 1, 2"):
        advantage_by_mistake([1.0, 2.0], ["ok"], ["click", "click"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-12, 12).map(lambda i: i / 4),  # sigma 0 or at least ~0.1
            st.sampled_from(["ok", "wrong_item", "wrong_query"]),
            st.sampled_from(["click", "search"]),
        ),
        min_size=2,
        max_size=30,
    ),
    st.floats(0.1, 10.0),
    st.floats(-5.0, 5.0),
)
def test_the_gap_does_not_depend_on_the_advantages_scale_or_offset(
    cells: list[tuple[float, str, str]], scale: float, offset: float
) -> None:
    """gap(v, c) reads advantages in units of their sigma: A -> scale * A + offset (scale
    > 0), as between estimators of different normalisation, leaves every gap as it was."""
    adv, errors, verbs = (list(x) for x in zip(*cells, strict=True))
    base = advantage_by_mistake(adv, errors, verbs)
    moved = advantage_by_mistake([scale * a + offset for a in adv], errors, verbs)
    assert base.keys() == moved.keys()
    for key, cell in base.items():  # equal advantages stay equal: their gaps stay 0
        if math.isnan(cell["gap"]):
            assert math.isnan(moved[key]["gap"])
        else:
            assert moved[key]["gap"] == pytest.approx(cell["gap"], abs=1e-6)


def test_label_forest_names_the_row_of_every_labelled_action() -> None:
    """A shop rollout of an untrained built-in policy: every action is labelled once, on
    the forest row that holds it, with the label that labelling the episodes gives."""
    cfg = load_config(
        "grpo",
        [
            "env.name=shop",
            "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
            "sft.enabled=false",
            "rollout.group_size=3",
            "rollout.max_turns=4",
            "train.threads=1",
        ],
    )
    run = build_run(cfg)
    tasks = [Task.make("train", i) for i in range(3)]
    res = run.rollouts(run.policy, tasks, generator=torch.Generator().manual_seed(0))
    rows, steps = label_forest("shop", run.make_env, res)
    assert sorted(rows) == list(range(res.forest.num_rows))  # a linear sampler: once each
    for row, step in zip(rows, steps, strict=True):
        assert res.forest.actions[row] == step.action
        assert int(res.forest.t[row]) == step.t
    direct = label_episodes("shop", run.make_env, res.episodes)
    assert [s.error for s in steps] == [s.error for s in direct]
    short = dataclasses.replace(res, episodes=res.episodes[1:])
    with pytest.raises(ValueError, match="do not follow its forest's paths"):
        label_forest("shop", run.make_env, short)


def test_an_evaluation_labels_every_action_of_its_episodes() -> None:
    # searching for words no goal has, three times: the first search is a wrong query,
    # the next two are searches on the results page (invalid)
    def make() -> ShopEnv:
        return ShopEnv("easy")

    tok = build_word_tokenizer([*make().vocabulary(), *PLAIN_WORDS])
    ev = evaluate(FixedAction(tok, "search[zzz]"), PlainRenderer(tok), make, episodes=12,
                  sampling=SamplingParams(), max_turns=3,
                  summarize=partial(label_mistakes, "shop", make))  # fmt: skip
    assert ev.success_rate == 0.0 and ev.mean_turns == 3.0
    assert ev.mistakes["actions"] == pytest.approx({"invalid_action": 2 / 3, "wrong_query": 1 / 3})
    assert ev.mistakes["failed"] == 12
    assert ev.mistakes["first_mistake"] == {"wrong_query": 12}
    ids = [f["task_id"] for f in ev.mistakes["failures"]]  # every held-out task, once
    assert len(set(ids)) == 12 and all(i.startswith("test/") for i in ids)
    assert ev.mistakes["failures"][0]["actions"] == [
        ["search[zzz]", "wrong_query"],
        ["search[zzz]", "invalid_action"],
        ["search[zzz]", "invalid_action"],
    ]
    # not asked for: nothing labelled
    plain = evaluate(FixedAction(tok, "search[zzz]"), PlainRenderer(tok), make, episodes=2,
                     sampling=SamplingParams(), max_turns=3)  # fmt: skip
    assert plain.mistakes == {}


def test_an_env_without_a_label_rule_is_refused_in_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert has_label_rule("shop") and not has_label_rule("recall")
    assert main(["eval", "--model", "smollm2-135m", "--env", "recall", "--mistakes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "env 'recall' has none (envs with one: shop, tools)" in err


def test_failures_prints_the_first_n_failed_episodes_with_their_labels() -> None:
    """``credo eval --failures N``: one line per failed episode, its task first, a label
    after each action that is not ``ok`` (brackets printed as they are, not as markup)."""
    from types import SimpleNamespace

    from rich.console import Console

    from credo.cli import _print_failures

    steps = [
        LabelledStep("test/3", 0, 0, "", "click[2]", "ok", "", "", False),
        LabelledStep("test/3", 0, 1, "", "choose[xl]", "invalid_action", "", "", False),
        LabelledStep("test/3", 0, 2, "", "back", "ok", "", "", False),
        LabelledStep("test/4", 1, 0, "", "buy", "ok", "", "", True),
        LabelledStep("test/5", 2, 0, "", "search[red]", "wrong_query", "", "", False),
    ]
    ev = SimpleNamespace(mistakes=mistake_summary(steps))  # what _print_failures reads
    console = Console(record=True, width=200)
    _print_failures(console, ev, 1)
    lines = console.export_text().splitlines()
    assert lines == [
        "the first 1 failed episodes (actions; [label] after a mistake):",
        "test/3: click[2] | choose[xl] [invalid_action] | back",
    ]
    console = Console(record=True, width=200)
    _print_failures(console, ev, 5)  # more than there are: both failures, not the success
    assert console.export_text().splitlines()[1:] == [
        "test/3: click[2] | choose[xl] [invalid_action] | back",
        "test/5: search[red] [wrong_query]",
    ]
    console = Console(record=True, width=200)
    _print_failures(console, ev, 0)
    assert console.export_text() == ""


def test_a_negative_failures_count_is_refused_in_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["eval", "--model", "smollm2-135m", "--failures", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--failures must be 0 or more (got -1)" in err
