"""The observers' side of part files: a recorder that streams its rows to a part, and the sink folder.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli, for the live engine (`--engine vllm`) and attached recordings
(`SPECREPLAY_RECORD`). The format, its writer and its readers live in traces/parts.py; here, what
the observers inside a live vLLM's processes write through it (`sink_recorder`: the scheduler side's
`rows` and `patch` lines; `SinkWriter`: the worker observer's), the temporary folder a live run's
parts go to, and the merged rows as a trace table.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from specreplay.traces import schema
from specreplay.traces.parts import PartWriter, merge_rows, read_parts

#: One process's part file under the sink folder (traces/parts.py).
Sink = PartWriter


def sink_recorder(sink: Sink):
    """A Recorder whose rows go to `sink` as they are written, keeping in memory only what the
    observers still read: the steps in flight (their row indices, request ids and scheduled
    counts). A server that records for a day holds a few steps, not a day of rows."""
    from specreplay.replay.observers.recorder import SCHEDULE_COLUMNS, STEP_COLUMNS, Recorder

    names = [*STEP_COLUMNS, *SCHEDULE_COLUMNS]
    scheduled_at = SCHEDULE_COLUMNS.index("sched_num_scheduled_tokens")

    class SinkRecorder(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.next_row = 0
            # step -> (its first row index, request ids, scheduled counts), for steps in flight
            self.in_flight: dict[int, tuple[int, list[str], list[int]]] = {}

        def append_step(self, step, total_scheduled, step_event, rows, evictions=None):
            first = self.next_row
            self.next_row += len(rows)
            index = {row[0]: first + i for i, row in enumerate(rows)}
            self.rows_of_step[step] = index
            # Steps whose output is applied are done here: only the ones in flight are kept.
            for done in [s for s in self.in_flight if s not in self.rows_of_step]:
                del self.in_flight[done]
            self.in_flight[step] = (first, [row[0] for row in rows], [row[scheduled_at] for row in rows])
            sink.write(
                {
                    "e": "rows",
                    "names": names,
                    "rows": [[step, total_scheduled, step_event, evictions, *r] for r in rows],
                }
            )
            return index

        def _where(self, at: int) -> tuple[int, str, int]:
            """Row `at` of a step in flight: (step, request id, its scheduled tokens)."""
            for step, (first, ids, scheduled) in self.in_flight.items():
                if first <= at < first + len(ids):
                    return step, ids[at - first], scheduled[at - first]
            raise KeyError(at)

        def scheduled_tokens(self, at: int) -> int:
            return self._where(at)[2]

        def fill(self, at, values):
            step, rid, _ = self._where(at)
            sink.write({"e": "patch", "rows": [[step, rid, values]]})

        def fill_columns(self, at, columns):
            # A step's rows (one output's, through fill_column_groups): one `cols` line, no dict per row.
            if at:
                step = self._where(at[0])[0]
                first, ids, _ = self.in_flight[step]
                sink.write_columns(step, [ids[a - first] for a in at], columns)

        def table(self, start=0, stop=None):
            raise RuntimeError("a sink recorder keeps no rows: merge its part files (traces/parts.py)")

    return SinkRecorder()


class SinkWriter:
    """The worker observer's rows of one step: the rows written one by one as a `patch` line,
    the ones written in bulk as a `cols` line."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.rows: list[list[Any]] = []
        self.columns: list[tuple[int, list[str], dict[str, list]]] = []

    def write(self, step: int, rid: str, values: dict[str, Any]) -> None:
        self.rows.append([step, rid, dict(values)])

    def write_columns(self, step: int, rids: list[str], columns: dict[str, list]) -> None:
        self.columns.append((step, rids, columns))

    def step_done(self, step: int) -> None:
        if self.rows:
            self.sink.write({"e": "patch", "rows": self.rows})
        for at_step, rids, columns in self.columns:
            self.sink.write_columns(at_step, rids, columns)
        self.rows, self.columns = [], []


def merge_parts(folder: str) -> list[dict[str, Any]]:
    """Every part's rows under `folder`, patched, in step order (the live engine's run)."""
    return merge_rows(read_parts(folder))


def rows_to_table(rows: list[dict[str, Any]]):
    from specreplay.replay.observers.recorder import Recorder

    rec = Recorder()
    for row in rows:
        for name in schema.COLUMN_NAMES:
            rec.cols[name].append(row.get(name))
    return rec.table()


def new_sink() -> str:
    return tempfile.mkdtemp(prefix="specreplay-live-")


def clean_sink(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


__all__ = [
    "Sink",
    "SinkWriter",
    "clean_sink",
    "merge_parts",
    "new_sink",
    "rows_to_table",
    "sink_recorder",
]
