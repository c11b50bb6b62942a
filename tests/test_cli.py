"""The ``credo`` command as a newcomer meets it (issue 16): every command's happy path and
error path, the exit code, the one-line error, the files written and the folders not.

A few runs go through a subprocess (what a user types, traceback-free end to end); the
rest call :func:`credo.cli.main` in-process, the same code without the interpreter start.
Every training run is tiny: one iteration, no warm start, four held-out episodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from credo.cli import build_parser, main, parse_args

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from small_run import TINY_RUN  # noqa: E402

TINY = [*TINY_RUN, "train.iterations=1"]
VOLATILE = ("time/", "perf/")


def _cli(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), str(cwd)])
    env["HF_HUB_OFFLINE"] = "1"
    env["COLUMNS"] = "200"  # the table's cells on one line each
    return subprocess.run(
        [sys.executable, "-m", "credo.cli", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _run(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str, *needles: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def _stable(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


# ------------------------------------------------------------------ a newcomer's env
GRID = '''
import random
from credo.envs import StepResult


class GridEnv:
    """A 3x3 grid: walk to the goal. The five required methods only."""

    max_turns = 6

    def reset(self, task, seed=0):
        r = random.Random(task.seed)
        self.x, self.y, self.turn = r.randrange(3), r.randrange(3), 0
        self.gx, self.gy = 2 - self.x, (self.y + 1) % 3
        return self.obs()

    def obs(self):
        return f"you are at {self.x} {self.y} , goal at {self.gx} {self.gy}"

    def step(self, action):
        self.turn += 1
        moves = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}
        done = self.turn >= self.max_turns
        if action.strip() not in moves:
            return StepResult("invalid . " + self.obs(), 0.0, done,
                              {"valid": False, "success": False})
        dx, dy = moves[action.strip()]
        self.x, self.y = min(2, max(0, self.x + dx)), min(2, max(0, self.y + dy))
        if (self.x, self.y) == (self.gx, self.gy):
            return StepResult("reached", 1.0, True, {"valid": True, "success": True})
        return StepResult(self.obs(), 0.0, done, {"valid": True, "success": False})

    def state_key(self):
        return f"{self.x}{self.y}{self.gx}{self.gy}{self.turn}"

    def snapshot(self):
        return (self.x, self.y, self.gx, self.gy, self.turn)

    def restore(self, s):
        self.x, self.y, self.gx, self.gy, self.turn = s
'''


@pytest.mark.slow
def test_minimal_env_fails_early_with_the_method_to_add(tmp_path: Path) -> None:
    """Issue 16 item 1: the README's five methods only, `--env myenv:GridEnv`. The env never
    prints its action words, so the built-in model could never write one: training stops
    before any compute, naming the methods to add, and leaves no run folder."""
    (tmp_path / "myenv.py").write_text(GRID)
    res = _cli("train", "--env", "myenv:GridEnv", "sft.enabled=false", "--quiet", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    _one_error_line(res.stderr, "GridEnv", "vocabulary()", "sample_action(rng)")
    assert not (tmp_path / "runs").exists()


def test_minimal_env_without_oracle_and_warm_start(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the warm start on (the default) the missing oracle is named before compute."""
    (tmp_path / "myenv2.py").write_text(
        GRID + "\n    def vocabulary(self):\n"
        "        return 'you are at goal invalid reached up down left right 0 1 2'.split()\n"
    )
    monkeypatch.chdir(tmp_path)
    rc, _, err = _run(["train", "--env", "myenv2:GridEnv", "--quiet"], capsys)
    assert rc == 2
    _one_error_line(err, "oracle_action()", "sft.enabled=false")
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ train (subprocess)
@pytest.mark.slow
def test_train_happy_path_overrides_anywhere_and_first_row(tmp_path: Path) -> None:
    """Overrides before and after options; the env given as a file path; the table's first
    row says there was no warm start; the run folder sits directly in runs/."""
    env_file = ROOT / "examples" / "custom_env.py"
    res = _cli(
        "train",
        "optim.lr=1e-4",
        "--env",
        f"{env_file}:GuessEnv",
        *[o for o in TINY if not o.startswith("env.name")],
        "--quiet",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "initial policy (no warm start)" in res.stdout
    assert "warm start (SFT)" not in res.stdout
    (run,) = (tmp_path / "runs").iterdir()  # one folder, not a tree following the path
    assert run.name.startswith("grpo-") and "GuessEnv" in run.name
    for name in ("config.yaml", "metrics.jsonl", "curves.png", "final_eval.json"):
        assert (run / name).exists(), name
    assert yaml.safe_load((run / "config.yaml").read_text())["optim"]["lr"] == 1e-4


@pytest.mark.slow
def test_bad_env_class_is_one_line_in_a_subprocess(tmp_path: Path) -> None:
    res = _cli("train", "--env", "json:JSONDecoder", cwd=tmp_path)
    assert res.returncode == 2
    _one_error_line(res.stderr, "JSONDecoder", "is not an env", "reset()")
    assert not (tmp_path / "runs").exists()


def test_version_and_help_examples(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("credo 0.")
    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    assert {"train", "sft", "eval", "play", "compare", "config", "check-env", "envs"} <= set(subs)
    for name, sub in subs.items():
        text = sub.format_help()
        assert "examples:" in text and f"credo {name}" in text, name
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, (name, action.dest)


def test_listings(capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = _run(["recipes"], capsys)
    assert rc == 0 and "gigpo" in out
    rc, out, _ = _run(["envs"], capsys)
    assert rc == 0 and "shop" in out and "credo.envs" in out


def test_interrupt_is_exit_130(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import credo.cli as cli

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_recipes", interrupted)
    rc, _, err = _run(["recipes"], capsys)
    assert rc == 130 and err.strip() == "interrupted"


def test_overrides_may_stand_anywhere() -> None:
    a = parse_args(["train", "optim.lr=1e-4", "--iterations", "5", "sft.enabled=false"])
    assert a.overrides == ["optim.lr=1e-4", "sft.enabled=false"] and a.iterations == 5
    e = parse_args(["eval", "runs/x", "--greedy", "rollout.temperature=0.5"])
    assert e.run_dir == "runs/x" and e.greedy and e.overrides == ["rollout.temperature=0.5"]
    e = parse_args(["eval", "rollout.temperature=0.5", "--greedy", "runs/x"])
    assert e.run_dir == "runs/x" and e.overrides == ["rollout.temperature=0.5"]


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["train", "--iteratons", "5"], ["credo train", "did you mean --iterations?"]),
        (["train", "stray"], ["unrecognized arguments: stray", "key.sub=value"]),
        (["train", "--iterations", "abc"], ["invalid int value: 'abc'"]),
        (["compare"], ["--recipes"]),
        (["recipes", "optim.lr=1"], ["takes no overrides"]),
    ],
)
def test_usage_errors_are_one_line(
    argv: list[str], needles: list[str], capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    _one_error_line(capsys.readouterr().err, *needles, "--help")


# ------------------------------------------------------------------ load-time errors
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["rollout.train_tasks=1"], ["rollout.train_tasks=1", "tasks_per_iter"]),
        (["optim.betas=[2,3]"], ["optim.betas", "[0, 1)"]),
        (["model.device=cuda"], ["model.device=cuda", "cpu"]),
        (["--model", "./no/such/folder"], ["no such folder"]),
        (["optim.lrr=1e-3"], ["optim.lrr", "Did you mean 'lr'"]),
        (["--env", "json:JSONDecoder"], ["is not an env"]),
        (["--env", "nosuchmod:Env"], ["cannot import module 'nosuchmod'"]),
        (["--env", "shoop"], ["Did you mean 'shop'"]),
        (["--recipe", "gipo"], ["Did you mean 'gigpo'"]),
    ],
)
def test_train_refuses_bad_input_before_compute(
    args: list[str],
    needles: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    if "model.device=cuda" in args and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    monkeypatch.chdir(tmp_path)
    rc, _, err = _run(["train", *args, "--quiet"], capsys)
    assert rc == 2
    _one_error_line(err, *needles)
    assert not (tmp_path / "runs").exists()


def test_recipe_yaml_syntax_error_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("inherit: base\noptim:\n  lr: [1e-4\n")
    rc, _, err = _run(["train", "--recipe", str(bad)], capsys)
    assert rc == 2
    _one_error_line(err, str(bad), "line")


def test_model_folder_and_hub_name_checks_are_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty").mkdir()
    rc, _, err = _run(["train", "--model", str(tmp_path / "empty")], capsys)
    assert rc == 2
    _one_error_line(err, "has no config.json")
    # fast: with HF_HUB_OFFLINE the check never waits on the network (no connection tried)
    import socket

    tried: list[object] = []

    def no_network(*args: object, **kwargs: object) -> None:
        tried.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    rc, _, err = _run(["eval", "--model", "NoSuchOrg/no-such-model-xyz"], capsys)
    assert rc == 2 and not tried
    _one_error_line(err, "NoSuchOrg/no-such-model-xyz", "HF_HUB_OFFLINE")
    assert not (tmp_path / "runs").exists()


def test_failed_start_leaves_no_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that fails after the run folder exists (here: the warm-start phase) removes
    the folder it made."""
    import credo.train.loop as loop

    def broken(*a: object, **k: object) -> None:
        raise ValueError("warm start failed on purpose")

    monkeypatch.setattr(loop, "start_policy", broken)
    rc, _, err = _run(["train", *TINY, f"train.runs_dir={tmp_path / 'runs'}", "--quiet"], capsys)
    assert rc == 2
    _one_error_line(err, "on purpose")
    assert list((tmp_path / "runs").iterdir()) == []


# ------------------------------------------------------------------ eval / compare / sft
@pytest.mark.parametrize("episodes", ["0", "-3"])
def test_eval_episodes_must_be_positive(episodes: str, capsys: pytest.CaptureFixture) -> None:
    rc, out, err = _run(["eval", "runs/whatever", "--episodes", episodes], capsys)
    assert rc == 2 and out == ""
    _one_error_line(err, "--episodes", episodes)


def test_eval_needs_a_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc, _, err = _run(["eval", str(tmp_path)], capsys)
    assert rc == 2
    _one_error_line(err, "not a run folder")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--recipes", "grpo", "--seeds", "0"], ["--seeds", "≥ 1"]),
        (["--recipes", "grpo,gipo"], ["Did you mean 'gigpo'"]),
        (["--recipes", "grpo,gigpo", "--reference", "gipo"], ["--reference 'gipo'"]),
    ],
)
def test_compare_checks_before_training(
    args: list[str], needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "cmp"
    rc, _, err = _run(["compare", *args, "--out", str(out), *TINY], capsys)
    assert rc == 2
    _one_error_line(err, *needles)
    assert not out.exists()


def test_sft_episodes_must_be_positive(capsys: pytest.CaptureFixture) -> None:
    rc, _, err = _run(["sft", "--episodes", "0"], capsys)
    assert rc == 2
    _one_error_line(err, "--episodes")


# ------------------------------------------------------------------ resume
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-iteration run (trained once for the module)."""
    root = tmp_path_factory.mktemp("finished")
    assert main(["train", *TINY, f"train.runs_dir={root}", "train.name=one", "--quiet"]) == 0
    return root / "one"


def _copy(run: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(run, dest)
    return dest


def test_resume_of_a_finished_run_says_so(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = _copy(finished_run, tmp_path / "r")
    events = sorted((run / "tensorboard").iterdir())
    rc, out, err = _run(["train", "--resume", str(run), "--quiet"], capsys)
    assert rc == 0 and err == ""
    assert "is finished" in out and "train.iterations=N" in out
    assert sorted((run / "tensorboard").iterdir()) == events
    rc, _, err = _run(["train", "--resume", str(run), "optim.lr=1"], capsys)
    assert rc == 2
    _one_error_line(err, "only train.iterations")


@pytest.mark.slow
def test_resume_extends_a_finished_run_exactly(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`--resume DIR train.iterations=2` on a 1-iteration run gives the metrics of a run
    trained for 2 iterations from the start, and the saved config says 2."""
    run = _copy(finished_run, tmp_path / "ext")
    rc, _, err = _run(["train", "--resume", str(run), "train.iterations=2", "--quiet"], capsys)
    assert rc == 0, err
    full = tmp_path / "full"
    cfg = [*TINY, "train.iterations=2", f"train.runs_dir={tmp_path}", "train.name=full"]
    assert main(["train", *cfg, "--quiet"]) == 0
    assert _stable(run / "metrics.jsonl") == _stable(full / "metrics.jsonl")
    assert len(_stable(run / "metrics.jsonl")) == 2
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["iterations"] == 2
    assert json.loads((run / "final_eval.json").read_text()) == json.loads(
        (full / "final_eval.json").read_text()
    )
    rc, _, err = _run(["train", "--resume", str(run), "train.iterations=1"], capsys)
    assert rc == 2
    _one_error_line(err, "extended, not shortened")


@pytest.mark.parametrize("damage", ["truncate", "empty"])
@pytest.mark.parametrize("target", ["policy/model.safetensors", "state.json"])
def test_resume_names_a_damaged_checkpoint_file(
    damage: str, target: str, finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = _copy(finished_run, tmp_path / "dmg")
    path = run / "checkpoints" / "step_1" / target
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"")
    rc, _, err = _run(["train", "--resume", str(run), "train.iterations=2"], capsys)
    assert rc == 2
    _one_error_line(err, str(path))


# ------------------------------------------------------------------ config
def test_config_prints_every_key_with_meaning_and_is_a_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from credo.train.config import load_config

    rc, out, _ = _run(["config", "--recipe", "gigpo", "optim.lr=1e-4", "--env", "shop"], capsys)
    assert rc == 0
    assert "# AdamW learning rate (default 3e-4)." in out
    assert "  lr: 0.0001" in out
    assert "# torch CPU threads" in out
    saved = tmp_path / "mine.yaml"
    saved.write_text(out)
    assert load_config(str(saved)).to_dict() == load_config("gigpo", ["optim.lr=1e-4"]).to_dict()


# ------------------------------------------------------------------ play
@pytest.mark.slow
def test_play_turns_and_why_it_ended(tmp_path: Path) -> None:
    res = _cli(
        "play", "--env", "examples.custom_env:GuessEnv", "env.kwargs.max_turns=2", "--split",
        "train", cwd=tmp_path, stdin="hint\nguess[1]\nguess[1]\n",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "[turn 1/2]" in res.stdout and "[turn 2/2]" in res.stdout
    assert "episode over after" in res.stdout
    assert ("turn limit reached" in res.stdout) or ("solved" in res.stdout)


def test_play_ctrl_c_and_eof(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(prompt: str = "") -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", interrupt)
    rc, out, err = _run(["play", "--env", "examples.custom_env:GuessEnv"], capsys)
    assert rc == 0 and "left the episode" in out and "Traceback" not in err


from examples.custom_env import GuessEnv as _GuessEnv  # noqa: E402


class StepRaisesGuess(_GuessEnv):
    """GuessEnv whose step() always raises (a broken env a user plays)."""

    def step(self, action: str):  # type: ignore[no-untyped-def]
        raise ConnectionError("the game server went away")


def test_play_with_an_env_that_raises_is_one_line(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("builtins.input", lambda prompt="": "guess[1]")
    rc, _, err = _run(["play", "--env", "test_cli:StepRaisesGuess", "sft.enabled=false"], capsys)
    assert rc == 2 and "Traceback" not in err
    assert err.strip().startswith(
        "error: the env raised ConnectionError: the game server went away"
    )
    assert "test_cli.py" in err and "in step" in err


def test_env_error_frame_of_an_env_under_a_folder_named_credo(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user env kept under a folder called ``credo`` (as a clone of this repository is
    named) still gets its ``[file:line in function]``: "inside credo" is the package's
    own folder, not any path containing ``/credo/``."""
    home = tmp_path / "credo" / "my_envs"
    home.mkdir(parents=True)
    (home / "broken_guess_env.py").write_text(
        "from examples.custom_env import GuessEnv\n\n\n"
        "class BrokenGuess(GuessEnv):\n"
        "    def step(self, action):\n"
        "        raise ConnectionError('the game server went away')\n"
    )
    monkeypatch.setattr("builtins.input", lambda prompt="": "guess[1]")
    env = f"{home / 'broken_guess_env.py'}:BrokenGuess"
    rc, _, err = _run(["play", "--env", env, "sft.enabled=false"], capsys)
    assert rc == 2 and "Traceback" not in err
    _one_error_line(err, "ConnectionError", "[broken_guess_env.py:6 in step]")


# ------------------------------------------------------------------ envs and check-env
def test_envs_by_entry_point_and_module_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package offering an env through the `credo.envs` entry-point group, and a module
    named in $CREDO_ENV_MODULES registering one: both work as `--env NAME` and are listed."""
    pkg = tmp_path / "newbie_envs_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from examples.custom_env import GuessEnv\n\n\n"
        "class EntryGuess(GuessEnv):\n    '''Guess, offered by an entry point.'''\n"
    )
    dist = tmp_path / "newbie_envs_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: newbie-envs-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[credo.envs]\nentryguess = newbie_envs_pkg:EntryGuess\n"
    )
    (tmp_path / "newbie_reg.py").write_text(
        "from credo.envs import register_env\nfrom examples.custom_env import GuessEnv\n\n\n"
        "@register_env('regguess')\nclass RegGuess(GuessEnv):\n    '''Guess, registered.'''\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CREDO_ENV_MODULES", "newbie_reg")
    rc, out, _ = _run(["envs"], capsys)
    assert rc == 0
    assert "entryguess" in out and "newbie-envs-pkg (entry point)" in out
    assert "regguess" in out and "newbie_reg" in out
    from credo.envs.base import make_env

    assert type(make_env("entryguess")).__name__ == "EntryGuess"
    assert type(make_env("regguess")).__name__ == "RegGuess"
    assert type(make_env("newbie_reg:regguess")).__name__ == "RegGuess"


STRICT = '''
from examples.custom_env import GuessEnv
from credo.envs import StepResult


class StrictGuess(GuessEnv):
    """Parses `guess[n]` exactly, as a README-only author might."""

    def step(self, action):
        if not (action.startswith("guess[") and action.endswith("]")):
            self.turn += 1
            return StepResult("invalid", 0.0, self.turn >= self.max_turns,
                              {"valid": False, "success": False})
        return super().step(action)


class TupleGuess(GuessEnv):
    def step(self, action):
        r = super().step(action)
        return (r.observation, r.reward, r.done, r.info)
'''


def test_check_env(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, out, _ = _run(
        ["check-env", "--env", "examples.custom_env:GuessEnv", "--tasks", "3"], capsys
    )
    assert rc == 0, out
    assert "ok      snapshot/restore round trip" in out
    assert "oracle actions survive the tokenizer" in out
    (tmp_path / "strict_env.py").write_text(STRICT)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, out, _ = _run(["check-env", "--env", "strict_env:StrictGuess", "--tasks", "2"], capsys)
    assert rc == 1
    assert "FAIL" in out and "'guess [ 4 ]'" in out
    rc, out, _ = _run(["check-env", "--env", "strict_env:TupleGuess", "--tasks", "2"], capsys)
    assert rc == 1
    assert "returned a tuple" in out and "StepResult" in out
    rc, _, err = _run(["train", "--env", "strict_env:TupleGuess", *TINY[1:]], capsys)
    assert rc == 2
    _one_error_line(err, "returned a tuple")
