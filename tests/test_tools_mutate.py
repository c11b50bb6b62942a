"""tools/mutate.py (``make mutate``): the decorator lifting and the target table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_mutate():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "credo_tools_mutate", ROOT / "tools" / "mutate.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


mutate = _load_mutate()

SOURCE = '''"""doc"""
REG = {}


def register(name):
    def deco(fn):
        REG[name] = fn
        return fn

    return deco


def twice(fn):
    return lambda *a: 2 * fn(*a)


@register("a")
@twice
def a(
    x,
    y=1,
):
    return x + y


class C:
    @staticmethod
    def s():
        @twice
        def inner():
            return 1

        return inner()


@register("b")
def b(x):
    return -x'''

LIFTED = '''"""doc"""
REG = {}


def register(name):
    def deco(fn):
        REG[name] = fn
        return fn

    return deco


def twice(fn):
    return lambda *a: 2 * fn(*a)


def a(
    x,
    y=1,
):
    return x + y
a = register("a")(twice(a))


class C:
    @staticmethod
    def s():
        @twice
        def inner():
            return 1

        return inner()


def b(x):
    return -x
b = register("b")(b)
'''


def test_lift_decorators_by_hand() -> None:
    # stacked decorators apply bottom-up; methods, classes and nested functions stay
    assert mutate.lift_decorators(SOURCE) == LIFTED
    assert mutate.lift_decorators(LIFTED) == LIFTED  # nothing left to lift


def _import(path: Path, name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lifted_module_binds_the_same_objects(tmp_path: Path) -> None:
    (tmp_path / "orig.py").write_text(SOURCE)
    (tmp_path / "lifted.py").write_text(mutate.lift_decorators(SOURCE))
    orig, lifted = _import(tmp_path / "orig.py", "orig"), _import(tmp_path / "lifted.py", "lifted")
    for m in (orig, lifted):
        assert m.a(1) == 4 and m.b(3) == -3 and m.C.s() == 2
        # the registry holds what the outer decorator saw, twice(a), which is `a` itself
        assert sorted(m.REG) == ["a", "b"] and m.REG["a"] is m.a and m.REG["b"] is m.b
        assert m.REG["a"](1, 2) == 6


def test_every_target_names_existing_sources_and_tests() -> None:
    assert set(mutate.CORE) <= set(mutate.TARGETS)
    for name, target in mutate.TARGETS.items():
        files = [p for pattern in target.files for p in ROOT.glob(pattern)]
        tests = [p for pattern in target.tests for p in ROOT.glob(pattern)]
        assert files and tests, name
        assert target.budget_s > 0
    # the core's time limits add up to under an hour
    assert sum(mutate.TARGETS[n].budget_s for n in mutate.CORE) < 3600


def test_selection_globs_and_a_fixed_sample() -> None:
    pytest.importorskip("mutmut", reason="make mutate needs mutmut (the dev extra)")
    shop = mutate.select_mutants(ROOT, mutate.TARGETS["shop"])
    funcs = {n.split("__mutmut_")[0] for n in shop}
    assert funcs == {
        "credo.envs.shop.xǁShopEnvǁscore",
        "credo.envs.shop.xǁShopEnvǁ_reward",
        "credo.envs.shop.xǁShopEnvǁ_finish_turn",
        "credo.envs.shop.xǁGoalǁscore",
        "credo.envs.shop.xǁGoalǁmatches",
        "credo.envs.shop.xǁGoalǁlooks_right",
    }
    grpo = mutate.Target(files=["src/credo/credit/grpo.py"], tests=[], sample=10)
    every = mutate.select_mutants(ROOT, mutate.Target(files=grpo.files, tests=[], sample=10**6))
    picked = mutate.select_mutants(ROOT, grpo)
    assert len(picked) == 10 and set(picked) < set(every)
    assert picked == mutate.select_mutants(ROOT, grpo)  # the same sample every run
    # decorated estimators are mutated too (lifted): rloo has mutants
    assert any(n.startswith("credo.credit.grpo.x_rloo__mutmut_") for n in every)
    assert mutate.select_mutants(ROOT, mutate.Target(files=grpo.files, tests=[])) == []


def test_bad_arguments_fail_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert mutate.main(["credits"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("mutate: unknown target(s) credits; valid: credit, objectives")
    assert mutate.main(["grpo", "--jobs", "0"]) == 2
    assert "--jobs must be ≥ 1, got 0" in capsys.readouterr().out
