"""The text of Python source that a cache key should hash: the code, not its prose.

A cached result keyed on source code (a warm start keyed on the built-in model's and the
env's modules, :func:`credo.train.warmstart.warm_start_key`; a result keyed on the user's
agent, :func:`credo.utils.imports.user_code_digest`) should be found again after a
docstring is reworded or a comment added, and not after the code changes.
"""

from __future__ import annotations

import ast
import io
import tokenize

__all__ = ["code_text"]


def code_text(source: str) -> str:
    r"""``source`` (a Python module) without what does not run: its docstrings (and any
    other statement that is only a string), its comments, trailing spaces and blank
    lines. The code itself is kept character for character, so any edit to it changes
    the text. Positions come from :mod:`ast` and :mod:`tokenize`, which place them the
    same way on every Python version. Line ends are first read as Python reads a source
    file (``\r\n`` and ``\r`` become ``\n``); source that does not parse is returned
    with only that done."""
    source = source.replace("\r\n", "\n").replace("\r", "\n")
    try:
        tree = ast.parse(source)
        # ((row, col), (row, col)) of what to cut: 1-based rows, character columns
        spans = [
            (tok.start, tok.end)
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT
        ]
    except (SyntaxError, tokenize.TokenError, ValueError):
        return source
    lines = source.split("\n")  # rows as ast and tokenize count them (not str.splitlines)

    def char_col(row: int, byte_col: int) -> int:  # ast counts UTF-8 bytes, not characters
        return len(lines[row - 1].encode()[:byte_col].decode(errors="ignore"))

    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and node.end_lineno is not None
            and node.end_col_offset is not None
        ):
            start = (node.lineno, char_col(node.lineno, node.col_offset))
            end = (node.end_lineno, char_col(node.end_lineno, node.end_col_offset))
            spans.append((start, end))
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    text = source
    for (r0, c0), (r1, c1) in sorted(spans, reverse=True):  # from the end: offsets hold
        text = text[: offsets[r0 - 1] + c0] + text[offsets[r1 - 1] + c1 :]
    kept = (line.rstrip() for line in text.split("\n"))
    return "\n".join(line for line in kept if line)
