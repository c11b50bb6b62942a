"""Every source reference points inside the repository.

Two checks over ``src``, ``tests``, ``docs``, ``examples``, ``benchmarks`` and
``README.md``:

- no file names the design notes' formula file or the folder of paper summaries that
  lived outside the repository (the algorithm reference is ``docs/algorithms.md``);
- every link to a section of ``docs/algorithms.md`` (and every in-page link of that
  file) names a heading that exists, with anchors computed the way
  GitHub computes them.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "algorithms.md"
SCANNED_DIRS = ("src", "tests", "docs", "examples", "benchmarks")
SCANNED_FILES = ("README.md",)
SKIPPED_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf", ".pyc", ".safetensors"}

# Built from pieces so that this file does not match its own pattern.
OUTSIDE_REFERENCE = re.compile(
    "ALGORITHMS" + r"\.md" + "|" + r"\bseeds" + "/" + "|" + r"\bseeds" + r"\s+folder"
)
ANCHOR_LINK = re.compile(r"algorithms\.md#([^\s)\]`'\",>]+)")
IN_PAGE_LINK = re.compile(r"\]\(#([^)\s]+)\)")

#: Files in the lead's area (``src/credo/train/``, ``src/credo/cli.py``, being refactored)
#: that still name the old references. Each is an expected failure; once a file is fixed
#: its test passes unexpectedly (strict), which says: delete it from this list.


def scanned_files() -> list[Path]:
    """Text files of the scanned folders and top-level files, sorted."""
    out = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for folder in SCANNED_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix.lower() in SKIPPED_SUFFIXES:
                continue
            out.append(path)
    return out


def read_text(path: Path) -> str | None:
    """The file's text, or None for a file that is not UTF-8 text."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def matches(path: Path, pattern: re.Pattern[str]) -> list[tuple[int, str, re.Match[str]]]:
    """``(line number, line, match)`` of every match of ``pattern`` in ``path``."""
    text = read_text(path)
    if text is None:
        return []
    return [
        (i, line, m)
        for i, line in enumerate(text.splitlines(), start=1)
        for m in pattern.finditer(line)
    ]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (without the de-duplication suffix).

    Links and images keep their text, backticks go, the text is lower-cased, every
    character that is not a letter, mark, digit, connector (``_``), space or hyphen is
    removed, and spaces become hyphens.
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip()
    kept = [c for c in text.lower() if unicodedata.category(c)[0] in "LMN" or c in " -_"]
    return "".join(kept).replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """ATX heading texts of ``markdown``, outside fenced code blocks, in order."""
    out, fence = [], None
    for line in markdown.splitlines():
        stripped = line.strip()
        marker = stripped[:3]
        if marker in ("```", "~~~"):
            if fence is None:
                fence = marker
            elif marker == fence:
                fence = None
            continue
        if fence is not None:
            continue
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            out.append(m.group(1))
    return out


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of ``markdown``; repeats get ``-1``, ``-2``, … as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(markdown):
        base = github_anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# ------------------------------------------------------------------ the helpers
@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Differences from verl", "differences-from-verl"),
        ("Dr.GRPO", "drgrpo"),
        ("KL estimators (k1, k2, k3)", "kl-estimators-k1-k2-k3"),
        ("Rényi OPSD", "rényi-opsd"),
        ("`episode-mean` weights", "episode-mean-weights"),
        ("PPO-clip", "ppo-clip"),
        ("See [GiGPO](#gigpo) & co.", "see-gigpo--co"),
        ("turn_sum", "turn_sum"),
    ],
)
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_anchors_skip_code_blocks_and_number_repeats() -> None:
    md = "# A\n\n```\n# not a heading\n```\n\n## A\n### B ##\n~~~\n# C\n~~~\n"
    assert headings(md) == ["A", "A", "B"]
    assert anchors(md) == {"a", "a-1", "b"}


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("see ALGORITHMS" + ".md §3", True),
        ("summary in ``shared/see" + "ds/000_x.txt``", True),
        ("the seeds" + " folder of the design notes", True),
        ("credo compare --seeds 3", False),
        ("random seeds 0..N-1", False),
        ("docs/algorithms.md#gigpo", False),
    ],
)
def test_outside_reference_pattern(line: str, found: bool) -> None:
    assert bool(OUTSIDE_REFERENCE.search(line)) is found


# --------------------------------------------------------------- the repository
def test_no_reference_outside_the_repository() -> None:
    hits = list(
        dict.fromkeys(  # one entry per line, however many matches it has
            f"{_rel(path)}:{i}: {line.strip()}"
            for path in scanned_files()
            for i, line, _ in matches(path, OUTSIDE_REFERENCE)
        )
    )
    assert not hits, (
        "these lines point outside the repository; link a section of docs/algorithms.md "
        "instead (e.g. docs/algorithms.md#gigpo):\n" + "\n".join(hits)
    )


def test_algorithm_links_name_existing_headings() -> None:
    valid = anchors(DOC.read_text(encoding="utf-8"))
    links = [
        (f"{_rel(path)}:{i}", m.group(1).rstrip(".,;:"))
        for path in scanned_files()
        for i, _, m in matches(path, ANCHOR_LINK)
    ]
    linked = {anchor for _, anchor in links}
    # the check is not vacuous: the sources do link these sections
    assert {"proas", "tsbpo", "sero", "axpo", "differences-from-verl"} <= linked
    bad = [f"{where}: #{anchor}" for where, anchor in links if anchor not in valid]
    assert not bad, "links to headings that docs/algorithms.md does not have:\n" + "\n".join(bad)


def test_in_page_links_of_the_reference_exist() -> None:
    text = DOC.read_text(encoding="utf-8")
    valid = anchors(text)
    links = [m.group(1) for _, _, m in matches(DOC, IN_PAGE_LINK)]
    assert links, "docs/algorithms.md has no in-page links to check"
    assert not [a for a in links if a not in valid], sorted(set(links) - valid)


def test_every_registered_method_and_recipe_is_documented() -> None:
    from credo.credit import estimator_names
    from credo.objectives import AGGREGATIONS, loss_names

    text = DOC.read_text(encoding="utf-8")
    recipes = [p.stem for p in (ROOT / "src" / "credo" / "train" / "recipes").glob("*.yaml")]
    assert recipes, "no recipes found"
    names = {
        *estimator_names(),
        *loss_names(),
        *AGGREGATIONS.names(),
        *(r for r in recipes if r != "base"),
    }
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"docs/algorithms.md does not mention: {', '.join(missing)}"


SRC = ROOT / "src"
MODULE_REF = re.compile(r"(?<![\w.+])credo(?:\.[A-Za-z_]\w*)+(?![\w/])")
PATH_REF = re.compile(r"\bsrc/credo/[\w/]+\.(?:py|yaml)\b")


def _module_file(dotted: str) -> Path | None:
    """The file of module or package ``dotted`` under ``src``, or ``None``."""
    base = SRC.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def unresolved_reference(ref: str) -> str | None:
    """Why ``credo.a.b.c`` names nothing (``None`` when it does): its longest prefix that
    is a module must exist, and the next name must appear in that module's source."""
    parts = ref.split(".")
    for i in range(len(parts), 1, -1):
        module = _module_file(".".join(parts[:i]))
        if module is None:
            continue
        if i == len(parts):
            return None
        name = parts[i]  # defined there, or imported into it
        if re.search(rf"\b{name}\b", module.read_text()):
            return None
        return f"{'.'.join(parts[:i])} defines no {name}"
    return f"no module {'.'.join(parts[:2])}"


def test_module_and_path_references_resolve() -> None:
    """Every ``credo.<module>[.<name>]`` and every ``src/credo/...`` path that the docs,
    the README and the source name exists (modules move; the prose must follow)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(SRC.rglob("*.py"))]
    bad = []
    for path in files:
        text = read_text(path) or ""
        for m in MODULE_REF.finditer(text):
            why = unresolved_reference(m.group(0))
            if why is not None:
                bad.append(f"{path.relative_to(ROOT)}: {m.group(0)} ({why})")
        bad += [
            f"{path.relative_to(ROOT)}: {m.group(0)} (no such file)"
            for m in PATH_REF.finditer(text)
            if not (ROOT / m.group(0)).is_file()
        ]
    assert not bad, "\n".join(bad)


def test_a_moved_module_is_an_unresolved_reference() -> None:
    assert unresolved_reference("credo.train.teaching.Teaching") is not None  # moved
    assert unresolved_reference("credo.teachers.teaching.Teaching") is None
    assert unresolved_reference("credo.train.parts.register_part") is None  # re-exported
    assert unresolved_reference("credo.nowhere") == "no module credo.nowhere"


#: a Markdown link or image: ``[text](target)``, the target without a title
MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def markdown_links(path: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every relative link of a Markdown file, outside code blocks
    and inline code (web addresses and mail links left out)."""
    out, fence = [], None
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        marker = line.strip()[:3]
        if marker in ("```", "~~~"):
            fence = marker if fence is None else (None if marker == fence else fence)
            continue
        if fence is not None:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        out += [
            (i, m.group(1))
            for m in MD_LINK.finditer(line)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", m.group(1))
        ]
    return out


def test_markdown_links_resolve() -> None:
    """Every relative link of README.md and docs/ names a file or folder that exists and,
    with ``#anchor``, a heading of that file (README's text moved to docs/ as #39 and #38
    reshaped it; a moved section must take its links along)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad, checked = [], 0
    for page in pages:
        for line, target in markdown_links(page):
            checked += 1
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                bad.append(f"{_rel(page)}:{line}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                bad.append(f"{_rel(page)}:{line}: {target} (no such heading)")
    assert checked > 100, checked  # the check reads the links it should
    assert not bad, "broken links:\n" + "\n".join(bad)
