"""Env workers in Ray actors (``rollout.env_workers``, :mod:`credo.rollout.ray_envs`) on a
real local Ray: the same samples as in process, a killed or hung actor replaced without
changing them, a call that keeps failing fails its episode as an env error.

One local Ray for the module (``num_cpus=2``; the env actors reserve 0 CPUs, so nothing
waits for a CPU that does not exist), shut down in the fixture's ``finally``. Every wait
in credo's pool is bounded (``env_timeout_s``, the actor start limit)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import ray  # the `ray` extra: CI installs it, nothing here is skipped
import torch

from credo.envs import Task
from credo.envs.shop import ShopEnv
from credo.policy import Generation, SamplingParams, build_word_tokenizer
from credo.rollout import PlainRenderer, sample
from credo.rollout.envguard import EnvErrorLog, env_guard
from credo.rollout.ray_envs import EnvPool, RemoteEnv, require_ray
from credo.rollout.render import PLAIN_WORDS
from credo.rollout.sampler import SamplerContext, make_sampler_state
from credo.rollout.tree import TreeParams
from credo.train.config import ConfigError, load_config
from credo.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.custom_env import GuessEnv  # noqa: E402

from ray_fault_envs import FaultyGuess  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier: a local Ray and its actors

WAIT_S = 60.0  # the longest any test here waits on Ray directly


@pytest.fixture(scope="module")
def local_ray() -> Any:
    """A local Ray with 2 CPUs whose workers can import credo, ``examples`` and this
    module (the env classes below); shut down however the tests end."""
    paths = [str(ROOT / "src"), str(ROOT), str(ROOT / "tests")]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
    try:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="error", log_to_driver=False)
        yield ray
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


class DrawPolicy:
    """A policy whose every answer is drawn from the sampling generator (so a changed
    order of draws would change the samples): ``guess[n]``, n uniform in 1..8, with the
    draw's log-probability. ``on_generate(call_index)`` runs before each batch."""

    def __init__(self, actions: list[str], on_generate: Any = None) -> None:
        self.tokenizer = build_word_tokenizer(
            [*GuessEnv().vocabulary(), *ShopEnv().vocabulary(), *PLAIN_WORDS]
        )
        self.actions, self.on_generate, self.calls = actions, on_generate, 0

    def generate(self, prompts: list, sampling: Any, generator: Any = None) -> list[Generation]:
        if self.on_generate is not None:
            self.on_generate(self.calls)
        self.calls += 1
        out = []
        for _ in prompts:
            k = int(torch.randint(len(self.actions), (1,), generator=generator))
            text = self.actions[k]
            ids = [
                *self.tokenizer.encode(text, add_special_tokens=False),
                self.tokenizer.eos_token_id,
            ]
            lp = torch.full((len(ids),), -float(torch.log(torch.tensor(len(self.actions)))))
            out.append(Generation(ids, lp, text, True))
        return out


GUESSES = [f"guess[{n}]" for n in range(1, 9)]
SHOP = ["search[red wool scarf]", "click[1]", "click[2]", "choose[m]", "buy", "back"]


def _rollouts(
    make_env: Any,
    *,
    sampler: str = "group",
    actions: list[str] = GUESSES,
    on_generate: Any = None,
    tasks: int = 4,
    size: int = 3,
) -> Any:
    policy = DrawPolicy(actions, on_generate)
    ctx = SamplerContext(
        policy,  # type: ignore[arg-type]
        PlainRenderer(policy.tokenizer),
        make_env,
        SamplingParams(),
        6,
        generator=torch.Generator().manual_seed(7),
        choices=torch.Generator().manual_seed(3),
    )
    params = TreeParams(allocator="uniform", rounds=2) if sampler == "tree" else None
    state = make_sampler_state(sampler, params) if params is not None else None
    return sample(
        sampler,
        ctx,
        [Task.make("train", i) for i in range(tasks)],
        group_size=size,
        params=params,
        state=state,
    )


def _same(a: Any, b: Any) -> None:
    """Two rollout results hold the same forest and episodes, value for value."""
    for f in dataclasses.fields(a.forest):
        if f.name == "_episodes":
            continue
        x, y = getattr(a.forest, f.name), getattr(b.forest, f.name)
        assert type(x) is type(y), f.name
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), f.name
        elif isinstance(x, dict):
            assert x.keys() == y.keys(), f.name
            for k in x:
                xs, ys = x[k], y[k]
                if isinstance(xs, torch.Tensor):
                    assert torch.equal(xs, ys), (f.name, k)
                else:
                    assert len(xs) == len(ys) and all(
                        (torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v)
                        for u, v in zip(xs, ys)
                    ), (f.name, k)
        else:
            assert len(x) == len(y) and all(
                (torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v) for u, v in zip(x, y)
            ), f.name
    assert [(e.task_id, e.ret, e.success, e.error) for e in a.episodes] == [
        (e.task_id, e.ret, e.success, e.error) for e in b.episodes
    ]
    assert a.env_steps == b.env_steps and a.generated_tokens == b.generated_tokens


def test_pool_gives_the_in_process_samples_groups_and_trees(local_ray: Any) -> None:
    pool = EnvPool(GuessEnv, 2, timeout_s=WAIT_S)
    try:
        _same(_rollouts(pool.make), _rollouts(GuessEnv))
        # trees: snapshots before every step and restores (branches) go through the actors;
        # shop adds abstract state keys and progress, read in the same round trip
        shop = EnvPool(ShopEnv, 2, timeout_s=WAIT_S)
        try:
            _same(
                _rollouts(shop.make, sampler="tree", actions=SHOP, tasks=2, size=4),
                _rollouts(ShopEnv, sampler="tree", actions=SHOP, tasks=2, size=4),
            )
        finally:
            shop.close()
        env = pool.make()
        assert isinstance(env, RemoteEnv) and env.max_turns == 4  # attributes: local copy
        assert env.vocabulary() == GuessEnv().vocabulary()
        assert pool.replacements == 0
    finally:
        pool.close()


def test_actor_killed_mid_iteration_is_replaced_and_samples_are_unchanged(local_ray: Any) -> None:
    pool = EnvPool(GuessEnv, 2, timeout_s=WAIT_S, retries=2)

    def kill(call: int) -> None:
        if call == 2:  # after two steps of every episode: both actors hold live episodes
            ray.kill(pool.actor(0), no_restart=True)

    try:
        faulted = _rollouts(pool.make, on_generate=kill)
        assert pool.replacements == 1
        _same(faulted, _rollouts(GuessEnv))
    finally:
        pool.close()


def test_hung_step_past_the_timeout_is_replaced_and_samples_are_unchanged(
    local_ray: Any, tmp_path: Path
) -> None:
    flag = tmp_path / "hang-once"
    flag.write_text("")
    woke = tmp_path / "woke"
    make = lambda: FaultyGuess(seed=1, turn=2, hang_s=WAIT_S, flag=str(flag), woke=str(woke))  # noqa: E731
    pool = EnvPool(make, 2, timeout_s=3.0, retries=2)
    try:
        faulted = _rollouts(pool.make)
        assert not flag.exists() and pool.replacements >= 1
        assert not woke.exists()  # the hang was cut short, not waited out
        _same(faulted, _rollouts(GuessEnv))
    finally:
        pool.close()


def test_retries_exhausted_fail_the_episode_as_an_env_error_and_the_run_goes_on(
    local_ray: Any, tmp_path: Path
) -> None:
    # task 1's first step hangs every time: its episode fails, task 0's is untouched
    make = lambda: FaultyGuess(seed=1, turn=1, hang_s=WAIT_S)  # noqa: E731
    pool = EnvPool(make, 2, timeout_s=2.0, retries=1)
    log = EnvErrorLog(tmp_path / "env_errors.jsonl", say=lambda line: None)
    try:
        with env_guard(step_timeout=0, log=log):
            res = _rollouts(pool.make, tasks=2, size=1)
        ok, failed = res.episodes
        assert failed.task_id == "train/1" and not failed.steps and not failed.success
        assert failed.error.startswith(
            "step: EnvWorkerError: step() failed 2 times: it ran longer than "
            "rollout.env_timeout_s=2 s"
        )
        assert ok.task_id == "train/0" and ok.error is None and ok.steps[-1].terminal
        assert pool.replacements >= 2  # one per try (more: a call slowed by a loaded machine)
        records = [json.loads(x) for x in (tmp_path / "env_errors.jsonl").read_text().splitlines()]
        assert [(r["task"], r["turn"], r["call"], r["phase"]) for r in records] == [
            ("train/1", 1, "step", "rollout")
        ]
        assert "rollout.env_retries=1" in records[0]["message"]
        # the pool goes on: the next iteration runs on the replaced actors
        again = _rollouts(pool.make, tasks=1, size=2)
        assert [e.error for e in again.episodes] == [None, None]
    finally:
        pool.close()


def _cfg(tmp: Path, name: str, *extra: str) -> Any:
    return load_config(
        "grpo",
        [
            "env.name=examples.custom_env:GuessEnv",
            "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
            "sft.enabled=false",
            "rollout.max_new_tokens=4",
            "rollout.tasks_per_iter=3",
            "rollout.group_size=3",
            "train.threads=1",
            "train.iterations=2",
            "eval.episodes=4",
            "rollout.env_timeout_s=20",
            *extra,
            f"train.runs_dir={tmp}",
            f"train.name={name}",
        ],
    )


def test_train_with_env_workers_equals_in_process(
    local_ray: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []  # env calls sent to actors, per batch
    execute = EnvPool.execute

    def spy(self: EnvPool, batch: list) -> None:
        calls.append(len(batch))
        execute(self, batch)

    monkeypatch.setattr(EnvPool, "execute", spy)
    metrics, sent = {}, {}
    for n in (0, 2):
        train(_cfg(tmp_path, f"w{n}", f"rollout.env_workers={n}"))
        sent[n], calls[:] = sum(calls), []
        lines = (tmp_path / f"w{n}" / "metrics.jsonl").read_text().splitlines()
        metrics[n] = [
            {k: v for k, v in json.loads(x).items() if not k.startswith(("time/", "perf/"))}
            for x in lines
        ]
    assert len(metrics[0]) == 2 and metrics[0] == metrics[2]
    # in process: no actor; 2 workers: every reset and step of both iterations went to one
    assert sent[0] == 0
    assert sent[2] == sum(m["rollout/env_steps"] for m in metrics[2]) + 2 * 3 * 3
    assert ray.is_initialized()  # the run did not shut down a Ray it did not start


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("rollout.env_workers=-1", "rollout.env_workers must be an integer ≥ 0, got -1"),
        ("rollout.env_retries=-1", "rollout.env_retries must be an integer ≥ 0, got -1"),
        ("rollout.env_timeout_s=0", "rollout.env_timeout_s must be a number of seconds > 0"),
        ("rollout.ray_address=''", "rollout.ray_address must be a Ray address"),
    ],
)
def test_bad_settings_fail_in_one_line(tmp_path: Path, setting: str, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        _cfg(tmp_path, "bad", setting)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_timeout_must_be_below_the_step_timeout(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, "bad", "rollout.env_workers=2", "rollout.env_timeout_s=90")
    assert str(info.value) == (
        "rollout.env_timeout_s=90 must be below rollout.step_timeout=60 (a hung worker is "
        "replaced before the episode times out)"
    )


def test_missing_ray_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ImportError) as info:
        require_ray()
    assert str(info.value).startswith("rollout.env_workers > 1 needs Ray, which is not installed")
    with pytest.raises(ConfigError) as cfg_info:
        _cfg(tmp_path, "noray", "rollout.env_workers=2")
    assert "rollout.env_workers=2 needs Ray" in str(cfg_info.value)
    assert "\n" not in str(cfg_info.value)
    _cfg(tmp_path, "inproc", "rollout.env_workers=1")  # 0 and 1 need no Ray
