"""The defects a new user hit first with their own third-party envs (issue 44), each
reproduced as they met it: a Gymnasium env in a module of the working folder, named by
``gym:module:Id`` or registered by a ``$CREDO_ENV_MODULES`` module; ``check-env``'s advice
for a gym env; a TextWorld game file given as one path; and an own game's label and end
banner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from credo.envs import Task, make_env
from credo.envs.base import ENV_MODULES_VAR
from credo.rollout.envcheck import EnvCheckError, collect_words

CORRIDOR = '''
import gymnasium as gym
from gymnasium import spaces


class Corridor(gym.Env):
    """A user's 6-cell corridor: "right" walks to the exit; the exit is the last cell."""

    def __init__(self, n=6):
        self.n = n
        self.observation_space = spaces.Text(200)
        self.action_space = spaces.Text(20)

    def _obs(self):
        return f"cell {self.pos} of {self.n}"

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(0, self.n - 1))
        return self._obs(), {}

    def step(self, action):
        if action not in ("left", "right"):
            return self._obs(), 0.0, False, False, {"valid": False}
        self.pos = self.pos + 1 if action == "right" else max(0, self.pos - 1)
        done = self.pos >= self.n - 1
        return self._obs(), float(done), done, False, {}


gym.register("{env_id}", entry_point=Corridor, max_episode_steps=12)
'''


def _user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, env_id: str) -> None:
    """The user's folder with their env module as the working folder, which (as under the
    ``credo`` console script) is not on ``sys.path``."""
    (tmp_path / f"{module}.py").write_text(CORRIDOR.replace("{env_id}", env_id))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, module, raising=False)


def _walk_right(env: object) -> tuple[float, bool]:
    obs = env.reset(Task.make("train", 0))  # type: ignore[attr-defined]
    assert obs.startswith("cell ")
    while True:
        res = env.step("right")  # type: ignore[attr-defined]
        if res.done:
            return res.reward, res.info["success"]


def test_gym_module_id_is_found_in_the_working_folder(tmp_path, monkeypatch) -> None:
    """Defect 1: ``gym:corridor_env:t3/Corridor-v0`` from the env's folder raised a
    ``ModuleNotFoundError`` traceback (the working folder was not on the path)."""
    _user_folder(tmp_path, monkeypatch, "corridor_one", "t3/CorridorOne-v0")
    env = make_env("gym:corridor_one:t3/CorridorOne-v0")
    assert _walk_right(env) == (1.0, True)


def test_a_gym_module_that_is_nowhere_is_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="No module named 'no_such_corridor'") as err:
        make_env("gym:no_such_corridor:t3/Nowhere-v0")
    assert "\n" not in str(err.value) and "working folder" in str(err.value)


def test_env_modules_var_registers_gym_ids(tmp_path, monkeypatch) -> None:
    """Defect 2: ``$CREDO_ENV_MODULES`` was ignored for ``gym:`` (and ``textarena:``)
    names, so an id that a user's module registers was 'Namespace t3 not found'."""
    _user_folder(tmp_path, monkeypatch, "corridor_two", "t3/CorridorTwo-v0")
    monkeypatch.setenv(ENV_MODULES_VAR, "corridor_two")
    env = make_env("gym:t3/CorridorTwo-v0")
    assert _walk_right(env) == (1.0, True)


def test_check_env_tells_a_gym_env_where_its_actions_go(tmp_path, monkeypatch) -> None:
    """Defect 3: ``check-env`` told a gym env to list its actions in ``action_format()``,
    which is the adapter's own and never read from the user's env."""
    _user_folder(tmp_path, monkeypatch, "corridor_three", "t3/CorridorThree-v0")
    with pytest.raises(EnvCheckError) as err:
        collect_words(lambda: make_env("gym:corridor_three:t3/CorridorThree-v0"), episodes=3)
    message = str(err.value)
    assert "action_format()" not in message
    assert "Gymnasium env class" in message and "env.kwargs.action_names" in message


def _fake_game(folder: Path, stem: str) -> Path:
    """A game file and its ``.json`` as tw-make writes them (the constructor only checks
    that both exist; nothing here starts the game)."""
    folder.mkdir(parents=True, exist_ok=True)
    game = folder / f"{stem}.z8"
    game.write_bytes(b"")
    game.with_suffix(".json").write_text("{}")
    return game


def test_one_textworld_game_file_is_a_list_of_one(tmp_path) -> None:
    """Defect 4: ``env.kwargs.game_files=/path/g.z8`` (a str) was read one character at
    a time ("PosixPath('/') has an empty name")."""
    pytest.importorskip("textworld")
    game, held_out = _fake_game(tmp_path, "g"), _fake_game(tmp_path / "held", "h")
    env = make_env("textworld", game_files=str(game), heldout_files=str(held_out))
    assert env.files == {"train": [game], "test": [held_out]}
    with pytest.raises(ValueError, match="a game file path or a list of them, got 3"):
        make_env("textworld", game_files=3)


def test_own_textworld_games_are_labelled_by_file(tmp_path) -> None:
    """Defect 5a: own games were labelled "tw-simple" in the per-difficulty breakdown."""
    pytest.importorskip("textworld")
    games = [_fake_game(tmp_path, "maze"), _fake_game(tmp_path / "kitchen_game", "game")]
    env = make_env("textworld", game_files=[str(g) for g in games])
    labels = set()
    for seed in range(2):
        env._file = env._game_for(Task.make("train", seed))  # what reset() selects
        labels.add(env.task_difficulty())
    assert labels == {"maze", "kitchen_game"}


def test_the_end_banner_is_cut_from_the_last_observation() -> None:
    """Defect 5b: the final observation kept "*** The End *** ... RESTART, RESTORE"
    (the interpreter's question to a human, which an agent cannot answer). The text is
    TextWorld's, as a won tw-simple game prints it."""
    from credo.envs.textworld_env import clean_text

    won = (
        "You put the lettuce on the stove.\n\n\nYour score has just gone up by one point.\n\n\n"
        "                                                       *** The End ***\n\n"
        "You scored 7 out of a possible 7, in 9 turns.\n\n\n"
        "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n"
        ">  -= Kitchen =-6/8"
    )
    assert clean_text(won) == (
        "You put the lettuce on the stove.\nYour score has just gone up by one point.\n"
        "You scored 7 out of a possible 7, in 9 turns."
    )
    lost = "You eat the rotten apple.\n\n    *** You lost! ***\n\nYou scored 0 out of 3."
    assert clean_text(lost) == "You eat the rotten apple.\nYou scored 0 out of 3."
    assert clean_text("A *** marked *** word stays.") == "A *** marked *** word stays."
