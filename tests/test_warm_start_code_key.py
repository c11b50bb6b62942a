"""A warm start's key hashes the code it depends on (the env's module, the renderer, the
SFT code, the built-in model) without its docstrings, comments and blank lines
(:func:`credo.utils.code_text.code_text`): a reworded docstring keeps recorded warm
starts valid, any edit to the code still gives a new key."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from credo.policy import tiny
from credo.train.config import load_config
from credo.train.warmstart import warm_start_key
from credo.utils.code_text import code_text
from credo.utils.imports import user_code_digest

SOURCE = '''"""The module's docstring."""

import math  # why math

X = "# a string, not a comment"


def f(a):  # trailing comment
    """f's docstring: é, ü (non-ASCII before the code on its line)"""; b = a + 1
    # a comment line

    return math.sqrt(b)


class C:
    """A class docstring
    over two lines."""

    y = "kept: an assignment, not a docstring"
'''

CODE = (
    "import math\n"
    'X = "# a string, not a comment"\n'
    "def f(a):\n"
    "    ; b = a + 1\n"
    "    return math.sqrt(b)\n"
    "class C:\n"
    '    y = "kept: an assignment, not a docstring"'
)


def test_code_text_drops_docstrings_comments_and_blank_lines_and_keeps_the_code() -> None:
    assert code_text(SOURCE) == CODE


def test_prose_edits_keep_the_text_and_code_edits_change_it() -> None:
    reworded = (
        SOURCE.replace("The module's docstring.", "Reworded, and longer than before.")
        .replace("# why math", "# another reason")
        .replace("over two lines.", "over\n    three lines.")
        .replace("    # a comment line\n", "")
        .replace("\n\nclass C", "\n\n\n\nclass C")
    )
    assert reworded != SOURCE
    assert code_text(reworded) == code_text(SOURCE)
    for before, after in [
        ("a + 1", "a + 2"),
        ('"# a string, not a comment"', '"# another string"'),
        ('"kept: an assignment, not a docstring"', '"changed"'),
        ("return math.sqrt(b)", "return math.sqrt(b) + 0"),
        ("    y =", "    z ="),
    ]:
        assert before in SOURCE
        assert code_text(SOURCE.replace(before, after)) != code_text(SOURCE), before


def test_a_line_separator_inside_a_string_does_not_shift_the_cuts() -> None:
    # str.splitlines breaks at a form feed or U+2028; Python's tokenizer does not
    source = 'x = "a\x0cb\u2028c"  # note\ndef f():\n    """doc"""\n    return x\n'
    assert code_text(source) == 'x = "a\x0cb\u2028c"\ndef f():\n    return x'


def test_windows_and_old_mac_line_ends_read_as_python_reads_them() -> None:
    # a user's agent file saved with \r or \r\n line ends: a bare \r raised IndexError
    for end in ("\r", "\r\n"):
        source = f'def f():{end}    """d"""{end}    return 1  # c{end}x = 2{end}'
        assert code_text(source) == "def f():\n    return 1\nx = 2"


@given(st.text(alphabet="ab #\"'\n\r:()=", max_size=40))
def test_code_text_never_raises_and_returns_source_it_cannot_parse(source: str) -> None:
    text = code_text(source)
    try:
        compile(source, "<hypothesis>", "exec")
    except (SyntaxError, ValueError):
        assert text == source.replace("\r\n", "\n").replace("\r", "\n")
    else:
        assert all(line.strip() for line in text.splitlines())  # no blank lines left


def test_a_docstring_edit_in_a_fingerprinted_module_keeps_the_warm_start_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = load_config("grpo", [])
    key = warm_start_key(cfg)
    real = inspect.getsource

    def edited(obj: object, doc: str) -> str:
        source = real(obj)  # type: ignore[arg-type]
        if obj is tiny:
            assert tiny.__doc__ and tiny.__doc__ in source
            source = source.replace(tiny.__doc__, doc)
        return source

    monkeypatch.setattr(inspect, "getsource", lambda o: edited(o, "Reworded."))
    assert warm_start_key(cfg) == key
    # the same module with one number of its code changed gets another key
    monkeypatch.setattr(
        inspect,
        "getsource",
        lambda o: (
            real(o).replace("hidden_size: int = 128", "hidden_size: int = 129")
            if o is tiny
            else real(o)
        ),
    )
    assert "hidden_size: int = 128" in real(tiny)
    assert warm_start_key(cfg) != key


def test_the_user_agents_digest_ignores_its_prose_and_follows_its_code(tmp_path: Path) -> None:
    """The user's agent code keys their agent warm start and its evaluations
    (:func:`credo.utils.imports.user_code_digest`); it hashed the files' bytes, so a
    reworded docstring in the agent threw its cached warm start away."""
    agent, helper = tmp_path / "agent.py", tmp_path / "helper.py"
    agent.write_text(
        '"""My agent."""\nfrom helper import act\n\n\ndef run(env):\n    return act(env)\n'
    )
    helper.write_text("def act(env):\n    return env.step('go')  # one step\n")
    spec = str(agent)
    first = user_code_digest(spec)
    agent.write_text(
        '"""My agent, reworded."""\n# a comment\nfrom helper import act\n\ndef run(env):\n    """Runs."""\n    return act(env)\n'
    )
    helper.write_text("def act(env):\n    return env.step('go')\n")
    assert user_code_digest(spec) == first
    helper.write_text("def act(env):\n    return env.step('stop')\n")  # a sibling's code
    assert user_code_digest(spec) != first
    (tmp_path / "latin.py").write_bytes(b"# caf\xe9\nx = 1\n")  # not UTF-8: its bytes count
    second = user_code_digest(spec)
    (tmp_path / "latin.py").write_bytes(b"# caf\xe8\nx = 1\n")
    assert user_code_digest(spec) != second
