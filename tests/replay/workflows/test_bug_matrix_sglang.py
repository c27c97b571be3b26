"""The bug matrix's SGLang column, measured on SGLang 0.5.23's real scheduler (its own environment).

Each SGLang failure specreplay knows reproduces on 0.5.23, or is fixed there (the built-in variant
that puts back the code before SGLang's fix reproduces it, and 0.5.23 does not); the vLLM
failures' workloads run there when SGLang takes them. The docs carry the whole table (the vLLM
columns are held in the main environment: test_bug_matrix.py).
"""

from __future__ import annotations

import pytest

from specreplay.cli.render import bug_matrix_markdown
from specreplay.replay.workflows.bug_matrix import bug_matrix
from specreplay.replay.workloads.known_bugs import KNOWN_BUGS
from tests.replay.workflows.test_bug_matrix import PAGE, table_in

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def cells():
    return bug_matrix(use_real=False, sglang=True)


def sglang_cells(cells) -> dict:
    return {c.bug: c for c in cells if c.runner == "sglang"}


def test_every_known_failure_has_an_sglang_cell_measured_on_the_real_scheduler(cells):
    got = sglang_cells(cells)
    assert list(got) == [b.key for b in KNOWN_BUGS]
    ran = [c for c in got.values() if c.verdict != "does not apply"]
    assert ran and all(c.measured_on == "sglang 0.5.23 scheduler + reference SGLang worker" for c in ran)


def test_what_sglang_0_5_23_has_and_what_it_fixed(cells):
    got = sglang_cells(cells)
    verdicts = {key: got[key].verdict for key in got if key.startswith("sglang-")}
    assert verdicts == {
        "sglang-stop-overcommit": "reproduces",  # #24590: no undo for a stop under overlap
        "sglang-abort-overcommit": "reproduces",
        "sglang-stale-verify": "fixed",  # #23456, in 0.5.23
        "sglang-stale-retract": "fixed",
        "sglang-abort-past-max": "reproduces",  # update_finish_state's to_finish branch
        "sglang-embeds-retract": "reproduces",  # #39645's class: the send cursor moves back
        "sglang-adaptive-upswitch": "fixed",  # #36897: the reservation covers the widest width
        "sglang-session-overclaim": "reproduces",  # the finishing round skipped, the finished length kept
        "sglang-session-rows-held": "reproduces",  # #37583's class (an open PR)
    }
    assert got["sglang-stale-verify"].evidence == (
        "no G3-stale-result-applied; outcome completed; before the fix (sglang-stale-commit): "
        "G3-stale-result-applied at step 3, request a"
    )
    assert got["sglang-abort-past-max"].evidence == "G8-delivered-past-max-tokens at step 4, request b"
    assert got["sglang-embeds-retract"].evidence == "G9-client-tokens at step 15, request 2"
    assert got["sglang-session-overclaim"].evidence == "G10-turn-past-computed at step 20, request s"
    assert got["sglang-session-rows-held"].evidence == "E2-run-incomplete at step 40, request s"
    assert got["sglang-adaptive-upswitch"].evidence == (
        "no K2-kv-foreign-tokens; outcome completed; before the fix (sglang-adaptive-reserve-current): "
        "K2-kv-foreign-tokens at step 24, request a"
    )


def test_the_vllm_failures_on_sglang(cells):
    """The seed's re-entry runs on SGLang and finds nothing (SGLang keeps no per-request draft
    slots: the drafts travel with the batch); vLLM's streaming failures run as SGLang streaming
    sessions and are absent, but the one with a single request row meets #37583's starvation; the
    workloads with control events SGLang does not take are refused, and the cell says why."""
    got = sglang_cells(cells)
    assert (got["reentry"].verdict, got["reentry"].evidence) == ("absent", "no finding")
    assert [
        got[key].evidence for key in ("streaming-preempt", "sync-streaming-turn", "sync-streaming-turn-runs-on")
    ] == [
        "no finding",
        "no finding",
        "E2-run-incomplete at step 10000 (not this failure's T1-wrong-token)",
    ]
    refused = [key for key, c in got.items() if c.verdict == "does not apply"]
    assert set(refused) == {
        "resubmit",
        "resubmit-then-reset",
        "resubmit-onto-waiting",
        "padded-admission-cut",
        "pause-kept-batch",
    }
    assert all("--engine sglang-scheduler" in got[key].evidence for key in refused)


def test_the_docs_carry_the_whole_matrix(cells):
    table = bug_matrix_markdown(cells).split("\n\n")[0]
    assert table == table_in(PAGE), (
        f"stale matrix in {PAGE.name}: paste `.venv-sglang/bin/specreplay scenarios --matrix --reference-only "
        "--format markdown`"
    )
