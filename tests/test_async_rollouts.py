"""Asynchronous rollouts (``rollout.staleness`` = k): iteration j is sampled by the
weights after max(0, j − k) updates while the trainer updates; what is in flight is
checkpointed and ``--resume`` continues exactly; bad settings are one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from credo.cli import main
from credo.envs.base import Task
from credo.policy.hf import HFPolicy
from credo.policy.tiny import TinyModelConfig, create_tiny_policy
from credo.rollout import RolloutResult
from credo.train.async_rollouts import AsyncRollouts
from credo.train.config import ConfigError, load_config
from credo.train.iteration import rollouts_of
from credo.train.run import build_run
from credo.train.state import TrainState
from small_run import SMALL, TINY_RUN


def _policy() -> HFPolicy:
    return create_tiny_policy(
        ["a", "b"], TinyModelConfig(hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8)
    )


def _set_version(policy: HFPolicy, v: int) -> None:
    """Mark the weights with a version number (every parameter filled with it)."""
    with torch.no_grad():
        for p in policy.model.parameters():
            p.fill_(float(v))


def _version(policy: HFPolicy) -> int:
    return int(next(policy.model.parameters()).flatten()[0].item())


class _Recorder:
    """A sampler that records which weights sampled which iteration, and the draws."""

    def __init__(self) -> None:
        self.sampled: dict[int, int] = {}
        self.draws: list[int] = []

    def draw(self, j: int) -> list[Task]:
        self.draws.append(j)
        return [Task("train", 100 + j)]

    def sample(self, policy: HFPolicy, tasks: list[Task], j: int) -> RolloutResult:
        assert tasks == [Task("train", 100 + j)]
        self.sampled[j] = _version(policy)
        return j  # type: ignore[return-value]  # stands for the rollout


def test_iteration_j_is_sampled_by_the_weights_after_j_minus_k_updates(tmp_path: Path) -> None:
    policy, rec, k, total = _policy(), _Recorder(), 2, 5
    queue = AsyncRollouts(k)
    draws_at: list[list[int]] = []
    for it in range(total):
        _set_version(policy, it)  # the weights after `it` updates
        before = len(rec.draws)
        tasks, rollout, version = queue.take(it, policy, total, draw=rec.draw, sample=rec.sample)
        draws_at.append(rec.draws[before:])
        assert rollout == it and tasks == [Task("train", 100 + it)]
        assert version == max(0, it - k)
    queue.close()
    # by hand: 0, 1, 2 with the warm start (version 0), then j - 2
    assert rec.sampled == {0: 0, 1: 0, 2: 0, 3: 1, 4: 2}
    # tasks are drawn in order, k ahead, also past the last iteration (never sampled):
    # a longer run draws the same, so a run extended on --resume continues exactly
    assert draws_at == [[0, 1, 2], [3], [4], [5], [6]]
    assert set(rec.sampled) == set(range(total))


def test_what_is_in_flight_is_checkpointed_and_sampled_again_on_resume(tmp_path: Path) -> None:
    policy, rec, k = _policy(), _Recorder(), 2
    queue = AsyncRollouts(k)
    for it in range(3):
        _set_version(policy, it)
        queue.take(it, policy, 3, draw=rec.draw, sample=rec.sample)
    queue.close()
    # after iteration 2 (3 done) in flight: 3 (version 1) and 4 (version 2)
    assert queue.state_dict(3)["flights"] == [
        {"iteration": 3, "version": 1, "tasks": [["train", 103, {}]]},
        {"iteration": 4, "version": 2, "tasks": [["train", 104, {}]]},
    ]
    queue.write(tmp_path, 3)
    assert sorted(p.name for p in (tmp_path / "async").iterdir()) == [
        "flights.json",
        "version_1",
        "version_2",
    ]
    _set_version(policy, 3)  # the resumed run's current weights
    again, rec2 = AsyncRollouts(k), _Recorder()
    again.load(tmp_path, policy)
    for it in (3, 4, 5):
        _set_version(policy, it)
        _, rollout, version = again.take(it, policy, 6, draw=rec2.draw, sample=rec2.sample)
        assert rollout == it and version == it - k
    again.close()
    assert rec2.sampled == {3: 1, 4: 2, 5: 3}  # the saved weights, then the new ones
    assert rec2.draws == [5, 6, 7]  # 3 and 4 come from the checkpoint, not drawn again
    with pytest.raises(ValueError, match=r"saved with rollout\.staleness=2; resume with the same"):
        AsyncRollouts(1).load(tmp_path, policy)


def test_a_sampler_error_reaches_the_trainer(tmp_path: Path) -> None:
    def broken(policy: HFPolicy, tasks: list[Task], j: int) -> RolloutResult:
        raise RuntimeError(f"env broke in iteration {j}")

    queue = AsyncRollouts(1)
    with pytest.raises(RuntimeError, match="env broke in iteration 0"):
        queue.take(0, _policy(), 3, draw=_Recorder().draw, sample=broken)
    queue.close()


def test_the_recorded_log_probs_are_the_stale_samplers(tmp_path: Path) -> None:
    """With k = 1 iteration 1 is sampled by the weights before the first update: its
    batch's log-probs (the sampler's, which TIS and KLPO read) are that policy's scores
    of the tokens, not the current weights'."""
    run = build_run(load_config("grpo", [*TINY_RUN, "rollout.staleness=1"]))
    try:
        state = TrainState.start(run, tmp_path, run.policy, None)
        warm = HFPolicy(__import__("copy").deepcopy(state.policy.model), state.policy.tokenizer)
        rollouts_of(run, state, 0)
        with torch.no_grad():  # an update: every weight moves
            for p in state.policy.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        state.iteration = 1
        _, rollout, version = rollouts_of(run, state, 1)
        assert version == 0
        batch = rollout.forest.to_batch(
            torch.zeros(rollout.forest.num_rows), pad_id=state.policy.pad_id
        )
        mask = batch.response_mask
        with torch.no_grad():
            by_warm = warm.score(batch.input_ids, batch.attention_mask).logprobs
            by_now = state.policy.score(batch.input_ids, batch.attention_mask).logprobs
        recorded = batch.old_logprobs
        assert mask.sum() > 0
        assert (recorded - by_warm)[mask].abs().max() < 1e-5
        assert (recorded - by_now)[mask].abs().max() > 1e-3
    finally:
        if state.rollouts is not None:
            state.rollouts.close()
        run.close()


def _stable(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


def test_an_async_run_resumes_exactly_also_past_its_planned_end(tmp_path: Path) -> None:
    """Three iterations in one go equal one, then a resume extended to three: the rollout
    in flight at the checkpoint (never sampled, since the first run ended) is sampled
    again by the weights it was taken with."""
    base = [*SMALL, "rollout.staleness=1", "eval.episodes=4", f"train.runs_dir={tmp_path}"]
    assert main(["train", *base, "train.iterations=3", "train.name=full", "--quiet"]) == 0
    assert main(["train", *base, "train.iterations=1", "train.name=part", "--quiet"]) == 0
    part, full = tmp_path / "part", tmp_path / "full"
    assert main(["train", "--resume", str(part), "train.iterations=3", "--quiet"]) == 0
    rows = _stable(full)
    assert _stable(part) == rows and len(rows) == 3
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    # there was signal to train on: mixed groups, non-zero advantages and gradients
    assert all(r["credit/zero_adv_frac"] < 1 and r["policy/grad_norm"] > 0 for r in rows)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.staleness=-1"], "rollout.staleness must be an integer ≥ 0"),
        (["rollout.staleness=1.5"], "rollout.staleness: expected an integer, got 1.5"),
        (
            ["rollout.staleness=1", "rollout.sampler=tree"],
            "rollout.staleness=1 needs a sampler without state across iterations; 'tree'",
        ),
        (
            ["rollout.staleness=1", "rollout.async_worker=process", "rollout.engine=vllm"],
            "rollout.async_worker=process needs an engine that samples with the trainer's own",
        ),
        (["rollout.async_worker=fork"], "rollout.async_worker must be thread or process"),
    ],
)
def test_bad_staleness_is_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("grpo", [*TINY_RUN, *overrides])


def test_the_process_worker_refuses_a_cuda_trainer() -> None:
    """(This machine has no CUDA, so the device check before it would speak first: the
    staleness check is called on a loaded config whose device is then set.)"""
    from credo.train.config.validate import _staleness

    cfg = load_config("grpo", [*TINY_RUN, "rollout.staleness=1", "rollout.async_worker=process"])
    cfg.model.device = "cuda:1"
    with pytest.raises(ConfigError, match=r"process samples in a fork .* CUDA does not allow"):
        _staleness(cfg)


def test_a_sync_checkpoint_is_not_resumed_asynchronously(tmp_path: Path) -> None:
    base = [*TINY_RUN, f"train.runs_dir={tmp_path}", "train.name=r", "train.iterations=1"]
    assert main(["train", *base, "--quiet"]) == 0
    queue = AsyncRollouts(1)
    step = tmp_path / "r" / "checkpoints" / "step_1"
    with pytest.raises(ValueError, match=r"saved without rollout\.staleness"):
        queue.load(step, _policy())


# ------------------------------------------------------------- the process worker
def _versioned(policy: HFPolicy, tasks: list[Task], j: int) -> RolloutResult:
    """Stands for the rollouts: which iteration, sampled by which weights."""
    return (j, _version(policy))  # type: ignore[return-value]


def test_the_process_worker_samples_iteration_j_with_the_weights_after_j_minus_k() -> None:
    """As the thread worker's test above, in a forked child: each version's weights are
    sent once and the child's copy samples with them."""
    policy, rec, k, total = _policy(), _Recorder(), 2, 5
    queue = AsyncRollouts(k, worker="process")
    try:
        for it in range(total):
            _set_version(policy, it)
            tasks, rollout, version = queue.take(
                it, policy, total, draw=rec.draw, sample=_versioned
            )
            assert tasks == [Task("train", 100 + it)]
            assert rollout == (it, max(0, it - k)) and version == max(0, it - k)
        assert queue._process is not None and queue._process._process.is_alive()
    finally:
        queue.close()
    assert queue._process is None


def _raises(policy: HFPolicy, tasks: list[Task], j: int) -> RolloutResult:
    raise RuntimeError(f"env broke in iteration {j}")


def _exits(policy: HFPolicy, tasks: list[Task], j: int) -> RolloutResult:
    import os

    os._exit(3)


def _records_an_env_error(policy: HFPolicy, tasks: list[Task], j: int) -> RolloutResult:
    from credo.rollout.envguard import record_env_error

    record_env_error(ValueError(f"bad move in {j}"), task=str(tasks[0].seed), turn=2)
    return j  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (_raises, r"env broke in iteration 0 \(in the rollout worker process"),
        (_exits, r"the rollout worker process exited \(code 3\) before sampling iteration 0"),
    ],
)
def test_the_process_workers_errors_reach_the_trainer(sample: Any, message: str) -> None:
    """An exception in the child reaches the trainer with its message; a child that
    dies is one line with its exit code."""
    queue = AsyncRollouts(1, worker="process")
    try:
        with pytest.raises(RuntimeError, match=message):
            queue.take(0, _policy(), 3, draw=_Recorder().draw, sample=sample)
    finally:
        queue.close()


def test_env_errors_met_in_the_process_worker_go_into_the_runs_log() -> None:
    from credo.rollout.envguard import EnvErrorLog, env_guard

    log = EnvErrorLog(None, say=lambda line: None)
    queue = AsyncRollouts(1, worker="process")
    try:
        with env_guard(log=log):
            for it in range(2):
                queue.take(it, _policy(), 2, draw=_Recorder().draw, sample=_records_an_env_error)
                assert log.count == it + 1  # iteration it's error, when its rollouts arrive
    finally:
        queue.close()
    assert [(r.task, r.turn, r.message) for r in log.records] == [
        ("100", 2, "ValueError: bad move in 0"),
        ("101", 2, "ValueError: bad move in 1"),
    ]


@pytest.mark.slow
def test_the_process_worker_gives_the_thread_workers_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run with the worker in a process: metric for metric the thread's (the
    same weights, tasks and random streams sample the same rollouts), with signal."""
    from credo.train import async_rollouts

    submitted: list[int] = []
    submit = async_rollouts.ProcessWorker.submit

    def counting(self: async_rollouts.ProcessWorker, flight: async_rollouts.InFlight) -> None:
        submitted.append(flight.iteration)
        submit(self, flight)

    monkeypatch.setattr(async_rollouts.ProcessWorker, "submit", counting)
    base = [*SMALL, "rollout.staleness=1", "eval.episodes=4", f"train.runs_dir={tmp_path}"]
    for worker in ("thread", "process"):
        args = [*base, "train.iterations=3", f"rollout.async_worker={worker}"]
        assert main(["train", *args, f"train.name={worker}", "--quiet"]) == 0
        assert submitted == ([] if worker == "thread" else [0, 1, 2])
    rows = _stable(tmp_path / "thread")
    assert _stable(tmp_path / "process") == rows and len(rows) == 3
    assert all(r["credit/zero_adv_frac"] < 1 and r["policy/grad_norm"] > 0 for r in rows)
