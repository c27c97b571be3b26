"""The schema says which side writes each column; the code's column lists are derived from it.

The recorder's row layout is positional (the scheduler observer builds one tuple per request per
step), so the derived list is held here against the observer's layout; the checker's list
(check/frames.py NEEDED) is held in tests/replay/check/test_needed_columns.py.
"""

from __future__ import annotations

import pytest

from specreplay.replay.observers import recorder
from specreplay.traces import schema

#: The scheduler observer's row tuple, field by field (replay/observers/scheduler_observer.py, the
#: `append(...)` in `after_schedule`): a schema change that moves a scheduler column fails here,
#: saying the observer's tuple must move with it.
OBSERVER_ROW = (
    "request_id",
    "sched_life",
    "sched_event",
    "sched_status",
    "sched_kind",
    "sched_skip",
    "sched_num_scheduled_tokens",
    "sched_num_draft_slots",
    "sched_num_computed_tokens",
    "sched_num_cached_tokens",
    "sched_cache_hit_blocks",
    "sched_num_output_placeholders",
    "sched_num_tokens",
    "sched_num_output_tokens",
    "sched_num_prompt_tokens",
    "sched_spec_len",
    "sched_spec_placeholders",
    "sched_is_prefill_chunk",
    "sched_finished_announced",
    "sched_preempted",
    "sched_num_in_flight_tokens",
    "sched_num_stale_output_tokens",
    "sched_preempt_blocks_alone",
    "sched_preempt_blocks_returned",
)


def test_every_column_has_one_writer_and_the_writers_partition_the_schema():
    assert set(schema.WRITTEN_BY) == set(schema.COLUMN_NAMES)
    assert set(schema.WRITTEN_BY.values()) == set(schema.WRITERS)
    parts = [schema.columns_written_by(w) for w in schema.WRITERS]
    assert sorted(n for part in parts for n in part) == sorted(schema.COLUMN_NAMES)
    # The prefixes say it too (the schema's docstring): a column's writer is its prefix's.
    for name, writer in schema.WRITTEN_BY.items():
        prefix = {"scheduler": ("sched_", "request_id"), "step": ("step",)}.get(writer, (writer + "_",))
        assert name.startswith(prefix), (name, writer)


def test_the_recorders_lists_are_the_schemas():
    assert recorder.STEP_COLUMNS == ("step", "step_total_scheduled_tokens", "step_event", "step_cache_evictions")
    assert recorder.SCHEDULE_COLUMNS == OBSERVER_ROW
    # Filled after the rows are appended: the apply, worker and truth columns, SGLang's own step
    # and scheduler columns (the vLLM observer's tuple leaves them out: null on its rows), and a KV
    # connector's (filled on the admissions it booked).
    sglang_first = tuple(n for n in schema.SGLANG_ONLY if schema.WRITTEN_BY[n] in ("step", "scheduler"))
    assert sglang_first and all(n.startswith(("step_", "sched_")) for n in sglang_first)
    assert schema.CONNECTOR_ONLY == ("sched_kv_external_tokens",)
    later = (
        schema.columns_written_by("apply") + schema.columns_written_by("worker") + schema.columns_written_by("truth")
    )
    assert recorder._LATER_COLUMNS == schema.in_schema_order(
        set(later) | set(sglang_first) | set(schema.CONNECTOR_ONLY)
    )
    assert sorted(recorder.STEP_COLUMNS + recorder.SCHEDULE_COLUMNS + recorder._LATER_COLUMNS) == sorted(
        schema.COLUMN_NAMES
    )


def test_the_helpers_refuse_what_is_not_in_the_schema():
    with pytest.raises(AssertionError, match="no such writer"):
        schema.columns_written_by("sched")
    with pytest.raises(AssertionError, match="not schema columns"):
        schema.in_schema_order({"step", "sched_nothing"})
    assert schema.in_schema_order(["sched_life", "step"]) == ("step", "sched_life")
