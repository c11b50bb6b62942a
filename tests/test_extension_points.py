"""A new teacher route, a new branching sampler and a new part of the run are each one
definition plus its registration, made here, outside the package: the config names them,
the run asks their declarations, and a training iteration runs them with no change to
the loop."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import credo.train.run as run_module
from credo.rollout import SAMPLERS, TreeParams, register_sampler, sample_trees
from credo.teachers import ROUTES, register_route
from credo.train.config import ConfigError, load_config
from credo.train.iteration import run_iteration
from credo.train.parts import (
    PARTS,
    IterationData,
    Part,
    PartContext,
    Unsharded,
    check_sharded,
    register_part,
)
from credo.train.parts import base as parts_base
from credo.train.run import build_run
from credo.train.state import TrainState
from small_run import SMALL

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: A short iteration from the untrained model (no warm start): 4 tasks × 4 episodes.
SHORT = [*SMALL, "sft.enabled=false", "train.iterations=1"]


def _one_iteration(overrides: list[str], tmp_path: Path) -> tuple[TrainState, dict[str, Any]]:
    run = build_run(load_config("grpo", [*SHORT, *overrides]))
    try:
        state = TrainState.start(run, tmp_path, run.policy, None)
        return state, run_iteration(run, state, 0)
    finally:
        run.close()


# ------------------------------------------------------------------ a teacher route
@pytest.fixture
def bonus_route() -> Iterator[list[int]]:
    """``teacher.route: test_bonus``: half a point per step with a teacher signal."""
    seen: list[int] = []

    @register_route("test_bonus")
    def test_bonus(lesson: Any, x: Any) -> None:
        seen.append(len(x.batch))
        lesson.row_reward = 0.5 * x.row_mask.float()

    yield seen
    ROUTES.unregister("test_bonus")


def test_a_teacher_route_registered_outside_the_package_trains(
    bonus_route: list[int], tmp_path: Path
) -> None:
    state, record = _one_iteration(
        ["teacher.kind=ema", "teacher.route=test_bonus", "teacher.full=false"], tmp_path
    )
    assert bonus_route == [record["rollout/env_steps"]]  # once, on every policy row (step)
    assert record["teacher/reward_mean"] == pytest.approx(0.5)  # its reward, before credit
    assert record["teacher/coverage"] == 1.0
    assert state.parts.get("teacher") in state.parts.reward
    # the config check knows it like a built-in route
    with pytest.raises(ConfigError, match="Did you mean 'test_bonus'"):
        load_config("grpo", ["teacher.kind=ema", "teacher.route=test_bonu"])


# ------------------------------------------------------------------ a branching sampler
@pytest.fixture
def forked_sampler() -> Iterator[list[int]]:
    """``rollout.sampler: test_forked``: TSBPO's trees under another name, declared as a
    sampler that branches from env snapshots."""
    calls: list[int] = []

    @register_sampler("test_forked", params=TreeParams, branches=True)
    def sample_forked(
        ctx: Any, tasks: Any, *, group_size: int, params: Any = None, state: Any = None
    ) -> Any:
        calls.append(len(tasks))
        return sample_trees(ctx, tasks, group_size=group_size, params=params)

    yield calls
    SAMPLERS.unregister("test_forked")


def test_a_branching_sampler_registered_outside_the_package_trains(
    forked_sampler: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshots: list[bool] = []
    real = run_module.preflight

    def preflight(make: Any, **kw: Any) -> None:
        snapshots.append(kw["snapshots"])
        real(make, **kw)

    monkeypatch.setattr(run_module, "preflight", preflight)
    _, record = _one_iteration(["rollout.sampler=test_forked"], tmp_path)
    assert snapshots == [True]  # its declaration, not its name, asked for the snapshot check
    assert forked_sampler == [4]  # the iteration's 4 tasks went through it
    assert record["rollout/tree_roots"] > 0 and record["rollout/env_steps"] > 0
    assert record["credit/adv_abs_max"] >= 0.0
    _one_iteration([], tmp_path / "group")
    assert snapshots == [True, False]  # the group sampler does not branch


# ------------------------------------------------------------------ a part of the run
class Bonus(Part):
    """One point more on every step, before credit; it needs the frozen reference."""

    def __init__(self, ctx: PartContext) -> None:
        self.reference = ctx.reference
        self.updates = 0

    def reward(self, data: IterationData) -> None:
        data.forest = data.forest.with_rewards(data.forest.reward + 1.0)
        data.metrics["test/reward_mean"] = float(data.forest.reward.mean())

    def after_update(self, data: IterationData) -> None:
        self.updates += 1


@pytest.fixture
def bonus_part() -> Iterator[None]:
    register_part("test_bonus", needs={"reference"})(Bonus)
    yield
    PARTS.unregister("test_bonus")


def test_a_part_registered_outside_the_package_runs_in_its_stages(
    bonus_part: None, tmp_path: Path
) -> None:
    state, record = _one_iteration([], tmp_path)
    part = state.parts.get("test_bonus")
    assert isinstance(part, Bonus) and part.updates == 1
    assert part.reference is not None and state.reference is not None  # its declared need
    assert record["test/reward_mean"] >= 1.0  # the env's rewards (≥ 0 here) plus one
    assert state.parts.reward[-1] is part and state.parts.after_update[-1] is part
    assert part not in state.parts.transform  # it overrides reward and after_update only


@pytest.mark.parametrize("refuse", [False, True])
def test_a_part_declares_it_needs_the_whole_optimizer_state(
    refuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Declared at registration (``unsharded=``), not named by the trainer: on sharded state
    the part is left off with one line naming its setting, or the run is refused in one."""
    rule = Unsharded("objective.entropy_coef", "0", "it copies AdamW's moments", refuse=refuse)
    register_part("test_whole", when=lambda cfg: cfg.objective.entropy_coef > 0, unsharded=rule)(
        Bonus
    )
    try:
        cfg = load_config("grpo", ["optim.max_kl=null", "objective.entropy_coef=0.01"])
        assert "test_whole" in [s.name for s in parts_base._configured(cfg)]  # unsharded: built
        monkeypatch.setattr(parts_base.dp, "sharded", lambda: True)
        assert "test_whole" not in [s.name for s in parts_base._configured(cfg)]
        if refuse:
            with pytest.raises(ValueError, match=r"^objective.entropy_coef=0.01 \(test_whole\) "):
                check_sharded(cfg, "DeepSpeed ZeRO")
        else:
            assert check_sharded(cfg, "DeepSpeed ZeRO") == [
                "objective.entropy_coef=0.01 is off with DeepSpeed ZeRO: it copies AdamW's "
                "moments (objective.entropy_coef=0 silences this)"
            ]
        assert check_sharded(load_config("grpo", ["optim.max_kl=null"]), "ZeRO") == []
    finally:
        PARTS.unregister("test_whole")


def test_sero_is_refused_on_sharded_state_in_one_line() -> None:
    cfg = load_config("grpo", ["rollout.oracle_horizon=2"])
    with pytest.raises(ValueError, match=r"rollout.oracle_horizon=2 \(oracle_rows\) with acc"):
        check_sharded(cfg, "accelerate's FSDP")
