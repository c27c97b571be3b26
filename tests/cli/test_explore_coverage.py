"""`specreplay explore` prints the coverage of its search: the situations reached, the new ones
near the end of the model length and lookahead allocation among them, and the engine settings
drawn; explore.json holds both (tests/replay/workflows/test_explore_space.py: the search)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from specreplay.cli.explore import _settings_line
from specreplay.cli.main import main


def test_the_coverage_lines_list_the_new_situations_and_the_settings(tmp_path):
    result = CliRunner().invoke(main, ["explore", "--impl", "sched-clear", "--budget", "16", "-o", str(tmp_path)])
    assert result.exit_code in (0, 1), result.output
    text = " ".join(result.output.split())  # the lines wrap at the console's width
    summary = json.loads((tmp_path / "explore.json").read_text())
    for situation in ("drafter-skipped", "skipped-drafts-verified", "lookahead-allocation"):
        assert f"{situation} {summary['coverage'][situation]}" in text
    assert "engine settings drawn (workloads): async 16; block_size " in text
    assert "sync" not in summary["settings"]  # sched-clear is an AsyncScheduler: async workloads only


def test_the_settings_line_groups_by_setting():
    assert _settings_line({"async": 30, "sync": 2, "k=0": 2, "k=3": 9}) == "async 30; sync 2; k 0: 2, 3: 9"
    assert _settings_line({}) == ""
