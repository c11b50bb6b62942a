"""Task sources: RODS's boundary / retire / spawn decisions on hand-worked reward tables,
its buffer's state round trip and exact resume, ``fixed`` = the old uniform draw, the
env variants of ``shop`` and ``tools``, and RODS under several samplers and estimators."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from examples.custom_env import GuessEnv

from credo.data.episode import Episode, Step
from credo.envs.base import HELDOUT_SEED_OFFSET, VARIANT_SEED_OFFSET, Task
from credo.envs.shop import ShopEnv
from credo.envs.tools import ToolsEnv
from credo.tasks import (
    RodsParams,
    RodsSource,
    TaskSourceContext,
    TaskStats,
    decide,
    episode_signal,
    group_stats,
    make_task_source,
    task_source_params,
)
from credo.train.config import ConfigError, load_config
from credo.train.loop import train
from small_run import SMALL as SMALL_RUN

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class VariantGuessEnv(GuessEnv):
    """The guessing game with variants: a variant's secret has the same parity."""

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        parity = random.Random(task.seed).randint(1, self.high) % 2
        while True:
            seed = rng.randrange(VARIANT_SEED_OFFSET, HELDOUT_SEED_OFFSET)
            if random.Random(seed).randint(1, self.high) % 2 == parity:
                return Task("train", seed)


class CountingEnv:
    """Only ``similar_task``: variant k of any task is train seed 1000 + k."""

    def __init__(self) -> None:
        self.k = 0

    def similar_task(self, task: Task, rng: random.Random) -> Task:
        self.k += 1
        return Task("train", 1000 + self.k)


def _episodes(table: dict[str, list[float]], tasks: list[Task]) -> list[Episode]:
    """Episodes whose final progress is the table's entry for each task (group = index)."""
    out = []
    for g, t in enumerate(tasks):
        for p in table[t.id]:
            step = Step("obs", "act", reward=p, terminal=True, info={"progress": p})
            out.append(Episode(g, [step], t.id, success=p == 1.0))
    return out


def _source(**params: object) -> RodsSource:
    ctx = TaskSourceContext(train_tasks=10, tasks_per_iter=2, make_env=CountingEnv)
    params = {"seed_pool": 3, "max_pool": 4, "synthesiser": "similar", **params}
    return RodsSource(ctx, RodsParams(**params))


# ----------------------------------------------------------------- the decisions
@pytest.mark.parametrize(
    ("rewards", "mean", "var", "boundary", "mastered", "dead"),
    [
        ([0, 1, 0, 1], 0.5, 0.25, True, False, False),  # σ²/¼ = 1
        ([1, 0, 0, 0], 0.25, 0.1875, True, False, False),  # σ²/¼ = 0.75 ≥ 0.5
        ([0, 0, 0, 0, 0, 0, 0, 1], 0.125, 0.109375, False, False, False),  # 0.4375 < 0.5
        ([1, 1, 1, 1], 1.0, 0.0, False, True, False),
        ([0, 0, 0, 0], 0.0, 0.0, False, False, True),
        ([0.5, 0.5], 0.5, 0.0, False, False, False),  # agreement in the middle: nothing
        ([1, 1, 0.8, 1], 0.95, 0.0075, False, True, False),  # μ ≥ τ_hi = 0.9
        ([0.25, 0.75], 0.5, 0.0625, False, False, False),  # σ²/¼ = 0.25 < 0.5
    ],
)
def test_decisions_on_hand_worked_groups(
    rewards: list[float], mean: float, var: float, boundary: bool, mastered: bool, dead: bool
) -> None:
    m, v = group_stats(rewards)
    assert m == pytest.approx(mean) and v == pytest.approx(var)
    d = decide(m, v, RodsParams())
    assert (d.boundary, d.mastered, d.dead) == (boundary, mastered, dead)


def test_thresholds_move_the_decisions() -> None:
    m, v = group_stats([0.25, 0.75])  # σ²/¼ = 0.25
    assert decide(m, v, RodsParams(tau_v=0.25)).boundary
    assert not decide(m, v, RodsParams(tau_v=0.26)).boundary
    assert decide(0.7, 0.0, RodsParams(tau_hi=0.7)).mastered
    assert decide(0.01, 0.0, RodsParams(dead_eps=0.05)).dead
    assert not decide(0.01, 0.0, RodsParams()).dead


def test_the_signal_is_progress_else_success_else_return() -> None:
    with_progress = Episode(0, [Step("o", "a", info={"progress": 0.4}), Step("o", "a")])
    assert episode_signal(with_progress) == 0.4  # the last step that reports one
    plain = Episode(0, [Step("o", "a", reward=2.0)], success=True)
    assert episode_signal(plain) == 1.0 and episode_signal(plain, "return") == 1.0
    assert episode_signal(Episode(0, [Step("o", "a", reward=-1.0)]), "return") == 0.0
    assert episode_signal(Episode(0, [], success=True, error="boom")) == 0.0
    with pytest.raises(ValueError, match="valid: progress, success, return"):
        episode_signal(plain, "reward")


# ----------------------------------------------------------------- the buffer
def test_retire_spawn_and_cap_on_a_reward_table() -> None:
    src = _source()
    src.pool = [TaskStats("train", s) for s in (0, 1, 2)]
    t0, t1, t2 = (Task("train", s) for s in (0, 1, 2))
    table = {t0.id: [1, 1, 1, 1], t1.id: [0, 1, 0, 1], t2.id: [0, 0, 0, 0]}
    # round 1: t0 mastered (streak 1), t1 boundary → one variant, t2 dead (streak 1)
    m = src.observe([t0, t1, t2], _episodes(table, [t0, t1, t2]), seed=0)
    assert m == {
        "tasks/pool_size": 4.0,
        "tasks/boundary_frac": pytest.approx(1 / 3),
        "tasks/proposed": 1.0,
        "tasks/spawned": 1.0,
        "tasks/retired": 0.0,
        "tasks/distinct": 1.0,  # no seed went through draw(): the variant only
        "tasks/valid_rate": 1.0,
    }
    v1 = Task("train", 1001)
    assert [e.id for e in src.pool] == [t0.id, t1.id, t2.id, v1.id]
    assert src.pool[3].parent == t1.id
    # round 2: t0 and t2 reach k = 2 rounds and retire, then t1 and v1 (boundary) spawn
    table[v1.id] = [1, 0, 0, 0]
    m = src.observe([t0, t1, t2, v1], _episodes(table, [t0, t1, t2, v1]), seed=1)
    assert m == {
        "tasks/pool_size": 4.0,
        "tasks/boundary_frac": 0.5,
        "tasks/proposed": 2.0,
        "tasks/spawned": 2.0,
        "tasks/retired": 2.0,
        "tasks/distinct": 3.0,
        "tasks/valid_rate": 1.0,
    }
    assert [e.id for e in src.pool] == [t1.id, v1.id, "train/1002", "train/1003"]
    # round 3: all four on the boundary, but the buffer is at max_pool = 4
    pool = [e.task for e in src.pool]
    table.update({"train/1002": [0, 1], "train/1003": [1, 0]})
    m = src.observe(pool, _episodes(table, pool), seed=2)
    assert m["tasks/spawned"] == 0.0 and m["tasks/pool_size"] == 4.0
    assert m["tasks/boundary_frac"] == 1.0
    e1 = src.pool[0]
    assert (e1.rounds, e1.mean_sum, e1.last_mean, e1.last_var) == (3, 1.5, 0.5, 0.25)
    assert (src.spawned_total, src.retired_total) == (3, 2)


def test_a_broken_streak_does_not_retire() -> None:
    src = _source(retire_after=2, spawn=0)
    t = Task("train", 0)
    src.pool = [TaskStats("train", 0)]
    for rewards, retired in (([1, 1], 0), ([1, 0], 0), ([1, 1], 0), ([1, 1], 1)):
        m = src.observe([t], _episodes({t.id: rewards}, [t]), seed=0)
        assert m["tasks/retired"] == retired


def test_draw_refills_with_fresh_seeds_and_returns_distinct_tasks() -> None:
    src = _source()
    tasks = src.draw(0, seed=123)
    assert len(tasks) == 2 and len({t.id for t in tasks}) == 2
    assert len(src.pool) == 3 and all(0 <= e.seed < 10 for e in src.pool)
    first = {e.seed for e in src.pool}
    src.pool = src.pool[:1]  # two retired
    src.draw(1, seed=5)
    assert len(src.pool) == 3
    assert {e.seed for e in src.pool[1:]}.isdisjoint(first)  # never-used seeds
    assert src.used_seeds == first | {e.seed for e in src.pool}


def test_boundary_tasks_are_drawn_more_often() -> None:
    src = _source(seed_pool=4, max_pool=4, boundary_weight=9.0)
    src.pool = [TaskStats("train", s, rounds=1) for s in range(4)]
    src.pool[2].boundary = True
    counts = np.zeros(4)
    for s in range(300):
        for t in src.draw(0, seed=s):
            counts[t.seed] += 1
    # P(task 2 in a draw of 2 from weights 1,1,9,1) = 0.75 + 0.25 * 0.9 = 0.975
    assert counts[2] / 300 == pytest.approx(0.975, abs=0.04)


def test_state_round_trip_continues_identically() -> None:
    def play(src: RodsSource, rounds: range) -> list:
        out = []
        for it in rounds:
            tasks = src.draw(it, seed=it)
            table = {t.id: [float((t.seed + i) % 3 == 0) for i in range(4)] for t in tasks}
            out.append(([t.id for t in tasks], src.observe(tasks, _episodes(table, tasks), it)))
        return out

    a, b = _source(max_pool=8), _source(max_pool=8)
    play(a, range(3))
    play(b, range(3))
    saved = json.loads(json.dumps(a.state_dict()))
    c = _source(max_pool=8)
    c.load_state_dict(saved)
    c._make_env = lambda: a._env  # the env's own variant counter continues too
    c._env = None
    assert c.state_dict() == a.state_dict()
    assert play(c, range(3, 8)) == play(b, range(3, 8))


def test_fixed_is_the_uniform_draw_of_the_iteration_seed() -> None:
    src = make_task_source("fixed", {}, TaskSourceContext(100, 5))
    ids = np.random.default_rng(42).choice(100, size=5, replace=False)
    assert src.draw(0, 42) == [Task.make("train", int(i)) for i in ids]
    assert src.observe([], [], 0) == {} and src.state_dict() == {}


def test_bad_params_say_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="Accepted: seed_pool, max_pool"):
        task_source_params("rods", {"pool": 3})
    with pytest.raises(ValueError, match="max_pool=2 must be ≥ seed_pool=3"):
        task_source_params("rods", {"seed_pool": 3, "max_pool": 2})
    with pytest.raises(ValueError, match="signal must be one of"):
        task_source_params("rods", {"signal": "reward"})
    with pytest.raises(ValueError, match="has no similar_task"):
        RodsSource(TaskSourceContext(10, 2, GuessEnv), RodsParams(3, synthesiser="similar"))
    with pytest.raises(ConfigError, match=r"tasks\.params\.seed_pool=4 must be between"):
        load_config("grpo", ["tasks.source=rods", "tasks.params={seed_pool: 4}"])
    with pytest.raises(ConfigError, match=r"lacks; implement it, use synthesiser=rules or set"):
        load_config(
            "grpo",
            [
                "env.name=examples.custom_env:GuessEnv",
                "tasks.source=rods",
                "tasks.params={synthesiser: similar}",
            ],
        )
    load_config("grpo", ["env.name=examples.custom_env:GuessEnv", "tasks.source=rods"])
    with pytest.raises(ConfigError, match="unknown task source 'rod'"):
        load_config("grpo", ["tasks.source=rod"])


# ----------------------------------------------------------------- env variants
@pytest.mark.parametrize(
    ("env", "kind"),
    [
        (ShopEnv("multi"), lambda e: e.goals[0].category),
        (ToolsEnv("hard"), lambda e: e.family),
        (ToolsEnv("default"), lambda e: e.family),
    ],
)
def test_env_variants_keep_the_structure_with_new_entities(env: object, kind: object) -> None:
    rng = random.Random(7)
    for seed in range(20):
        task = Task.make("train", seed)
        env.reset(task)
        want, text = kind(env), env.instruction()
        variant = env.similar_task(task, rng)
        assert variant.split == "train"
        assert VARIANT_SEED_OFFSET <= variant.seed < HELDOUT_SEED_OFFSET
        env.reset(variant)
        assert kind(env) == want and env.instruction() != text


# ----------------------------------------------------------------- in training
SMALL = [
    *SMALL_RUN,
    "env.name=test_tasks_rods:VariantGuessEnv",
    "rollout.train_tasks=50",
    "tasks.source=rods",
    "tasks.params={seed_pool: 6, max_pool: 10, retire_after: 1, tau_v: 0.5}",
    "eval.episodes=8",
    "train.checkpoint_every=2",
]


def _rods_run(tmp: Path, name: str, recipe: str, iterations: int, extra: list[str] = ()):
    sys.modules.setdefault("test_tasks_rods", sys.modules[__name__])
    over = [*SMALL, *extra, f"train.iterations={iterations}"]
    cfg = load_config(recipe, [*over, f"train.runs_dir={tmp}", f"train.name={name}"])
    return train(cfg, quiet=True)


def _stable(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in metrics]


@pytest.mark.slow
def test_rods_resumes_exactly(tmp_path: Path) -> None:
    full = _rods_run(tmp_path, "full", "grpo", 4)
    part = _rods_run(tmp_path, "part", "grpo", 2)
    resumed = train(
        load_config(
            "grpo",
            [*SMALL, "train.iterations=4", f"train.runs_dir={tmp_path}", "train.name=part"],
        ),
        resume=part.run_dir,
        quiet=True,
    )
    assert _stable(resumed.metrics) == _stable(full.metrics)
    assert sum(r["tasks/spawned"] for r in full.metrics) > 0  # the buffer did move
    assert sum(r["tasks/retired"] for r in full.metrics) > 0
    saved = json.loads((full.run_dir / "checkpoints" / "step_4" / "state.json").read_text())
    assert len(saved["task_source"]["pool"]) == full.metrics[-1]["tasks/pool_size"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "extra"),
    [("grpo", []), ("gigpo", []), ("tsbpo", []), ("axpo", [])],
)
def test_rods_works_with_samplers_and_estimators(
    tmp_path: Path, recipe: str, extra: list[str]
) -> None:
    res = _rods_run(tmp_path, recipe, recipe, 2, extra)
    for r in res.metrics:
        # seed_pool 6 less this round's retirements (at most its 4 tasks), cap 10
        assert 6 - 4 <= r["tasks/pool_size"] <= 10
        assert 0 <= r["tasks/boundary_frac"] <= 1
        assert r["tasks/spawned"] >= 0 and r["tasks/retired"] >= 0


def test_distinct_counts_every_seed_once_across_reuse() -> None:
    src = _source(spawn=0, retire_after=1)  # 10 training seeds, a buffer of 3
    counts = []
    for it in range(12):
        tasks = src.draw(it, seed=it)
        table = {t.id: [1.0, 1.0] for t in tasks}  # every group mastered: retired at once
        counts.append(src.observe(tasks, _episodes(table, tasks), seed=it)["tasks/distinct"])
    assert counts == sorted(counts) and counts[-1] == 10.0  # never falls, tops at 10
    assert len(src.used_seeds) < 10  # the buffer did start reusing seeds
