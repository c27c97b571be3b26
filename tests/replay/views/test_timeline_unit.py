"""replay/views/timeline.py as a library: `build_timeline` on recorded traces (lanes per request,
cells per step, the findings lane, field lanes, the engine lane, windows) and its cell helpers.
(tests/cli/test_show.py holds the rendering of `specreplay show`.)"""

from __future__ import annotations

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls import resolve
from specreplay.replay.views.timeline import (
    DEFAULT_WINDOW,
    MAX_DEFAULT_REQUESTS,
    Timeline,
    amount,
    build_timeline,
    default_steps,
    engine_cell,
    short_code,
)
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces.io import open_trace, write_trace


def record(scenario: str, impl: str = "upstream"):
    trace = run_workload(build_scenario(scenario), resolve(impl, allow_import=False))
    return trace, check_trace(trace)


@pytest.fixture(scope="module")
def reentry():
    return record("reentry")


def lanes(timeline: Timeline) -> dict[tuple[str, str], dict[int, str]]:
    return {
        (lane.request_id, lane.side): {step: cell.text for step, cell in lane.cells.items()} for lane in timeline.lanes
    }


def rows_per_request(trace) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for row in trace.table.select(["request_id", "step"]).to_pylist():
        out.setdefault(row["request_id"], []).append(row["step"])
    return out


def test_request_10_of_the_reentry_trace(reentry):
    """README, "See it": admitted with 3 tokens, skipped twice by the budget and out of the
    worker's batch, back at step 4 with 1 token and 3 draft slots fed as -1 placeholders."""
    trace, findings = reentry
    timeline = build_timeline(trace, findings, requests=["10"], field_name="num_computed_tokens")
    assert (timeline.first_step, timeline.last_step) == (1, trace.num_steps) == (1, 9)
    got = lanes(timeline)
    assert list(got) == [("10", "sched"), ("10", "worker"), ("10", "sched C"), ("10", "worker C"), ("10", "findings")]
    assert [got[("10", "sched")][s] for s in range(1, 9)] == ["N3", "b", "b", "R1+3", "1+3", "1+3", "1+3", "1+3"]
    assert [got[("10", "worker")][s] for s in range(1, 9)] == ["3", ".", ".", "1+3!", "1+3", "1+3", "1+3", "1+3"]
    assert [got[("10", "sched C")][s] for s in range(1, 9)] == ["0", "3", "3", "3", "7", "8", "12", "16"]
    assert [got[("10", "worker C")][s] for s in range(1, 9)] == ["0", ".", ".", "3", "4", "8", "12", "16"]
    assert got[("10", "findings")] == {4: "S5*"}  # two warnings there, S5 named first
    assert {f.code for f in timeline.findings[(4, "10")]} == {"S5-draft-provenance", "X5-placeholder-drafts"}
    styles = {s: c.style for lane in timeline.lanes if lane.side == "sched" for s, c in lane.cells.items()}
    assert (styles[1], styles[2], styles[4]) == ("new", "skip", "reentry")


def test_default_requests_are_those_with_findings(reentry):
    trace, findings = reentry
    assert {f.request_id for f in findings} == {"10"}
    timeline = build_timeline(trace, findings)
    assert {lane.request_id for lane in timeline.lanes} == {"10"}
    assert timeline.requests_in_range == 1


def test_a_clean_trace_has_a_scheduler_and_a_worker_lane_per_request_with_a_cell_per_row():
    trace, findings = record("reentry", "sched-clear")
    assert not findings
    timeline = build_timeline(trace, findings)
    rows = rows_per_request(trace)
    assert timeline.requests_in_range == len(rows) == 11 <= MAX_DEFAULT_REQUESTS
    got = lanes(timeline)
    assert set(got) == {(rid, side) for rid in rows for side in ("sched", "worker")}  # no findings lanes
    for rid, steps in rows.items():
        assert sorted(got[(rid, "sched")]) == sorted(got[(rid, "worker")]) == steps
    assert got[("10", "sched")][4] == "R1"  # sched-clear: re-enters with 1 token, no stale draft slots
    assert all("!" not in text for (_, side), cells in got.items() if side == "worker" for text in cells.values())


def test_a_step_window_and_a_trace_file_give_the_same_cells(reentry, tmp_path):
    trace, findings = reentry
    window = build_timeline(trace, findings, requests=["10", "3"], steps=(3, 5))
    assert (window.first_step, window.last_step) == (3, 5)
    assert all(set(lane.cells) <= {3, 4, 5} for lane in window.lanes)
    assert [lane.request_id for lane in window.lanes if lane.side == "sched"] == ["10", "3"]  # the order asked
    from_file = build_timeline(
        open_trace(write_trace(trace, tmp_path / "t.parquet")), findings, requests=["10", "3"], steps=(3, 5)
    )
    assert lanes(from_file) == lanes(window)
    open_ended = build_timeline(trace, findings, requests=["10"], steps=(6, 1 << 40))
    assert (open_ended.first_step, open_ended.last_step) == (6, 9)
    assert build_timeline(trace, findings, requests=["no-such-request"]).lanes == []


def test_the_engine_lane_marks_pauses_resumes_and_cache_resets():
    trace, findings = record("pause-clear")
    timeline = build_timeline(trace, findings, requests=["0"], field_name="num_output_placeholders")
    engine = next(lane for lane in timeline.lanes if lane.request_id == "engine")
    assert engine.side == "events" and timeline.lanes[0] is engine
    # No schedule() at steps 6-8 (paused, nothing may run): the pause, its cache clear and the
    # resume reach the next scheduled step's rows, 9; the reset with step 13 in flight is at 14.
    assert {step: cell.text for step, cell in engine.cells.items()} == {9: "ZXS", 14: "X"}
    sched = lanes(timeline)[("0", "sched")]
    assert not {6, 7, 8} & set(sched)
    assert (sched[9], sched[14]) == ("^U14", "^U20")  # resumed after each cut (^: the cut changed it)
    assert ("0", "sched P") in lanes(timeline) and ("0", "worker P") not in lanes(timeline)  # P: scheduler only
    assert [s for s, text in sched.items() if text.startswith("^")] == [9, 14]


@pytest.mark.parametrize(
    "label, letters",
    [
        ("pause(keep, clear_cache)", "Z"),
        ("resume", "S"),
        ("reset_prefix_cache(running)", "X"),
        ("pause: clear_cache", "X"),
        ("pause(wait); resume; reset_prefix_cache", "ZSX"),
    ],
)
def test_engine_cell(label, letters):
    assert engine_cell(label).text == letters


def test_cell_helpers():
    assert amount(4, 3) == "1+3" and amount(16, 0) == "16"
    assert short_code("S5-draft-provenance") == "S5"
    assert default_steps(DEFAULT_WINDOW, []) is None  # short: the whole trace

    class At:
        step = 100

    assert default_steps(500, [At()]) == (92, 92 + DEFAULT_WINDOW - 1)
    assert default_steps(70, [At()]) == (92, 70)  # clipped to the trace
