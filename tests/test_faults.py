"""Fault injection: faulty envs, kills at every write point, signals, concurrent runs.

Each test reproduces one item of issue 17 (the probe table) and failed before its fix.

- Kills at exact write points are simulated by raising :class:`Killed` (a
  ``BaseException``, so no ``except Exception`` in credo swallows it) from inside the
  write path; one case is a real ``SIGKILL`` of a subprocess, one a real SIGTERM. After
  each, ``--resume`` must give the metrics, the weights and the optimizer state of an
  uninterrupted run, bit for bit.
- Faulty envs (:class:`FaultyEnv`: raises, hangs, returns a NaN reward or a non-string
  observation on chosen calls) must fail their own episode, be written to
  ``env_errors.jsonl`` and shown, and never hide behind a downstream error.

Runs use the small ``GuessEnv`` config of ``tests/test_train_golden.py`` (real signal:
the warm start solves some tasks and not others), four iterations so that at least two
follow every resume point; the warm start is trained once per session (the session's
cache) and shared by every run here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from safetensors.torch import load_file

import credo
from credo.envs.base import ENVS, register_env
from credo.train.config import load_config
from credo.train.loop import train
from small_run import SMALL

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.custom_env import GuessEnv  # noqa: E402

ITERATIONS = 4
CREDO_SRC = str(Path(credo.__file__).resolve().parents[1])
VOLATILE = ("time/", "perf/")


class Killed(BaseException):
    """A simulated ``kill -9``: nothing after the raise point runs (``finally`` blocks
    aside, which a real kill skips too, but which only release in-memory resources)."""


def _cfg(tmp: Path, name: str, *extra: str) -> Any:
    return load_config(
        "grpo",
        [
            *SMALL,
            f"train.iterations={ITERATIONS}",
            "train.checkpoint_every=1",
            *extra,
            f"train.runs_dir={tmp}",
            f"train.name={name}",
        ],
    )


def _stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in records]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final_policy" / "model.safetensors"))


def _optimizer(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step_{ITERATIONS}" / "optimizer.safetensors"))


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run (it also trains the shared warm start)."""
    tmp = tmp_path_factory.mktemp("reference")
    res = train(_cfg(tmp, "ref"), quiet=True)
    assert res.iterations == ITERATIONS and res.final is not None
    rates = [r["rollout/success_rate"] for r in res.metrics]
    assert any(0 < x < 1 for x in rates)  # real signal: some groups have advantages
    return {
        "metrics": _stable(res.metrics),
        "weights": _weights(res.run_dir),
        "optimizer": _optimizer(res.run_dir),
        "final": res.final.success_rate,
        "run_dir": res.run_dir,
    }


def _resume_matches(reference: dict[str, Any], run_dir: Path, cfg: Any) -> None:
    """Resume ``run_dir`` to the end; metrics, weights and optimizer state must equal the
    reference run's."""
    res = train(cfg, resume=run_dir, quiet=True)
    assert not res.interrupted
    assert _stable(res.metrics) == reference["metrics"]
    assert [r["iteration"] for r in res.metrics] == list(range(ITERATIONS))
    assert _same_tensors(_weights(run_dir), reference["weights"])
    assert _same_tensors(_optimizer(run_dir), reference["optimizer"])
    assert res.final is not None and res.final.success_rate == reference["final"]
    leftovers = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def _kill_on(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str, when: Any) -> None:
    """Make ``obj.name(*args)`` raise :class:`Killed` once ``when(*args)`` is true (the
    call itself does not happen), and behave normally otherwise."""
    real = getattr(obj, name)
    fired = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not fired and when(*args):
            fired.append(args)
            raise Killed(f"{name}{args}")
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, wrapper)


def _named(path: Any, fragment: str) -> bool:
    return fragment in os.fspath(path)


# --------------------------------------------------------------------------- crash/resume

KILL_POINTS = {
    # a checkpoint's files: the optimizer moments of step_2 (policy already written)
    "checkpoint-files": lambda mp: _kill_on(
        mp,
        __import__("credo.train.checkpoint", fromlist=["x"]),
        "save_file",
        lambda tensors, path: _named(path, "step_2") and "optimizer" in path,
    ),
    # step_2 complete in its temporary folder (state.json written), before its rename
    "checkpoint-rename": lambda mp: _kill_on(
        mp, os, "replace", lambda src, dst: Path(dst).name == "step_2"
    ),
    # step_2 renamed into place, `latest` not yet rewritten
    "latest-marker": lambda mp: _kill_on(
        mp,
        os,
        "replace",
        lambda src, dst: Path(dst).name == "latest" and (Path(dst).parent / "step_2").exists(),
    ),
    # metrics: a torn line in the middle of iteration 2's record
    "metrics-append": None,
    # pruning step_1 after step_3 is written: killed halfway through the deletion
    "prune": None,
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_kill_at_write_point_then_resume_is_identical(
    point: str, reference: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17 items 7, 9, 11 and the fault-injection suite: a kill at each write point
    of a checkpoint, of ``latest``, of ``metrics.jsonl`` and of pruning, then ``--resume``:
    metrics, weights and optimizer state equal an uninterrupted run's."""
    from credo.train import checkpoint as ckpt
    from credo.train import logging as train_logging

    cfg = _cfg(tmp_path, point)
    if point == "metrics-append":
        real_write = train_logging.MetricsLog.write

        def torn(self: Any, record: dict) -> None:
            if record["iteration"] == 2:
                with self.path.open("a") as fh:
                    fh.write(json.dumps(record)[:100])
                raise Killed("metrics")
            real_write(self, record)

        monkeypatch.setattr(train_logging.MetricsLog, "write", torn)
    elif point == "prune":
        real_rmtree = ckpt.shutil.rmtree

        def half(path: Any, *args: Any, **kwargs: Any) -> None:
            if "step_1" in Path(path).name and (Path(path) / "policy").exists():
                real_rmtree(Path(path) / "policy")  # half deleted
                raise Killed("prune")
            real_rmtree(path, *args, **kwargs)

        monkeypatch.setattr(ckpt.shutil, "rmtree", half)
    else:
        KILL_POINTS[point](monkeypatch)
    with pytest.raises(Killed):
        train(cfg, quiet=True)
    monkeypatch.undo()
    for step in (tmp_path / point / "checkpoints").glob("step_*"):  # no half checkpoint
        assert (step / "policy" / "model.safetensors").exists(), step
    _resume_matches(reference, tmp_path / point, cfg)


@pytest.mark.slow
def test_resume_before_the_first_checkpoint_does_not_duplicate_metrics(
    reference: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 6: killed twice before the first checkpoint (``checkpoint_every=10``), each
    resume starts over and ``metrics.jsonl`` ends with one row per iteration."""
    from credo.train import iteration as iteration_module

    cfg = _cfg(tmp_path, "early", "train.checkpoint_every=10")
    real = iteration_module.policy_update
    for kill_at in (2, 3):

        def killing(ctx, batch, *, iteration, generator, kill_at=kill_at):  # type: ignore[no-untyped-def]
            if iteration == kill_at:
                raise Killed(f"iteration {iteration}")
            return real(ctx, batch, iteration=iteration, generator=generator)

        monkeypatch.setattr(iteration_module, "policy_update", killing)
        with pytest.raises(Killed):
            train(cfg, resume=tmp_path / "early" if kill_at == 3 else None, quiet=True)
        rows = (tmp_path / "early" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(r)["iteration"] for r in rows] == list(range(kill_at))
    monkeypatch.undo()
    _resume_matches(reference, tmp_path / "early", cfg)


@pytest.mark.slow
def test_kill_while_resume_rewrites_config_and_metrics(
    reference: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 9: a kill while a resume rewrites ``metrics.jsonl`` (or ``config.yaml``)
    leaves the previous complete file, and the next resume continues exactly."""
    from credo.train import iteration as iteration_module

    cfg = _cfg(tmp_path, "rewrite")
    real = iteration_module.policy_update

    def killing(ctx, batch, *, iteration, generator):  # type: ignore[no-untyped-def]
        if iteration == 2:
            raise Killed("iteration 2")
        return real(ctx, batch, iteration=iteration, generator=generator)

    monkeypatch.setattr(iteration_module, "policy_update", killing)
    with pytest.raises(Killed):
        train(cfg, quiet=True)
    monkeypatch.undo()
    run = tmp_path / "rewrite"
    config_before = (run / "config.yaml").read_text()
    metrics_before = (run / "metrics.jsonl").read_text()
    assert len(metrics_before.splitlines()) == 2
    for name in ("metrics.jsonl", "config.yaml"):
        _kill_on(monkeypatch, os, "replace", lambda src, dst, name=name: Path(dst).name == name)
        cfg_changed = cfg if name == "metrics.jsonl" else _cfg(tmp_path, "rewrite", "eval.seed=7")
        with contextlib.suppress(Killed):
            train(cfg_changed, resume=run, quiet=True)
        monkeypatch.undo()
        assert (run / "config.yaml").read_text() == config_before
        assert (run / "metrics.jsonl").read_text() == metrics_before
    _resume_matches(reference, run, cfg)


@pytest.mark.slow
def test_real_sigkill_of_a_subprocess_then_resume_is_identical(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    """A real ``kill -9`` (the process kills itself as step_3 is renamed into place):
    the resumed run equals the uninterrupted one."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        sys.path[:0] = [{CREDO_SRC!r}, {str(ROOT)!r}]
        import torch
        torch.set_num_threads(1)
        from credo.train.config import load_config
        from credo.train.loop import train
        real = os.replace
        def replace(src, dst):
            if Path(dst).name == "step_3":
                os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst)
        os.replace = replace
        train(load_config("grpo", OVERRIDES), quiet=True)
        """
    )
    overrides = [
        *SMALL,
        f"train.iterations={ITERATIONS}",
        f"train.runs_dir={tmp_path}",
        "train.name=sigkill",
    ]
    script = script.replace("OVERRIDES", repr(overrides))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=os.environ
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run = tmp_path / "sigkill"
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert [n for n in names if n.startswith("step_")] == ["step_1", "step_2"]
    assert any(n.startswith(".step_3.") for n in names)  # the killed save's temporary folder
    _resume_matches(reference, run, _cfg(tmp_path, "sigkill"))


@pytest.mark.slow
def test_sigterm_stops_like_ctrl_c_and_resume_is_identical(
    reference: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Item 12: SIGTERM finishes the iteration, saves a checkpoint, prints the resume
    hint (also with ``quiet``), and the resume is exact; one save per step (item 8: a
    stop at a checkpoint boundary saves once)."""
    from credo.train import iteration as iteration_module
    from credo.train import state as state_module

    real = iteration_module.policy_update
    saves: list[int] = []
    real_save = state_module.save_checkpoint

    def counting_save(run_dir, iteration, *args, **kwargs):  # type: ignore[no-untyped-def]
        saves.append(iteration)
        return real_save(run_dir, iteration, *args, **kwargs)

    def terminating(ctx, batch, *, iteration, generator):  # type: ignore[no-untyped-def]
        if iteration == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends
        return real(ctx, batch, iteration=iteration, generator=generator)

    monkeypatch.setattr(iteration_module, "policy_update", terminating)
    monkeypatch.setattr(state_module, "save_checkpoint", counting_save)
    cfg = _cfg(tmp_path, "term", "train.checkpoint_every=2")
    stopped = train(cfg, quiet=True)
    assert stopped.interrupted and stopped.iterations == 2
    assert saves == [2]  # the stop fell on a checkpoint boundary: saved once
    err = capsys.readouterr().err
    assert f"credo train --resume {tmp_path / 'term'}" in err
    monkeypatch.undo()
    _resume_matches(reference, tmp_path / "term", cfg)


def test_ctrl_c_during_set_up_or_warm_start_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 12: Ctrl-C during the warm start gives one line with the resume command and
    no traceback (also with ``quiet``); the folder can then be resumed."""
    from credo.train import loop

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "start_policy", interrupted)
    res = train(_cfg(tmp_path, "setup", "train.iterations=1"), quiet=True)
    assert res.interrupted and res.iterations == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"credo train --resume {tmp_path / 'setup'}" in err[0]
    monkeypatch.setattr(loop, "build_run", interrupted)
    res = train(_cfg(tmp_path, "setup2", "train.iterations=1"), quiet=True)
    assert res.interrupted
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted during set-up" in err[0]


def test_tensorboard_history_survives_resume(
    reference: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 10: after a resume TensorBoard still shows every iteration's scalars, at the
    env steps an uninterrupted run logged them."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from credo.train import iteration as iteration_module

    real = iteration_module.policy_update

    def killing(ctx, batch, *, iteration, generator):  # type: ignore[no-untyped-def]
        if iteration == 3:
            raise Killed("iteration 3")
        return real(ctx, batch, iteration=iteration, generator=generator)

    cfg = _cfg(tmp_path, "tb")
    monkeypatch.setattr(iteration_module, "policy_update", killing)
    with pytest.raises(Killed):
        train(cfg, quiet=True)
    monkeypatch.undo()
    train(cfg, resume=tmp_path / "tb", quiet=True)

    def scalars(run_dir: Path) -> list[tuple[int, float]]:
        acc = EventAccumulator(str(run_dir / "tensorboard"))
        acc.Reload()
        return [(e.step, e.value) for e in acc.Scalars("rollout/success_rate")]

    expected = [
        (r["rollout/env_steps_total"], r["rollout/success_rate"]) for r in reference["metrics"]
    ]
    got = scalars(tmp_path / "tb")
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert all(math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(got, expected))


# ------------------------------------------------------------------------------ checkpoints


class _Policy:
    def save(self, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_text("w")


def test_a_leftover_tmp_checkpoint_is_never_parsed(tmp_path: Path) -> None:
    """Item 7: a ``step_N.tmp`` with its ``state.json`` (a kill before the rename, as
    older versions named it) is not a checkpoint and does not break the fallback."""
    from credo.train.checkpoint import latest_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, 1, _Policy(), None, {})
    tmp = tmp_path / "checkpoints" / "step_2.tmp"
    tmp.mkdir()
    (tmp / "state.json").write_text("{}")
    (tmp_path / "checkpoints" / "latest").unlink()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_1"
    save_checkpoint(tmp_path, 2, _Policy(), None, {})
    assert not tmp.exists()  # leftovers are cleaned by the next save


def test_replacing_a_checkpoint_keeps_it_until_the_new_one_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 8: re-saving ``step_N`` never deletes the complete one first; a kill between
    moving it aside and renaming the new one leaves it restorable."""
    from credo.train.checkpoint import clean_partial, latest_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, 3, _Policy(), None, {"mark": "old"}, keep=1)
    _kill_on(
        monkeypatch,
        os,
        "replace",
        lambda src, dst: Path(dst).name == "step_3" and ".step_3." in Path(src).name,
    )
    with pytest.raises(Killed):
        save_checkpoint(tmp_path, 3, _Policy(), None, {"mark": "new"}, keep=1)
    monkeypatch.undo()
    clean_partial(tmp_path)
    path = latest_checkpoint(tmp_path)
    assert path is not None and json.loads((path / "state.json").read_text())["mark"] == "old"
    save_checkpoint(tmp_path, 3, _Policy(), None, {"mark": "new"}, keep=1)
    path = latest_checkpoint(tmp_path)
    assert json.loads((path / "state.json").read_text())["mark"] == "new"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_3"]


# ------------------------------------------------------------------------------ concurrency


def test_a_second_run_in_the_same_folder_is_refused(tmp_path: Path) -> None:
    """Item 13: a run whose folder is locked by a live process stops at once, naming it;
    a lock left by a dead process (``kill -9``) is taken over."""
    from credo.utils.lock import RunLock, RunLocked

    run = tmp_path / "same"
    run.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from credo.utils.lock import RunLock; "
            f"RunLock(Path({str(run)!r})).acquire(); print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLocked, match=f"process {holder.pid}"):
            train(_cfg(tmp_path, "same", "sft.enabled=false", "train.iterations=1"), quiet=True)
        assert not (run / "metrics.jsonl").exists() and not (run / "config.yaml").exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    lock = RunLock(run).acquire()  # the holder died: its lock is stale
    assert lock.stale is not None and lock.stale["pid"] == holder.pid
    with pytest.raises(RunLocked, match=str(os.getpid())):
        RunLock(run).acquire()  # and now this process holds it
    lock.release()


def test_warm_start_cache_writers_never_share_a_temporary_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 14: two writers storing the same warm start at once both finish, and the
    cached folder is complete (each writes under its own temporary name)."""
    import threading

    from credo.train.warmstart import _store

    class Slow:
        class model:
            name_or_path = ""

            class config:
                _name_or_path = ""

        def save(self, path: Path) -> None:
            path.mkdir(parents=True)
            time.sleep(0.2)
            (path / "model.safetensors").write_text("w")

    folder = tmp_path / "warmstart" / "key"
    errors: list[BaseException] = []

    def store() -> None:
        try:
            _store(Slow(), folder, {"demo_success": 0.5})  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=store) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert (folder / "warmstart.json").exists() and (
        folder / "policy" / "model.safetensors"
    ).exists()
    assert [p.name for p in folder.parent.iterdir()] == ["key"]  # no temporary left


def test_a_killed_warm_start_writers_temporary_folder_is_removed(tmp_path: Path) -> None:
    """Issue 46, item 7: a warm-start cache write killed mid-way left its hidden
    ``.KEY.PID.RAND.tmp`` folder (as large as the model) forever; the next write into the
    cache removes the ones whose process is gone, and keeps a live writer's."""
    from credo.policy.tiny import TinyModelConfig, create_tiny_policy
    from credo.train.warmstart import _store

    root = tmp_path / "warmstart"
    dead = root / f".other.{2**22 + 1}.0123abcd.tmp"  # above Linux's largest pid
    live = root / f".other.{os.getppid()}.0123abcd.tmp"
    for leftover in (dead, live):
        (leftover / "policy").mkdir(parents=True)
        (leftover / "policy" / "model.safetensors").write_bytes(b"w" * 1000)
    policy = create_tiny_policy(["a"], TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2))
    _store(policy, root / "key", {"demo_success": 0.5})
    assert sorted(p.name for p in root.iterdir()) == sorted(["key", live.name])


# ------------------------------------------------------------------------------- faulty envs


class FaultyEnv(GuessEnv):
    """GuessEnv with faults on chosen calls, counted across all instances of the class:
    ``fail`` maps a call name (``reset``, ``step``, ``snapshot``) to a rule
    ``(kind, every)``: on every ``every``-th call of that name, ``kind`` happens
    (``raise``, ``sleep``, ``nan``, ``int_obs``). ``woke`` counts the 30-second sleeps
    that ran to their end: a guard that cuts a hang short returns before any does."""

    fail: ClassVar[dict[str, tuple[str, int]]] = {}
    calls: ClassVar[dict[str, int]] = {}
    made: ClassVar[int] = 0
    woke: ClassVar[int] = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        type(self).made += 1

    def _fault(self, call: str) -> str | None:
        n = type(self).calls[call] = type(self).calls.get(call, 0) + 1
        rule = type(self).fail.get(call)
        if rule is None or n % rule[1]:
            return None
        kind = rule[0]
        if kind == "raise":
            raise RuntimeError(f"faulty-env-{call}-{n}")
        if kind == "sleep":
            time.sleep(30)
            type(self).woke += 1
        return kind

    def reset(self, task: Any, seed: int = 0) -> Any:
        kind = self._fault("reset")
        obs = super().reset(task, seed)
        return 7 if kind == "int_obs" else obs

    def step(self, action: str) -> Any:
        kind = self._fault("step")
        res = super().step(action)
        if kind == "nan":
            res.reward = float("nan")
        if kind == "int_obs":
            res.observation = 42
        return res

    def snapshot(self) -> tuple:
        self._fault("snapshot")
        return super().snapshot()


FAULTY = "test-faulty"
if FAULTY not in ENVS:
    register_env(FAULTY)(FaultyEnv)


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> type[FaultyEnv]:
    """:class:`FaultyEnv` with fresh counters and no faults yet."""
    monkeypatch.setattr(FaultyEnv, "fail", {})
    monkeypatch.setattr(FaultyEnv, "calls", {})
    monkeypatch.setattr(FaultyEnv, "made", 0)
    monkeypatch.setattr(FaultyEnv, "woke", 0)
    return FaultyEnv


FAST = [
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
    "sft.episodes=40",
    "sft.steps=4",
    "sft.noisy_episodes=20",
    "sft.noisy_steps=2",
    "sft.cache=false",
    "rollout.tasks_per_iter=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "eval.episodes=8",
    "train.threads=1",
]


def _faulty_cfg(tmp: Path, name: str, *extra: str, recipe: str = "grpo") -> Any:
    return load_config(
        recipe,
        [*FAST, f"env.name={FAULTY}", *extra, f"train.runs_dir={tmp}", f"train.name={name}"],
    )


def _errors(run_dir: Path) -> list[dict]:
    path = run_dir / "env_errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize(
    ("recipe", "extra"),
    [
        ("grpo", []),
        ("tsbpo", []),  # the tree sampler: snapshots, restores, branches
        ("grpo", ["rollout.oracle_horizon=2", "objective.oracle_coef=0.1"]),  # oracle
    ],
)
def test_env_that_raises_sometimes_is_contained_in_every_phase(
    recipe: str,
    extra: list[str],
    faulty: type[FaultyEnv],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Item 1 (and 3's "never written anywhere"): an env whose ``step`` raises on every
    20th call, ``reset`` on every 25th and ``snapshot`` on every 30th does not kill the
    run, with the warm start on, under the group and tree samplers and with oracle
    continuations: the failed episodes are written to ``env_errors.jsonl`` (task, turn,
    phase, the env's own message, the line that raised) and the first few shown, one
    line each."""
    faulty.fail = {"step": ("raise", 20), "reset": ("raise", 25), "snapshot": ("raise", 30)}
    res = train(
        _faulty_cfg(tmp_path, "flaky", "train.iterations=2", *extra, recipe=recipe), quiet=True
    )
    assert res.iterations == 2 and res.final is not None
    errors = _errors(res.run_dir)
    phases = {e["phase"] for e in errors}
    assert {"warm start", "rollout", "eval"} <= phases
    assert all(e["message"].startswith("RuntimeError: faulty-env-") for e in errors)
    assert all("test_faults.py" in e["location"] for e in errors)
    # the tree sampler's branches also `restore`; a failed snapshot is named as one
    calls = {"reset", "step", "snapshot", "restore"}
    assert {"reset", "step"} <= {e["call"] for e in errors} <= calls
    for e in errors:  # a failed snapshot is recorded as `snapshot` (issue 46), no other call
        assert ("faulty-env-snapshot-" in e["message"]) == (e["call"] == "snapshot"), e
    rollout = [e for e in errors if e["phase"] == "rollout"]
    assert sum(r["rollout/env_errors"] for r in res.metrics) == len(rollout)
    if extra:  # the snapshots of the oracle's start states are taken by the sampler's steps
        assert sum(r["rollout/oracle_continuations"] for r in res.metrics) > 0
    assert all(e["task"].startswith("train") and e["turn"] >= 0 for e in rollout)
    shown = [line for line in capsys.readouterr().err.splitlines() if "env error" in line]
    assert len(shown) == 5 and "faulty-env-" in shown[0]


def test_a_truncated_metrics_file_is_detected(tmp_path: Path) -> None:
    """Item 9: on resume, iterations missing below the checkpoint (a file cut short) are
    reported, not silently accepted; the rewrite keeps the rest."""
    from credo.train.logging import MetricsLog, read_metrics

    rows = [{"iteration": i, "x": i} for i in range(5)]
    del rows[2]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"iteration": 5, "x"'
    )
    log = MetricsLog(tmp_path, resume_from=4, tensorboard=False)
    assert log.missing == [2]
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 3]


def test_a_hanging_env_times_out_and_is_rebuilt(faulty: type[FaultyEnv]) -> None:
    """Item 2: an env whose ``step`` never returns fails its episode after
    ``rollout.step_timeout`` seconds; the demonstrations build a fresh env after it."""
    from credo.rollout.envguard import EnvErrorLog, env_guard
    from credo.train.run import build_run
    from credo.train.sft import collect_demonstrations

    run = build_run(load_config("grpo", [*FAST, "env.name=examples.custom_env:GuessEnv"]))
    faulty.fail = {"step": ("sleep", 5)}
    log = EnvErrorLog(None, say=lambda line: None)
    with env_guard(step_timeout=0.2, log=log):
        demos = collect_demonstrations(faulty, run.renderer, episodes=6, epsilon=0.0)
    assert faulty.woke == 0  # every hang was cut short: none of the 30 s sleeps had ended
    assert (
        log.count >= 1
        and "did not return within rollout.step_timeout=0.2 s" in log.records[0].message
    )
    assert "test_faults.py" in log.records[0].location  # where the env was stuck
    assert faulty.made == 1 + log.count  # one fresh env after each timeout
    assert 0 < len(demos.episodes) == 6 - log.count


def test_when_every_demonstration_fails_the_env_error_is_shown(faulty: type[FaultyEnv]) -> None:
    """Item 3 in the warm start: when every demonstration episode fails, the error shows
    the env's own exception (it used to be "no demonstration rows to train on")."""
    from credo.rollout.envguard import EnvFailure
    from credo.train.run import build_run
    from credo.train.sft import collect_demonstrations

    run = build_run(load_config("grpo", [*FAST, "env.name=examples.custom_env:GuessEnv"]))
    faulty.fail = {"reset": ("raise", 1)}
    with pytest.raises(EnvFailure, match="RuntimeError: faulty-env-reset-1"):
        collect_demonstrations(faulty, run.renderer, episodes=3, epsilon=0.0)


@pytest.mark.parametrize(
    ("what", "extra", "recipe"),
    [
        ("reset", [], "grpo"),
        ("snapshot", [], "tsbpo"),
        ("snapshot", ["rollout.oracle_horizon=2", "objective.oracle_coef=0.1"], "grpo"),
    ],
)
def test_when_every_episode_fails_the_env_error_is_shown(
    what: str, extra: list[str], recipe: str, faulty: type[FaultyEnv], tmp_path: Path
) -> None:
    """Item 3: when every episode fails (``reset`` raising; ``snapshot`` raising under
    the tree sampler or oracle continuations), the error names the env's own exception,
    not "this forest has no token data"."""
    from credo.rollout.envguard import EnvFailure

    faulty.fail = {what: ("raise", 1)}
    name = f"all-{what}-{recipe}"
    cfg = _faulty_cfg(
        tmp_path, name, "sft.enabled=false", "train.iterations=1", *extra, recipe=recipe
    )
    with pytest.raises(EnvFailure) as info:
        train(cfg, quiet=True)
    message = str(info.value)
    assert f"RuntimeError: faulty-env-{what}-" in message
    assert message.index("faulty-env") < message.index("then stopped with")
    assert "env_errors.jsonl" in message
    first = _errors(tmp_path / name)[0]
    # the env's own message (its call counter also counts the pre-flight env check's calls)
    assert re.fullmatch(rf"RuntimeError: faulty-env-{what}-\d+", first["message"])
    assert first["call"] == what  # issue 46: a failed snapshot() was recorded as "step"


def test_a_nan_reward_names_the_env_and_saves_a_checkpoint(
    faulty: type[FaultyEnv], tmp_path: Path
) -> None:
    """Item 4: a NaN reward in iteration 1 stops the run with an error naming the env and
    the task (not the estimator), after saving a checkpoint of iteration 1's start."""
    from credo.rollout.envguard import EnvFailure
    from credo.train import loop
    from credo.train.checkpoint import latest_checkpoint

    cfg = _faulty_cfg(
        tmp_path,
        "nan",
        "sft.enabled=false",
        "train.iterations=3",
        "train.checkpoint_every=10",
        "eval.episodes=1",
    )
    real = loop.run_iteration

    def nan_from_iteration_1(run: Any, state: Any, it: int) -> Any:
        if it == 1:
            faulty.fail = {"step": ("nan", 1)}
        return real(run, state, it)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "run_iteration", nan_from_iteration_1)
        with pytest.raises(EnvFailure) as info:
            train(cfg, quiet=True)
    message = str(info.value)
    assert "iteration 1" in message and "the env FaultyEnv returned the reward nan" in message
    assert "for task train/" in message and "not the estimator" in message
    assert "non-finite advantages" not in message
    last = latest_checkpoint(tmp_path / "nan")
    assert last is not None and last.name == "step_1"


def test_a_non_string_observation_fails_its_episode_clearly(
    faulty: type[FaultyEnv],
) -> None:
    """Item 5: an observation that is not a str fails that episode with a message that
    says so (it used to be converted silently); evaluation counts and shows it."""
    from credo.train.run import build_run

    run = build_run(load_config("grpo", [*FAST, "env.name=examples.custom_env:GuessEnv"]))
    run.make_env = faulty
    faulty.fail = {"reset": ("int_obs", 3)}
    ev = run.evaluate(episodes=6)
    assert ev.errors == 2
    assert ev.first_error is not None
    assert "FaultyEnv.reset() returned an observation of type int" in ev.first_error
    assert "observations must be str" in ev.first_error


def test_a_non_finite_gradient_stops_before_the_optimizer_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 16 (trainer side): a NaN gradient norm stops the run naming the iteration,
    and no NaN reaches the weights."""
    from credo.train import update as update_module

    real = update_module.torch.nn.utils.clip_grad_norm_

    def nan_norm(params: Any, clip: float) -> torch.Tensor:
        real(params, clip)
        return torch.tensor(float("nan"))

    monkeypatch.setattr(update_module.torch.nn.utils, "clip_grad_norm_", nan_norm)
    cfg = load_config(
        "grpo",
        [
            *FAST,
            "env.name=examples.custom_env:GuessEnv",
            "sft.enabled=false",
            "train.iterations=1",
            f"train.runs_dir={tmp_path}",
            "train.name=nangrad",
        ],
    )
    with pytest.raises(FloatingPointError, match="iteration 0: the gradient norm is nan"):
        train(cfg, quiet=True)


def test_defaults_checkpoint_every_iteration_and_time_out_steps() -> None:
    """Checkpoints every iteration by default (a crash loses at most the iteration under
    way); ``rollout.step_timeout`` defaults to 60 s and is validated."""
    from credo.train.config import ConfigError, recipe_names

    assert {load_config(r, []).train.checkpoint_every for r in recipe_names()} == {1}
    assert load_config("grpo", []).rollout.step_timeout == 60.0
    for bad in ("-1", "inf", "abc"):
        with pytest.raises(ConfigError, match=r"rollout\.step_timeout"):
            load_config("grpo", [f"rollout.step_timeout={bad}"])
    assert load_config("grpo", ["rollout.step_timeout=null"]).rollout.step_timeout is None
