"""``mixture``: several envs in one run (issue 41). Routing is a pure function of the task,
every method acts on the current task's env, held-out success and training success are
reported per env with the weakest env, and a run on a mixture resumes exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from credo.envs import Task, make_env
from credo.envs.base import privileged_context, restore_env, snapshot_env
from credo.envs.mixture import MixtureEnv, mixture_entries

LIGHTS = {"name": "gym:credo/TextLights-v0", "label": "lights"}
GUESS = {"name": "examples.custom_env:GuessEnv", "label": "guess"}


def _mixture(**weights: float) -> MixtureEnv:
    envs = [
        {**GUESS, "weight": weights.get("guess", 1.0)},
        {**LIGHTS, "weight": weights.get("lights", 1.0)},
    ]
    env = make_env("mixture", envs=envs)
    assert isinstance(env, MixtureEnv)
    return env


def test_each_task_goes_to_one_env_by_weight_the_same_every_time() -> None:
    env = _mixture(guess=1.0, lights=3.0)
    tasks = [Task.make("train", i) for i in range(4000)]
    picks = [env.index_of(t) for t in tasks]
    assert picks == [_mixture(guess=1.0, lights=3.0).index_of(t) for t in tasks]  # any process
    share = picks.count(1) / len(picks)
    assert 0.72 < share < 0.78  # 3 of 4 (binomial sd 0.007)
    held = [env.index_of(Task.make("test", i)) for i in range(2000)]
    assert 0.72 < held.count(1) / len(held) < 0.78
    # a task that names its env goes there, whatever its seed
    assert env.index_of(Task("train", 5, {"env": "guess"})) == 0
    assert env.index_of(Task("train", 5, {"env": "lights"})) == 1
    with pytest.raises(ValueError, match="names env 'maze'; this mixture has guess, lights"):
        env.index_of(Task("train", 5, {"env": "maze"}))


def test_an_env_of_weight_zero_gets_no_task_but_keeps_its_words() -> None:
    """A domain teacher trained on one env of a mixture: the other env (weight 0) gets no
    task, in either split, but its words stay in the vocabulary (the student's)."""
    for first, second in ((0.0, 1.0), (1.0, 0.0)):
        env = _mixture(guess=first, lights=second)
        want = 0 if first > 0 else 1
        picks = {
            env.index_of(Task.make(split, i)) for split in ("train", "test") for i in range(3000)
        }
        assert picks == {want}
        assert env.vocabulary() == _mixture().vocabulary()


def test_every_method_acts_on_the_current_tasks_env() -> None:
    env = _mixture()
    guess, lights = make_env(GUESS["name"]), make_env(LIGHTS["name"])
    seen = set()
    for i in range(12):
        task = Task.make("train", i)
        inner = [guess, lights][env.index_of(task)]
        label = env.labels[env.index_of(task)]
        assert env.reset(task) == inner.reset(task)
        assert env.task_env() == label and env.state_key() == f"{label}|{inner.state_key()}"
        assert env.instruction() == inner.instruction()
        assert privileged_context(env, "oracle") == privileged_context(inner, "oracle")
        while True:  # the oracle of the current env solves its task
            action = env.oracle_action()
            assert action == inner.oracle_action()
            res, ref = env.step(action), inner.step(action)
            assert (res.observation, res.reward, res.done) == (
                ref.observation,
                ref.reward,
                ref.done,
            )
            assert res.info == {**ref.info, "env": label}
            if res.done:
                break
        assert res.info["success"]
        seen.add(label)
    assert seen == {"guess", "lights"}
    words = env.vocabulary()
    assert set(guess.vocabulary()) <= set(words) and set(lights.vocabulary()) <= set(words)
    # the rules of each env that has some, under its label (GuessEnv has none)
    assert env.action_format() == f"lights: {lights.action_format()}"


def test_snapshot_and_restore_cross_envs() -> None:
    env = _mixture()
    a, b = Task.make("train", 0), Task.make("train", 1)
    while env.index_of(b) == env.index_of(a):
        b = Task(b.split, b.seed + 1)
    env.reset(a)
    env.step(env.oracle_action())
    snap, key = snapshot_env(env), env.state_key()
    env.reset(b)  # another env's task
    assert env.state_key() != key
    restore_env(env, snap)
    assert env.state_key() == key and env.task_env() == env.labels[env.index_of(a)]


def test_similar_tasks_stay_in_their_env() -> None:
    env = _mixture()
    task = next(
        Task.make("train", i) for i in range(50) if _mixture().index_of(Task.make("train", i)) == 1
    )
    variant = env.similar_task(task, random.Random(0))
    assert variant.data["env"] == "lights" and env.index_of(variant) == 1


@pytest.mark.parametrize(
    ("envs", "message"),
    [
        ([], "must be a list"),
        ([{"kwargs": {}}], "envs[0] must be a mapping with an env name"),
        ([{"name": "shop", "weigth": 2}], "unknown key 'weigth'"),
        ([{"name": "shop", "weight": -1}], "weight must be a number >= 0"),
        ([{"name": "shop", "weight": 0}], "every env has weight 0"),
        ([{"name": "shop"}, {"name": "shop"}], "label 'shop' is taken"),
        ([{"name": "mixture"}], "cannot hold a mixture"),
        ([{"name": "shop", "kwargs": [1]}], "kwargs must be a mapping"),
    ],
)
def test_bad_entries_are_one_line(envs: list, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        mixture_entries(envs)


def test_held_out_success_per_env_and_the_weakest() -> None:
    from credo.eval.evaluate import evaluate
    from credo.train.config import load_config
    from credo.train.run import build_run

    envs = "{envs: [{name: 'examples.custom_env:GuessEnv', label: guess}, {name: 'gym:credo/TextLights-v0', label: lights}]}"
    cfg = load_config(
        "grpo",
        [
            "env.name=mixture",
            f"env.kwargs={envs}",
            "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
            "sft.enabled=false",
            "rollout.max_new_tokens=4",
            "train.threads=1",
        ],
    )
    run = build_run(cfg)
    res = evaluate(
        run.policy, run.renderer, run.make_env, episodes=40, sampling=run.sampling,
        max_turns=run.max_turns,
    )  # fmt: skip
    mix = run.make_env()
    routed = [mix.labels[mix.index_of(Task.make("test", i))] for i in range(40)]
    assert {k: v["tasks"] for k, v in res.by_env.items()} == {
        k: routed.count(k) for k in sorted(set(routed))
    }
    rates = {k: v["success_rate"] for k, v in res.by_env.items()}
    assert res.weakest_env == min(sorted(rates), key=rates.__getitem__)
    total = sum(v["success_rate"] * v["tasks"] for v in res.by_env.values())
    assert total / 40 == pytest.approx(res.success_rate)


def test_training_success_per_env_from_the_steps_labels() -> None:
    from credo.data import Episode, Step
    from credo.train.iteration import success_by_env

    def ep(label: str | None, success: bool) -> Episode:
        info = {} if label is None else {"env": label}
        step = Step(observation="o", action="a", reward=1.0, info=info)
        return Episode(group=0, steps=[step], success=success)

    eps = [ep("a", True), ep("a", False), ep("b", True), ep("a", True)]
    assert success_by_env(eps) == {"rollout/success/a": 2 / 3, "rollout/success/b": 1.0}
    assert success_by_env([ep(None, True)]) == {}


@pytest.mark.slow
def test_a_mixture_run_reports_each_env_and_resumes_exactly(tmp_path: Path) -> None:
    """Two iterations in one go and one + a resume give the same metrics; the run's
    held-out result has each env and the weakest; metrics have each env's success."""
    from credo.cli import main

    base = [
        "env.name=mixture",
        "env.kwargs={envs: [{name: 'examples.custom_env:GuessEnv', label: guess}, "
        "{name: 'gym:credo/TextLights-v0', label: lights}]}",
        "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
        "sft.enabled=false",
        "rollout.tasks_per_iter=4",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "eval.episodes=8",
        "train.threads=1",
        f"train.runs_dir={tmp_path}",
    ]
    assert main(["train", *base, "train.iterations=2", "train.name=full", "--quiet"]) == 0
    assert main(["train", *base, "train.iterations=1", "train.name=part", "--quiet"]) == 0
    part = tmp_path / "part"
    assert main(["train", "--resume", str(part), "train.iterations=2", "--quiet"]) == 0

    def stable(run: Path) -> list[dict]:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]

    full = tmp_path / "full"
    assert stable(part) == stable(full) and len(stable(full)) == 2
    rows = stable(full)
    assert all(any(k.startswith("rollout/success/") for k in r) for r in rows)
    final = json.loads((full / "final_eval.json").read_text())
    assert set(final["by_env"]) <= {"guess", "lights"} and final["by_env"]
    assert final["weakest_env"] in final["by_env"]
    assert final == json.loads((part / "final_eval.json").read_text())


def test_ray_env_workers_are_refused_in_one_line() -> None:
    """Ray's env workers answer ``extract_action`` and the oracle from a local instance,
    which would parse with the wrong env's rules: a mixture stays in the process."""
    from credo.rollout.ray_envs import EnvPool

    with pytest.raises(
        ValueError, match=r"runs in this process only \(.*\); set rollout.env_workers=0"
    ):
        EnvPool(_mixture, 2)
