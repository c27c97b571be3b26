"""The sink's recorder (families/vllm/sink.py), the one inside a live or attached vLLM: what it writes
to its part files merges into the rows the in-memory recorder holds for the same run, in the
columnar lines and in the per-row patch lines of earlier recordings alike; and it keeps only the
steps in flight, however long it records."""

from __future__ import annotations

import pytest

from specreplay.replay.engines import ports
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.sink import SinkWriter, merge_parts, rows_to_table, sink_recorder
from specreplay.replay.impls.registry import resolve
from specreplay.replay.observers.recorder import Recorder
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces.parts import PartWriter, flush_all


def teeing_recorder(folders: dict[str, bool]):
    """A Recorder class that also sends every call to a sink recorder per folder (columnar or
    not): the same run, recorded the in-memory way and the part-file ways at once."""

    class Tee(Recorder):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.sinks = [sink_recorder(PartWriter(f, "core", columnar=c)) for f, c in folders.items()]

        def append_step(self, step, total_scheduled, step_event, rows, evictions=None):
            index = super().append_step(step, total_scheduled, step_event, rows, evictions)
            for sink in self.sinks:
                assert sink.append_step(step, total_scheduled, step_event, rows, evictions) == index
            return index

        def fill(self, at, values):
            super().fill(at, values)
            for sink in self.sinks:
                sink.fill(at, values)

        def fill_columns(self, at, columns):
            super().fill_columns(at, columns)
            for sink in self.sinks:
                sink.fill_columns(at, columns)

        def fill_column_groups(self, groups):
            super().fill_column_groups(groups)
            for sink in self.sinks:
                sink.fill_column_groups(groups)

    return Tee


@pytest.mark.parametrize("scenario", ["reentry", "abort-inflight", "streaming-append", "pause-clear", "random"])
def test_a_run_recorded_to_parts_merges_into_the_rows_recorded_in_memory(tmp_path, monkeypatch, scenario):
    columnar, legacy = tmp_path / "cols", tmp_path / "patch"
    columnar.mkdir(), legacy.mkdir()
    monkeypatch.setattr(ports, "Recorder", teeing_recorder({str(columnar): True, str(legacy): False}))
    trace = run_workload(build_scenario(scenario, 3), resolve("upstream", allow_import=False))
    flush_all()  # what the writer thread has not written yet (merge_parts flushes too)
    lines = {f: (f / next(p.name for p in f.iterdir())).read_text() for f in (columnar, legacy)}
    assert '"e":"cols"' in lines[columnar] and '"e":"cols"' not in lines[legacy]  # both ways ran
    for folder in (columnar, legacy):
        merged = rows_to_table(merge_parts(str(folder)))
        assert merged.to_pylist() == trace.table.to_pylist(), folder.name


def test_the_sink_recorder_keeps_only_the_steps_in_flight(tmp_path):
    """Two steps in flight (async), 500 steps recorded: the recorder holds two, its columns nothing."""
    writer = PartWriter(str(tmp_path), "core")
    rec = sink_recorder(writer)
    rows = [(f"r{i}", 0, "", "running", "cached", "", 4) + (None,) * 13 for i in range(8)]
    for step in range(1, 501):
        index = rec.append_step(step, 32, "", rows)
        if step > 1:  # the step before is applied once this one is scheduled
            done = rec.rows_of_step.pop(step - 1)
            at = list(done.values())
            assert [rec.scheduled_tokens(a) for a in at] == [4] * 8
            rec.fill_column_groups([(at, {"apply_step": [step] * 8, "apply_outcome": ["applied"] * 8})])
        rec.fill(index["r3"], {"apply_finish_reason": "aborted"})
    assert len(rec.in_flight) == 2 and not rec.step_start
    assert all(not values for values in rec.cols.values())
    merged = merge_parts(str(tmp_path))
    assert len(merged) == 500 * 8
    assert {r["apply_step"] for r in merged if r["step"] == 7} == {8}
    assert [r["apply_finish_reason"] for r in merged if r["step"] == 9 and r["request_id"] == "r3"] == ["aborted"]


def test_the_worker_writer_writes_a_step_as_one_line_of_each_kind(tmp_path):
    writer = PartWriter(str(tmp_path), "runner")
    sink = SinkWriter(writer)
    sink.write(4, "a", {"worker_kept_finished": True})
    sink.write_columns(4, ["b", "c"], {"worker_row": [0, 1], "worker_draft_ids": [[7], []]})
    sink.step_done(4)
    flush_all()
    assert [line.split(",", 1)[0] for line in open(writer.path)] == ['{"e":"patch"', '{"e":"cols"']
