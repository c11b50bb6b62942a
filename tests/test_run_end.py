"""The last writes of a run (issue 46, item 2).

``final_policy/`` was written in place after ``final_eval.json``, and "finished" meant only
that ``final_eval.json`` existed: a kill during the final save left a run that ``--resume``
called finished while its ``final_policy/`` had no tokenizer (``credo eval`` and
``credo serve`` failed). Now every artefact of the run's end is written by
temp-and-rename, ``final_eval.json`` last with the digests of ``final_policy/``, and a run
is finished only when all of them are complete (:mod:`credo.train.finish`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from credo.cli import main
from credo.policy.hf import HFPolicy
from credo.policy.tiny import TinyModelConfig, create_tiny_policy
from credo.train.finish import (
    FINAL_EVAL,
    FINAL_POLICY,
    remove_final_leftovers,
    save_final_policy,
    unfinished_reason,
    write_final_eval,
)
from credo.utils.atomic import temp_path
from small_run import TINY_RUN

TINY = [*TINY_RUN, "train.iterations=1"]


#: above the largest pid Linux hands out (2**22): never a live process
DEAD_PID = 2**22 + 1


class Killed(BaseException):
    """A simulated ``kill -9`` at the raise point (no ``except Exception`` catches it)."""


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return create_tiny_policy(
        ["a", "b"], TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2), seed=0
    )


def test_a_finished_run_is_one_whose_every_final_artefact_is_complete(policy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "run"
    run.mkdir()
    assert unfinished_reason(run, 3) == f"{run / FINAL_EVAL} is missing or unreadable"
    save_final_policy(policy, run)
    write_final_eval(run, {"success_rate": 0.5}, 3)
    final = json.loads((run / FINAL_EVAL).read_text())
    assert final["iteration"] == 3 and final["success_rate"] == 0.5
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {
        Path(k).name for k in final["artefacts"]
    }
    assert unfinished_reason(run, 3) is None
    # the run was extended to 5 iterations: the final evaluation is of iteration 3
    assert "is of iteration 3, the latest checkpoint of iteration 5" in str(
        unfinished_reason(run, 5)
    )
    weights = run / FINAL_POLICY / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:100])
    assert unfinished_reason(run, 3) == f"{weights} has 100 bytes, {len(data):,} were written"
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert unfinished_reason(run, 3) == f"{weights} was changed after it was written (its " + (
        "SHA-256 differs)"
    )
    (run / FINAL_POLICY / "tokenizer.json").unlink()
    weights.write_bytes(data)
    assert unfinished_reason(run, 3) == f"{run / FINAL_POLICY / 'tokenizer.json'} is missing"


def test_a_final_eval_of_an_older_credo_counts_when_the_policy_is_there(policy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "old"
    run.mkdir()
    (run / FINAL_EVAL).write_text(json.dumps({"success_rate": 0.25}))
    assert unfinished_reason(run, 1) == f"{run / FINAL_POLICY} lacks its weights or tokenizer"
    policy.save(run / FINAL_POLICY)
    assert unfinished_reason(run, 1) is None


def test_a_kill_during_the_final_save_leaves_the_old_folder_or_none(  # type: ignore[no-untyped-def]
    policy, tmp_path, monkeypatch
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    save_final_policy(policy, run)
    before = sorted(p.name for p in (run / FINAL_POLICY).iterdir())

    def half(self: Any, path: Path) -> None:
        Path(path).mkdir(parents=True)
        self.model.save_pretrained(path, safe_serialization=True)
        raise Killed("during the tokenizer")

    monkeypatch.setattr(HFPolicy, "save", half)
    with pytest.raises(Killed):
        save_final_policy(policy, run)
    # the complete folder of before is untouched, and no half-written one took its place
    assert sorted(p.name for p in (run / FINAL_POLICY).iterdir()) == before
    # a real kill -9 skips the clean-up: its hidden temporary folder stays until the next
    # start of the run removes it; one of a live process (pid 1) is left alone
    dead = run / f".final_policy.{DEAD_PID}.0123abcd.tmp"  # no process can have this pid
    (dead / "sub").mkdir(parents=True)
    live = run / ".curves.png.1.0123abcd.tmp"
    mine = temp_path(run / FINAL_EVAL)  # this process's: perhaps another thread's write
    live.write_bytes(b"x")
    mine.write_bytes(b"y")
    assert remove_final_leftovers(run) == [dead.name]
    assert sorted(p.name for p in run.iterdir()) == sorted([live.name, mine.name, FINAL_POLICY])


def _train(*args: str) -> int:
    return main(["train", *TINY, *args, "--quiet"])


@pytest.mark.slow
def test_resume_redoes_a_run_end_killed_in_the_final_save(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The issue's probe: kill during the final save, then ``--resume`` must not call the
    run finished; it redoes the end, after which ``credo eval`` of the run works."""
    real = HFPolicy.save

    def killed_in_final(self: Any, path: Path) -> None:
        if FINAL_POLICY not in str(path):
            return real(self, path)
        Path(path).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, safe_serialization=True)
        raise Killed("final save, before the tokenizer")

    monkeypatch.setattr(HFPolicy, "save", killed_in_final)
    with pytest.raises(Killed):
        _train(f"train.runs_dir={tmp_path}", "train.name=r")
    monkeypatch.setattr(HFPolicy, "save", real)
    run = tmp_path / "r"
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert "is finished" not in capsys.readouterr().out
    assert unfinished_reason(run, 1) is None
    assert (run / FINAL_POLICY / "tokenizer_config.json").exists()
    assert not [p.name for p in run.iterdir() if p.name.startswith(".final")]
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert main(["train", "--resume", str(run)]) == 0
    assert f"{run} is finished" in capsys.readouterr().out


@pytest.mark.slow
def test_an_extended_run_killed_in_its_final_eval_is_not_finished(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch, capsys
) -> None:
    """A run extended after it finished and killed during its new final evaluation kept
    the old ``final_eval.json``; ``--resume`` called it finished with the old result."""
    from credo.train.run import Run

    assert _train(f"train.runs_dir={tmp_path}", "train.name=r") == 0
    run = tmp_path / "r"
    real = Run.evaluate

    def killed_in_final_eval(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (run / "checkpoints" / "step_2").exists():  # iteration 2 done: the final one
            raise Killed("final evaluation")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Run, "evaluate", killed_in_final_eval)
    with pytest.raises(Killed):
        main(["train", "--resume", str(run), "train.iterations=2", "--quiet"])
    monkeypatch.setattr(Run, "evaluate", real)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert "is finished" not in capsys.readouterr().out
    assert json.loads((run / FINAL_EVAL).read_text())["iteration"] == 2


@pytest.mark.slow
def test_following_the_advice_for_a_damaged_checkpoint_resumes(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 46, item 7: for truncated checkpoint weights ``--resume`` advised deleting
    ``step_N/policy``, after which the resume failed on the missing weights; deleting the
    whole ``step_N`` is what works, and is what it now says."""
    import re
    import shutil

    assert _train(f"train.runs_dir={tmp_path}", "train.name=r", "train.iterations=2") == 0
    run = tmp_path / "r"
    weights = run / "checkpoints" / "step_2" / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.iterations=3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {weights} is unreadable")
    advised = Path(re.search(r"delete (\S+?)[ ,;]", err).group(1))
    shutil.rmtree(advised)  # do as it says, then resume
    assert main(["train", "--resume", str(run), "train.iterations=3", "--quiet"]) == 0
    assert advised == run / "checkpoints" / "step_2"
    assert json.loads((run / FINAL_EVAL).read_text())["iteration"] == 3


@pytest.mark.slow
def test_a_kill_while_saving_the_reference_leaves_a_resumable_run(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The reference policy (``reference/``, saved at a run's start when a KL term needs
    it) was written in place: a kill mid-write left a truncated file that ``--resume``
    refused ("start a new run"). Now written by temp-and-rename, it is whole or absent."""
    real = HFPolicy.save

    def killed_in_reference(self: Any, path: Path) -> None:
        if "reference" not in Path(path).name:
            return real(self, path)
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"\x40" + b"\x00" * 7 + b'{"a')  # cut
        raise Killed("reference save")

    monkeypatch.setattr(HFPolicy, "save", killed_in_reference)
    with pytest.raises(Killed):
        _train(f"train.runs_dir={tmp_path}", "train.name=r", "objective.kl_coef=0.1")
    monkeypatch.setattr(HFPolicy, "save", real)
    run = tmp_path / "r"
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert unfinished_reason(run, 1) is None and (run / "reference" / "config.json").exists()
