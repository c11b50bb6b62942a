"""``sokoban``: rooms from gym-sokoban's own generator, the rules played on them (pushes,
walls, stuck boxes), both rewards hand-worked, the BFS oracle, determinism, ``check-env``
and the refusals."""

from __future__ import annotations

import importlib.util
import random

import pytest

from credo.envs import Task, make_env
from credo.envs.sokoban import Room, SokobanEnv, solve
from credo.envs.thirdparty import MissingPackage
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.envcheck import check_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gym_sokoban") is None,
    reason="gym-sokoban is not installed (pip install --no-deps gym-sokoban==0.0.6)",
)


def _room(rows: list[str]) -> tuple[Room, tuple[int, int], frozenset]:
    """A room drawn in the env's own symbols (spaces optional)."""
    grid = [r.replace(" ", "") for r in rows]
    cells = {(r, c): ch for r, row in enumerate(grid) for c, ch in enumerate(row)}
    walls = frozenset(rc for rc, ch in cells.items() if ch == "#")
    targets = frozenset(rc for rc, ch in cells.items() if ch in "O√S")
    boxes = frozenset(rc for rc, ch in cells.items() if ch in "X√")
    player = next(rc for rc, ch in cells.items() if ch in "PS")
    return Room(walls, targets, (len(grid), len(grid[0]))), player, boxes


def _set(env: SokobanEnv, rows: list[str]) -> None:
    env.reset(Task.make("train", 0))
    env.room, env.player, env.boxes = _room(rows)
    env.num_boxes = len(env.boxes)


ROOM = ["######", "#____#", "#PX_O#", "#____#", "######"]


def test_a_push_a_wall_and_the_render() -> None:
    env = make_env("sokoban", size=6)
    _set(env, ROOM)
    res = env.step("left")  # a wall: a valid move that changes nothing
    assert res.info["valid"] and env.player == (2, 1) and res.reward == 0.0
    res = env.step("Right.")  # pushes the box one cell
    assert env.player == (2, 2) and env.boxes == {(2, 3)} and not res.done
    res = env.step("I go right")  # the box lands on the target: solved
    assert res.done and res.info["success"] and res.reward == 1.0 and res.info["turns"] == 3
    assert res.observation.splitlines()[2] == "# _ _ P √ #"
    assert res.observation.endswith("boxes on targets : 1 / 1")
    assert env.progress() == 1.0 and env.state_key() == "done|p2.3|b2.4"


def test_invalid_moves_spend_a_turn_and_move_nothing() -> None:
    env = make_env("sokoban", max_turns=2)
    _set(env, ROOM)
    res = env.step("push the box")
    assert not res.info["valid"] and env.player == (2, 1) and res.observation.startswith("invalid")
    res = env.step("north")
    assert res.done and not res.info["success"] and res.info["turns"] == 2


def test_the_shaped_reward_is_gym_sokobans() -> None:
    """−0.1 per step, +1 onto a target, −1 off it, +10 when all are on."""
    env = make_env("sokoban", reward="sokoban")
    _set(env, ["#######", "#_____#", "#PX_O_#", "#__X_O#", "#######"])
    assert env.step("right").reward == pytest.approx(-0.1)  # box (2,2) -> (2,3)
    assert env.step("right").reward == pytest.approx(0.9)  # (2,3) -> (2,4), a target
    assert env.step("right").reward == pytest.approx(-1.1)  # pushed off to (2,5)
    assert env.step("left").reward == pytest.approx(-0.1)  # walks back, nothing moves
    env.boxes = frozenset({(2, 4), (3, 3)})  # one on its target, one to push
    env.player = (3, 2)
    res = env.step("right")  # (3,3) -> (3,4): not a target
    assert res.reward == pytest.approx(-0.1)
    res = env.step("right")  # (3,4) -> (3,5): the last target: +1 and +10
    assert res.done and res.info["success"] and res.reward == pytest.approx(10.9)


def test_the_solver_is_shortest_and_sees_a_stuck_box() -> None:
    room, player, boxes = _room(ROOM)
    assert solve(room, player, boxes) == ["right", "right"]
    # the player must go round the box to push it left onto the target
    room, player, boxes = _room(["######", "#O_X_#", "#___P#", "######"])
    assert solve(room, player, boxes) == ["up", "left", "left"]
    cornered = _room(["#####", "#X__#", "#_P_#", "#__O#", "#####"])
    assert solve(*cornered) is None
    env = make_env("sokoban")
    _set(env, ["#####", "#X__#", "#_P_#", "#__O#", "#####"])
    assert env.abstract_state_key() == "off"
    env.player = (1, 2)  # beside the stuck box and below a wall: the oracle spends a move
    assert env.oracle_action() == "up"  # that changes nothing (up: the wall)
    assert env.step("up").info["valid"] and env.player == (1, 2)


def test_rooms_come_from_the_generator_and_the_oracle_solves_them() -> None:
    env = make_env("sokoban")
    first = env.reset(Task.make("train", 3))
    assert make_env("sokoban").reset(Task.make("train", 3)) == first  # one room per seed
    assert env.reset(Task.make("test", 3)) != first
    lengths = []
    for seed in range(40):
        env.reset(Task.make("test", seed))
        grid = env._render().splitlines()[:6]
        assert all(len(row.split()) == 6 for row in grid)
        assert grid[0] == "# # # # # #" and grid[-1] == "# # # # # #"  # the outer wall
        assert sum(row.split().count("X") for row in grid) == 1
        plan = solve(env.room, env.player, env.boxes)
        assert plan  # gym-sokoban plays its rooms in reverse: every one is solvable
        lengths.append(len(plan))
        while True:
            res = env.step(env.oracle_action())
            if res.done:
                break
        assert res.info["success"] and res.info["turns"] == lengths[-1]
    assert max(lengths) >= 3  # not all one-push rooms
    big = make_env("sokoban", size=7, boxes=2, max_turns=40)
    big.reset(Task.make("train", 0))
    assert len(big.boxes) == 2 and big.task_difficulty() == "7x7-2box"


def test_generation_leaves_the_global_random_states_alone() -> None:
    import numpy as np

    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    make_env("sokoban").reset(Task.make("train", 11))
    assert (random.random(), np.random.rand()) == expected


def test_check_env_passes() -> None:
    env = make_env("sokoban")
    report = check_env(
        lambda: make_env("sokoban"), tasks=4, tokenizer=build_word_tokenizer(env.vocabulary())
    )
    assert report.ok and len(report.passed) == 3, (report.problems, report.errors)


def test_refusals_are_one_line(monkeypatch) -> None:
    for kwargs, match in (
        ({"size": 3}, "size must be an integer >= 5"),
        ({"boxes": 0}, "boxes must be an integer >= 1"),
        ({"max_turns": 0}, "max_turns must be a positive integer"),
        ({"reward": "dense"}, "reward must be 'success' or 'sokoban'"),
    ):
        with pytest.raises(ValueError, match=match):
            make_env("sokoban", **kwargs)
    import credo.envs.sokoban as sokoban

    monkeypatch.setattr(sokoban, "_room_utils", None)
    monkeypatch.setattr(sokoban.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingPackage, match="pip install --no-deps gym-sokoban") as err:
        SokobanEnv()
    assert "\n" not in str(err.value)


def test_the_coordinates_line_for_the_word_level_model() -> None:
    """The built-in tokenizer drops line breaks; ``coordinates=true`` adds the cells."""
    env = make_env("sokoban", coordinates=True)
    _set(env, ROOM)
    obs = env.step("up").observation  # (2,1) -> (1,1)
    assert obs.splitlines()[-1] == "player row 1 col 1 ; box row 2 col 2 ; target row 2 col 4"
    words = set(env.vocabulary())
    assert {"player", "row", "col", "5", ";"} <= words
    assert make_env("sokoban").reset(Task.make("train", 0)).splitlines()[-1].startswith("boxes")


def test_the_room_cache_is_bounded(monkeypatch) -> None:
    import credo.envs.sokoban as sokoban

    monkeypatch.setattr(sokoban, "ROOM_CACHE", 3)
    env = make_env("sokoban")
    first = env.reset(Task.make("train", 0))
    for seed in range(1, 6):
        env.reset(Task.make("train", seed))
    assert list(env._rooms) == [3, 4, 5]
    assert env.reset(Task.make("train", 0)) == first  # generated again, the same room
