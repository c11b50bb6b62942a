"""Markdown tables, as ``credo compare`` and ``credo pipeline`` write them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["markdown_table"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``header`` and ``rows`` as a Markdown table (one line each, a trailing newline);
    a pipe inside a cell is escaped (``|A| p99`` stays one cell)."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)]) + "\n"
