"""Part files: how the observers inside a live vLLM's processes write, and how the parts are read.

Where it sits: workloads -> models -> impls -> record -> **engines** -> check, for the live engine
(`--engine vllm`) and attached recordings (`SPECREPLAY_RECORD`). Each process an observer runs in
appends to its own part file, one JSON line per event, flushed as written, so a process that
dies loses at most the line it was writing. An attached run's part starts with a `part` line
naming its run; the scheduler side writes `rows` (a step's scheduler rows), `patch` (columns
filled later: the apply, the worker view), and, attached, `config`, `step` and the input
events (record/input_observer.py).

`read_parts` reads a folder back, noting lines cut mid-write; `merge_rows` joins the rows and
their patches in step order.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from specreplay.traces import schema


class Sink:
    """One process's part file under the folder: one JSON line per event, flushed."""

    def __init__(self, folder: str, role: str, header: dict[str, Any] | None = None) -> None:
        self.path = os.path.join(folder, f"{role}-{os.getpid()}-{id(self)}.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")
        if header is not None:
            self.write(header)

    def write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()


def sink_recorder(sink: Sink):
    """A Recorder that also streams its rows and patches to `sink` as they are written."""
    from specreplay.replay.record.recorder import SCHEDULE_COLUMNS, Recorder

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


# ---------------------------------------------------------------------- reading
@dataclass
class Part:
    path: str
    events: list[dict[str, Any]] = field(default_factory=list)
    cut_lines: int = 0  # lines that are not whole JSON (a process died writing one)

    @property
    def header(self) -> dict[str, Any]:
        return self.events[0] if self.events and self.events[0].get("e") == "part" else {}

    @property
    def run(self) -> str | None:
        return self.header.get("run")

    @property
    def role(self) -> str:
        return self.header.get("role") or os.path.basename(self.path).split("-", 1)[0]


def collect_inputs(parts: list[Part]) -> dict[str, Any]:
    """The recorded inputs (the input observer's events), by kind, in the order they happened."""
    inputs: dict[str, list] = {"requests": [], "chunks": [], "aborts": [], "events": []}
    key = {"request": "requests", "stream": "chunks", "abort": "aborts", "event": "events"}
    for part in parts:
        for event in part.events:
            kind = event.get("e")
            if kind in key:
                inputs[key[kind]].append({k: v for k, v in event.items() if k != "e"})
    return inputs


def ran_classes(parts: list[Part]) -> dict[str, str]:
    """The scheduler and runner classes the recorded vLLM ran (module.QualifiedName, written by
    the plugin once it has put any variant class in place): what the trace header names."""
    ran: dict[str, str] = {}
    for part in parts:
        for event in part.events:
            if event.get("e") == "ran":
                ran.update({k: str(v) for k, v in event.items() if k in ("scheduler", "runner")})
    return ran


def read_parts(folder: str) -> list[Part]:
    parts = []
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        part = Part(path)
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    event = json.loads(line)
                except ValueError:
                    part.cut_lines += 1
                    continue
                if isinstance(event, dict):
                    part.events.append(event)
                else:
                    part.cut_lines += 1
        parts.append(part)
    return parts


def merge_rows(parts: list[Part]) -> list[dict[str, Any]]:
    """Rows from every part, patched, in step order (within a step, the scheduler's row order)."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    order: list[tuple[int, str]] = []
    patches: list[list[Any]] = []
    for part in parts:
        for event in part.events:
            kind = event.get("e")
            if kind == "rows":
                for values in event["rows"]:
                    row = dict(zip(event["names"], values))
                    key = (row["step"], row["request_id"])
                    rows[key] = row
                    order.append(key)
            elif kind == "patch":
                patches.extend(event["rows"])
    for step, rid, values in patches:
        row = rows.get((step, rid))
        if row is not None:
            row.update(values)
    order.sort(key=lambda k: k[0])  # stable
    return [rows[k] for k in order]


def observer_failures(parts: list[Part]) -> list[str]:
    """What the guard reported (record/guard.py): specreplay's own failures, one per message."""
    seen: dict[str, None] = {}
    for part in parts:
        for event in part.events:
            if event.get("e") == "error":
                seen.setdefault(f"{part.role} process {part.header.get('pid', '?')}: {event.get('message')}")
    return list(seen)


def merge_parts(folder: str) -> list[dict[str, Any]]:
    """Every part's rows under `folder`, patched, in step order (the live engine's run)."""
    return merge_rows(read_parts(folder))


def rows_to_table(rows: list[dict[str, Any]]):
    from specreplay.replay.record.recorder import Recorder

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
    "Part",
    "Sink",
    "SinkWriter",
    "clean_sink",
    "merge_parts",
    "merge_rows",
    "observer_failures",
    "new_sink",
    "read_parts",
    "rows_to_table",
    "sink_recorder",
]
