"""Part files: a recording's JSON-lines files, one per process, written and read back.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli, beside the journal (traces/journal.py). The observers inside a live or
attached vLLM's processes (replay/engines/sink.py, plugin.py, attached.py) each append to their own
part file under one folder, one JSON object a line, flushed as written, so a process that dies loses
at most the line it was writing. This module is the format, with no knowledge of vLLM: `PartWriter`
writes a part, `read_parts` reads a folder back (counting lines cut mid-write), and the readers
below take what a merge needs from the parts.

The lines, by their `e` key: `part` (the first line of an attached run's part: its run id,
role, process, vLLM release, patches), `rows` (a step's scheduler rows: `names`, `rows`),
`patch` (columns filled later, `[step, request_id, values]` each: the apply, the worker view),
`ran` (the scheduler or runner class that ran), `unknown_runner` (a runner class specreplay does
not observe), `not_recorded` (what a process could not record, and why), `error` (the guard's report of specreplay's own
failure), `config` and `step` (attached: the engine config read from vLLM, each schedule()),
and the recorded inputs `request`, `stream`, `abort`, `event` (replay/observers/input_observer.py).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any


class PartWriter:
    """One process's part file under `folder`: one JSON line per event, flushed as written."""

    def __init__(self, folder: str, role: str, header: dict[str, Any] | None = None) -> None:
        self.path = os.path.join(folder, f"{role}-{os.getpid()}-{id(self)}.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")
        if header is not None:
            self.write(header)

    def write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()


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


def read_parts(folder: str) -> list[Part]:
    """Every part file (*.jsonl) under `folder`, in name order; a line that is not a whole JSON
    object (cut mid-write) is counted, not read."""
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
        patched = rows.get((step, rid))
        if patched is not None:
            patched.update(values)
    order.sort(key=lambda k: k[0])  # stable
    return [rows[k] for k in order]


#: The recorded inputs' line kinds -> their list in a trace's `inputs` metadata.
INPUT_LINES = {"request": "requests", "stream": "chunks", "abort": "aborts", "event": "events"}


def collect_inputs(parts: list[Part]) -> dict[str, Any]:
    """The recorded inputs (the input observer's events), by kind, in the order they happened."""
    inputs: dict[str, list[Any]] = {key: [] for key in INPUT_LINES.values()}
    for part in parts:
        for event in part.events:
            kind = event.get("e")
            if kind in INPUT_LINES:
                inputs[INPUT_LINES[kind]].append({k: v for k, v in event.items() if k != "e"})
    return inputs


def ran_classes(parts: list[Part]) -> dict[str, str]:
    """The scheduler and runner classes the recorded vLLM ran (module.QualifiedName, written by
    the plugin once it has put any variant class in place): what the trace header names."""
    ran: dict[str, str] = {}
    for part in parts:
        for event in part.events:
            if event.get("e") == "ran":
                ran.update({k: str(v) for k, v in event.items() if k in ("scheduler", "runner", "runner_family")})
    return ran


def unknown_runners(parts: list[Part]) -> list[dict[str, str]]:
    """The runners a worker process ran that specreplay does not observe (plugin's
    `unknown_runner` lines: their class and the ones it knows)."""
    return [
        {k: str(v) for k, v in event.items() if k != "e"}
        for part in parts
        for event in part.events
        if event.get("e") == "unknown_runner"
    ]


def not_recorded(parts: list[Part]) -> list[str]:
    """Why a process recorded nothing (an attached plugin that could not set up, e.g. MRV2 on a
    CPU without Triton's interpreter), one line per distinct message."""
    return list(dict.fromkeys(str(e.get("message")) for p in parts for e in p.events if e.get("e") == "not_recorded"))


def observer_failures(parts: list[Part]) -> list[str]:
    """What the guard reported (replay/observers/guard.py): specreplay's own failures, one per message."""
    seen: dict[str, None] = {}
    for part in parts:
        for event in part.events:
            if event.get("e") == "error":
                seen.setdefault(f"{part.role} process {part.header.get('pid', '?')}: {event.get('message')}")
    return list(seen)


__all__ = [
    "INPUT_LINES",
    "Part",
    "PartWriter",
    "collect_inputs",
    "merge_rows",
    "not_recorded",
    "observer_failures",
    "ran_classes",
    "read_parts",
    "unknown_runners",
]
