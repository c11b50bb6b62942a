"""The ``textworld`` adapter on real TextWorld games generated offline with ``tw-make``
(:mod:`tw_games`: one training and one held-out ``tw-simple`` game per session):
admissible commands, intermediate rewards, state keys, snapshots, ``check-env``, the
generator's cache, and a short SERO training run."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from credo.envs import Task, make_env
from credo.envs.textworld_env import TextWorldEnv, clean_text, normalize
from credo.envs.textworld_games import DEFAULT_SETTINGS, game_file, tw_make_command
from credo.envs.thirdparty import MissingPackage
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.envcheck import check_env
from tw_games import TW_OPTIONS

pytestmark = (
    pytest.mark.slow
)  # the slow tier: TextWorld: games generated with tw-make, training on them


def _env(cache: Path, **kw) -> TextWorldEnv:
    return make_env("textworld", cache_dir=str(cache), **{**TW_OPTIONS, **kw})


def test_walkthrough_wins_with_intermediate_rewards(tw_cache: Path) -> None:
    env = _env(tw_cache)
    for task in (Task.make("train", 0), Task.make("test", 0)):
        obs = env.reset(task)
        assert obs.startswith("-= ") and "\ncommands : " in obs and "$$" not in obs
        assert env.instruction() and env.progress() == 0.0
        rewards, keys = [], {env.state_key()}
        while True:
            res = env.step(env.oracle_action())
            assert res.info["valid"]
            rewards.append(res.reward)
            keys.add(env.state_key())
            if res.done:
                break
        # tw-simple with dense rewards: several score changes that add up to 1
        assert res.info["success"] and sum(rewards) == pytest.approx(1.0)
        assert sum(r > 0 for r in rewards) >= 3 and env.progress() == 1.0
        assert len(keys) == len(rewards) + 1  # every command changed the world's facts


def test_train_and_held_out_tasks_play_different_games(tw_cache: Path) -> None:
    env = _env(tw_cache)
    train = env.reset(Task.make("train", 0)), env.instruction()
    assert env.reset(Task.make("train", 5)) == train[0]  # one training game: seeds cycle
    held_out = env.reset(Task.make("test", 0)), env.instruction()
    assert held_out != train and env.files["train"] != env.files["test"]


def test_commands_are_the_admissible_ones(tw_cache: Path) -> None:
    env = _env(tw_cache)
    env.reset(Task.make("train", 0))
    key = env.state_key()
    res = env.step("dance wildly")
    assert res.info == {"valid": False, "score": 0.0} and res.reward == 0.0
    assert res.observation.startswith("invalid action : not a command here .")
    assert env.state_key() == key
    again = env.step("dance")  # the invalid note does not pile up
    assert again.observation.count("invalid action") == 1
    first = env.oracle_action()
    spaced = "  " + first.upper().replace(" ", "   ") + " . "  # case, spaces, a final dot
    assert env.step(spaced).info["valid"] and env.state_key() != key
    assert env.step("x" * 500).info["valid"] is False  # too long to be a command
    assert normalize(' "Go  East." ') == "go east"
    assert clean_text("\n\nYou open it.\n\n\n>  -= Room =-0/1") == "You open it."


def test_turn_limit_and_reward_options(tw_cache: Path) -> None:
    env = _env(tw_cache, max_turns=3, reward="success", show_commands=False)
    obs = env.reset(Task.make("train", 0))
    assert "commands :" not in obs
    results = [env.step(env.oracle_action()) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["success"] is False and all(r.reward == 0.0 for r in results)
    with pytest.raises(ValueError, match="'score' or 'success'"):
        _env(tw_cache, reward="points")
    with pytest.raises(ValueError, match="positive integer"):
        _env(tw_cache, games=0)


def test_snapshot_restore_replays_the_commands(tw_cache: Path) -> None:
    env = _env(tw_cache)
    env.reset(Task.make("train", 0))
    env.step(env.oracle_action())
    snap = env.snapshot()
    key = env.state_key()
    first = [env.step(env.oracle_action()).observation for _ in range(3)]
    fresh = _env(tw_cache)
    fresh.reset(Task.make("test", 0))  # another game: restore goes back to the task's
    fresh.restore(snap)
    assert fresh.state_key() == key
    assert [fresh.step(fresh.oracle_action()).observation for _ in range(3)] == first


def test_the_plausible_actor_and_the_oracle_after_a_detour(tw_cache: Path) -> None:
    env = _env(tw_cache)
    env.reset(Task.make("train", 0))
    rng = random.Random(0)
    for _ in range(4):
        action = env.sample_action(rng)
        assert action in env._admissible()
        if env.step(action).done:
            return
    while True:  # the oracle replans from wherever the detour left it
        res = env.step(env.oracle_action())
        if res.done:
            break
    assert res.info["success"]


def test_check_env_passes(tw_cache: Path) -> None:
    env = _env(tw_cache)
    tokenizer = build_word_tokenizer(env.vocabulary())
    report = check_env(lambda: _env(tw_cache), tasks=2, tokenizer=tokenizer)
    assert report.ok and len(report.passed) == 3, (report.problems, report.errors)


def test_generated_games_are_cached(tw_cache: Path) -> None:
    path = game_file("tw-simple", 0, cache_dir=tw_cache)  # found, not generated again
    assert path.exists() and path.with_suffix(".json").exists()
    assert not list(tw_cache.glob(".tmp-*"))  # no half-written folders left
    cmd = tw_make_command("tw-coin_collector", {"level": 3, "test": True}, 7, Path("g.z8"))
    assert cmd[1:] == ["tw-coin_collector", "--level", "3", "--test", "--seed", "7",
                       "--output", "g.z8", "--silent", "-f"]  # fmt: skip
    assert DEFAULT_SETTINGS["tw-simple"] == {"rewards": "dense", "goal": "detailed"}
    with pytest.raises(ValueError, match="plain word"):
        tw_make_command("tw-simple", {"goal": "x; rm -rf"}, 0, Path("g.z8"))
    with pytest.raises(ValueError, match="failed"):
        game_file("tw-simple", 1, {"rewards": "nope"}, cache_dir=tw_cache, timeout=60)


def test_a_missing_package_is_one_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "textworld", None)
    with pytest.raises(MissingPackage, match=r"pip install 'credo\[textworld\]'") as err:
        TextWorldEnv()
    assert "\n" not in str(err.value)


def test_sero_trains_on_textworld(tw_cache: Path, tmp_path: Path) -> None:
    """Two SERO iterations (GRPO plus oracle continuations) of the built-in model on the
    training game: every iteration restores the game at states the policy reached
    (snapshots replayed, none dropped as divergent), continues with TextWorld's own
    walkthrough, and the oracle loss gives a non-zero gradient. (A warm start this
    short solves nothing yet: GRPO alone would have all-zero advantages here.)"""
    from credo.train.config import load_config
    from credo.train.loop import train
    from small_run import SMALL

    cfg = load_config(
        "sero",
        [
            *[o for o in SMALL if not o.startswith("env.name=")],
            "env.name=textworld",
            f"env.kwargs={{games: 1, heldout_games: 1, cache_dir: '{tw_cache}', max_turns: 6}}",
            "rollout.max_new_tokens=8",
            "sft.episodes=40",
            "sft.steps=30",
            "sft.noisy_episodes=40",
            "sft.noisy_steps=10",
            "eval.episodes=2",
            "train.iterations=2",
            f"train.runs_dir={tmp_path}",
            "train.name=tw",
            "train.checkpoint_every=100",
        ],
    )
    res = train(cfg, quiet=True)
    for r in res.metrics:
        assert r["rollout/oracle_continuations"] > 0 and r["rollout/oracle_dropped"] == 0
        assert r["rollout/oracle_steps"] >= r["rollout/oracle_continuations"]
        assert r["loss/oracle"] > 0 and r["policy/grad_norm"] > 0, r["iteration"]
