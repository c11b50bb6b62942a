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


def test_choose_mutants_applies_globs_then_a_fixed_sample() -> None:
    names = [f"credo.envs.shop.xǁGoalǁscore__mutmut_{i}" for i in range(1, 6)]
    names += [f"credo.envs.shop.xǁShopEnvǁ_generate__mutmut_{i}" for i in range(1, 40)]
    names += [
        "credo.envs.shop.xǁShopEnvǁ_reward__mutmut_1",
        "credo.envs.shop.x_parse_action__mutmut_1",
    ]
    shop = mutate.choose_mutants(names, mutate.TARGETS["shop"])
    assert shop == sorted([*names[:5], "credo.envs.shop.xǁShopEnvǁ_reward__mutmut_1"])
    sampled = mutate.Target(files=[], tests=[], sample=7)
    picked = mutate.choose_mutants(names, sampled)
    assert len(picked) == 7 and set(picked) < set(names) and picked == sorted(picked)
    assert mutate.choose_mutants(list(reversed(names)), sampled) == picked  # order-free, fixed
    assert mutate.choose_mutants(names[:3], sampled) == sorted(names[:3])  # fewer: all


def test_every_shop_glob_names_a_real_method() -> None:
    import ast

    tree = ast.parse((ROOT / "src" / "credo" / "envs" / "shop.py").read_text())
    methods = {
        f"xǁ{c.name}ǁ{f.name}"
        for c in tree.body
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, ast.FunctionDef)
    }
    for glob in mutate.TARGETS["shop"].mutants:
        assert glob.removeprefix("credo.envs.shop.").removesuffix("__mutmut_*") in methods, glob


def test_decorated_estimators_get_mutants() -> None:
    pytest.importorskip(
        "mutmut", reason="mutmut not installed: make mutate needs it (the dev extra)"
    )
    target = mutate.Target(files=["src/credo/credit/grpo.py"], tests=[], sample=10)
    every = mutate.all_mutants(ROOT, target)
    funcs = {n.split("__mutmut_")[0] for n in every}
    # rloo, grpo and dr_grpo are registered with @register_estimator: lifted, so mutated
    assert funcs == {
        "credo.credit.grpo.x_episode_group_advantage",
        "credo.credit.grpo.x_grpo",
        "credo.credit.grpo.x_dr_grpo",
        "credo.credit.grpo.x_rloo",
    }
    assert mutate.select_mutants(ROOT, mutate.Target(files=target.files, tests=[])) == []
