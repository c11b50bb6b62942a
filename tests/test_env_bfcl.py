"""``bfcl``: BFCL's multi-turn base tasks on bfcl-eval's real backends and checker: the
safe call parser (nothing evaluated), the ground truth wins every task, a wrong or missing
call fails the request BFCL's checker fails, splits, snapshots and ``check-env``."""

from __future__ import annotations

import importlib.util

import pytest

from credo.envs import Task, make_env
from credo.envs.bfcl import MAX_INT, BfclEnv, _entries, parse_calls
from credo.envs.thirdparty import MissingPackage
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.envcheck import check_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bfcl_eval") is None,
    reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval==2026.3.23)",
)


def test_the_parser_reads_literal_calls_and_evaluates_nothing() -> None:
    assert parse_calls("[cd(folder='document'), mkdir(dir_name='temp')]") == [
        ("cd", [], {"folder": "document"}),
        ("mkdir", [], {"dir_name": "temp"}),
    ]
    assert parse_calls("sort('final_report.pdf')") == [("sort", ["final_report.pdf"], {})]
    assert parse_calls("```python\n[ls(a=True)]\n```") == [("ls", [], {"a": True})]
    assert parse_calls("I moved the file.") is None  # an answer in words
    assert parse_calls("") is None and parse_calls("[]") is None
    # not a plain call: a reply in words, never run
    assert parse_calls("__import__('os').system('echo hacked')") is None
    assert parse_calls("[cd(folder=open('/etc/passwd').read())]") == [
        ("cd", [], {"__invalid__": True})
    ]
    assert parse_calls(f"[power(base=2, exponent={MAX_INT * 10})]") == [
        ("power", [], {"__invalid__": True})
    ]
    assert parse_calls("[f(**{'a': 1})]") == [("f", [], {"__invalid__": True})]
    # JSON's spelling, and what the word-level tokenizer writes back
    assert parse_calls("[ ls ( a = true ) ]") == [("ls", [], {"a": True})]


def _play(env: BfclEnv, replies: list[str]):
    res = None
    for reply in replies:
        res = env.step(reply)
        if res.done:
            break
    return res


def test_the_ground_truth_wins_and_a_wrong_state_fails() -> None:
    env = make_env("bfcl")
    first = env.reset(Task.make("test", 0))  # multi_turn_base_0: four requests
    assert env.entry["id"] == "multi_turn_base_0" and "final_report.pdf" in first
    res = env.step(env.oracle_action())  # cd, mkdir, mv
    assert not res.done and res.info["calls"] == 3 and res.info["valid"]
    assert res.observation.splitlines()[0].startswith("cd : ")
    res = env.step(env.oracle_action())  # "done": the second request is shown
    assert (
        env.oracle_action().startswith("[cd(folder='temp')")
        and "budget analysis" in res.observation
    )
    while not res.done:
        res = env.step(env.oracle_action())
    assert res.info["success"] and res.reward == 1.0 and res.info["turns_passed"] == 4

    env.reset(Task.make("test", 0))  # the temp folder made in the wrong place
    res = _play(env, ["[mkdir(dir_name='temp')]", "done"])
    assert res.done and not res.info["success"] and res.info["turns_passed"] == 0
    assert res.info["failure"] == "multi_turn:instance_state_mismatch"

    env.reset(Task.make("test", 0))  # answering in words only: nothing was done
    res = env.step("Sure, done!")
    assert res.done and not res.info["success"] and res.reward == 0.0

    turns = make_env("bfcl", reward="turns")
    turns.reset(Task.make("test", 0))
    res = _play(turns, [turns.oracle_action(), "done", "done"])  # request 2 not done
    assert res.done and res.reward == pytest.approx(1 / 4)


def test_calls_that_fail_are_error_results_not_crashes() -> None:
    env = make_env("bfcl")
    env.reset(Task.make("test", 0))
    res = env.step("[rm_everything(), cd(folder='nowhere'), cd(folder=1+1)]")
    lines = res.observation.splitlines()
    assert lines[0] == "rm_everything : Error during execution: no function named 'rm_everything'"
    assert "nowhere" in lines[1] and "literal values" in lines[2]
    assert not res.info["valid"] and not res.done


def test_steps_per_request_are_bounded() -> None:
    env = make_env("bfcl", max_steps=2)
    env.reset(Task.make("test", 0))
    assert not env.step("[ls()]").done and env.request == 0
    res = env.step("[ls()]")  # the second call step ends the request (and fails it)
    assert res.done and not res.info["success"] and res.info["request"] == 0


def test_every_task_is_won_by_its_ground_truth_and_the_splits_are_disjoint() -> None:
    train, test = _entries()
    assert len(train) == 160 and len(test) == 40
    assert not {e["id"] for e in train} & {e["id"] for e in test}
    env = make_env("bfcl")
    wins = 0
    for split, n in (("train", 160), ("test", 40)):
        for i in range(n):
            env.reset(Task.make(split, i))
            while True:
                res = env.step(env.oracle_action())
                if res.done:
                    break
            wins += res.info["success"]
    assert wins == 200


def test_snapshots_and_check_env() -> None:
    env = make_env("bfcl", functions="compact")
    env.reset(Task.make("train", 7))
    env.step(env.oracle_action())
    snap, key = env.snapshot(), env.state_key()
    after = env.step("[mkdir(dir_name='x')]") if "mkdir" in env.model.methods else None
    env.restore(snap)
    assert env.state_key() == key
    if after is not None:
        assert env.step("[mkdir(dir_name='x')]").observation == after.observation
    assert len(env.instruction()) < 6000  # compact: one line per function
    report = check_env(
        lambda: make_env("bfcl"), tasks=3, tokenizer=build_word_tokenizer(env.vocabulary())
    )
    assert report.ok, (report.problems, report.errors)


def test_refusals_are_one_line(monkeypatch) -> None:
    for kwargs, match in (
        ({"max_steps": 0}, "max_steps must be a positive integer"),
        ({"reward": "points"}, "'success' or 'turns'"),
        ({"functions": "yaml"}, "'json' or 'compact'"),
    ):
        with pytest.raises(ValueError, match=match):
            make_env("bfcl", **kwargs)
    import credo.envs.bfcl as bfcl

    monkeypatch.setattr(bfcl.importlib.util, "find_spec", lambda name: None)
    bfcl._entries.cache_clear()
    try:
        with pytest.raises(MissingPackage, match="pip install --no-deps bfcl-eval") as err:
            BfclEnv()
        assert "\n" not in str(err.value)
    finally:
        monkeypatch.undo()
        bfcl._entries.cache_clear()


def test_the_vocabulary_splits_words_as_the_word_level_tokenizer() -> None:
    """The env keeps its own copy of the tokenizer's split (envs do not import policy)."""
    from credo.envs.bfcl import split_words
    from credo.policy.tokenizer import split_words as tokenizer_split

    for text in (
        "[cd(folder='document'), mkdir(dir_name='temp')]",
        "Move 'final_report.pdf' to $HOME; then: grep [a,b].  Ünïcode\ttabs\nlines",
        '{"name": "cat", "parameters": {"type": "dict"}}',
    ):
        assert split_words(text) == tokenizer_split(text)
