"""A trace without ground truth, as a live vLLM engine records one, made from any trace by nulling
its ground-truth columns (so the behaviour is tested without vllm installed)."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from specreplay.replay.check.coverage import GROUND_TRUTH
from specreplay.traces.trace import Trace

#: What a trace with no ground truth leaves unchecked, in catalogue order, as every report names it
#: (test_coverage holds the catalogue-derived list to it).
NEED_TRUTH = [
    "S3-scheduler-computed-tokens",
    "X2-worker-kv-position",
    "T1-wrong-token",
    "K1-kv-content",
    "K2-kv-foreign-tokens",
    "K3-kv-unowned-block",
    "K4-kv-write-unowned",
    "K6-cache-hit-content",
    "X12-padding-verified",
]
NOT_CHECKED = f"no ground truth: {', '.join(NEED_TRUTH)} not checked"
#: A forced live trace (families/vllm/forced_logits.py): the oracle's token ground truth, none for the KV
#: cache. What it leaves unchecked, and the note every report gives.
NEED_KV_TRUTH = [code for code in NEED_TRUTH if code != "T1-wrong-token"]
FORCED_NOT_CHECKED = (
    f"no KV ground truth (tokens checked against the oracle, T1): {', '.join(NEED_KV_TRUTH)} not checked"
)


def without_ground_truth(trace: Trace, columns: tuple[str, ...] = GROUND_TRUTH, keep_rows: int = 0) -> Trace:
    """`trace` with `columns` null in every row but its first `keep_rows`."""
    table = trace.table
    for name in columns:
        index = table.schema.get_field_index(name)
        field = table.schema.field(index)
        kept = table.column(name).slice(0, keep_rows).combine_chunks()
        nulls = pa.nulls(table.num_rows - len(kept), field.type)
        table = table.set_column(index, field, pa.chunked_array([kept, nulls], field.type))
    return dataclasses.replace(trace, table=table)
