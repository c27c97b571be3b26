"""Tables piped into a log (no terminal, no COLUMNS): drawn at the width they need, never squeezed
into rich's 80-column default with their cells cut to "…" (cli/common.py `print_table`).

A Model Runner V2 request's story has 17 columns, wider than 80: `diff` of the resubmit scenario
on MRV2 (its engine dies at step 12, on request 0's second life) prints it under its findings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main

STORY_HEADER = [
    "m",
    "kind",
    "skip",
    "n",
    "k",
    "C",
    "P",
    "T",
    "slot",
    "q",
    "dC",
    "dC'",
    "cpu",
    "from",
    "base",
    "acc",
    "rej",
]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("piped") / "resubmit-v2.parquet"
    result = CliRunner().invoke(main, ["record", "--scenario", "resubmit", "--runner", "v2", "-o", str(out)])
    assert out.exists(), result.output
    return out


def story(output: str) -> list[str]:
    """The story table's header row and its step rows (from the header to the table's end)."""
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == STORY_HEADER[:2])
    return [line for line in lines[at:] if line.strip() and "─" not in line]


def test_a_piped_story_table_is_drawn_whole(trace):
    result = CliRunner().invoke(main, ["diff", str(trace)], env={"COLUMNS": None, "NO_COLOR": "1"})
    assert result.exit_code == 1, result.output
    rows = story(result.output)
    assert "…" not in result.output
    assert rows[0].split() == STORY_HEADER
    assert [row.split()[0] for row in rows[1:]] == [str(step) for step in range(5, 13)]
    assert all(len(row.split()) >= 12 for row in rows[1:])  # every row whole, its empty cells aside


def test_columns_still_sets_the_width(trace):
    """COLUMNS=80 (or a terminal of 80) is a width asked for: the table fits it, as before."""
    result = CliRunner().invoke(main, ["diff", str(trace)], env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert max(len(line) for line in story(result.output)) <= 80
