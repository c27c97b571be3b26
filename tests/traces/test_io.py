"""Schema round trip, the reader's validation of broken files and the writer's of broken rows."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specreplay.traces import schema
from specreplay.traces.errors import TraceError
from specreplay.traces.io import open_trace, read_ahead_of, read_trace, write_trace


def test_round_trip_keeps_rows_and_metadata(tmp_path, reentry_traces):
    trace = reentry_traces["upstream"]
    path = write_trace(trace, tmp_path / "t.parquet")
    back = read_trace(path)
    assert back.content_equals(trace)
    assert back.table.schema.equals(schema.SCHEMA)
    assert back.workload == trace.workload and back.impl.name == "upstream"


def test_readable_without_specreplay(tmp_path, reentry_traces):
    import pandas as pd

    path = write_trace(reentry_traces["upstream"], tmp_path / "t.parquet")
    df = pd.read_parquet(path)
    assert list(df.columns) == list(schema.COLUMN_NAMES) and len(df) == reentry_traces["upstream"].table.num_rows


def _broken(tmp_path, reentry_traces, mutate) -> str:
    path = write_trace(reentry_traces["upstream"], tmp_path / "ok.parquet")
    table = pq.read_table(path)
    table = mutate(table)
    out = tmp_path / "bad.parquet"
    pq.write_table(table, out)
    return str(out)


def _meta(table, **changes):
    meta = dict(table.schema.metadata)
    meta.update({k.encode(): v.encode() for k, v in changes.items()})
    return table.replace_schema_metadata(meta)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.drop_columns(["worker_row"]), "missing columns: worker_row"),
        (lambda t: t.append_column("extra", pa.array([1] * t.num_rows)), "unexpected columns: extra"),
        (
            lambda t: t.set_column(t.schema.get_field_index("step"), "step", t["step"].cast(pa.float64())),
            "mistyped: step",
        ),
        (lambda t: _meta(t, **{"specreplay.schema_version": "99"}), "newer than this specreplay reads"),
        (lambda t: _meta(t, **{"specreplay.schema_version": "1"}), "v1 (specreplay 0.1, before request lives"),
        (lambda t: t.replace_schema_metadata({}), "without specreplay metadata"),
        (lambda t: _meta(t, **{"specreplay.workload": "{nope"}), "not valid JSON"),
        (
            lambda t: t.set_column(
                t.schema.get_field_index("sched_num_tokens"),
                "sched_num_tokens",
                pa.array([-5] * t.num_rows, pa.int32()),
            ),
            "expected a count >= 0",
        ),
        (
            lambda t: t.set_column(
                t.schema.get_field_index("sched_kind"),
                "sched_kind",
                pa.array(["bogus"] * t.num_rows).dictionary_encode().cast(pa.dictionary(pa.int8(), pa.string())),
            ),
            "unknown value 'bogus'",
        ),
        (lambda t: t.take(list(reversed(range(t.num_rows)))), "not in step order"),
        (lambda t: pa.concat_tables([t, t.slice(0, 1)]).sort_by("step"), "duplicate (step, request_id)"),
    ],
)
def test_reader_rejects_broken_traces_with_one_line(tmp_path, reentry_traces, mutate, message):
    path = _broken(tmp_path, reentry_traces, mutate)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_reader_rejects_non_parquet_and_truncated_files(tmp_path, reentry_traces):
    junk = tmp_path / "junk.parquet"
    junk.write_text("hello")
    with pytest.raises(TraceError, match="not a readable Parquet file"):
        read_trace(junk)
    good = write_trace(reentry_traces["upstream"], tmp_path / "good.parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(TraceError, match="Parquet"):
        read_trace(cut)
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "missing.parquet")


def test_markdown_table_documents_every_column():
    text = schema.markdown_table()
    assert all(f"`{name}`" in text for name in schema.COLUMN_NAMES)
    assert json.dumps(schema.ENUMS)


@pytest.mark.parametrize(
    "key, change, message",
    [
        ("specreplay.config", {"max_num_batched_tokens": "x"}, "max_num_batched_tokens must be an integer"),
        ("specreplay.outcome", {"status": "exploded"}, "outcome status 'exploded'"),
        ("specreplay.outcome", {"status": "crashed", "step": "x"}, "outcome step 'x'"),
        ("specreplay.impl", {"name": 5}, "no implementation name"),
    ],
)
def test_reader_validates_metadata_contents(tmp_path, reentry_traces, key, change, message):
    def mutate(t):
        meta = dict(t.schema.metadata)
        doc = json.loads(meta[key.encode()])
        doc.update(change)
        meta[key.encode()] = json.dumps(doc).encode()
        return t.replace_schema_metadata(meta)

    with pytest.raises(TraceError, match=message):
        read_trace(_broken(tmp_path, reentry_traces, mutate))


def test_reader_rejects_half_filled_column_groups(tmp_path, reentry_traces):
    def null_position(t):
        i = t.schema.get_field_index("worker_first_position")
        values = t["worker_first_position"].to_pylist()
        values[values.index(next(v for v in values if v is not None))] = None
        return t.set_column(i, "worker_first_position", pa.array(values, pa.int32()))

    with pytest.raises(TraceError, match="filled together"):
        read_trace(_broken(tmp_path, reentry_traces, null_position))


def test_written_traces_are_world_readable(tmp_path, reentry_traces):
    path = write_trace(reentry_traces["upstream"], tmp_path / "t.parquet")
    assert path.stat().st_mode & 0o044 == 0o044


def test_a_v2_trace_reads_with_its_v3_columns_null_and_diffs_without_them(tmp_path, reentry_traces):
    """A schema v2 trace (before the recorded outcomes): it reads, compares with a
    recording of the same workload today on the columns both have, and is written back as v2.
    Today's run differs in its tail only: the reference now steps once more to announce the last
    request finished, as vLLM's engine core does, and that schedule pops step 8's batch."""
    from pathlib import Path

    from specreplay.replay.check.tracediff import diff_traces

    golden = read_trace(Path(__file__).parent / "data" / "reentry-v2.parquet")  # kept as written by 0.2
    assert golden.schema_version == 2
    assert golden.table["apply_sampled_token_ids"].null_count == golden.num_rows
    fresh = reentry_traces["upstream"]
    assert fresh.schema_version == schema.SCHEMA_VERSION >= 3
    applied = fresh.table.filter(pa.compute.equal(fresh.table["apply_outcome"], "applied"))
    assert applied["apply_sampled_token_ids"].null_count == 0
    diff = diff_traces(fresh, golden)
    assert diff.left_out == [name for name in schema.COLUMN_NAMES if schema.ADDED_IN.get(name, 2) > 2]
    assert dict(diff.fields) == {"apply_step": 1, "(row)": 1}  # step 8's batch popped at 9; 9: the announcement
    assert [(f.step, f.request_id, f.field) for f in diff.findings] == [(8, "10", "apply_step"), (9, "10", "(row)")]
    assert "apply_sampled_token_ids" in diff.left_out
    assert diff_traces(fresh, fresh).left_out == []
    again = read_trace(write_trace(golden, tmp_path / "upgraded.parquet"))
    assert again.schema_version == 2 and again.table.equals(golden.table)


def test_the_recorder_refuses_to_write_rows_that_fail_validation(tmp_path, reentry_traces):
    """A recorder bug (here: a negative count) is caught at record time, before the file exists."""
    import dataclasses

    import pyarrow as pa

    from specreplay.traces.errors import RecordingError
    from specreplay.traces.io import write_trace

    trace = reentry_traces["upstream"]
    table = trace.table
    at = table.schema.get_field_index("sched_num_tokens")
    broken = dataclasses.replace(
        trace, table=table.set_column(at, table.schema.field(at), pa.array([-1] * table.num_rows, pa.int32()))
    )
    with pytest.raises(RecordingError, match="sched_num_tokens holds -1"):
        write_trace(broken, tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()
    bad_outcome = dataclasses.replace(trace, outcome={"status": "exploded"})
    with pytest.raises(RecordingError, match="outcome status"):
        write_trace(bad_outcome, tmp_path / "bad.parquet")


def _stepped(n: int):
    """Tables 0..n-1, each a one-row table saying its number."""
    for i in range(n):
        yield pa.table({"i": [i]})


def test_read_ahead_hands_over_every_batch_in_order_and_raises_where_the_reader_stopped():
    assert [t["i"][0].as_py() for t in read_ahead_of(_stepped(50))] == list(range(50))

    def broken():
        yield from _stepped(3)
        raise TraceError("t.parquet: Parquet data is damaged or truncated (page 4)")

    seen = []
    with pytest.raises(TraceError, match="page 4"):
        for table in read_ahead_of(broken()):
            seen.append(table["i"][0].as_py())
    assert seen == [0, 1, 2]  # every batch before the damage first, as without the thread


def test_a_caller_that_stops_early_stops_the_reading_thread():
    stream = read_ahead_of(_stepped(1000))
    assert next(stream)["i"][0].as_py() == 0
    stream.close()  # the caller leaves the loop: the thread must not wait forever to hand over
    assert not [t for t in threading.enumerate() if t.name == "specreplay-read-ahead"]


def test_a_trace_checked_with_read_ahead_gives_the_same_report(tmp_path, reentry_traces):
    from specreplay.replay.check.checker import NEEDED, check_report

    path = write_trace(reentry_traces["pr30796"], tmp_path / "t.parquet")
    traces = [open_trace(path) for _ in range(2)]
    # Batches of a few rows: many batches, and steps split across them.
    plain = check_report(traces[0], traces[0].batches(columns=NEEDED, batch_rows=7))
    ahead = check_report(traces[1], traces[1].batches(columns=NEEDED, batch_rows=7, read_ahead=True))
    assert plain.findings and ahead == plain
