"""Every citation of the reference specification in the code resolves in docs/reference.md.

The code cites the reference by invariant name (`INV-X2`), by event (`E1(m)`, `E4(j)`), by the
worker design ("design B"), by section number ("reference section 2", "...spec-state.md,
section 4.2") and by section title ("docs/reference.md, the step timeline"). Each must be
findable in docs/reference.md: a name as a heading or a bold label spelled exactly as cited, a
section number as a heading with that number, a title as (part of) a heading. The checker's codes
must all appear in the document's code table with the source `specreplay codes` gives them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reference.md"
#: Where citations are looked for: the packages, the README and the docs pages written for users
#: (the reference itself is the target; the trace-format and CLI pages are generated).
SCANNED = ("replay", "cli", "traces", "README.md", "docs")
NOT_SCANNED = {DOC, ROOT / "docs" / "trace-format.md", ROOT / "docs" / "cli.md"}

#: Named anchors: an invariant, an event of step m (or j), a worker design.
NAME_PATTERNS = (
    re.compile(r"(?<![\w-])INV-[A-Z]+[0-9]+(?![\w])"),
    re.compile(r"(?<![\w-])E[1-4]\((?:m|j)(?:[-+\u2212]1)?\)"),
    re.compile(r"\bdesign [AB]\b"),
)
#: A section number, on a line that points at the reference ("reference section 2", or the
#: research note's path followed by ", section 4.2").
SECTION = re.compile(r"\bsection (\d+(?:\.\d+)*)\b", re.IGNORECASE)
POINTS_AT_REFERENCE = re.compile(r"reference|spec-state", re.IGNORECASE)
#: A section title: "docs/reference.md, the step timeline" (up to a closing parenthesis, a
#: colon, a semicolon or the end of the line).
TITLE = re.compile(r"docs/reference\.md,\s+([^)\n:;]+)")


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in sorted(path.rglob("*")) if p.suffix in (".py", ".md") and p.is_file())
    return [file for file in files if file not in NOT_SCANNED]


def collect_citations(files: list[Path]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(names, sections): each cited anchor -> where it is cited ("path:line"). A section is a
    number ("4.2") or a title ("the step timeline")."""
    names: dict[str, list[str]] = {}
    sections: dict[str, list[str]] = {}
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            for pattern in NAME_PATTERNS:
                for match in pattern.finditer(line):
                    names.setdefault(match.group(0), []).append(where)
            if POINTS_AT_REFERENCE.search(line):
                for match in SECTION.finditer(line):
                    sections.setdefault(match.group(1), []).append(where)
            for match in TITLE.finditer(line):
                title = match.group(1).strip().rstrip(".,")
                if title and not SECTION.match(title):
                    sections.setdefault(title, []).append(where)
    return names, sections


def _labels(doc: str) -> list[str]:
    """The text of every heading and every bold span: where a reader searches for an anchor."""
    labels = [line.lstrip("#").strip() for line in doc.splitlines() if re.match(r"#{1,6}\s", line)]
    labels += re.findall(r"\*\*(.+?)\*\*", doc)
    return labels


def name_resolves(name: str, doc: str) -> bool:
    exact = re.compile(r"(?<![\w-])" + re.escape(name) + r"(?![\w])")
    return any(exact.search(label) for label in _labels(doc))


def section_resolves(section: str, doc: str) -> bool:
    if re.fullmatch(r"\d+(?:\.\d+)*", section):
        heading = re.compile(r"^#{1,6}\s+" + re.escape(section) + r"\.?\s", re.MULTILINE)
        return bool(heading.search(doc))
    title = re.sub(r"^the\s+", "", section.lower())
    return any(title in label.lower() for label in _labels(doc) if label)


def unresolved(names: dict[str, list[str]], sections: dict[str, list[str]], doc: str) -> list[str]:
    missing = [
        f"{name} (cited at {', '.join(where[:3])})"
        for name, where in sorted(names.items())
        if not name_resolves(name, doc)
    ]
    missing += [
        f"section {number} (cited at {', '.join(where[:3])})"
        for number, where in sorted(sections.items())
        if not section_resolves(number, doc)
    ]
    return missing


@pytest.fixture(scope="module")
def doc() -> str:
    assert DOC.is_file(), "docs/reference.md is missing"
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def citations() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    return collect_citations(scanned_files())


def test_the_code_cites_the_reference(citations):
    # Guard against a scan that silently finds nothing (moved folders, a broken pattern).
    names, _sections = citations
    assert any(name.startswith("INV-") for name in names), "no INV-* citation found in the code"


def test_every_citation_resolves(citations, doc):
    names, sections = citations
    missing = unresolved(names, sections, doc)
    assert not missing, "cited in the code but not a heading or bold label in docs/reference.md:\n" + "\n".join(missing)


def test_a_missing_anchor_is_caught(citations, doc):
    """The check above can fail: strip one cited invariant's labels and it must be reported."""
    names, sections = citations
    name = sorted(n for n in names if n.startswith("INV-"))[0]
    stripped = re.sub(r"(?<![\w-])" + re.escape(name) + r"(?![\w])", "INV-REMOVED", doc)
    assert any(entry.startswith(name + " ") for entry in unresolved(names, sections, stripped))
    numbers = sorted(n for n in sections if re.fullmatch(r"\d+(?:\.\d+)*", n))
    if numbers:
        number = numbers[0]
        renumbered = re.sub(r"^(#{1,6}\s+)" + re.escape(number) + r"(?=\.?\s)", r"\g<1>99", doc, flags=re.MULTILINE)
        assert any(entry.startswith(f"section {number} ") for entry in unresolved({}, sections, renumbered))


def _all_codes():
    import importlib

    for module in ("specreplay.replay.check.catalogue", "specreplay.replay.check.checker", "specreplay.replay.checker"):
        try:
            return importlib.import_module(module).all_codes()
        except (ImportError, AttributeError):
            continue
    pytest.fail("no module provides the checker's all_codes()")


def test_every_checker_code_is_in_the_table(doc):
    rows = {}
    for line in doc.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells
    missing = []
    for code, severity, _statement, source in _all_codes():
        row = rows.get(code)
        if row is None or row[1] != severity or row[2] != source:
            missing.append(f"{code} ({severity}, {source}): table row {row}")
    assert not missing, "checker codes missing or different in docs/reference.md's table:\n" + "\n".join(missing)
