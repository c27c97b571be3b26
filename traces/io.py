"""Write and read trace files, validating everything on read.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli. `write_trace` is the only way a trace reaches disk; `open_trace` /
`read_trace` the only way one comes back. Every kind of broken file (not Parquet, truncated, wrong
or newer schema, missing, extra or mistyped columns, broken metadata, impossible values) becomes one
`TraceError` line. `open_trace` validates the footer at once and the rows a bounded batch at a time
(`READ_ROWS`, however large the file's row groups) as `TraceFile.batches()` streams them
(traces.validate), so a trace larger than memory can be checked; `read_trace` loads a whole trace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from specreplay.traces import schema
from specreplay.traces.errors import RecordingError, TraceError
from specreplay.traces.header import Config, ImplHeader, Inputs, Outcome, Volatile, WorkloadHeader
from specreplay.traces.trace import Trace
from specreplay.traces.validate import RowValidator

ROW_GROUP_SIZE = 1 << 20  # large groups compress best (about 4 bytes a request-step)
#: Rows a streamed batch holds at most (`TraceFile.batches`), whatever the row groups: what one
#: batch costs in memory (a read-ahead reader holds two: `diff` of a million-row trace peaks at
#: 275 MB with 32,768, 365 MB with 65,536, at the same speed), and a size whose numpy
#: temporaries stay in cache (the checker runs about 1.4x faster per row than on 1M-row batches).
READ_ROWS = 1 << 15

_OUTCOMES = ("completed", "crashed", "step_limit", "partial")


def write_trace(trace: Trace, path: str | os.PathLike[str], row_group_size: int = ROW_GROUP_SIZE) -> Path:
    """Write `trace` to `path` atomically (a temporary file renamed into place), so an existing
    file at `path` is never left half-written. A trace that holds recorded inputs (an attached or
    live vLLM's: its users' prompts and outputs as token ids) is its owner's alone (0600); any
    other is an ordinary file."""
    path = Path(path)
    table = trace.table.cast(schema.SCHEMA).replace_schema_metadata(trace.metadata())
    # A trace read from an older version is written as that version (its newer columns null).
    check_before_writing(table, str(path), RowValidator(str(path), trace.schema_version))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            row_group_size=row_group_size,
            use_dictionary=_dictionary_columns(table),
            write_statistics=True,
        )
        if trace.inputs is None:  # mkstemp made it 0600: the recorded ones stay so
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


#: Columns written without Parquet's dictionary encoding where that is smaller. A dictionary
#: stores each id as a bit-packed index (9 bits for a 512-token vocabulary), which no codec can
#: shrink further: the repeats are there but not byte-aligned. A drafter that proposes the same
#: tokens for the same positions step after step (drafts rejected, the request one token further)
#: repeats k - 1 of its k ids from its previous row, and as plain int32s those repeats are byte
#: matches zstd finds (the benchmark trace: 3.4 -> 1.5 bytes a request-step for the drafts). Where
#: drafts are accepted there is less to find and the dictionary stays smaller, so the writer
#: measures both on a sample. Either way a reader needs to know nothing: the values, types and
#: schema are the same.
PLAIN_IF_SMALLER = ("worker_draft_ids",)
_SAMPLE_ROWS = 1 << 16


def _dictionary_columns(table: pa.Table) -> list[str]:
    """The columns to dictionary-encode: all but those of `PLAIN_IF_SMALLER` that a sample of
    rows (from the middle of the run, past the prefills) writes smaller without a dictionary."""
    start = max(0, (table.num_rows - _SAMPLE_ROWS) // 2)
    plain = set()
    for name in PLAIN_IF_SMALLER:
        sample = table.select([name]).slice(start, _SAMPLE_ROWS)
        sizes = []
        for dictionary in (True, False):
            sink = pa.BufferOutputStream()
            pq.write_table(sample, sink, compression="zstd", use_dictionary=dictionary, write_statistics=False)
            sizes.append(sink.getvalue().size)
        if sizes[1] < sizes[0]:
            plain.add(name)
    # Named by their Parquet leaf paths: a list column's values are `<name>.list.element` (the
    # top-level name alone would leave a list column without a dictionary).
    return [_leaf(field) for field in table.schema if field.name not in plain]


def _leaf(field: pa.Field) -> str:
    return f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name


def check_before_writing(table: pa.Table, where: str, validator: RowValidator | None = None) -> None:
    """The checks the reader makes, made on what is about to be written: a recorder bug is caught
    at record time (RecordingError), not when someone reads the file."""
    try:
        if table.schema.metadata:
            header_from_metadata(where, table.schema.metadata)
        (validator or RowValidator(where)).check(table)
    except TraceError as exc:
        raise RecordingError(f"refusing to write rows that fail validation: {exc}") from None


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a whole trace file into memory. Raises `TraceError` with one line on any
    problem. For traces that may not fit in memory, use `open_trace` and its `batches()`."""
    return open_trace(path).read()


def open_trace(path: str | os.PathLike[str]) -> TraceFile:
    """Open a trace file: its footer (schema, columns, metadata) is validated now, its rows batch
    by batch as they are read. Raises `TraceError` with one line on any problem."""
    path = Path(path)
    where = str(path)
    if not path.exists():
        raise TraceError(f"{where}: no such file")
    if path.is_dir():
        raise TraceError(f"{where}: is a directory, expected a .parquet trace file")
    try:
        parquet = pq.ParquetFile(path)
        file_schema = parquet.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        from specreplay.traces.journal import is_journal

        if is_journal(path):
            raise TraceError(
                f"{where}: is the journal of a recording that did not finish; "
                f"turn it into a trace with `specreplay recover {where}`"
            ) from None
        raise TraceError(
            f"{where}: not a readable Parquet file ({_short(exc)}); record a trace with `specreplay record`"
        ) from None
    meta = file_schema.metadata or {}
    version = _check_schema_version(where, meta)
    _check_columns(where, file_schema, version)
    header = header_from_metadata(where, meta)
    return TraceFile(path, parquet, header)


class TraceFile:
    """An opened trace: its metadata now, its rows one validated row group at a time.

    `header` is a `Trace` with the metadata and no rows; `batches()` streams the rows in bounded
    memory (one row group at a time, each checked by a `RowValidator`); `read()` loads them all."""

    def __init__(self, path: Path, parquet: pq.ParquetFile, header: Trace) -> None:
        self.path = path
        self.where = str(path)
        self._parquet = parquet
        self.header = header
        self.num_rows = parquet.metadata.num_rows
        # Row-group statistics are per leaf column: find `step` by name (columns may be in any order).
        names = [parquet.metadata.schema.column(i).path for i in range(parquet.metadata.num_columns)]
        self._step_leaf = names.index("step")

    def __getattr__(self, name: str) -> Any:
        # The rest of the header's (seed, device, version, schema_version, metadata(), ...).
        if name.startswith("_") or name in ("header", "path", "where", "num_rows"):
            raise AttributeError(name)
        return getattr(self.header, name)

    # The typed header parts, named so that a type checker sees them (traces.header).
    @property
    def workload(self) -> WorkloadHeader:
        return self.header.workload

    @property
    def config(self) -> Config:
        return self.header.config

    @property
    def impl(self) -> ImplHeader:
        return self.header.impl

    @property
    def outcome(self) -> Outcome:
        return self.header.outcome

    @property
    def inputs(self) -> Inputs | None:
        return self.header.inputs

    @property
    def impl_name(self) -> str:
        return self.header.impl_name

    @property
    def num_steps(self) -> int:
        """The last step (steps are in order, so the last row group's maximum)."""
        groups = self._parquet.metadata.num_row_groups
        if not self.num_rows or not groups:
            return 0
        column = self._parquet.metadata.row_group(groups - 1).column(self._step_leaf)
        stats = column.statistics
        if stats is not None and stats.has_min_max and isinstance(stats.max, int):
            return int(stats.max)
        last = None
        for batch in self.batches(columns=("step",)):
            last = batch
        return int(pc.max(last.column("step")).as_py()) if last is not None and last.num_rows else 0

    def batches(
        self, columns: tuple[str, ...] | None = None, batch_rows: int | None = READ_ROWS, read_ahead: bool = False
    ) -> Iterator[pa.Table]:
        """Validated rows in step order, as tables in the schema, with the given columns (all by
        default; every column is read and validated either way), at most `batch_rows` rows a table
        (None: a row group a table). `read_ahead`: the next batch is decoded and validated on a
        thread while the caller works on this one (`read_ahead`, below)."""
        batches = self._validated(columns, batch_rows)
        return read_ahead_of(batches) if read_ahead else batches

    def _validated(self, columns: tuple[str, ...] | None, batch_rows: int | None) -> Iterator[pa.Table]:
        validator = RowValidator(self.where, self.header.schema_version)
        for index in range(self._parquet.metadata.num_row_groups):
            for group in self._decoded(index, batch_rows):
                for name in schema.COLUMN_NAMES:  # added after the file's schema version: null
                    if name not in group.column_names:
                        group = group.append_column(name, pa.nulls(group.num_rows, schema.SCHEMA.field(name).type))
                try:
                    group = group.select(list(schema.COLUMN_NAMES)).cast(schema.SCHEMA)
                except (pa.ArrowException, ValueError) as exc:
                    raise TraceError(
                        f"{self.where}: columns do not match schema v{schema.SCHEMA_VERSION} ({_short(exc)})"
                    ) from None
                validator.check(group)
                yield group if columns is None else group.select(list(columns))

    def _decoded(self, index: int, batch_rows: int | None) -> Iterator[pa.Table]:
        """Row group `index` decoded, whole or `batch_rows` rows at a time. Decoding a whole group
        held it all in memory at once: a million-row group decodes to 200 MB and more, and the
        checker's numpy columns of it on top; a bounded batch keeps the peak independent of how
        the file was written (older writers made groups of 1M rows)."""
        parts: Iterator[pa.Table | pa.RecordBatch] | None = None
        while True:
            try:  # a damaged page surfaces when it is decoded, in any batch
                if parts is None:
                    parts = (
                        iter([self._parquet.read_row_group(index)])
                        if batch_rows is None
                        else self._parquet.iter_batches(batch_size=batch_rows, row_groups=[index])
                    )
                part = next(parts, None)
                if part is None:
                    return
                group = part if isinstance(part, pa.Table) else pa.Table.from_batches([part])
                group = group.replace_schema_metadata(None)
                group.validate(full=True)  # offsets, dictionary indices, UTF-8: a damaged file stops here
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise TraceError(f"{self.where}: Parquet data is damaged or truncated ({_short(exc)})") from None
            yield group

    def read(self) -> Trace:
        """Every row in memory, validated."""
        tables = list(self.batches(batch_rows=None))  # all of it in memory anyway: whole groups, fewer chunks
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        return dataclasses.replace(self.header, table=table)

    def rows_of(self, request_id: str, first_step: int, last_step: int, columns: tuple[str, ...]) -> pa.Table:
        """One request's rows over a step range, reading only the row groups that hold those
        steps (by their statistics); used to tell a finding's story without loading the trace."""
        wanted = []
        meta = self._parquet.metadata
        for index in range(meta.num_row_groups):
            stats = meta.row_group(index).column(self._step_leaf).statistics
            if stats is not None and stats.has_min_max and (stats.max < first_step or stats.min > last_step):
                continue
            wanted.append(index)
        if not wanted:
            return schema.empty_table().select(list(columns))
        try:
            table = self._parquet.read_row_groups(wanted, columns=list(columns))
            table.validate(full=True)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise TraceError(f"{self.where}: Parquet data is damaged or truncated ({_short(exc)})") from None
        keep = pc.and_(
            pc.equal(table["request_id"], request_id),
            pc.and_(pc.greater_equal(table["step"], first_step), pc.less_equal(table["step"], last_step)),
        )
        return table.filter(keep)


def read_ahead_of(items: Iterator[pa.Table], depth: int = 1) -> Iterator[pa.Table]:
    """`items`, produced `depth` ahead on a thread of their own. Decoding a Parquet batch and
    validating it run in Arrow's C++ with the GIL released, so on a second core they overlap with
    the caller's work on the batch before (the checker's rules: `diff` of a million-row trace
    took 2.0 s instead of 2.5 s on two loaded cores, side by side). What the thread raises (a
    damaged file's TraceError) is raised here, at the batch it stopped at; a caller that stops
    early stops the thread. Memory: `depth` batches more."""
    handoff: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        handoff.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            handoff.put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            handoff.put(exc)

    thread = threading.Thread(target=produce, name="specreplay-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a put that waits for room, then let it see `stop`
            try:
                handoff.get(timeout=0.1)
            except queue.Empty:
                pass


def header_from_metadata(where: str, meta: dict[bytes, bytes], outcome_required: bool = True) -> Trace:
    """A trace's validated metadata as a `Trace` without rows. `outcome_required=False` is for a
    recording journal, whose outcome is `running` until `recover` replaces it."""
    version = _check_schema_version(where, meta)
    config = _json(where, meta, schema.META_CONFIG)
    outcome = _json(where, meta, schema.META_OUTCOME)
    impl = _json(where, meta, schema.META_IMPL)
    _check_metadata(where, config, outcome if outcome_required else {"status": "completed"}, impl)
    inputs = _json(where, meta, schema.META_INPUTS, required=False)  # {}: none (the writer leaves it out)
    return Trace(
        table=schema.empty_table(),
        workload=WorkloadHeader.from_dict(_json(where, meta, schema.META_WORKLOAD), where),
        config=Config.from_dict(config, where),
        impl=ImplHeader.from_dict(impl, where),
        outcome=Outcome.from_dict(outcome, where),
        seed=_int(where, meta, schema.META_SEED),
        device=meta.get(schema.META_DEVICE, b"cpu").decode(errors="replace"),
        version=meta.get(schema.META_VERSION, b"?").decode(errors="replace"),
        volatile=Volatile.from_dict(_json(where, meta, schema.META_VOLATILE, required=False), where),
        schema_version=version,
        inputs=Inputs.from_dict(inputs, where) if inputs else None,
    )


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:160] + ("..." if len(text) > 160 else "")


def _check_schema_version(where: str, meta: dict[bytes, bytes]) -> int:
    raw = meta.get(schema.META_SCHEMA_VERSION)
    if raw is None:
        raise TraceError(
            f"{where}: Parquet file without specreplay metadata (no schema version); it was not written by specreplay"
        )
    try:
        version = int(raw)
    except ValueError:
        raise TraceError(f"{where}: schema version {raw[:40]!r} is not a number") from None
    if version > schema.SCHEMA_VERSION:
        raise TraceError(
            f"{where}: trace schema v{version} is newer than this specreplay reads "
            f"(v{schema.SCHEMA_VERSION}); upgrade specreplay"
        )
    if version == 1:
        raise TraceError(
            f"{where}: trace schema v1 (specreplay 0.1, before request lives and control events); "
            f"this specreplay reads v{schema.SCHEMA_VERSION}: record the workload again"
        )
    if version < schema.OLDEST_READ:
        raise TraceError(f"{where}: trace schema v{version} is not supported (expected v{schema.SCHEMA_VERSION})")
    return version


def _check_columns(where: str, file_schema: pa.Schema, version: int = schema.SCHEMA_VERSION) -> None:
    names = file_schema.names
    missing = [n for n in schema.columns_of_version(version) if n not in names]
    extra = [n for n in names if n not in schema.DESCRIPTIONS]
    mistyped = []
    for field in schema.SCHEMA_FIELDS:
        if field.name in names:
            got = file_schema.field(field.name).type
            want = field.type
            same = got.equals(want) or (
                pa.types.is_dictionary(want) and pa.types.is_dictionary(got) and got.value_type.equals(want.value_type)
            )
            if not same:
                mistyped.append(f"{field.name} is {got}, expected {want}")
    problems = []
    if missing:
        problems.append("missing columns: " + ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else ""))
    if extra:
        problems.append("unexpected columns: " + ", ".join(extra[:6]) + (" ..." if len(extra) > 6 else ""))
    if mistyped:
        problems.append("mistyped: " + "; ".join(mistyped[:4]) + (" ..." if len(mistyped) > 4 else ""))
    if problems:
        raise TraceError(
            f"{where}: does not match trace schema v{version} ("
            + "; ".join(problems)
            + "); re-record it with this specreplay"
        )


def _check_metadata(where: str, config: dict[str, Any], outcome: dict[str, Any], impl: dict[str, Any]) -> None:
    from specreplay.replay.workloads.config import EngineConfig
    from specreplay.traces.errors import InputError

    try:
        EngineConfig.from_dict(config, "config")
    except InputError as exc:
        raise TraceError(f"{where}: metadata {exc}") from None
    status = outcome.get("status")
    if status not in _OUTCOMES:
        raise TraceError(f"{where}: metadata outcome status {status!r} is not one of {', '.join(_OUTCOMES)}")
    if status != "completed" or "step" in outcome:
        step = outcome.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TraceError(f"{where}: metadata outcome step {step!r} is not a step number")
    if not isinstance(outcome.get("message", ""), str):
        raise TraceError(f"{where}: metadata outcome message is not text")
    unfinished = outcome.get("unfinished", [])
    if not isinstance(unfinished, list) or not all(isinstance(rid, str) for rid in unfinished):
        raise TraceError(f"{where}: metadata outcome unfinished is not a list of request ids")
    if not isinstance(impl.get("name"), str) or not impl["name"]:
        raise TraceError(f"{where}: metadata impl has no implementation name")


def _json(where: str, meta: dict[bytes, bytes], key: bytes, required: bool = True) -> dict[str, Any]:
    raw = meta.get(key)
    if raw is None:
        if required:
            raise TraceError(f"{where}: metadata {key.decode()} is missing; the trace is incomplete")
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise TraceError(f"{where}: metadata {key.decode()} is not valid JSON") from None
    if not isinstance(value, dict):
        raise TraceError(f"{where}: metadata {key.decode()} should be a JSON object")
    return value


def _int(where: str, meta: dict[bytes, bytes], key: bytes) -> int:
    raw = meta.get(key, b"0")
    try:
        return int(raw)
    except ValueError:
        raise TraceError(f"{where}: metadata {key.decode()} is not an integer") from None
