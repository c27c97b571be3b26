"""The typed trace header (traces.header): every shipped trace reads into typed values and writes
back with byte-identical metadata; unknown keys survive; mistyped known keys are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from specreplay.traces import schema
from specreplay.traces.errors import TraceError
from specreplay.traces.header import Config, ImplHeader, Outcome, WorkloadHeader
from specreplay.traces.io import read_trace, write_trace

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*ROOT.glob("replay/corpus/*.parquet"), *ROOT.glob("tests/traces/data/*.parquet")])


def test_the_shipped_traces_are_found():
    assert len(SHIPPED) >= 12


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_trace_writes_back_with_identical_metadata(path, tmp_path):
    before = pq.ParquetFile(path).schema_arrow.metadata
    trace = read_trace(path)
    assert isinstance(trace.outcome, Outcome) and isinstance(trace.impl, ImplHeader)
    assert isinstance(trace.config, Config) and isinstance(trace.workload, WorkloadHeader)
    out = write_trace(trace, tmp_path / path.name)
    assert pq.ParquetFile(out).schema_arrow.metadata == before
    assert trace.metadata() == {k: v for k, v in before.items() if k.startswith(b"specreplay.")}


def _rewrite(path: Path, to: Path, key: bytes, change) -> Path:
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    meta[key] = json.dumps(change(json.loads(meta[key])), sort_keys=True, separators=(",", ":")).encode()
    pq.write_table(table.replace_schema_metadata(meta), to)
    return to


def test_unknown_keys_are_kept_byte_for_byte(tmp_path):
    src = _rewrite(SHIPPED[0], tmp_path / "a.parquet", schema.META_OUTCOME, lambda o: {**o, "later_key": [1, "x"]})
    src = _rewrite(src, tmp_path / "b.parquet", schema.META_IMPL, lambda o: {**o, "patches": ["p"], "new": {"a": 1}})
    trace = read_trace(src)
    assert trace.outcome.extra == {"later_key": [1, "x"]}
    assert trace.impl.patches == ["p"] and trace.impl.extra == {"new": {"a": 1}}
    out = write_trace(trace, tmp_path / "c.parquet")
    assert pq.ParquetFile(out).schema_arrow.metadata == pq.ParquetFile(src).schema_arrow.metadata


def test_an_executor_left_out_stays_out_and_a_null_one_stays_null():
    assert "executor" not in ImplHeader.from_dict({"name": "x"}).to_dict()
    assert ImplHeader.from_dict({"name": "x", "executor": None}).to_dict() == {"name": "x", "executor": None}
    assert ImplHeader(name="x").to_dict() == {"name": "x", "executor": None}  # describe always writes it


@pytest.mark.parametrize(
    ("key", "change", "says"),
    [
        (schema.META_OUTCOME, lambda o: {**o, "kind": 3}, "metadata outcome kind is not text"),
        (schema.META_IMPL, lambda o: {**o, "engine": ["x"]}, "metadata impl engine is not text"),
        (schema.META_WORKLOAD, lambda o: {**o, "name": 1}, "metadata workload name is not text"),
        (schema.META_WORKLOAD, lambda o: {**o, "config": []}, "metadata workload config is not a JSON object"),
        (schema.META_VOLATILE, lambda o: {**o, "host": 1}, "metadata volatile host is not text"),
    ],
)
def test_a_mistyped_known_key_is_one_line(tmp_path, key, change, says):
    bad = _rewrite(SHIPPED[0], tmp_path / "bad.parquet", key, change)
    with pytest.raises(TraceError) as err:
        read_trace(bad)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_header_part_given_as_a_mapping_is_read_as_a_file_would_be():
    trace = read_trace(SHIPPED[0])
    import dataclasses

    again = dataclasses.replace(trace, outcome={"status": "crashed", "step": 3, "kind": "engine-crash"})
    assert again.outcome == Outcome(status="crashed", step=3, kind="engine-crash")
    assert again.outcome.crashed
