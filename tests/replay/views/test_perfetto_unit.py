"""replay/views/perfetto.py as a library: `export_events` on recorded traces, checked against the
trace's own rows: a process per request with a scheduler and a worker track, a slice per row,
the counters, a flow arrow per applied output, the findings and the control events, and the
windows (steps, rows). (tests/cli/test_show.py holds `specreplay export` and the format rules.)"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls import resolve
from specreplay.replay.views.perfetto import SCHED_TID, STEP_US, WORKER_TID, export_events
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces.io import open_trace, write_trace

COUNTERS = ("num_computed_tokens (scheduler)", "num_computed_tokens (worker)", "num_output_placeholders")


def record(scenario: str, impl: str = "upstream"):
    trace = run_workload(build_scenario(scenario), resolve(impl, allow_import=False))
    return trace, check_trace(trace)


@pytest.fixture(scope="module")
def reentry():
    trace, findings = record("reentry")
    return trace, findings, export_events(trace, findings)


def pids(doc) -> dict[str, int]:
    return {
        e["args"]["name"].removeprefix("request "): e["pid"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def of(doc, ph: str, **match) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph and all(e.get(k) == v for k, v in match.items())]


def test_a_process_per_request_with_a_scheduler_and_a_worker_track(reentry):
    trace, _, doc = reentry
    rows = trace.table.to_pylist()
    requests = list(dict.fromkeys(r["request_id"] for r in rows))
    assert list(pids(doc)) == requests  # in order of first appearance, pids 1..n
    assert list(pids(doc).values()) == list(range(1, len(requests) + 1))
    for pid in pids(doc).values():
        threads = {e["args"]["name"]: e["tid"] for e in of(doc, "M", pid=pid, name="thread_name")}
        assert threads == {"scheduler": SCHED_TID, "worker": WORKER_TID}
    assert json.loads(json.dumps(doc)) == doc  # plain JSON
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["first_step"] == 1


def test_a_slice_per_row_and_counters_per_row(reentry):
    trace, _, doc = reentry
    rows = trace.table.to_pylist()
    for rid, pid in pids(doc).items():
        mine = [r for r in rows if r["request_id"] == rid]
        sched = of(doc, "X", pid=pid, tid=SCHED_TID)
        assert [e["args"]["step"] for e in sched] == [r["step"] for r in mine]
        assert all(e["ts"] == (e["args"]["step"] - 1) * STEP_US and e["dur"] == STEP_US for e in sched)
        assert [e["args"]["num_computed_tokens"] for e in sched] == [r["sched_num_computed_tokens"] for r in mine]
        worker = of(doc, "X", pid=pid, tid=WORKER_TID)
        assert [e["args"]["step"] for e in worker] == [r["step"] for r in mine if r["worker_row"] is not None]
        counters = Counter(e["name"] for e in of(doc, "C", pid=pid))
        in_batch = sum(r["worker_row"] is not None for r in mine)
        assert counters == Counter(
            {COUNTERS[0]: len(mine), COUNTERS[2]: len(mine)} | ({COUNTERS[1]: in_batch} if in_batch else {})
        )


def test_request_10_re_enters_with_placeholder_drafts(reentry):
    _, _, doc = reentry
    pid = pids(doc)["10"]
    assert [e["name"] for e in of(doc, "X", pid=pid, tid=SCHED_TID)][:4] == [
        "new 3",
        "skipped: budget",
        "skipped: budget",
        "re-entering 1+3",
    ]
    worker = {e["args"]["step"]: e for e in of(doc, "X", pid=pid, tid=WORKER_TID)}
    assert 2 not in worker and 3 not in worker  # out of the batch while skipped
    assert worker[4]["name"] == "ran 1+3 (-1 drafts)" and worker[4]["args"]["draft_ids"] == [-1, -1, -1]


def test_a_flow_arrow_per_applied_output(reentry):
    trace, _, doc = reentry
    slices = {(r["request_id"], r["step"]) for r in trace.table.to_pylist()}
    expected = sorted(
        (r["request_id"], r["step"], int(r["apply_step"]))
        for r in trace.table.to_pylist()
        if r["sched_num_scheduled_tokens"]
        and r["apply_outcome"] not in (None, "ignored")
        and r["apply_step"] > r["step"]
        and (r["request_id"], int(r["apply_step"])) in slices
    )
    assert expected  # async: every decode step's output is applied a step or two later
    by_pid = {pid: rid for rid, pid in pids(doc).items()}
    starts = {e["id"]: e for e in of(doc, "s")}
    ends = {e["id"]: e for e in of(doc, "f")}
    assert starts.keys() == ends.keys() and all(isinstance(i, int) for i in starts)
    got = sorted(
        (by_pid[starts[i]["pid"]], starts[i]["ts"] // STEP_US + 1, ends[i]["ts"] // STEP_US + 1) for i in starts
    )
    assert got == expected
    for i in starts:
        assert starts[i]["pid"] == ends[i]["pid"] and starts[i]["tid"] == ends[i]["tid"] == SCHED_TID
        assert ends[i]["args"]["scheduled_at"] == f"{by_pid[starts[i]['pid']]}@{starts[i]['ts'] // STEP_US + 1}"


def test_a_marker_per_finding_on_the_side_that_owns_it(reentry):
    _, findings, doc = reentry
    marks = [e for e in of(doc, "i") if e.get("cat") == "finding"]
    by_pid = {pid: rid for rid, pid in pids(doc).items()}
    assert sorted((e["name"], by_pid[e["pid"]], e["ts"] // STEP_US + 1) for e in marks) == sorted(
        (f.code, f.request_id, f.step) for f in findings
    )
    for e in marks:
        assert e["tid"] == (SCHED_TID if e["name"].startswith("S") else WORKER_TID)
        assert e["args"]["severity"] == "warning"  # upstream on reentry: waste, no error


def test_control_events_are_global_instants():
    trace, findings = record("pause-clear")
    doc = export_events(trace, findings)
    marks = [e for e in of(doc, "i") if e.get("cat") == "control event"]
    assert [(e["ts"] // STEP_US + 1, e["name"]) for e in marks] == [
        (9, "pause(keep); pause: clear_cache; resume"),
        (14, "reset_prefix_cache(running)"),
    ]
    assert all(e["pid"] == 0 and e["s"] == "g" for e in marks)


def test_a_step_window_is_relative_to_its_first_step(reentry, tmp_path):
    trace, findings, _ = reentry
    doc = export_events(trace, findings, steps=(3, 5))
    assert (doc["otherData"]["first_step"], doc["otherData"]["last_step"]) == (3, 5)
    steps = {e["args"]["step"] for e in of(doc, "X")}
    assert steps == {3, 4, 5}
    assert all(e["ts"] == (e["args"]["step"] - 3) * STEP_US for e in of(doc, "X"))
    assert all(3 <= e["ts"] // STEP_US + 3 <= 5 for e in of(doc, "f"))  # arrows end inside the window
    from_file = export_events(open_trace(write_trace(trace, tmp_path / "t.parquet")), findings, steps=(3, 5))
    assert from_file == doc  # streamed from a file: the same document


def test_the_row_budget_ends_the_window_at_a_step_boundary(reentry):
    trace, findings, _ = reentry
    per_step = Counter(trace.table.column("step").to_pylist())
    doc = export_events(trace, findings, max_rows=per_step[1] + 1)
    last = doc["otherData"]["last_step"]
    assert last == 2 < trace.num_steps  # step 1 is under the budget, step 2 crosses it: nothing after
    exported = Counter(e["args"]["step"] for e in of(doc, "X", tid=SCHED_TID))
    assert exported == Counter({s: per_step[s] for s in (1, 2)})  # whole steps only
    assert export_events(trace, findings, max_steps=3)["otherData"]["last_step"] == 3
