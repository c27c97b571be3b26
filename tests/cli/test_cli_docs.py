"""The documentation stays whole: docs/cli.md is every command's current `--help`, every docs page
is linked from the README, and every relative link in the README and docs/ reaches a file."""

from __future__ import annotations

import re
from pathlib import Path

import click

from specreplay.cli.docs import REGENERATE, anchor, reference, walk
from specreplay.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "cli.md"
#: A markdown link or image: [text](target) / ![alt](target); the target up to a space or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def sections(page: str) -> dict[str, str]:
    """The page's `## specreplay ...` sections: heading text -> body."""
    parts = re.split(r"^## (specreplay[^\n]*)\n", page, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def missing_from(page: str, group: click.Command) -> list[str]:
    """Each command without its own section, and each option or argument not in its command's."""
    found = sections(page)
    missing = []
    for path, command, _ctx in walk(group):
        name = " ".join(path)
        body = found.get(name)
        if body is None:
            missing.append(f"command `{name}`")
            continue
        for param in command.params:
            names = (
                [*param.opts, *param.secondary_opts] if isinstance(param, click.Option) else [param.human_readable_name]
            )
            if not any(re.search(r"(?<![\w-])" + re.escape(n) + r"(?![\w-])", body) for n in names):
                missing.append(f"`{name}` option {'/'.join(names)}")
    return missing


def test_every_command_and_option_is_in_the_cli_reference():
    missing = missing_from(CLI_PAGE.read_text(encoding="utf-8"), main)
    assert not missing, f"missing from docs/cli.md (regenerate it: `{REGENERATE}`):\n" + "\n".join(missing)


def test_the_cli_reference_is_current():
    assert CLI_PAGE.read_text(encoding="utf-8") == reference(), (
        f"docs/cli.md is stale: regenerate it with `{REGENERATE}`"
    )


def test_a_new_option_or_command_is_caught():
    """The check above can fail: a command grown by one option, and a group grown by one command."""
    page = CLI_PAGE.read_text(encoding="utf-8")
    grown = click.Group("specreplay", commands=dict(main.commands))
    extra = click.Command("brand-new", params=[click.Option(["--never-documented"])])
    grown.add_command(extra)
    record = main.commands["record"]
    grown.add_command(click.Command("record", params=[*record.params, click.Option(["--also-new"])]))
    assert set(missing_from(page, grown)) == {"command `specreplay brand-new`", "`specreplay record` option --also-new"}


def test_the_reference_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = reference()
    monkeypatch.setenv("COLUMNS", "250")
    assert reference() == narrow
    assert all(f"## {' '.join(path)}" in narrow for path, _c, _x in walk(main))
    assert anchor(("specreplay", "record")) == "specreplay-record" and "(#specreplay-record)" in narrow


def doc_pages() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md"))


def broken_links(files: list[Path], root: Path = ROOT) -> list[str]:
    """Relative links whose file (the part before any '#') does not exist, as "path:line: target"."""
    broken = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL (https:, mailto:) or an anchor in the same page
                file = target.split("#", 1)[0]
                if not (path.parent / file).exists():
                    broken.append(f"{path.relative_to(root)}:{number}: {target}")
    return broken


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {(ROOT / target.split("#", 1)[0]).resolve() for target in LINK.findall(readme)}
    unlinked = [page.name for page in doc_pages() if page.resolve() not in linked]
    assert doc_pages() and not unlinked, f"docs pages the README does not link: {unlinked}"


def test_every_relative_link_resolves():
    broken = broken_links([ROOT / "README.md", *doc_pages()])
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text("[ok](there.md#a) [url](https://example.com) [self](#top) ![img](gone.svg) [bad](missing.md)\n")
    assert broken_links([page], root=tmp_path) == ["page.md:1: gone.svg", "page.md:1: missing.md"]
