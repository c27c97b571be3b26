"""The recording journal: a trace's rows on disk while it is being recorded, so a crash keeps them.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli. While a run records to `OUT.parquet`, the recorder appends settled rows
(steps whose output was applied: they never change again) to `OUT.parquet.partial`, an Arrow IPC
stream, every few steps and on any Python-level exception. Each append is one record batch of whole
steps, written straight to the operating system, so a process killed at any point (SIGKILL included)
leaves every batch written before the kill readable and never half a step. When the run ends, the
Parquet trace is written and the journal deleted; after a crash, `specreplay recover` reads the
complete batches and writes an ordinary trace whose outcome is `partial`, saying the step it stops
at.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa

from specreplay.traces import schema
from specreplay.traces.errors import TraceError
from specreplay.traces.header import Outcome
from specreplay.traces.trace import Trace

SUFFIX = ".partial"
#: The first bytes of an Arrow IPC stream (continuation marker) and of an Arrow IPC file.
IPC_MAGIC = (b"\xff\xff\xff\xff", b"ARROW1")


def journal_path(output: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(output)}{SUFFIX}")


class JournalWriter:
    """Appends whole steps of trace rows to an IPC stream. `header` gives the metadata (its
    outcome is stored as `running`: a journal is by definition unfinished)."""

    def __init__(self, path: str | os.PathLike[str], header: Trace) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        meta = header.metadata()
        meta[schema.META_OUTCOME] = json.dumps({"status": "running"}).encode()
        # OSFile is unbuffered: every batch is in the operating system once write_table returns.
        # The header goes to a temporary name first, so a journal that exists always has one.
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        self._sink = pa.OSFile(str(tmp), "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema.SCHEMA.with_metadata(meta))
        # The stream writes its schema with the first batch: an empty one puts the header down now.
        self._writer.write_batch(pa.RecordBatch.from_pylist([], schema=schema.SCHEMA))
        os.replace(tmp, self.path)
        self.rows = 0
        from specreplay.traces.validate import RowValidator

        self._validator = RowValidator(f"{self.path} (as recorded)")  # carries step order across appends

    def append(self, table: pa.Table) -> None:
        from specreplay.traces.io import check_before_writing

        if table.num_rows:
            check_before_writing(table, str(self.path), self._validator)
            self._writer.write_table(table, max_chunksize=table.num_rows)
            self.rows += table.num_rows

    def close(self) -> None:
        if not self._sink.closed:
            self._writer.close()
            self._sink.close()

    def discard(self) -> None:
        """The run finished and its trace is written: the journal has served its purpose."""
        self.close()
        self.path.unlink(missing_ok=True)


def is_journal(path: str | os.PathLike[str]) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(6)
    except OSError:
        return False
    return head.startswith(IPC_MAGIC[0]) or head.startswith(IPC_MAGIC[1])


def holds_steps(path: str | os.PathLike[str]) -> bool:
    """Whether a journal has at least one complete batch of rows (something `recover` can return)."""
    try:
        reader = pa.ipc.open_stream(pa.OSFile(os.fspath(path), "rb"))
        while True:
            if reader.read_next_batch().num_rows:
                return True
    except (StopIteration, pa.ArrowException, OSError, ValueError):
        return False


def recover(path: str | os.PathLike[str]) -> Trace:
    """The complete batches of a journal as a trace with outcome `partial` (validated like any
    trace read from disk). Raises `TraceError` when there is nothing to recover."""
    from specreplay.traces.io import header_from_metadata
    from specreplay.traces.validate import RowValidator

    where = os.fspath(path)
    if not Path(where).is_file():
        raise TraceError(f"{where}: no such journal file")
    try:
        reader = pa.ipc.open_stream(pa.OSFile(where, "rb"))
    except (pa.ArrowException, OSError, ValueError):
        raise TraceError(
            f"{where}: not a specreplay recording journal (no Arrow stream header); nothing to recover"
        ) from None
    header = header_from_metadata(where, reader.schema.metadata or {}, outcome_required=False)
    batches = []
    while True:
        try:
            batch = reader.read_next_batch()
            batch.validate(full=True)
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError):
            break  # the batch being written when the process died: everything before it is whole
        if batch.num_rows:
            batches.append(batch)
    if not batches:
        raise TraceError(
            f"{where}: the recording stopped before its first flush; the journal holds no "
            "complete step, nothing to recover"
        )
    table = pa.Table.from_batches(batches, schema=reader.schema).replace_schema_metadata(None)
    try:
        table = table.select(list(schema.COLUMN_NAMES)).cast(schema.SCHEMA)
    except (pa.ArrowException, ValueError, KeyError) as exc:
        raise TraceError(f"{where}: journal columns do not match schema v{schema.SCHEMA_VERSION} ({exc})") from None
    # One chunk, one dictionary per enum column (in order of first appearance, as a recorder writes).
    table = table.unify_dictionaries().combine_chunks()
    RowValidator(where).check(table)
    last = table["step"][-1].as_py() if table.num_rows else 0
    header.table = table
    header.outcome = Outcome(
        status="partial",
        step=last,
        message=f"recording stopped; recovered the {table.num_rows} rows of steps 1..{last} flushed before it stopped",
    )
    return header
