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
    """A Recorder that also streams its rows and patches to `sink` as they are written."""
    from specreplay.replay.observers.recorder import SCHEDULE_COLUMNS, Recorder

    names = ["step", "step_total_scheduled_tokens", "step_event", *SCHEDULE_COLUMNS]

    class SinkRecorder(Recorder):
        def append_step(self, step, total_scheduled, step_event, rows):
            index = super().append_step(step, total_scheduled, step_event, rows)
            c = self.cols
            sink.write({"e": "rows", "names": names, "rows": [[c[n][i] for n in names] for i in index.values()]})
            return index

        def fill(self, at, values):
            self.fill_many([(at, values)])

        def fill_many(self, fills):
            c = self.cols
            for at, values in fills:
                Recorder.fill(self, at, values)
            if fills:  # one line for the whole output: JSON encoding is most of a sink's cost
                sink.write(
                    {"e": "patch", "rows": [[c["step"][at], c["request_id"][at], values] for at, values in fills]}
                )

    return SinkRecorder()


class SinkWriter:
    """The worker observer's rows of one step, as one patch line."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.rows: list[list[Any]] = []

    def write(self, step: int, rid: str, values: dict[str, Any]) -> None:
        self.rows.append([step, rid, dict(values)])

    def step_done(self, step: int) -> None:
        if self.rows:
            self.sink.write({"e": "patch", "rows": self.rows})
        self.rows = []


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
