"""The ``gym`` adapter on real Gymnasium envs: credo's text env ``credo/TextLights-v0``
(written with Gymnasium's API, made with ``gymnasium.make``) and Gymnasium's own
``FrozenLake-v1`` through the Discrete mapping (``action_names``); ``check-env`` and a
short training run."""

from __future__ import annotations

import sys

import gymnasium
import pytest

from credo.envs import Task, make_env, resolve_env
from credo.envs.gym_env import GymEnv
from credo.envs.gym_lights import ENV_ID, TextLightsEnv
from credo.envs.thirdparty import MissingPackage
from credo.policy.tokenizer import build_word_tokenizer
from credo.rollout.envcheck import check_env


def test_the_shipped_text_env_is_a_gymnasium_env() -> None:
    make_env("gym")  # registers it
    env = gymnasium.make(ENV_ID)
    assert isinstance(env.unwrapped, TextLightsEnv)
    assert isinstance(env.observation_space, gymnasium.spaces.Text)
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    obs2, reward, _, _, info = env.step("flip 1")
    assert env.observation_space.contains(obs2) and info["valid"] and reward in (0.0, 1.0)
    assert env.spec.max_episode_steps == 8


def test_gym_id_names_the_env_and_the_oracle_wins() -> None:
    env = make_env(f"gym:{ENV_ID}")
    assert isinstance(env, GymEnv) and env.max_turns == 8  # the spec's max_episode_steps
    for seed in range(10):
        obs = env.reset(Task.make("train", seed))
        lamps = obs.split()[3::2]
        off = lamps.count("off")
        rewards = []
        while True:
            res = env.step(env.oracle_action())
            rewards.append(res.reward)
            if res.done:
                break
        assert res.info["success"] and len(rewards) == off and rewards[-1] == 1.0
        assert env.state_key().startswith("done|1")


def test_the_oracle_is_the_teachers_privileged_text() -> None:
    """An env with ``oracle_action()`` gives self-teachers (Rényi OPSD, ``teacher.privileged:
    oracle``) the oracle's next action as its privileged text, ``None`` once the episode is
    over or for another kind; an env with neither method offers none; an env with its own
    ``privileged_context`` is asked directly."""
    from credo.envs.base import privileged_context

    env = make_env(f"gym:{ENV_ID}")
    obs = env.reset(Task.make("train", 3))
    first_off = obs.split()[3::2].index("off") + 1
    assert privileged_context(env, "oracle") == env.oracle_action() == f"flip {first_off}"
    assert privileged_context(env, "hint") is None
    while not env.step(env.oracle_action()).done:
        pass
    assert privileged_context(env, "oracle") is None
    lake = make_env("gym:FrozenLake-v1", action_names=["left", "down", "right", "up"])
    assert privileged_context(lake, "oracle") is None and not hasattr(lake, "privileged_context")

    class Hinted(TextLightsEnv):
        def privileged_context(self, kind: str) -> str | None:
            return f"{kind} text"

    gymnasium.register("credo-test/Hinted-v0", entry_point=Hinted, max_episode_steps=8)
    try:
        hinted = make_env("gym:credo-test/Hinted-v0")
        hinted.reset(Task.make("train", 3))
        assert privileged_context(hinted, "hint") == "hint text"
    finally:
        gymnasium.registry.pop("credo-test/Hinted-v0", None)


def test_steps_and_invalid_actions() -> None:
    env = GymEnv(ENV_ID)
    obs = env.reset(Task.make("train", 3))
    assert obs == "lamps : 1 off 2 off 3 off 4 off 5 on 6 on" and env.state_key() == "000011"
    res = env.step("flip 1")
    assert res.info == {"valid": True} and env.state_key() == "100011" and not res.done
    res = env.step("FLIP 2")  # upper case is outside the Text space's charset
    assert res.info == {"valid": False} and res.observation.startswith("invalid action")
    assert env.state_key() == "100011"
    res = env.step("x" * 40)  # longer than the space's max_length
    assert res.info == {"valid": False}
    res = env.step("flip 9")  # in the space, but the env says it is invalid
    assert res.info == {"valid": False} and "use flip" in res.observation
    res = env.step("jump")
    assert not res.info["valid"] and env.state_key() == "100011"
    for _ in range(3):  # turn 8 ends the episode (TimeLimit truncation)
        res = env.step("flip 6")
    assert res.done and res.info["success"] is False and res.info["turns"] == 8
    with pytest.raises(RuntimeError, match="episode ended"):
        env.step("flip 1")


def test_discrete_spaces_through_action_names() -> None:
    """Gymnasium's FrozenLake-v1 (Discrete observations and actions), non-slippery: the
    4x4 map's shortest path, named with action_names, wins with reward 1."""
    names = ["left", "down", "right", "up"]
    env = make_env("gym:FrozenLake-v1", action_names=names, make_kwargs={"is_slippery": False})
    assert env.reset(Task.make("train", 0)) == "state 0"
    path = ["right", "right", "down", "down", "down", "right"]
    for move in path[:-1]:
        res = env.step(move)
        assert res.info["valid"] and not res.done
    assert env.step("fly").info["valid"] is False
    res = env.step(path[-1])
    assert res.done and res.info["success"] and res.reward == 1.0
    assert res.observation == "state 15"
    assert "left" in env.vocabulary() and env.sample_action(__import__("random").Random(0)) in names
    assert env.action_format() == "Reply with exactly one action: left, down, right, up."


def test_snapshot_restore() -> None:
    env = GymEnv(ENV_ID)
    env.reset(Task.make("train", 5))
    env.step("flip 1")
    snap = env.snapshot()
    first = [env.step(a).observation for a in ("flip 2", "flip 3")]
    env.restore(snap)
    assert [env.step(a).observation for a in ("flip 2", "flip 3")] == first


def test_check_env_passes() -> None:
    env = GymEnv(ENV_ID)
    report = check_env(
        lambda: GymEnv(ENV_ID), tasks=4, tokenizer=build_word_tokenizer(env.vocabulary())
    )
    assert report.ok and len(report.passed) == 3, (report.problems, report.errors)


def test_refusals_are_one_line() -> None:
    with pytest.raises(ValueError, match="needs Text"):
        make_env("gym:CartPole-v1")
    with pytest.raises(ValueError, match="pass action_names"):
        make_env("gym:FrozenLake-v1")
    with pytest.raises(ValueError, match="cannot make 'NoSuchEnv-v0'"):
        make_env("gym:NoSuchEnv-v0")
    assert callable(resolve_env("gym:anything"))  # resolved lazily, made on use


def test_a_missing_package_is_one_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(MissingPackage, match=r"pip install 'credo\[gym\]'") as err:
        GymEnv()
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_grpo_trains_on_text_lights(tmp_path) -> None:
    """Two GRPO iterations of the built-in model on ``gym:credo/TextLights-v0``: mixed
    outcomes, non-zero advantages and gradients."""
    from credo.train.config import load_config
    from credo.train.loop import train
    from small_run import SMALL
    from test_train_e2e import _assert_signal

    cfg = load_config(
        "grpo",
        [
            *[o for o in SMALL if not o.startswith("env.name=")],
            f"env.name=gym:{ENV_ID}",
            "sft.steps=60",
            "eval.episodes=8",
            "train.iterations=2",
            f"train.runs_dir={tmp_path}",
            "train.name=gym",
            "train.checkpoint_every=100",
        ],
    )
    res = train(cfg, quiet=True)
    _assert_signal(res.metrics)


def test_credo_check_env_command(capsys) -> None:
    from credo.cli import main

    assert main(["check-env", "--env", f"gym:{ENV_ID}", "--tasks", "3"]) == 0
    assert "GymEnv (gym:credo/TextLights-v0) passes the env checks" in capsys.readouterr().out


def test_textlights_vocabulary_can_list_more_lamps_than_it_draws() -> None:
    """A model trained on 5-7 lamps and evaluated on 8-9 (``eval.shifted``) needs the
    numbers 8 and 9 in its word-level tokenizer: ``vocabulary_lamps`` lists them."""
    numbers = {str(i) for i in range(1, 10)}
    assert numbers - set(TextLightsEnv(5, 7).vocabulary()) == {"8", "9"}
    assert numbers <= set(TextLightsEnv(5, 7, vocabulary_lamps=9).vocabulary())
    env = make_env(
        f"gym:{ENV_ID}", make_kwargs={"min_lamps": 5, "max_lamps": 7, "vocabulary_lamps": 9}
    )
    assert numbers <= set(env.vocabulary())
    with pytest.raises(ValueError, match="vocabulary_lamps"):
        TextLightsEnv(5, 7, vocabulary_lamps=6)
