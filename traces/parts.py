"""Part files: a recording's JSON-lines files, one per process, written and read back.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli, beside the journal (traces/journal.py). The observers inside a live or
attached vLLM's processes (replay/families/vllm/sink.py, plugin.py, attached.py) each append to their own
part file under one folder, one JSON object a line, queued on the engine's thread and written by a
background thread 20 ms after the first event since its last write (it sleeps while nothing is
queued), so a process killed outright loses at most its last 20 ms and the line it was writing,
and its engine's thread never encodes JSON. This module is the format, with no knowledge of vLLM:
`PartWriter` writes a part, `read_parts` reads a folder back (counting a last line cut mid-write,
finding a line damaged after it was written), and the readers below take what a merge needs from
the parts.

The lines, by their `e` key: `part` (the first line of an attached run's part: its run id,
role, process, vLLM release, patches), `rows` (a step's scheduler rows: `names`, `rows`),
`patch` (columns filled later, `[step, request_id, values]` each: an abort's finish, a row the
worker wrote alone), `cols` (columns filled later for many rows of one step at once: `step`, `ids`
and `cols`, a list per column name, row `ids[i]` getting `cols[name][i]`: an output's apply
columns, a step's worker view; one line per step and no key repeated per row, so it costs the
writer a fraction of the `patch` lines it replaces, which merge still reads),
`ran` (the scheduler or runner class that ran), `unknown_runner` (a runner class specreplay does
not observe), `not_recorded` (what a process could not record, and why), `error` (the guard's report of specreplay's own
failure), `config` and `step` (attached: the engine config read from vLLM, each schedule()),
`crashed` (the engine died: the step, vLLM's kind and message: families/vllm/flight.py), `lost` (lines
a failed write lost before it, and why: a full disk), `window` (the
second line of a flight recorder's dump: the steps it holds, traces/window.py),
and the recorded inputs `request`, `stream`, `abort`, `event` (replay/observers/input_observer.py).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specreplay.traces.online_checks import CHECKS
from specreplay.traces.window import Window

#: How often the background flusher writes what the writers of a process queued: the most a
#: process killed outright (SIGKILL, vLLM's own shutdown of its engine core) loses.
FLUSH_INTERVAL_S = 0.02


class PartWriter:
    """One process's part file under `folder`: one JSON line per event. `write` only queues the
    event on the engine's thread; a background thread per process encodes and writes the queue
    every FLUSH_INTERVAL_S, and at exit, before a fork and before `read_parts` reads a folder in
    this process (`flush_all`). `write(event, now=True)` writes at once, after what is queued (a
    failure report, a line that must be on disk before anything else can go wrong). The file is
    the writer's alone (0600): a recording holds prompts. `columnar=False` writes many rows'
    columns as the `patch` lines of earlier recordings (the same rows once merged:
    tests/replay/engines/test_sink.py). `transform` rewrites each event on the background thread
    before it is encoded (traces/pseudonym.py: the token ids through the run's permutation)."""

    def __init__(
        self,
        folder: str,
        role: str,
        header: dict[str, Any] | None = None,
        *,
        columnar: bool = True,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        window: int | None = None,
        checks: Sequence[str] = (),
        on_check: Callable[[str, str], None] | None = None,
    ) -> None:
        self.folder, self.name = folder, f"{role}-{os.getpid()}-{id(self)}.jsonl"
        self.path = os.path.join(folder, self.name)
        self.columnar = columnar
        self._transform = transform
        self._encode = json.JSONEncoder(separators=(",", ":")).encode
        # A flight recorder's part (traces/window.py) keeps its lines in memory until a dump.
        self.window = Window(window) if window is not None else None
        # Its online checks (traces/online_checks.py), read off each line as it is encoded;
        # `on_check(name, message)` when one fails, after the lines are in the window.
        self._checks = [(name, CHECKS[name]) for name in checks] if self.window is not None else []
        self._on_check = on_check
        self._fd = -1
        self._size = 0  # the bytes on disk, all whole lines (a failed write is cut back to it)
        self.lost_lines = 0  # lines a failed write lost since the last `lost` line went out
        self._lost_why = ""
        if self.window is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.fchmod(self._fd, 0o600)  # whatever the umask
            self._size = os.fstat(self._fd).st_size
        self._closed = False
        self._queue: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        _FLUSHER.add(self)
        if header is not None:
            self.write(header, now=True)

    def write(self, event: dict[str, Any], now: bool = False) -> None:
        """Queue `event` (the caller hands it over: nothing in it may change afterwards)."""
        self._queue.append(event)  # list.append is atomic under the GIL: no lock on the hot path
        if now:
            self.flush()
        elif not _FLUSHER.pending:  # the first write since the last flush wakes the writer thread
            _FLUSHER.wake()

    def write_columns(self, step: int, ids: list[str], columns: dict[str, list[Any]]) -> None:
        """Columns of many rows of `step`: row `ids[i]` gets `columns[name][i]`."""
        if not ids:
            return
        if self.columnar:
            self.write({"e": "cols", "step": step, "ids": ids, "cols": columns})
            return
        names, values = list(columns), list(columns.values())
        rows = [[step, rid, {n: v[i] for n, v in zip(names, values)}] for i, rid in enumerate(ids)]
        self.write({"e": "patch", "rows": rows})

    def flush(self) -> None:
        """Encode and write what is queued, in order, as one write."""
        with self._lock:
            if not self._queue or self._closed:
                return
            queued = self._queue[:]
            del self._queue[: len(queued)]  # what the engine thread appends meanwhile stays queued
            if self._transform is not None:
                queued = [self._transform(event) for event in queued]
            if self.window is None:
                self._append("".join([self._encode(event) + "\n" for event in queued]).encode(), len(queued))
                return
            fired = []
            for event in queued:
                self.window.add(event, (self._encode(event) + "\n").encode())
                for name, check in self._checks:
                    message = check(event)
                    if message is not None and self.window.may_fire(name):
                        fired.append((name, message))
        for name, message in fired:  # outside the lock: the callback dumps, which flushes
            if self._on_check is not None:
                self._on_check(name, message)

    def _append(self, data: bytes, lines: int) -> None:
        """Write `lines` whole lines. A write that fails (a full disk, a file-size limit) is cut
        back to the last whole line, so the part never holds half a line with lines after it
        (which merge would refuse as damage), and its lines are counted: the next write that
        succeeds puts a `lost` line before its own, which merge reports. Raises the OSError."""
        if self.lost_lines:
            lost = {"e": "lost", "lines": self.lost_lines, "why": self._lost_why}
            data = (self._encode(lost) + "\n").encode() + data
        start = self._size
        try:
            while data:
                written = os.write(self._fd, data)
                self._size += written
                data = data[written:]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
                self._size = start
            self.lost_lines += lines
            self._lost_why = exc.strerror or type(exc).__name__
            raise
        self.lost_lines = 0

    def dump(self, into: str, reason: str, extra: Sequence[dict[str, Any]] = ()) -> str | None:
        """A flight recorder's window as a part file under `into` (created 0700): its header,
        the `window` line, `extra` lines (a crash), then what the window holds. Written aside and
        renamed, so a reader sees all of it or none. None: not a flight recorder's part."""
        if self.window is None:
            return None
        self.flush()
        with self._lock:
            window = self.window
            lines = [window.pinned[0]] if window.pinned else []
            lines += [(self._encode(e) + "\n").encode() for e in (window.header(reason), *extra)]
            lines += window.contents()
        os.makedirs(into, mode=0o700, exist_ok=True)
        path = os.path.join(into, self.name)
        aside = path + ".part"
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            data = b"".join(lines)
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        os.replace(aside, path)
        return path

    def __del__(self) -> None:  # dropped unclosed: what it queued still goes out, its fd is freed
        # A plain try: at interpreter exit the module's globals (contextlib) may already be gone.
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        _FLUSHER.discard(self)


class _Flusher:
    """The process's background writer thread and its writers. Started by the first write in a
    process (a forked child starts its own: `_after_fork`); a daemon, drained at exit by atexit
    and by multiprocessing's finalizers (a multiprocessing child skips atexit).

    It sleeps until a write wakes it, then waits FLUSH_INTERVAL_S for the rest of the step's
    events and writes them all. Waking on a timer instead cost about 200 us of CPU per wake-up on
    these machines whether or not anything was queued: 1% of a core for an idle engine, and most
    of the writer's CPU on a runner whose steps take seconds (Model Runner V2 under Triton's
    interpreter). Only the first write after a flush pays for the wake-up (an Event.set)."""

    def __init__(self) -> None:
        self.writers: weakref.WeakSet[PartWriter] = weakref.WeakSet()
        self.thread: threading.Thread | None = None  # None in a forked child until its first write
        self.pending = False  # woken since the last flush: later writes need not wake it again
        self.woken = threading.Event()

    def add(self, writer: PartWriter) -> None:
        self.writers.add(writer)

    def discard(self, writer: PartWriter) -> None:
        self.writers.discard(writer)

    def wake(self) -> None:
        self.pending = True
        if self.thread is None:
            self._start()
        self.woken.set()

    def _start(self) -> None:
        with contextlib.suppress(Exception):  # a process without multiprocessing's machinery
            import multiprocessing.util

            multiprocessing.util.Finalize(None, flush_all, exitpriority=100)
        self.thread = threading.Thread(target=self._run, name="specreplay-part-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.woken.wait()
            time.sleep(FLUSH_INTERVAL_S)
            # Cleared before the flush: a write that lands after this point wakes the next round.
            self.pending = False
            self.woken.clear()
            self.flush_all()

    def thread_cpu_s(self) -> float:
        """The writer thread's whole CPU time so far (its wake-ups included), read from outside it."""
        thread = self.thread
        if thread is None or thread.ident is None:
            return 0.0
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (AttributeError, OSError):  # no per-thread clocks on this platform
            return 0.0

    def flush_all(self) -> None:
        for writer in list(self.writers):
            with contextlib.suppress(OSError):  # a full disk: the engine runs on, the tail is lost
                writer.flush()

    def _after_fork(self) -> None:
        """In a forked child: the parent's thread is gone and a lock it held stays held."""
        for writer in list(self.writers):
            writer._lock = threading.Lock()
        self.thread, self.pending, self.woken = None, False, threading.Event()


_FLUSHER = _Flusher()
os.register_at_fork(before=lambda: _FLUSHER.flush_all(), after_in_child=_FLUSHER._after_fork)
atexit.register(lambda: _FLUSHER.flush_all())  # a forked child inherits it


def flush_all() -> None:
    """Write out every part writer's queue in this process."""
    _FLUSHER.flush_all()


def writer_cpu_s() -> float:
    """CPU seconds this process's background writer thread has spent (encoding, writing, waking)."""
    return _FLUSHER.thread_cpu_s()


# ---------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Damage:
    """A line inside a part that is not a whole JSON object, with more lines after it: no process
    that dies writing leaves that (it loses the end of its last write and writes nothing more),
    so the file was changed after it was written (a disk, a copy, an editor)."""

    line: int  # 1-based
    lines: int  # the file's lines
    events_before: int  # the part's events read before it: what a salvage keeps
    why: str  # what is wrong with the line

    def __str__(self) -> str:
        return f"line {self.line} of {self.lines} is damaged ({self.why})"


@dataclass
class Part:
    path: str
    events: list[dict[str, Any]] = field(default_factory=list)
    cut_lines: int = 0  # 1 when the last line is not whole JSON: the process died writing it
    damaged: Damage | None = None  # the first line before the last that is not whole JSON
    size: int = 0  # bytes

    @property
    def header(self) -> dict[str, Any]:
        return self.events[0] if self.events and self.events[0].get("e") == "part" else {}

    @property
    def run(self) -> str | None:
        return self.header.get("run")

    @property
    def role(self) -> str:
        return self.header.get("role") or os.path.basename(self.path).split("-", 1)[0]

    def salvage(self) -> None:
        """Keep only what precedes the damage (`merge --salvage`)."""
        if self.damaged is not None:
            del self.events[self.damaged.events_before :]


def read_parts(folder: str) -> list[Part]:
    """Every part file (*.jsonl) under `folder`, in name order. A line that is not a whole JSON
    object is not read: the file's last line is a line cut mid-write (counted); any other is
    damage (`Part.damaged`, the first such line; the events after it are read too, and the
    caller decides: merge refuses the file, or salvages what precedes it)."""
    flush_all()  # this process's own writers first (a live in-process run merges its own parts)
    parts = []
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        parts.append(read_part(path))
    return parts


def read_part(path: str) -> Part:
    """One part file (read_parts)."""
    with open(path, "rb") as fh:
        data = fh.read()
    part = Part(path, size=len(data))
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the file ends with a newline (or is empty)
        lines.pop()
    for number, raw in enumerate(lines, start=1):
        event, why = _decode(raw)
        if event is not None:
            part.events.append(event)
            continue
        # A process killed inside a write leaves a prefix of it and writes nothing more: only the
        # last line can be one it was writing.
        if number == len(lines):
            part.cut_lines += 1
        elif part.damaged is None:
            part.damaged = Damage(number, len(lines), len(part.events), why)
    return part


def _decode(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """A line's event, or None and why not (the writer writes ASCII JSON objects, one a line)."""
    if b"\x00" in raw:
        return None, f"{raw.count(0)} NUL byte(s)"
    try:
        event = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except json.JSONDecodeError as exc:
        return None, f"not JSON: {exc.msg} at column {exc.colno}"
    if not isinstance(event, dict):
        return None, f"a JSON {type(event).__name__}, not an object"
    return event, ""


def merge_rows(parts: list[Part]) -> list[dict[str, Any]]:
    """Rows from every part, patched, in step order (within a step, the scheduler's row order)."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    order: list[tuple[int, str]] = []
    patches: list[dict[str, Any]] = []  # `patch` and `cols` lines, in the order written
    for part in parts:
        for event in part.events:
            kind = event.get("e")
            if kind == "rows":
                for values in event["rows"]:
                    row = dict(zip(event["names"], values))
                    key = (row["step"], row["request_id"])
                    rows[key] = row
                    order.append(key)
            elif kind in ("patch", "cols"):
                patches.append(event)
    for event in patches:
        if event["e"] == "patch":
            for step, rid, values in event["rows"]:
                patched = rows.get((step, rid))
                if patched is not None:
                    patched.update(values)
            continue
        step, columns = event["step"], event["cols"]
        for i, rid in enumerate(event["ids"]):
            patched = rows.get((step, rid))
            if patched is not None:
                patched.update({name: values[i] for name, values in columns.items()})
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
    "Damage",
    "Part",
    "PartWriter",
    "FLUSH_INTERVAL_S",
    "collect_inputs",
    "flush_all",
    "merge_rows",
    "not_recorded",
    "observer_failures",
    "ran_classes",
    "read_part",
    "read_parts",
    "unknown_runners",
    "writer_cpu_s",
]


def whole_steps(rows: list[dict[str, Any]], announcements: bool = False) -> tuple[list[dict[str, Any]], list[int]]:
    """Drop the trailing steps from the last whole one on: the run stopped inside the first step
    after it (a scheduled row whose worker row never arrived). Steps that schedule nothing are
    looked through, and go with the cut: a Ctrl-C lands while the worker still runs step s and
    the core has already stepped s + 1 to announce an abort. A step inside the run with such a
    row stays: that is a finding (X1), not a cut.

    A step that schedules nothing has no worker rows of its own: vLLM's engine core calls the
    worker's execute_model for it, which returns at once, and no sample_tokens follows; the
    worker observers (V1's and Model Runner V2's alike) write only the announced requests'
    `worker_kept_finished` there, and nothing at all for a step that announces nothing (an
    async scheduler's step whose one request has its placeholders at max_tokens already).
    `announcements` (a flight recorder's dump, taken mid-run): a trailing step that announces a
    finish is cut when that view is missing: the dump came before the worker ran it. One that
    announces nothing is never waited for."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_step[row["step"]].append(row)
    first_cut = None
    for step in sorted(by_step, reverse=True):
        scheduled = [r for r in by_step[step] if r.get("sched_num_scheduled_tokens")]
        if not scheduled:
            if announcements and any(r.get("worker_kept_finished") is None for r in finishes(by_step[step])):
                first_cut = step
            continue
        if all(r.get("worker_num_scheduled_tokens") is not None for r in scheduled):
            break
        first_cut = step
    if first_cut is None:
        return rows, []
    cut = [step for step in sorted(by_step) if step >= first_cut]
    return [r for r in rows if r["step"] < first_cut], cut


def finishes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that announce a request's finish (its id in the step's finished_req_ids)."""
    return [r for r in rows if r.get("sched_status") == "finished" and not r.get("sched_num_scheduled_tokens")]
