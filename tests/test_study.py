"""Study files (:mod:`credo.commands.study`) and arms in ``credo compare``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from credo.cli import main
from credo.commands.compare import Arm, compare
from credo.commands.study import load_study, run_study, write_index
from credo.train.config import ConfigError, load_config
from small_run import SMALL


def _runs_as(
    monkeypatch: pytest.MonkeyPatch, script: str = "pass"
) -> tuple[list[list[str]], list[subprocess.Popen[bytes]]]:
    """Make ``compare --jobs`` start ``python -c SCRIPT`` in place of each ``credo train``
    run (with the same keyword arguments); returns the commands it asked for and the
    processes started, both filled as runs start."""
    import credo.commands.compare as cmp

    commands: list[list[str]] = []
    procs: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(cmd: list[str], **kw: object) -> subprocess.Popen[bytes]:
        commands.append(cmd)
        procs.append(real_popen([sys.executable, "-c", script], **kw))  # type: ignore[call-overload]
        return procs[-1]

    monkeypatch.setattr(cmp.subprocess, "Popen", popen)
    return commands, procs


STUDIES = Path(__file__).resolve().parents[1] / "studies"


def _study(tmp_path: Path, **fields: object) -> Path:
    data: dict[str, object] = {
        "title": "two schedules",
        "claim": "more steps per batch learn more",
        "overrides": [*SMALL, "eval.episodes=8"],
        "iterations": 1,
        "seeds": [0],
        "reference": "one",
        "arms": [
            {"name": "one", "recipe": "grpo", "overrides": ["optim.minibatches=1"]},
            {"name": "two", "recipe": "grpo", "overrides": ["optim.minibatches=2"]},
        ],
    }
    data.update(fields)
    path = tmp_path / "studies" / "tiny.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"colour": "red"}, r"unknown field\(s\) colour; fields: arms, claim"),
        ({"arms": []}, r"needs arms: a list of \{name, recipe, overrides\}"),
        ({"claim": ""}, r"needs a claim"),
        ({"seeds": 0}, r"seeds must be a positive count or a list of seeds, got 0"),
        ({"iterations": -3}, r"iterations must be a positive integer, got -3"),
        ({"reference": "three"}, r"reference 'three' is not an arm; arms: one, two"),
        ({"verdict": "great"}, r"verdict 'great' is not one of: reproduced in kind"),
        ({"overrides": ["optim.lr"]}, r"overrides must be a list of key=value strings"),
        (
            {"arms": [{"name": "a", "recipe": "grpo"}, {"name": "a", "recipe": "gigpo"}]},
            r"arm names must differ: a, a",
        ),
        (
            {"arms": [{"name": "one", "recipe": "grpo", "overrides": ["credit.estimator=gipo"]}]},
            r"arm one: unknown estimator 'gipo'. Did you mean 'gigpo'",
        ),
        (
            {"arms": [{"recipe": "no_such_recipe"}], "reference": None},
            r"arm no_such_recipe: unknown recipe",
        ),
        ({"setup": {"name": "t"}}, r"setup must be a list of \{name, recipe, overrides\}"),
        ({"setup": [{"recipe": "grpo"}]}, r"setup run 1 must be a mapping with name and recipe"),
        (
            {"setup": [{"name": "t", "recipe": "grpo", "overrides": ["optim.lr=-1"]}]},
            r"arm t: optim.lr",
        ),
    ],
)
def test_a_bad_study_file_is_one_line_naming_the_file(
    tmp_path: Path, fields: dict, message: str
) -> None:
    path = _study(tmp_path, **fields)
    with pytest.raises(ConfigError, match=rf"^study {path}: {message}"):
        load_study(path)


def test_setup_runs_train_first_and_arms_name_them(tmp_path: Path) -> None:
    """A study whose arm needs a teacher trains it first (``setup``), once, and the arm's
    ``{setup}/NAME`` names it; the file loads before the teacher exists."""
    teacher = {"name": "teacher", "recipe": "grpo", "overrides": ["train.iterations=1"]}
    arm = {"name": "opd", "recipe": "opd", "overrides": ["teacher.path={setup}/teacher"]}
    path = _study(tmp_path, setup=[teacher], arms=[arm], reference=None)
    study = load_study(path)  # the teacher does not exist yet
    assert [a.name for a in study.setup] == ["teacher"]
    out = tmp_path / "runs"
    summaries = run_study(study, out_root=out, docs=None)
    assert [s.recipe for s in summaries] == ["opd"]
    run = out / "tiny" / "opd-seed0"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["teacher"]["path"] == str(out / "tiny" / "teacher")
    assert (out / "tiny" / "teacher" / "final_policy").is_dir()
    made = (out / "tiny" / "teacher" / "metrics.jsonl").stat().st_mtime_ns
    run_study(study, out_root=out, docs=None)  # finished: read, not trained again
    assert (out / "tiny" / "teacher" / "metrics.jsonl").stat().st_mtime_ns == made


def test_an_arm_that_needs_its_setup_path_loads_before_the_setup_run_exists(
    tmp_path: Path,
) -> None:
    """``credit.seed_graph=teacher`` needs ``credit.teacher``, which names a setup run:
    the file loads before that run exists (an empty folder stands in for it); a typo in
    the same arm still stops it, and the real folder is what the arm gets."""
    teacher = {"name": "teacher", "recipe": "grpo", "overrides": ["train.iterations=1"]}
    seeded = ["credit.seed_graph=teacher", "credit.teacher={setup}/teacher/final_policy"]
    arm = {"name": "proas", "recipe": "proas", "overrides": seeded}
    path = _study(tmp_path, setup=[teacher], arms=[arm], reference=None)
    study = load_study(path)
    assert study.arms_in(tmp_path)[0].overrides[1] == (
        f"credit.teacher={tmp_path}/teacher/final_policy"
    )
    bad = {"name": "proas", "recipe": "proas", "overrides": [*seeded, "credit.seed_episodes=0"]}
    path = _study(tmp_path, setup=[teacher], arms=[bad], reference=None)
    with pytest.raises(ConfigError, match=r"arm proas: credit.seed_episodes must be ≥ 1"):
        load_study(path)


def test_the_cli_refuses_a_bad_study_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _study(tmp_path, reference="three")
    assert main(["study", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: study") and "reference 'three'" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "runs").exists()
    assert main(["study", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_shipped_studies_load_and_are_indexed() -> None:
    """Every study file in studies/ loads (names, recipes, every arm's overrides; an
    engine this venv lacks, vLLM, checked for everything but its install) and has a row
    in docs/studies/README.md."""
    files = sorted(STUDIES.glob("*.yaml"))
    assert files
    index = (STUDIES.parent / "docs" / "studies" / "README.md").read_text()
    for f in files:
        s = load_study(f, machine=False)
        assert s.title in index, f"{f.name} has no row in docs/studies/README.md"


def test_a_study_trains_its_arms_writes_its_page_and_resumes(tmp_path: Path) -> None:
    path = _study(tmp_path, verdict="answered", why="two steps: +x points", notes="Read *this*.")
    study = load_study(path)
    docs = tmp_path / "docs"
    summaries = run_study(study, out_root=tmp_path / "runs", docs=docs, command="credo study X")
    assert [s.recipe for s in summaries] == ["one", "two"]
    runs = tmp_path / "runs" / "tiny"
    for arm in ("one", "two"):
        cfg = yaml.safe_load((runs / f"{arm}-seed0" / "config.yaml").read_text())
        assert cfg["optim"]["minibatches"] == (1 if arm == "one" else 2)
        assert cfg["train"]["iterations"] == 1
    page = (docs / "tiny.md").read_text()
    assert page.startswith("# two schedules\n")
    assert "**Verdict: answered.** two steps: +x points" in page
    assert "credo study X" in page and "| one | grpo | optim.minibatches=1 |" in page
    assert "Read *this*." in page and "(img/tiny.png)" in page
    assert (docs / "img" / "tiny.png").stat().st_size > 0
    index = (docs / "README.md").read_text()
    assert "[two schedules](tiny.md)" in index and "| answered | two steps: +x points |" in index
    # a second run reads the finished runs: nothing trains again
    stamp = (runs / "one-seed0" / "final_eval.json").stat().st_mtime_ns
    again = run_study(study, out_root=tmp_path / "runs", docs=docs)
    assert (runs / "one-seed0" / "final_eval.json").stat().st_mtime_ns == stamp
    assert [s.final for s in again] == [s.final for s in summaries]


def test_arms_of_one_recipe_in_compare(tmp_path: Path) -> None:
    """The same recipe twice, under two arm names, with its own settings each."""
    with pytest.raises(ConfigError, match="arm names must differ"):
        compare([Arm("a", "grpo"), Arm("a", "gigpo")], [0], out_dir=tmp_path / "x")
    with pytest.raises(ConfigError, match="--jobs must be a positive"):
        compare([Arm("a", "grpo")], [0], out_dir=tmp_path / "x", jobs=0)
    assert not (tmp_path / "x").exists()


def _stable(line: str) -> dict:
    """A metrics record without its timings."""
    return {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}


@pytest.mark.slow
def test_jobs_train_side_by_side_with_the_same_results(tmp_path: Path) -> None:
    """``--jobs 2``: each run in its own ``credo train`` process, the arms sharing a warm
    start waiting for the first; the results equal one-at-a-time runs bit for bit."""
    arms = [
        Arm("one", "grpo", ("optim.minibatches=1",)),
        Arm("two", "grpo", ("optim.minibatches=2",)),
    ]
    common = [*SMALL, "eval.episodes=8", "train.iterations=2"]
    seq = compare(arms, [0, 1], overrides=common, out_dir=tmp_path / "seq")
    records = tmp_path / "records"
    par = compare(arms, [0, 1], overrides=common, out_dir=tmp_path / "par", jobs=2, records=records)
    assert [s.final for s in par] == [s.final for s in seq]
    # each run recorded as it finished; read back without training (run_study's records)
    assert sorted(p.name for p in records.iterdir()) == sorted(
        [*(f"{a}-seed{s}" for a in ("one", "two") for s in (0, 1)), "warmstarts"]
    )
    assert len(list((records / "warmstarts").iterdir())) == 2  # one per seed
    read = compare(arms, [0, 1], overrides=common, out_dir=tmp_path / "read", records=records)
    assert [s.final for s in read] == [s.final for s in seq]
    assert not (tmp_path / "read" / "one-seed0").exists()
    for name in ("one-seed0", "two-seed1"):
        a = (tmp_path / "seq" / name / "metrics.jsonl").read_text().splitlines()
        b = (tmp_path / "par" / name / "metrics.jsonl").read_text().splitlines()
        assert [_stable(r) for r in a] == [_stable(r) for r in b]
    assert (tmp_path / "par" / "one-seed0.log").exists()


def test_write_index_lists_every_study(tmp_path: Path) -> None:
    _study(tmp_path)
    other = tmp_path / "studies" / "other.yaml"
    other.write_text(
        textwrap.dedent(
            """
            title: another
            paper: "P"
            claim: "C"
            result: "R"
            verdict: mixed
            why: "W"
            arms: [{recipe: grpo}]
            """
        )
    )
    index = write_index(tmp_path / "studies", tmp_path / "docs").read_text()
    assert "| another | P | C | R | mixed | W |" in index
    assert "| two schedules | — | more steps per batch learn more | — | pending | — |" in index


# ------------------------------------------------------------- studies of pipelines
#: A two-stage pipeline: a warm start (evaluated) and an evaluation of it with one
#: option changed, on the small run's env and model.
PIPE = """
name: tiny_pipe
recipe: grpo
overrides:
  env.name: examples.custom_env:GuessEnv
  model.tiny: {hidden_size: 32, num_layers: 1, num_heads: 4, intermediate_size: 64}
  sft.episodes: 100
  sft.steps: 30
  sft.noisy_episodes: 20
  sft.noisy_steps: 5
  rollout.max_new_tokens: 6
  train.threads: 1
  eval.episodes: 8
stages:
  - {name: warm, kind: sft}
  - name: fewer_turns
    kind: eval
    policy: warm
    overrides: {env.kwargs.max_turns: 2}
    params: {trials: 2, ks: [1, 2], episodes: 4}
"""


def _pipeline_study(tmp_path: Path, **fields: object) -> Path:
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(PIPE)
    data: dict[str, object] = {
        "title": "two warm starts",
        "claim": "more SFT steps solve more",
        "seeds": [0, 1],
        "arms": [
            {"name": "short", "pipeline": str(pipe)},
            {"name": "long", "pipeline": str(pipe), "overrides": ["sft.steps=60"]},
        ],
    }
    data.update(fields)
    path = tmp_path / "studies" / "pipes.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_study_of_pipelines_runs_each_seed_and_tabulates_every_measured_stage(
    tmp_path: Path,
) -> None:
    from credo.pipeline.study import run_pipeline_study

    study = load_study(_pipeline_study(tmp_path, verdict="answered", why="w"))
    assert [a.name for a in study.pipelines] == ["short", "long"] and not study.arms
    docs, runs = tmp_path / "docs", tmp_path / "runs"
    data = run_pipeline_study(study, out_root=runs, docs=docs, jobs=2, command="credo study P")
    folder = runs / "pipes"
    # each arm x seed is its own pipeline, with the seed and the arm's overrides
    for arm, seed in [("short", 0), ("short", 1), ("long", 0), ("long", 1)]:
        spec = yaml.safe_load((folder / f"{arm}-seed{seed}" / "pipeline.yaml").read_text())
        assert f"train.seed={seed}" in spec["command_line"]
        assert ("sft.steps=60" in spec["command_line"]) == (arm == "long")
    # one row per arm and stage that measured success, the numbers of its stage.json
    assert [(r["arm"], r["stage"], r["kind"]) for r in data["rows"]] == [
        ("short", "warm", "sft"),
        ("short", "fewer_turns", "eval"),
        ("long", "warm", "sft"),
        ("long", "fewer_turns", "eval"),
    ]
    for r in data["rows"]:
        for seed, value in zip([0, 1], r["success"], strict=True):
            marker = folder / f"{r['arm']}-seed{seed}" / r["stage"] / "stage.json"
            assert value == json.loads(marker.read_text())["summary"]["success_rate"]
    # pass^k only where an eval stage ran several trials per task: its eval.json's values
    assert ["pass_hat_k" in r for r in data["rows"]] == [False, True, False, True]
    for r in data["rows"][1::2]:
        assert list(r["pass_hat_k"]) == ["1", "2"]
        for seed in (0, 1):
            ev = folder / f"{r['arm']}-seed{seed}" / r["stage"] / "eval.json"
            saved = json.loads(ev.read_text())["pass_hat_k"]
            assert [r["pass_hat_k"][k][seed] for k in ("1", "2")] == [saved["1"], saved["2"]]
            assert saved["2"] <= saved["1"]
    row = data["rows"][0]
    mean = 100 * (row["success"][0] + row["success"][1]) / 2
    page = (docs / "pipes.md").read_text()
    assert f"| short | warm (sft) | {mean:.1f} %" in page
    assert "| pass^1, mean ± sd | pass^2, mean ± sd |" in page
    short_evals = data["rows"][1]["pass_hat_k"]["2"]
    assert f"| {100 * (short_evals[0] + short_evals[1]) / 2:.1f} % ± " in page
    assert f"| long | `{tmp_path / 'pipe.yaml'}` | sft.steps=60 |" in page
    assert "img/pipes.png" not in page  # no training curve for a pipeline study
    assert "[two warm starts](pipes.md)" in (docs / "README.md").read_text()
    # a second run reads the finished pipelines: nothing runs again
    stamp = (folder / "short-seed0" / "warm" / "stage.json").stat().st_mtime_ns
    assert run_pipeline_study(study, out_root=runs, docs=None) == data
    assert (folder / "short-seed0" / "warm" / "stage.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"iterations": 3}, r"a study of pipelines takes no iterations \(each pipeline"),
        ({"reference": "short"}, r"a study of pipelines takes no reference"),
        (
            {"arms": [{"name": "a", "recipe": "grpo"}, {"name": "b", "pipeline": "P"}]},
            r"arm 2: no pipeline file 'P'",
        ),
        (
            {"arms": [{"name": "a", "pipeline": 3}]},
            r"arm 1 must be a mapping with a pipeline file \(and name, overrides\)",
        ),
    ],
)
def test_a_bad_pipeline_study_is_one_line(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_study(_pipeline_study(tmp_path, **fields))


def test_recipe_and_pipeline_arms_do_not_mix(tmp_path: Path) -> None:
    arms = [{"name": "a", "recipe": "grpo"}, {"name": "b", "pipeline": str(tmp_path / "pipe.yaml")}]
    with pytest.raises(ConfigError, match="arms must all name a recipe or all name a pipeline"):
        load_study(_pipeline_study(tmp_path, arms=arms))


def test_a_pipeline_arm_with_a_bad_value_stops_before_any_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arms = [{"name": "a", "pipeline": str(tmp_path / "pipe.yaml"), "overrides": ["optim.lr=-1"]}]
    path = _pipeline_study(tmp_path, arms=arms)
    out = tmp_path / "runs"
    assert main(["study", str(path), "--out", str(out), "--docs", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: study {path}: arm a: ") and "optim.lr" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_run_stopped_before_its_end_is_reported_as_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that a signal stopped (it checkpoints and exits cleanly, with no final
    result) makes the comparison say so in one line, naming the run and how to continue,
    in process and with ``--jobs`` (was: "No such file ... final_eval.json")."""
    import credo.commands.compare as cmp

    common = [*SMALL, "eval.episodes=8", "train.iterations=1"]
    # in process: train returns as after SIGTERM, without a final evaluation
    monkeypatch.setattr(cmp, "train", lambda *a, **k: None)
    with pytest.raises(cmp.RunStopped, match=r"1 run\(s\) stopped before their end.*grpo-seed0"):
        compare([Arm("grpo", "grpo")], [0], overrides=common, out_dir=tmp_path / "one")
    # in processes: each exits 0 without finishing; no further run starts after a stop
    started, _ = _runs_as(monkeypatch)
    arms = [Arm("a", "grpo"), Arm("b", "grpo", ("optim.minibatches=2",))]
    with pytest.raises(cmp.RunStopped, match=r"run the same command again to continue"):
        compare(arms, [0, 1], overrides=common, out_dir=tmp_path / "par", jobs=2)
    assert len(started) == 2  # the two first runs; the other two never started


def test_runs_stopped_before_their_end_continue_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run a signal stopped (its checkpoints kept) resumes before runs that have not
    started, with ``--jobs`` as in process: an interrupted session's partial run is
    finished first (was: in study order, after every earlier arm)."""
    import credo.commands.compare as cmp

    common = [*SMALL, "eval.episodes=8", "train.iterations=1"]
    arms = [Arm("a", "grpo"), Arm("b", "grpo", ("optim.minibatches=2",))]
    (tmp_path / "par" / "b-seed1" / "checkpoints").mkdir(parents=True)  # stopped at once
    started, _ = _runs_as(monkeypatch)
    with pytest.raises(cmp.RunStopped):
        compare(arms, [0, 1], overrides=common, out_dir=tmp_path / "par", jobs=2)
    assert started[0][-2:] == ["--resume", str(tmp_path / "par" / "b-seed1")]
    assert "train.name=a-seed0" in started[1]
    # in process: the same order
    order: list[str] = []
    monkeypatch.setattr(cmp, "train", lambda cfg, **k: order.append(cfg.train.name))
    stopped = tmp_path / "one" / "b-seed1"
    (stopped / "checkpoints").mkdir(parents=True)
    cfg = load_config(
        "grpo", [*common, "optim.minibatches=2", "train.seed=1", "train.name=b-seed1"]
    )
    (stopped / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))  # a resume reads it
    with pytest.raises(cmp.RunStopped):
        compare(arms, [0, 1], overrides=common, out_dir=tmp_path / "one")
    assert order == ["b-seed1"]


def test_an_interrupted_comparison_stops_its_runs_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--jobs``: each run is a session of its own (a terminal's Ctrl-C does not reach it
    twice), and an interrupted comparison (Ctrl-C, or SIGTERM from a scheduler) sends
    each running run one SIGINT, so it checkpoints and stops, and waits for it (was: a
    SIGTERM killed the comparison and left its runs training, unrecorded)."""
    import os
    import signal
    import threading
    import time

    marks = tmp_path / "marks"
    marks.mkdir()
    # a run: says it is ready, then counts the SIGINTs it gets for a second and exits
    child = (
        "import os, signal, sys, time\n"
        "got = []\n"
        "signal.signal(signal.SIGINT, lambda *a: got.append(1))\n"
        f"open(os.path.join({str(marks)!r}, 'ready-%d' % os.getpid()), 'w').close()\n"
        "end = time.monotonic() + 20\n"
        "while not got and time.monotonic() < end:\n"
        "    time.sleep(0.05)\n"
        "time.sleep(1.0)\n"
        f"open(os.path.join({str(marks)!r}, 'sigint-%d' % os.getpid()), 'w').write("
        "'%d %d' % (len(got), os.getsid(0)))\n"
    )
    _, children = _runs_as(monkeypatch, child)

    def stop_when_both_run() -> None:  # as a scheduler stops a job
        end = time.monotonic() + 30
        while len(list(marks.glob("ready-*"))) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    common = [*SMALL, "eval.episodes=8", "train.iterations=1", "sft.enabled=false"]
    arms = [Arm("a", "grpo"), Arm("b", "grpo", ("optim.minibatches=2",))]

    def unhandled(signum: int, frame: object) -> None:  # stands for SIGTERM's default
        raise RuntimeError("the comparison left SIGTERM to its default: it dies")

    try:
        previous = signal.signal(signal.SIGTERM, unhandled)
        threading.Thread(target=stop_when_both_run, daemon=True).start()
        try:
            with pytest.raises(KeyboardInterrupt):
                compare(arms, [0, 1], overrides=common, out_dir=tmp_path / "par", jobs=2)
        finally:
            signal.signal(signal.SIGTERM, previous)
        assert len(children) == 2
        for proc in children:
            assert proc.poll() is not None  # waited for
            count, sid = (marks / f"sigint-{proc.pid}").read_text().split()
            assert count == "1"  # one SIGINT each
            assert int(sid) == proc.pid != os.getsid(0)  # a session of its own
    finally:
        for proc in children:  # only if the test failed before they ended
            if proc.poll() is None:
                proc.kill()
                proc.wait()
