"""The ``textarena`` adapter on TextArena's real games (GuessTheNumber, TowerOfHanoi,
FrozenLake, Minesweeper): moves as the games expect them, invalid moves, determinism under
a shared global ``random``, snapshots, ``check-env``, and a short training run."""

from __future__ import annotations

import random
import sys

import pytest

from credo.envs import Task, make_env
from credo.envs.textarena_env import GAMES, GENERIC, TextArenaEnv, hanoi_next_move, register_game
from credo.envs.thirdparty import MissingPackage
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.envcheck import check_env

IDS = ["GuessTheNumber-v0", "TowerOfHanoi-v0", "FrozenLake-v0", "Minesweeper-v0-small"]


def _oracle_episode(env: TextArenaEnv, task: Task) -> tuple[list[str], list[float], dict]:
    env.reset(task)
    actions, rewards = [], []
    while True:
        actions.append(env.oracle_action())
        res = env.step(actions[-1])
        rewards.append(res.reward)
        assert res.info["valid"], (actions, res.observation)
        if res.done:
            return actions, rewards, res.info


@pytest.mark.parametrize("game", IDS)
def test_the_oracle_wins_every_game(game: str) -> None:
    env = make_env(f"textarena:{game}")
    for seed in range(10):
        _, rewards, info = _oracle_episode(env, Task.make("train", seed))
        assert info["success"] and rewards[-1] == 1.0 and sum(rewards) == 1.0
        assert env.progress() == 1.0 and env.state_key().startswith("done|")


def test_hand_worked_oracle_moves() -> None:
    # three disks on A: the optimal first move puts disk 1 on C (7 moves in all)
    assert hanoi_next_move({"A": [3, 2, 1], "B": [], "C": []}) == ("A", "C")
    # disk 3 is home on C, disks 2 and 1 on B: move 1 to A, then 2 to C
    assert hanoi_next_move({"A": [], "B": [2, 1], "C": [3]}) == ("B", "A")
    assert hanoi_next_move({"A": [1], "B": [2], "C": [3]}) == ("B", "C")
    assert hanoi_next_move({"A": [], "B": [], "C": [3, 2, 1]}) is None
    env = TextArenaEnv("TowerOfHanoi-v0")
    actions, _, _ = _oracle_episode(env, Task.make("train", 0))
    assert actions == ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]
    # binary search over 1..20: the first guess is 10, the range the hints leave shows
    env = TextArenaEnv("GuessTheNumber-v0")
    obs = env.reset(Task.make("train", 1))
    assert obs == "the number is from 1 to 20" and env.oracle_action() == "[10]"
    secret = env._game.game_number
    res = env.step("[10]")
    lo, hi = (11, 20) if secret > 10 else (1, 9)
    assert res.observation.endswith(f"the number is from {lo} to {hi}") or secret == 10
    assert env.state_key() == f"{lo}-{hi}" or secret == 10


def test_moves_with_the_tokenizer_spaces_and_invalid_moves() -> None:
    env = TextArenaEnv("TowerOfHanoi-v0")
    env.reset(Task.make("train", 0))
    res = env.step("[ a c ]")  # what the word-level tokenizer writes for [A C]
    assert res.info == {"valid": True, "move": "[A C]"} and env.state_key() == "A:3,2|B:|C:1"
    res = env.step("[ A C ]")  # disk 2 onto disk 1: the game refuses it
    assert not res.info["valid"] and "larger disk" in res.observation and not res.done
    assert env.state_key() == "A:3,2|B:|C:1"
    res = env.step("move it")  # a second invalid move in a row ends the game (its rule)
    assert res.done and not res.info["valid"] and res.info["success"] is False
    assert res.reward == 0.0
    env = TextArenaEnv("FrozenLake-v0", reward="game")
    env.reset(Task.make("train", 0))
    res = env.step("[ W ]")  # up from the top-left corner: a wall
    assert not res.info["valid"] and "wall" in res.observation
    assert env.step("[ s ]").info == {"valid": True, "move": "[down]"}


def test_tasks_come_from_the_seed_whatever_the_global_random() -> None:
    """TextArena draws from the global ``random``; the adapter keeps its own state, so
    other code drawing between calls changes nothing (Minesweeper places its mines on
    the first move)."""

    def play(disturb: bool) -> list[str]:
        env = TextArenaEnv("Minesweeper-v0-small")
        out = [env.reset(Task.make("train", 7))]
        for move in ["[2 2]", "[0 0]", "[4 4]", "[1 3]"]:
            if disturb:
                random.seed(99)
                random.random()
            res = env.step(move)
            out.append(res.observation + env.state_key())
            if res.done:
                break
        return out

    assert play(False) == play(True)
    a, b = TextArenaEnv("GuessTheNumber-v0"), TextArenaEnv("GuessTheNumber-v0")
    secrets = set()
    for seed in range(20):
        a.reset(Task.make("train", seed))
        b.reset(Task.make("train", seed))
        assert a._game.game_number == b._game.game_number
        secrets.add(a._game.game_number)
    assert len(secrets) > 5  # the seed picks the secret
    a.reset(Task.make("test", 0))
    assert 1 <= a._game.game_number <= 20


def test_snapshot_restore_replays_exactly() -> None:
    env = TextArenaEnv("Minesweeper-v0-small")
    env.reset(Task.make("train", 3))
    env.step(env.oracle_action())
    snap = env.snapshot()
    first = [env.step(env.oracle_action()).observation for _ in range(2)]
    env.restore(snap)
    again = [env.step(env.oracle_action()).observation for _ in range(2)]
    assert first == again


@pytest.mark.parametrize("game", IDS)
def test_check_env_passes(game: str) -> None:
    env = TextArenaEnv(game)
    tokenizer = build_word_tokenizer(env.vocabulary())
    report = check_env(lambda: TextArenaEnv(game), tasks=3, tokenizer=tokenizer)
    assert report.ok, (report.problems, report.errors)
    assert len(report.passed) == 3


def test_options_and_names() -> None:
    assert set(GAMES) == {"GuessTheNumber", "TowerOfHanoi", "FrozenLake", "Minesweeper"}
    env = make_env("textarena", game="TowerOfHanoi-v0-medium")
    assert env.max_turns == 30 and env.task_difficulty() == "TowerOfHanoi-v0-medium"
    assert make_env("textarena:GuessTheNumber-v0", max_turns=3).max_turns == 3
    with pytest.raises(ValueError, match="needs NLTK data"):
        TextArenaEnv("Wordle-v0")
    with pytest.raises(ValueError, match="'success' or 'game'"):
        TextArenaEnv(reward="points")
    with pytest.raises(ValueError, match="positive integer"):
        TextArenaEnv(max_turns=0)
    with pytest.raises(ValueError, match="has no game"):
        TextArenaEnv("GuessTheNumber-v9")


def test_a_missing_package_is_one_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(MissingPackage, match=r"pip install 'credo\[textarena\]'") as err:
        TextArenaEnv()
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_grpo_trains_on_guess_the_number(tmp_path) -> None:
    """Two GRPO iterations of the built-in model on GuessTheNumber (short instruction):
    its warm start wins about a quarter of the games, so every iteration has mixed
    outcomes, non-zero advantages and a non-zero gradient."""
    from credo.train.config import load_config
    from credo.train.loop import train
    from small_run import SMALL
    from test_train_e2e import _assert_signal

    cfg = load_config(
        "grpo",
        [
            *[o for o in SMALL if not o.startswith("env.name=")],
            "env.name=textarena:GuessTheNumber-v0",
            "env.kwargs={instruction: short}",
            "sft.steps=150",
            "eval.episodes=8",
            "train.iterations=2",
            f"train.runs_dir={tmp_path}",
            "train.name=ta",
            "train.checkpoint_every=100",
        ],
    )
    res = train(cfg, quiet=True)
    _assert_signal(res.metrics)


def test_credo_play_and_check_env_commands(monkeypatch, capsys) -> None:
    import io

    from credo.cli import main

    moves = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(moves) + "\n"))
    assert main(["play", "--env", "textarena:TowerOfHanoi-v0"]) == 0
    out = capsys.readouterr().out
    assert "Congratulations! You solved the Tower of Hanoi puzzle." in out and "success True" in out
    assert main(["check-env", "--env", "textarena:FrozenLake-v0", "--tasks", "3"]) == 0
    assert "passes the env checks on 3 tasks" in capsys.readouterr().out


# ---------------------------------------------------------------- any single-player game
def test_any_single_player_game_plays_through_the_generic_spec() -> None:
    """Mastermind has no spec of its own: the reply's first bracketed move reaches the
    game (spaces as the word-level tokenizer writes them), which judges it."""
    env = make_env("textarena:Mastermind-v0")
    assert env.spec is GENERIC and env.max_turns == 20
    assert not hasattr(env, "oracle_action") and not hasattr(env, "sample_action")
    first = env.reset(Task.make("train", 0))
    assert "Mastermind" in env.instruction() and "[2 1 4 5]" in env.instruction()
    key = env.state_key()
    snap = env.snapshot()
    res = env.step("my guess is [ 1 2 3 4 ] now")
    assert res.info == {"valid": True, "move": "[1 2 3 4]"}
    assert "black peg" in res.observation and env.state_key() != key
    env.restore(snap)
    assert env.state_key() == key and env.reset(Task.make("train", 0)) == first
    res = env.step("no move here")
    assert not res.info["valid"] and res.info["move"] is None and not res.done
    res = env.step("[ 7 ]")  # a second invalid move in a row ends it (TextArena's rule)
    assert res.done and not res.info["success"] and res.reward == 0.0


def test_error_allowance_forgives_invalid_moves() -> None:
    env = make_env("textarena:LightsOut-v0", error_allowance=3)
    env.reset(Task.make("train", 1))
    for _ in range(3):
        res = env.step("[ 9 9 ]")
        assert not res.info["valid"] and not res.done
    assert env.step("[ 9 9 ]").done  # the fourth in a row is one too many
    with pytest.raises(ValueError, match="error_allowance must be an integer >= 0"):
        make_env("textarena:LightsOut-v0", error_allowance=-1)


def test_register_game_gives_a_game_an_oracle(monkeypatch) -> None:
    """A user's oracle for a game credo has no spec for: the warm start can use it."""
    monkeypatch.setitem(GAMES, "Mastermind", GAMES.get("Mastermind", GENERIC))

    def read_the_code(game) -> str:
        return "[" + " ".join(str(d) for d in game.state.game_state["secret_code"]) + "]"

    register_game("Mastermind", oracle=read_the_code, vocabulary=lambda game: ["peg", "pegs"])
    env = make_env("textarena:Mastermind-v0")
    env.reset(Task.make("test", 2))
    res = env.step(env.oracle_action())
    assert res.done and res.info["success"] and res.reward == 1.0
    assert "pegs" in env.vocabulary() and env.privileged_context("oracle") is None
    with pytest.raises(ValueError, match="unknown fields \\['solver'\\]"):
        register_game("Mastermind", solver=read_the_code)


def test_games_that_cannot_be_played_here_are_one_line() -> None:
    """Word games fetch NLTK data when built: refused from their source, before any
    import (so no download is tried); multi-player and broken games: refused too."""
    for game in ("Wordle-v0", "Hangman-v0", "SpellingBee-v0"):
        with pytest.raises(ValueError, match="credo never downloads") as err:
            make_env(f"textarena:{game}")
        assert "\n" not in str(err.value)
    assert "textarena.envs.Wordle.env" not in sys.modules
    with pytest.raises(ValueError, match="number of players has to be 2"):
        make_env("textarena:TicTacToe-v0")
    with pytest.raises(ValueError, match="not a single-player one"):
        make_env("textarena:PublicGoodsGame-v0")


def test_a_game_that_swaps_its_invalid_move_arguments_is_a_plain_loss() -> None:
    """Cryptarithm (textarena 0.7.4) passes the reason text as the reward of a game lost
    by invalid moves; that was a ValueError out of step(): it is a loss, reward 0."""
    env = make_env("textarena:Cryptarithm-v0", reward="game")
    env.reset(Task.make("train", 0))
    assert not env.step("no move").done
    res = env.step("still no move")
    assert res.done and res.reward == 0.0
    assert res.info["success"] is False and res.info["game_reward"] == 0.0
