"""Write and read trace files, validating everything on read.

Where it sits: record -> **traces** -> replay -> diff. `write_trace` is the only way a trace reaches
disk; `read_trace` is the only way one comes back, and it turns every kind of broken file (not
Parquet, truncated, wrong or newer schema, missing, extra or mistyped columns, impossible values)
into one `TraceError` line.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from specreplay.traces import schema
from specreplay.traces.errors import TraceError
from specreplay.traces.trace import Trace

#: Columns whose values are counts and can never be negative in a well-formed trace.
#: (Placeholder counts are deliberately absent: a negative one is a finding, not a broken file.)
_NON_NEGATIVE = (
    "step_total_scheduled_tokens", "sched_num_scheduled_tokens", "sched_num_draft_slots",
    "sched_num_tokens", "sched_num_output_tokens", "sched_num_prompt_tokens", "sched_spec_len",
    "apply_num_scheduled_tokens", "apply_num_draft_slots", "apply_num_tokens", "apply_token_mismatches",
    "worker_num_scheduled_tokens", "worker_num_draft_slots", "worker_cached_drafts",
    "worker_num_accepted", "worker_num_emitted", "worker_num_output_tokens", "worker_row",
    "worker_first_position",
    "truth_num_computed_tokens", "truth_kv_after",
)

ROW_GROUP_SIZE = 1 << 20  # large groups compress best (about 4 bytes a request-step)

#: Columns filled together: in any row they are all null or all set.
_GROUPS = {
    "worker": tuple(n for n in schema.COLUMN_NAMES if n.startswith("worker_") and n != "worker_num_accepted"),
    # apply_token_mismatches needs ground truth: null in a live engine's trace.
    "apply": tuple(n for n in schema.COLUMN_NAMES if n.startswith("apply_")
                   and n not in ("apply_finish_reason", "apply_token_mismatches")),
    "truth": tuple(n for n in schema.COLUMN_NAMES if n.startswith("truth_")),
}
_OUTCOMES = ("completed", "crashed", "step_limit")


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write `trace` to `path` atomically (a temporary file renamed into place), so an existing
    file at `path` is never left half-written."""
    path = Path(path)
    table = trace.table.cast(schema.SCHEMA).replace_schema_metadata(trace.metadata())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP_SIZE,
                       use_dictionary=True, write_statistics=True)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a trace is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace file. Raises `TraceError` with one line on any problem."""
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
        raise TraceError(f"{where}: not a readable Parquet file ({_short(exc)}); "
                         "record a trace with `specreplay record`") from None
    meta = file_schema.metadata or {}
    _check_schema_version(where, meta)
    _check_columns(where, file_schema)
    try:
        table = parquet.read().replace_schema_metadata(None)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TraceError(f"{where}: Parquet data is damaged or truncated ({_short(exc)})") from None
    try:
        table = table.select(list(schema.COLUMN_NAMES)).cast(schema.SCHEMA)
    except (pa.ArrowException, ValueError) as exc:
        raise TraceError(f"{where}: columns do not match schema v{schema.SCHEMA_VERSION} ({_short(exc)})") from None
    validate_values(table, where)
    config = _json(where, meta, schema.META_CONFIG)
    outcome = _json(where, meta, schema.META_OUTCOME)
    impl = _json(where, meta, schema.META_IMPL)
    _check_metadata(where, config, outcome, impl)
    return Trace(
        table=table,
        workload=_json(where, meta, schema.META_WORKLOAD),
        config=config,
        impl=impl,
        outcome=outcome,
        seed=_int(where, meta, schema.META_SEED),
        device=meta.get(schema.META_DEVICE, b"cpu").decode(errors="replace"),
        version=meta.get(schema.META_VERSION, b"?").decode(errors="replace"),
        volatile=_json(where, meta, schema.META_VOLATILE, required=False),
    )


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:160] + ("..." if len(text) > 160 else "")


def _check_schema_version(where: str, meta: dict[bytes, bytes]) -> None:
    raw = meta.get(schema.META_SCHEMA_VERSION)
    if raw is None:
        raise TraceError(f"{where}: Parquet file without specreplay metadata (no schema version); "
                         "it was not written by specreplay")
    try:
        version = int(raw)
    except ValueError:
        raise TraceError(f"{where}: schema version {raw[:40]!r} is not a number") from None
    if version > schema.SCHEMA_VERSION:
        raise TraceError(f"{where}: trace schema v{version} is newer than this specreplay reads "
                         f"(v{schema.SCHEMA_VERSION}); upgrade specreplay")
    if version < 1 or version != schema.SCHEMA_VERSION:
        raise TraceError(f"{where}: trace schema v{version} is not supported (expected v{schema.SCHEMA_VERSION})")


def _check_columns(where: str, file_schema: pa.Schema) -> None:
    names = file_schema.names
    missing = [n for n in schema.COLUMN_NAMES if n not in names]
    extra = [n for n in names if n not in schema.DESCRIPTIONS]
    mistyped = []
    for field in schema.SCHEMA_FIELDS:
        if field.name in names:
            got = file_schema.field(field.name).type
            want = field.type
            same = got.equals(want) or (pa.types.is_dictionary(want) and pa.types.is_dictionary(got)
                                        and got.value_type.equals(want.value_type))
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
        raise TraceError(f"{where}: does not match trace schema v{schema.SCHEMA_VERSION} ("
                         + "; ".join(problems) + "); re-record it with this specreplay")


def validate_values(table: pa.Table, where: str) -> None:
    """Reject values no recorder can produce: negative counts, unknown enum values, steps out of
    order, duplicate (step, request_id) rows, nulls in required columns."""
    for field in schema.SCHEMA_FIELDS:
        if not field.nullable and table[field.name].null_count:
            raise TraceError(f"{where}: column {field.name} has null values; it is required")
    for name in _NON_NEGATIVE:
        col = table[name]
        if col.null_count == len(col):
            continue
        low = pc.min(col).as_py()
        if low is not None and low < 0:
            raise TraceError(f"{where}: column {name} holds {low}, expected a count >= 0")
    for name, allowed in schema.ENUMS.items():
        seen = pc.unique(table[name].combine_chunks().dictionary_decode()
                         if pa.types.is_dictionary(table[name].type) else table[name])
        unknown = [v for v in seen.to_pylist() if v is not None and v not in allowed]
        if unknown:
            raise TraceError(f"{where}: column {name} holds unknown value {unknown[0]!r}; "
                             f"expected one of {', '.join(repr(a) for a in allowed)}")
    if table.num_rows == 0:
        return
    drafts = table["worker_draft_ids"].combine_chunks()
    if pc.list_flatten(drafts).null_count:
        raise TraceError(f"{where}: column worker_draft_ids holds null draft ids")
    for group, names in _GROUPS.items():
        nulls = [table[n].is_null() for n in names]
        for name, mask in zip(names[1:], nulls[1:]):
            if not pc.all(pc.equal(mask, nulls[0])).as_py():
                raise TraceError(f"{where}: column {name} is null where {names[0]} is not (or the reverse); "
                                 f"the {group} columns of a row are filled together")
    steps = table["step"]
    if pc.min(steps).as_py() < 1:
        raise TraceError(f"{where}: column step holds {pc.min(steps).as_py()}, steps start at 1")
    steps = steps.combine_chunks()  # compare neighbours in pyarrow: numpy is not a dependency
    if table.num_rows > 1 and pc.any(pc.less(steps.slice(1), steps.slice(0, len(steps) - 1))).as_py():
        raise TraceError(f"{where}: rows are not in step order; the trace was reordered or damaged")
    keys = pc.binary_join_element_wise(pc.cast(steps, pa.string()), table["request_id"], "\x00")
    if len(pc.unique(keys)) != table.num_rows:
        raise TraceError(f"{where}: duplicate (step, request_id) rows; the trace is damaged")


def _check_metadata(where: str, config: dict[str, Any], outcome: dict[str, Any], impl: dict[str, Any]) -> None:
    from specreplay.replay.config import EngineConfig
    from specreplay.traces.errors import InputError

    try:
        EngineConfig.from_dict(config, "config")
    except InputError as exc:
        raise TraceError(f"{where}: metadata {exc}") from None
    status = outcome.get("status")
    if status not in _OUTCOMES:
        raise TraceError(f"{where}: metadata outcome status {status!r} is not one of {', '.join(_OUTCOMES)}")
    if status != "completed":
        step = outcome.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TraceError(f"{where}: metadata outcome step {step!r} is not a step number")
    if not isinstance(outcome.get("message", ""), str):
        raise TraceError(f"{where}: metadata outcome message is not text")
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
