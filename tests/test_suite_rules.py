"""Rules the suite keeps so that it passes on any machine, busy or quiet.

**No wall-clock assertion.** A test that asserts on elapsed wall time (``time.perf_counter``,
``time.time``, ``time.monotonic`` and their ``_ns`` forms) fails on a loaded machine for
no fault of the code: the fuzz harness's slowest step took 0.68 s of wall time beside two
training jobs. A test may bound CPU time (``time.thread_time``, ``time.process_time``),
count operations, or check an order of events; speed targets live in ``benchmarks/``.

The check follows wall-clock values through assignments within a function (``t0 =
time.perf_counter()``, ``took = time.perf_counter() - t0``, ``slowest = max(slowest,
took)``) and flags every ``assert`` that reads one. Deadlines that only bound a wait
(``while time.monotonic() < deadline``) are fine: they are not asserted.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: ``time`` functions that read the wall clock
WALL_CLOCK = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns"}


def _wall_clock_names(tree: ast.Module) -> set[str]:
    """Names bound to a wall-clock function by ``from time import ...`` in this module."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "time"
        for alias in node.names
        if alias.name in WALL_CLOCK
    }


def _reads_clock(expr: ast.AST, tainted: set[str], direct: set[str]) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            f = node.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr in WALL_CLOCK
                and isinstance(f.value, ast.Name)
                and f.value.id == "time"
            ):
                return True
            if isinstance(f, ast.Name) and f.id in direct:
                return True
        if isinstance(node, ast.Name) and node.id in tainted:
            return True
    return False


def _assignments(node: ast.AST) -> list[tuple[list[str], ast.AST]]:
    """``(names, value)`` pairs that ``node`` assigns; ``a, b = x, y`` pairs element-wise,
    so that ``cpu, wall = thread_time() - c0, perf_counter() - w0`` taints ``wall`` only."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
        targets = [node.target]
    else:
        return []
    value = node.value
    if value is None:
        return []
    out = []
    for t in targets:
        if (
            isinstance(t, ast.Tuple)
            and isinstance(value, ast.Tuple)
            and len(t.elts) == len(value.elts)
        ):
            out += [(_names(e), v) for e, v in zip(t.elts, value.elts)]
        else:
            out.append((_names(t), value))
    return out


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def wall_clock_asserts(source: str) -> list[int]:
    """Line numbers of the ``assert`` statements in ``source`` that read the wall clock,
    directly or through a name assigned from it (per function, in source order)."""
    tree = ast.parse(source)
    direct = _wall_clock_names(tree)
    scopes: list[ast.AST] = [tree] + [
        n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    bad: set[int] = set()
    for scope in scopes:
        tainted: set[str] = set()
        body = [n for n in ast.walk(scope) if n is not scope]
        # two passes: a name tainted late in a loop body taints what reads it earlier
        for _ in range(2):
            for node in sorted(body, key=lambda n: (getattr(n, "lineno", 0), 0)):
                for names, value in _assignments(node):
                    if _reads_clock(value, tainted, direct):
                        tainted.update(names)
                if isinstance(node, ast.Assert) and _reads_clock(node.test, tainted, direct):
                    bad.add(node.lineno)
    return sorted(bad)


def test_no_test_asserts_on_wall_clock_time() -> None:
    found = [
        f"{path.relative_to(TESTS)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in wall_clock_asserts(path.read_text())
    ]
    assert not found, (
        "wall-clock assertions (use time.thread_time/process_time, a count, or an order of "
        f"events; speed targets belong in benchmarks/): {found}"
    )


def test_the_wall_clock_check_finds_what_it_should() -> None:
    flagged = wall_clock_asserts(
        "import time\n"
        "from time import monotonic as now\n"
        "def a():\n"
        "    t0 = time.perf_counter()\n"
        "    work()\n"
        "    assert time.perf_counter() - t0 < 0.5\n"  # 6
        "def b():\n"
        "    slowest = 0.0\n"
        "    for _ in range(3):\n"
        "        t0 = time.perf_counter()\n"
        "        took = time.perf_counter() - t0\n"
        "        slowest = max(slowest, took)\n"
        "    assert slowest < 0.5\n"  # 13
        "def c():\n"
        "    start = now()\n"
        "    assert now() - start < 1\n"  # 16
        "def d():\n"
        "    c0 = time.thread_time()\n"
        "    assert time.thread_time() - c0 < 0.5\n"  # CPU time: fine
        "    deadline = time.monotonic() + 5\n"
        "    while time.monotonic() < deadline:\n"  # a bounded wait: fine
        "        pass\n"
        "    assert done()\n"
        "    cpu, wall = time.thread_time() - c0, time.perf_counter() - c0\n"
        "    assert cpu < 1\n"  # the CPU half of a paired assignment: fine
        "    assert wall < 1\n"  # 26
    )
    assert flagged == [6, 13, 16, 26]


def test_a_skip_for_a_missing_package_fails_under_make_test(tmp_path: Path) -> None:
    """``make test`` sets CREDO_REQUIRE_EXTRAS=1 (it installs every package the tests use):
    a test skipped because a package is not installed then fails, naming it; a skip for
    another reason stays a skip; plain ``pytest`` still allows both."""
    import os
    import shutil
    import subprocess
    import sys

    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_extra.py").write_text(
        "import pytest\n\n\n"
        "def test_needs_a_package():\n"
        "    pytest.importorskip('no_such_package_for_credo')\n\n\n"
        "@pytest.mark.skipif(True, reason='peft not installed: make smollm installs it')\n"
        "def test_needs_peft():\n"
        "    pass\n\n\n"
        "@pytest.mark.skipif(True, reason='this machine has a CUDA device')\n"
        "def test_cpu_only():\n"
        "    pass\n"
    )

    def run(require: bool) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "CREDO_REQUIRE_EXTRAS"}
        if require:
            env["CREDO_REQUIRE_EXTRAS"] = "1"
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfs", str(tmp_path)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    plain = run(False)
    assert plain.returncode == 0 and "3 skipped" in plain.stdout, plain.stdout
    strict = run(True)
    assert strict.returncode == 1, strict.stdout
    # importorskip skips in the call (a failure), a skipif mark in the setup (an error)
    assert "1 failed, 1 skipped, 1 error" in strict.stdout
    assert (
        "no_such_package_for_credo" in strict.stdout and "CREDO_REQUIRE_EXTRAS=1" in strict.stdout
    )
