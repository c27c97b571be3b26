"""The recorder's bulk column fills give what the per-row fills gave (issue 20's batched hot
paths), and every schema column is filled from exactly one place."""

from __future__ import annotations

from specreplay.replay.observers import recorder
from specreplay.replay.observers.recorder import Recorder


def test_fill_columns_is_fill_row_by_row():
    one, bulk = Recorder(), Recorder()
    rows = [(str(i),) + (None,) * (len(recorder.SCHEDULE_COLUMNS) - 1) for i in range(5)]
    for rec in (one, bulk):
        rec.append_step(1, 5, "", rows)
    values = {"worker_row": [4, 3, 2], "worker_draft_ids": [[1], [], [2, 3]]}
    at = [4, 0, 2]
    for i, row in enumerate(at):
        one.fill(row, {name: column[i] for name, column in values.items()})
    bulk.fill_columns(at, values)
    assert one.cols == bulk.cols


APPLY_GROUPS = [
    (
        [3, 1],
        {"apply_step": [2, 2], "apply_outcome": ["applied", "dropped"], "apply_sampled_token_ids": [(5,), ()]},
    ),
    ([4], {"apply_step": [2], "apply_outcome": ["ignored"]}),
    ([], {"apply_step": [], "apply_outcome": []}),
]
APPLY_FILLS = [
    (3, {"apply_step": 2, "apply_outcome": "applied", "apply_sampled_token_ids": (5,)}),
    (1, {"apply_step": 2, "apply_outcome": "dropped", "apply_sampled_token_ids": ()}),
    (4, {"apply_step": 2, "apply_outcome": "ignored"}),
]


def test_fill_column_groups_is_fill_row_by_row():
    """The apply columns written column by column land as the old per-row fills did."""
    one, bulk = Recorder(), Recorder()
    rows = [(str(i),) + (None,) * (len(recorder.SCHEDULE_COLUMNS) - 1) for i in range(5)]
    for rec in (one, bulk):
        rec.append_step(1, 5, "", rows)
    for at, values in APPLY_FILLS:
        one.fill(at, values)
    bulk.fill_column_groups(APPLY_GROUPS)
    assert one.cols == bulk.cols
    assert one.table().equals(bulk.table())


def test_the_recorder_fills_every_schema_column_once_per_row():
    """The scheduler observer fills columns in bulk from its row tuples: each schema column must come from
    exactly one place (the step, the step total, a scheduler field, or the later apply, worker and
    truth groups), or a trace would shift columns against each other."""
    from specreplay.traces import schema

    sources = recorder.STEP_COLUMNS + recorder.SCHEDULE_COLUMNS + recorder._LATER_COLUMNS
    assert sorted(sources) == sorted(schema.COLUMN_NAMES)
