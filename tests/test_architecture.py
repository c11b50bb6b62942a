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
    "teachers": {"data", "envs", "objectives", "policy", "rollout", "utils"},
    "serve": {"data", "policy", "rollout", "utils"},
    "integrations": {"data", "credit", "objectives", "utils"},
    "eval": {"data", "envs", "policy", "rollout", "utils"},
    "tasks": {"data", "envs", "policy", "utils"},
    "critics": {"data", "envs", "policy", "rollout", "teachers", "utils"},
    "engines": {"data", "policy", "rollout", "utils"},
    "agent": {"data", "envs", "eval", "policy", "rollout", "serve", "utils"},
    "train": {
        "agent",
        "credit",
        "critics",
        "data",
        "engines",
        "envs",
        "eval",
        "objectives",
        "policy",
        "rollout",
        "tasks",
        "teachers",
        "utils",
    },
    "commands": {"critics", "data", "envs", "eval", "policy", "rollout", "train", "utils"},
    "pipeline": {"commands", "data", "envs", "eval", "policy", "rollout", "train", "utils"},
    "cli": {"commands", "envs", "eval", "pipeline", "serve", "train", "utils"},
    "__main__": {"cli"},  # python -m credo (torchrun, accelerate launch)
}

DOC = SRC.parents[1] / "docs" / "architecture.md"


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


#: Config fields that name a registered part (``objective.loss``, ``rollout.sampler``,
#: ``teacher.route``, ...).
PART_NAME_FIELDS = {
    "aggregation",
    "engine",
    "estimator",
    "kind",
    "loss",
    "proposer",
    "route",
    "sampler",
    "sampler_in_use",
    "sanitiser",
    "source",
}


def _registered_names() -> set[str]:
    """Every name a config can give a registered part (``grpo``, ``ppo``, ``tree``,
    ``oprd``, ``ema``, ``rods``, ...)."""
    import credo.agent  # noqa: F401  (registers the agent sampler)
    from credo.credit import ESTIMATORS
    from credo.envs.base import ENVS
    from credo.objectives import AGGREGATIONS, LOSSES
    from credo.policy.engine import ENGINES
    from credo.rollout import SAMPLERS
    from credo.tasks import TASK_SOURCES
    from credo.teachers import PROPOSERS, ROUTES, SANITISERS, TEACHERS

    registries = (ESTIMATORS, ENVS, AGGREGATIONS, LOSSES, ENGINES, SAMPLERS, TASK_SOURCES)
    registries += (PROPOSERS, ROUTES, SANITISERS, TEACHERS)
    return {name for registry in registries for name in registry.names()}


def _literals(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return []


def test_the_trainer_asks_registries_not_names() -> None:
    """``credo.train`` never compares a config field that names a registered part, nor
    anything, with a registered part's name: what a part needs it declares when it
    registers (``register_loss(needs=)``, ``register_sampler(branches=)``,
    ``register_route(to_loss=)``, ``register_part(when=, needs=)``), and the trainer asks
    the registry."""
    names = _registered_names()
    found = []
    for path in sorted((SRC / "train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            literals = [s for side in sides for s in _literals(side)]
            field = any(isinstance(s, ast.Attribute) and s.attr in PART_NAME_FIELDS for s in sides)
            if literals and (field or set(literals) & names):
                found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_the_check_sees_a_comparison_of_a_part_name(tmp_path: Path) -> None:
    """The check above is not vacuous: the comparisons it forbids are found."""
    names = _registered_names()
    assert {"grpo", "ppo", "tree", "oprd", "ema", "rods", "vllm", "agent"} <= names
    tree = ast.parse('if cfg.rollout.sampler in ("tree", "resample"): pass\nx = y == "renyi_opsd"')
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert [_literals(c.comparators[0]) for c in compares] == [["tree", "resample"], ["renyi_opsd"]]
    assert isinstance(compares[0].left, ast.Attribute) and compares[0].left.attr in PART_NAME_FIELDS


def _documented() -> dict[str, set[str]]:
    """The package table of ``docs/architecture.md``: package → the packages its
    "imports" column names."""
    rows: dict[str, set[str]] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`credo."):
            imports = {x.strip() for x in cells[2].split(",")} - {"—", ""}
            rows[cells[0].strip("`").removeprefix("credo.")] = imports
    return rows


def test_every_package_is_in_the_architecture_doc_with_its_imports() -> None:
    """``docs/architecture.md`` lists every package of ``src/credo`` (and ``cli``) with
    exactly the imports :data:`ALLOWED` grants it."""
    on_disk = {p.parent.name for p in SRC.glob("*/__init__.py")} | {"cli"}
    documented = _documented()
    assert set(documented) == on_disk
    assert documented == {name: ALLOWED[name] for name in on_disk}
