"""Importing the user's own code named on the command line (``--env module:Class``,
``--agent path/to/file.py:function``), the same way for every flag.

A user runs credo from their project folder and names their code as they would run it:
a dotted module found from the working folder (as ``python -m`` would), or a ``.py``
file whose own folder is on the import path (as ``python path/to/file.py`` would, though
after the installed packages), so that the file may import the modules beside it.
Failures become one ``ValueError`` line naming the flag, never a traceback from inside
the user's import.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from credo.utils.code_text import code_text

__all__ = [
    "add_cwd_to_path",
    "import_user_module",
    "is_file_spec",
    "user_code_digest",
    "user_module_files",
]


def add_cwd_to_path() -> None:
    """Put the working folder on the import path (``--env mymodule:MyEnv`` from the
    project folder), once."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def is_file_spec(module_name: str) -> bool:
    """``module_name`` names a file (``x.py`` or a path), not a dotted module."""
    return module_name.endswith(".py") or "/" in module_name or os.sep in module_name


def _add_folder_to_path(folder: str) -> None:
    """Make a file's siblings importable, as ``python file.py`` does, but after the
    installed packages: a user's folder never shadows a package credo itself imports."""
    if folder not in sys.path:
        sys.path.append(folder)


def import_user_module(
    spec: str, module_name: str, *, flag: str, prefix: str, fresh: bool = False
) -> ModuleType:
    """Import ``module_name`` (the part of ``spec`` before its ``:``).

    Args:
        spec: the whole value given to the flag (quoted in error messages).
        module_name: a dotted module (the working folder is put on the path first) or a
            ``.py`` file path (its folder is put on the path, after the installed
            packages, so that it can import its siblings).
        flag: the option named in errors (``"--env"``, ``"--agent"``).
        prefix: a file is imported as the module ``prefix + its stem``; importing the
            same file again returns that module instead of running it twice, unless
            ``fresh``.
        fresh: run a file again even when it was imported before (a file edited since
            is read anew).

    Raises:
        ValueError: the file does not exist, the module cannot be found, or importing it
            raised (one line saying which).
    """
    if is_file_spec(module_name):
        path = os.path.abspath(os.path.expanduser(module_name))
        if not os.path.isfile(path):
            raise ValueError(f"{flag} {spec!r}: no such file {module_name!r}")
        mod_name = prefix + os.path.splitext(os.path.basename(path))[0]
        loaded = sys.modules.get(mod_name)
        if not fresh and loaded is not None and getattr(loaded, "__file__", "") == path:
            return loaded
        mod_spec = importlib.util.spec_from_file_location(mod_name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"{flag} {spec!r}: cannot load {module_name!r} as a Python file")
        _add_folder_to_path(os.path.dirname(path))
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_name] = module
        try:
            mod_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[mod_name]
            raise ValueError(
                f"{flag} {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
            ) from None
        return module
    add_cwd_to_path()
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{flag} {spec!r}: cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:
        raise ValueError(
            f"{flag} {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None


def user_module_files(module_name: str) -> list[Path]:
    """The source files that make up the user's module ``module_name`` (a dotted name or
    a ``.py`` path), for keying caches by content rather than by name: the module's own
    file and every ``.py`` file beside it (the siblings it may import; a changed sibling
    it does not import costs a needless recomputation, never a stale result). Empty when
    the module cannot be found or has no source file (a built-in or compiled module).

    A dotted module is located without running it (its parent packages are imported,
    as Python must to find it)."""
    if is_file_spec(module_name):
        origin: str | None = os.path.abspath(os.path.expanduser(module_name))
    else:
        add_cwd_to_path()
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            found = None
        origin = found.origin if found is not None else None
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        return []
    own = Path(origin)
    return [own, *sorted(p for p in own.parent.glob("*.py") if p != own and p.is_file())]


def user_code_digest(module_name: str) -> str:
    """A SHA-256 of the source of the user's module ``module_name`` and its siblings
    (:func:`user_module_files`: names relative to its folder, and their code), so that a
    result cached for the user's code is found again only while that code is unchanged;
    ``""`` when it has no source file to read. A file's code is its
    :func:`~credo.utils.code_text.code_text` (a reworded docstring or comment keeps the
    digest); a file that is not UTF-8 counts byte for byte."""
    files = user_module_files(module_name)
    if not files:
        return ""
    h = hashlib.sha256()
    for path in files:
        raw = path.read_bytes()
        try:
            body = code_text(raw.decode("utf-8")).encode()
        except UnicodeDecodeError:
            body = raw
        h.update(path.name.encode() + b"\0")
        h.update(body)
        h.update(b"\0")
    return h.hexdigest()
