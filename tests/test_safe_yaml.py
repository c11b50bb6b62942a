"""Every YAML file a user hands credo is read bounded (issue 46, item 1).

A 543-byte recipe of nested aliases reached 13.9 GB before it was killed, because the
recipe was loaded and then expanded (``json.loads(json.dumps(data))``) before anything
checked it; a 1,000-level nested file gave a ``RecursionError`` traceback. Here the same
files stop with one ``error:`` line, cheaply, at every place credo reads YAML from a user:
recipes, overrides, pipeline files, study files and a run's ``config.yaml`` on resume.
"""

from __future__ import annotations

import ast
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from credo.cli import main
from credo.commands.study import load_study
from credo.pipeline.spec import PipelineError, load_pipeline
from credo.train.config import ConfigError, apply_overrides, load_config
from credo.utils.safe_yaml import MAX_VALUES, YAMLLimitError, load_yaml, read_yaml_file

SRC = Path(__file__).resolve().parents[1] / "src" / "credo"


def laughs(levels: int, width: int = 9) -> str:
    """``levels`` anchored lists, each ``width`` aliases of the one before: the document
    stands for about ``width ** levels`` values."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


#: 9**7 ≈ 4.8 million values once expanded, from 476 bytes
BOMB = laughs(6)
DEEP = "a: " + "[" * 1000 + "]" * 1000 + "\n"


def _bounded(fn, *args):  # type: ignore[no-untyped-def]
    """``fn(*args)`` with the CPU time and the peak Python allocation it took."""
    tracemalloc.start()
    cpu = time.process_time()
    try:
        try:
            out = fn(*args)
        except BaseException as exc:  # returned to the test to check
            out = exc
        return out, time.process_time() - cpu, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_expanded_size_is_counted_by_hand() -> None:
    # root mapping 1; key a 1; [1, 2] is 1 + 2 = 3; key b 1; [*a, *a] is 1 + 3 + 3 = 7
    doc = "a: &a [1, 2]\nb: [*a, *a]\n"
    assert load_yaml(doc, max_values=13) == {"a": [1, 2], "b": [[1, 2], [1, 2]]}
    with pytest.raises(YAMLLimitError, match="more than 12 values"):
        load_yaml(doc, max_values=12)
    # depth: a mapping holding a list holding a mapping is 3 levels
    assert load_yaml("x: [{y: 1}]", max_depth=3) == {"x": [{"y": 1}]}
    with pytest.raises(YAMLLimitError, match="nested more than 2 deep") as err:
        load_yaml("x: [{y: 1}]", max_depth=2)
    assert (err.value.problem_mark.line, err.value.problem_mark.column) == (0, 4)


def test_merge_keys_and_ordinary_anchors_still_load() -> None:
    doc = "base: &b {lr: 0.1, steps: 3}\nrun: {<<: *b, steps: 5}\n"
    assert load_yaml(doc) == {"base": {"lr": 0.1, "steps": 3}, "run": {"lr": 0.1, "steps": 5}}


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(YAMLLimitError, match=r"alias \*a refers to a node that contains it"):
        load_yaml("&a [1, *a]")


def test_an_alias_bomb_recipe_stops_at_once_with_one_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text("inherit: grpo\n" + BOMB)
    code, cpu, peak = _bounded(main, ["config", "--recipe", str(recipe)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"error: recipe {recipe} (line 7, column")
    assert f"more than {MAX_VALUES:,} values once its aliases" in err
    assert cpu < 2.0 and peak < 20 * 2**20


def test_a_deeply_nested_recipe_is_one_line_not_a_recursion_error(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    recipe = tmp_path / "deep.yaml"
    recipe.write_text(DEEP)
    assert main(["config", "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "(line 1, column 67): mappings and sequences are nested more than 64 deep" in err


def test_override_values_are_bounded_too() -> None:
    with pytest.raises(ConfigError, match=r"cannot parse the value.*undefined alias"):
        apply_overrides({}, ["env.kwargs=*nothing"])
    pairs = ["k0: &k0 [1]"] + [f"k{i}: &k{i} [*k{i - 1}, *k{i - 1}]" for i in range(1, 40)]
    with pytest.raises(ConfigError, match="more than 100,000 values") as err:
        load_config("grpo", ["env.kwargs={" + ", ".join(pairs) + "}"])
    assert "\n" not in str(err.value)


def test_pipeline_and_study_files_and_overrides_are_bounded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pipe = tmp_path / "p.yaml"
    pipe.write_text("stages: []\n" + BOMB)
    with pytest.raises(PipelineError, match=f"pipeline {pipe} \\(line 7, column .*more than"):
        load_pipeline(pipe)
    pipe.write_text(DEEP)
    with pytest.raises(PipelineError, match="nested more than 64 deep"):
        load_pipeline(pipe)
    pipe.write_text("stages: [{name: a, kind: eval}]\n")
    with pytest.raises(PipelineError, match=r"cannot parse the value.*nested more than 64"):
        load_pipeline(pipe, ["name=" + "[" * 200 + "]" * 200])
    study = tmp_path / "s.yaml"
    study.write_text("title: t\nclaim: c\n" + BOMB)
    with pytest.raises(ConfigError, match=f"study {study} \\(line 8, column .*more than"):
        load_study(study)


def test_resume_reads_config_yaml_bounded(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(BOMB)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / 'config.yaml'} (line 6" in err


def test_files_over_the_byte_bound_and_not_utf8_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "big.yaml"
    f.write_text("a: 1\n" * 30)
    assert read_yaml_file(f, max_bytes=150) == {"a": 1}
    with pytest.raises(YAMLLimitError, match="larger than 100 bytes"):
        read_yaml_file(f, max_bytes=100)
    f.write_bytes(b"a: \xff\n")
    with pytest.raises(yaml.YAMLError, match="not UTF-8 text"):
        read_yaml_file(f)


def test_no_yaml_is_read_around_the_bounded_reader() -> None:
    """Every ``yaml.safe_load`` / ``yaml.load`` / ``yaml.full_load`` call in credo's
    source is in :mod:`credo.utils.safe_yaml`, so a new reader cannot skip the bounds."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "safe_yaml.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"safe_load", "load", "full_load", "unsafe_load", "load_all"}
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "yaml"
            ):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []
