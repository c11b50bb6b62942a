"""The package layering of ``docs/architecture.md`` holds: imports run one way only, and
no module imports itself back through others (lazy imports inside functions included;
imports only for type checking excluded)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "credo"

#: What each package may import (besides itself); ``docs/architecture.md`` draws it.
ALLOWED: dict[str, set[str]] = {
    "utils": set(),
    "data": {"utils"},
    "envs": {"data", "utils"},
    "policy": {"data", "utils"},
    "credit": {"data", "utils"},
    "objectives": {"data", "utils"},
    "rollout": {"data", "envs", "policy", "utils"},
    "teachers": {"data", "objectives", "policy", "rollout", "utils"},
    "serve": {"data", "policy", "rollout", "utils"},
    "integrations": {"data", "credit", "objectives", "utils"},
    "eval": {"data", "envs", "policy", "rollout", "utils"},
    "tasks": {"data", "envs", "utils"},
    "critics": {"data", "envs", "policy", "rollout", "utils"},
    "engines": {"data", "policy", "rollout", "utils"},
    "agent": {"envs", "eval", "policy", "rollout", "serve", "utils"},
    "train": {
        "agent",
        "engines",
        "critics",
        "data",
        "tasks",
        "envs",
        "policy",
        "rollout",
        "credit",
        "objectives",
        "teachers",
        "eval",
        "serve",
        "utils",
    },
    "commands": {
        "critics",
        "data",
        "envs",
        "eval",
        "policy",
        "rollout",
        "train",
        "utils",
    },
    "pipeline": {"commands", "data", "envs", "eval", "policy", "rollout", "train", "utils"},
    "cli": {"commands", "train", "eval", "envs", "serve", "pipeline", "utils"},
    "__main__": {"cli"},  # python -m credo (torchrun, accelerate launch)
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """The ``credo.*`` modules ``path`` imports at run time (``if TYPE_CHECKING:`` blocks
    left out)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("credo"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("credo"):
            found.add(node.module)
            for a in node.names:  # `from credo.train import sft` imports a module
                if (
                    (SRC.parent / (node.module + "." + a.name).replace(".", "/"))
                    .with_suffix(".py")
                    .exists()
                ):
                    found.add(f"{node.module}.{a.name}")
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_packages_import_one_way() -> None:
    bad = []
    for mod, deps in _graph().items():
        pkg = _package(mod)
        if pkg not in ALLOWED:
            continue
        for d in deps:
            other = _package(d)
            if other and other != pkg and other not in ALLOWED[pkg]:
                bad.append(f"{mod} imports {d}")
    assert not bad, "\n".join(sorted(bad))
    assert {_package(m) for m in _graph()} - {""} <= set(ALLOWED), "a new package: add it here"


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d) :], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    # a package's __init__ re-exporting its modules is not a cycle of logic
    real = [c for c in cycles if not any(_is_reexport(a, b) for a, b in itertools.pairwise(c))]
    assert not real, "\n".join(" -> ".join(c) for c in real)


def _is_reexport(a: str, b: str) -> bool:
    """``a`` is a package whose ``__init__`` imports its own submodule ``b``."""
    return b.startswith(a + ".") and (SRC.parent / a.replace(".", "/") / "__init__.py").exists()
