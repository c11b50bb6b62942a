"""The one way credo reads YAML written by a user: safe loading, bounded before it is built.

``yaml.safe_load`` refuses Python objects, but not a file that is small on disk and huge
in memory. Anchors and aliases let 543 bytes of nested aliases stand for billions of
values (the "billion laughs"): PyYAML builds them as shared references, and the first
deep copy or ``json.dumps`` expands them (a recipe reached 13.9 GB before it was
killed). A 1,000-level nested document makes PyYAML's recursive composer raise
``RecursionError``, a traceback instead of an error line.

:func:`load_yaml` therefore reads the document's *event stream* first (PyYAML's parser is
iterative, not recursive, and builds nothing) and keeps three counts, refusing the
document at the first one over its bound, before any node is composed:

- **nesting depth**: open mappings and sequences (bound :data:`MAX_DEPTH`);
- **expanded size**: the number of values the document stands for once every alias is
  expanded: a scalar counts 1, a collection 1 plus its contents, an alias the expanded
  size of the node its anchor names (bound :data:`MAX_VALUES`). An alias to a node still
  being read (a recursive structure) is refused too;
- **bytes** of a file (bound :data:`MAX_BYTES`, :func:`read_yaml_file`).

Only then is the document loaded with ``yaml.SafeLoader``. Every bound is far above what
credo's own files use (a recipe has a few hundred values, 4 levels deep).
Errors are :class:`YAMLLimitError`, a ``yaml.MarkedYAMLError`` with the line and column
where the bound was crossed, so every caller's existing ``except yaml.YAMLError`` turns it
into its one-line message (:func:`yaml_problem`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_VALUES",
    "YAMLLimitError",
    "load_yaml",
    "read_yaml_file",
    "yaml_problem",
]

#: Deepest nesting of mappings and sequences accepted.
MAX_DEPTH = 64
#: Most values a document may stand for with its aliases expanded.
MAX_VALUES = 100_000
#: Largest YAML file read (4 MiB).
MAX_BYTES = 4 * 2**20


class YAMLLimitError(yaml.MarkedYAMLError):
    """A YAML document over one of this module's bounds (``problem`` says which)."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem=problem, problem_mark=mark)


def _check_events(text: str, max_depth: int, max_values: int) -> None:
    """Walk ``text``'s events and raise :class:`YAMLLimitError` at the first bound
    crossed (see the module docstring). Syntax errors are left to the loader."""
    sizes: dict[str, int] = {}  # anchor → expanded size of its (complete) node
    open_anchors: set[str] = set()  # anchors of collections still being read
    stack: list[list[Any]] = []  # per open collection: [size so far, anchor]
    total = 0

    def add(n: int, mark: Any) -> None:
        nonlocal total
        total += n
        if total > max_values:
            raise YAMLLimitError(
                f"the document stands for more than {max_values:,} values once its aliases "
                f"(*name) are expanded; at most {max_values:,} are accepted",
                mark,
            )
        if stack:
            stack[-1][0] += n

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.DocumentStartEvent, yaml.StreamStartEvent)):
            sizes.clear()
            open_anchors.clear()
            total = 0
        elif isinstance(event, yaml.ScalarEvent):
            add(1, event.start_mark)
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                raise YAMLLimitError(
                    f"alias *{event.anchor} refers to a node that contains it (a recursive "
                    "structure); anchors may only name complete nodes",
                    event.start_mark,
                )
            add(sizes.get(event.anchor, 1), event.start_mark)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) >= max_depth:
                raise YAMLLimitError(
                    f"mappings and sequences are nested more than {max_depth} deep; at most "
                    f"{max_depth} levels are accepted",
                    event.start_mark,
                )
            add(1, event.start_mark)
            stack.append([0, event.anchor])
            if event.anchor is not None:
                open_anchors.add(event.anchor)
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            size, anchor = stack.pop()
            if anchor is not None:
                open_anchors.discard(anchor)
                sizes[anchor] = size + 1
            if stack:  # the closed collection's contents count in its parent too
                stack[-1][0] += size


def load_yaml(text: str, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> Any:
    """``text`` loaded with ``yaml.SafeLoader`` once its events are within the bounds.

    Raises:
        yaml.YAMLError: not valid YAML, or :class:`YAMLLimitError` (over a bound).
    """
    _check_events(text, max_depth, max_values)
    return yaml.load(text, Loader=yaml.SafeLoader)


def read_yaml_file(path: str | Path, *, max_bytes: int = MAX_BYTES, **bounds: int) -> Any:
    """The YAML file ``path`` read with :func:`load_yaml` (at most ``max_bytes`` bytes
    are read; a larger file is refused).

    Raises:
        OSError: the file cannot be read.
        yaml.YAMLError: as :func:`load_yaml`, or the file is larger than ``max_bytes``,
            or it is not UTF-8 text.
    """
    with Path(path).open("rb") as fh:
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise YAMLLimitError(f"the file is larger than {max_bytes:,} bytes (the most accepted)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YAMLLimitError(f"not UTF-8 text (byte {exc.start})") from None
    return load_yaml(text, **bounds)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """`` (line L, column C): problem`` of a YAML error, in one line (no position when
    the error has none)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or "not valid YAML"
    return f"{where}: {' '.join(str(problem).split())}"
