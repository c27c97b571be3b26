"""Trace against trace: the first (step, request, field) where two traces part, and what differs after.

Where it sits: traces -> **diff**. Rows are matched on (step, request_id); every schema column
is compared. Differences come back as findings (code `D1-trace-differs`, scheduler = trace A's
value, worker = trace B's) so the CLI renders them like any other finding.

Both traces stream in step order (row groups from `TraceFile.batches()`, or an in-memory table in
slices) and are compared a run of whole steps at a time: when the two sides hold the same
(step, request) rows, which is the common case, every column is compared vectorised; a run whose
rows differ falls back to matching row by row. Memory stays bounded by the batch size.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specreplay.replay.findings import Finding
from specreplay.traces import schema
from specreplay.traces.trace import Trace

_KEY = ("step", "request_id")
_COLUMNS = [c for c in schema.COLUMN_NAMES if c not in _KEY]


@dataclass
class TraceDiff:
    findings: list[Finding] = field(default_factory=list)  # first difference per field, in order
    fields: Counter = field(default_factory=Counter)  # differing rows per column
    only_a: int = 0
    only_b: int = 0
    rows_compared: int = 0

    @property
    def same(self) -> bool:
        return not self.findings

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None


def diff_traces(a: Trace, b: Trace, batch_rows: int = 1 << 20) -> TraceDiff:
    """Two in-memory traces."""
    return diff_batches(a, b, a.table.to_batches(max_chunksize=batch_rows), b.table.to_batches(max_chunksize=batch_rows))


def diff_batches(a, b, batches_a: Iterable, batches_b: Iterable) -> TraceDiff:
    """Two traces arriving in batches in step order; `a` and `b` give the metadata (outcome, steps)."""
    out = TraceDiff()
    first_per_field: dict[str, Finding] = {}
    for chunk_a, chunk_b in _aligned(iter(batches_a), iter(batches_b)):
        _compare(chunk_a, chunk_b, out, first_per_field)
    # Messages may be worded differently by different engines; status, step and kind must agree.
    if _outcome_key(a) != _outcome_key(b):
        out.fields["(outcome)"] += 1
        first_per_field["(outcome)"] = Finding("D1-trace-differs", "error", max(a.num_steps, b.num_steps), None,
                                               "(outcome)", a.outcome.get("status"), b.outcome.get("status"),
                                               f"run outcome: {a.outcome} in A, {b.outcome} in B")
    out.findings = sorted(first_per_field.values(), key=lambda f: (f.step, schema.COLUMN_NAMES.index(f.field)
                                                                    if f.field in schema.COLUMN_NAMES else 99))
    return out


def _aligned(batches_a: Iterator, batches_b: Iterator) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Pairs of tables holding the same run of whole steps, one from each trace."""
    held = {"a": _empty(), "b": _empty()}
    sources = {"a": batches_a, "b": batches_b}
    done = {"a": False, "b": False}
    while True:
        for side in ("a", "b"):
            # Read until this side holds a step beyond its last (its held steps are then whole).
            while not done[side] and (held[side].num_rows == 0 or _last(held[side]) == _first(held[side])):
                batch = next(sources[side], None)
                if batch is None:
                    done[side] = True
                else:
                    held[side] = pa.concat_tables([held[side], _table(batch)])
        if done["a"] and done["b"]:
            if held["a"].num_rows or held["b"].num_rows:
                yield held["a"], held["b"]
            return
        # Whole steps on both sides: below each unfinished side's last (possibly partial) step.
        bound = min((_last(held[s]) if not done[s] else np.iinfo(np.int64).max) for s in ("a", "b"))
        parts = {s: _split(held[s], bound) for s in ("a", "b")}
        held = {s: parts[s][1] for s in ("a", "b")}
        yield parts["a"][0], parts["b"][0]


def _empty() -> pa.Table:
    return schema.SCHEMA.empty_table()


def _table(batch) -> pa.Table:
    return batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])


def _first(table: pa.Table) -> int:
    return table["step"][0].as_py()


def _last(table: pa.Table) -> int:
    return table["step"][-1].as_py()


def _split(table: pa.Table, bound: int) -> tuple[pa.Table, pa.Table]:
    """Rows with step < bound, and the rest."""
    steps = table["step"].to_numpy()
    cut = int(np.searchsorted(steps, bound, side="left"))
    return table.slice(0, cut), table.slice(cut)


def _compare(ta: pa.Table, tb: pa.Table, out: TraceDiff, first_per_field: dict[str, Finding]) -> None:
    ta = ta.sort_by([("step", "ascending"), ("request_id", "ascending")])
    tb = tb.sort_by([("step", "ascending"), ("request_id", "ascending")])
    if not (ta["step"].equals(tb["step"]) and ta["request_id"].equals(tb["request_id"])):
        _compare_rowwise(ta, tb, out, first_per_field)
        return
    out.rows_compared += ta.num_rows
    for name in _COLUMNS:
        rows = _differing_rows(ta[name], tb[name])
        if not len(rows):
            continue
        out.fields[name] += len(rows)
        if name not in first_per_field:
            i = int(rows[0])
            va, vb = ta[name][i].as_py(), tb[name][i].as_py()
            first_per_field[name] = Finding("D1-trace-differs", "error", ta["step"][i].as_py(), ta["request_id"][i].as_py(),
                                            name, va, vb, f"{name}: {va!r} in A, {vb!r} in B")


def _differing_rows(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """Indexes of the rows where two aligned columns differ (null equals only null)."""
    a, b = a.combine_chunks(), b.combine_chunks()
    if pa.types.is_dictionary(a.type):
        a, b = a.dictionary_decode(), b.dictionary_decode()
    null_a, null_b = _np(a.is_null()), _np(b.is_null())
    differ = null_a != null_b
    if pa.types.is_list(a.type):
        len_a = _np(pc.fill_null(pc.list_value_length(a), 0))
        len_b = _np(pc.fill_null(pc.list_value_length(b), 0))
        differ |= len_a != len_b
        same_len = ~differ
        flat_a, flat_b = _np(pc.list_flatten(a)), _np(pc.list_flatten(b))
        parents_a = _np(pc.list_parent_indices(a))
        if len(flat_a) == len(flat_b) and same_len.all():
            differ[np.unique(parents_a[flat_a != flat_b])] = True
        else:  # lengths differ somewhere: compare the equal-length rows one by one
            la, lb = a.to_pylist(), b.to_pylist()
            for i in np.flatnonzero(same_len):
                differ[i] = la[i] != lb[i]
        return np.flatnonzero(differ)
    values = pc.fill_null(pc.not_equal(a, b), False)
    differ |= _np(values)
    return np.flatnonzero(differ)


def _np(array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def _compare_rowwise(ta: pa.Table, tb: pa.Table, out: TraceDiff, first_per_field: dict[str, Finding]) -> None:
    """Rows matched one by one on (step, request_id): for runs of steps where the row sets differ."""
    rows_a, rows_b = _rows(ta), _rows(tb)
    col_a = {c: ta[c].to_pylist() for c in _COLUMNS}
    col_b = {c: tb[c].to_pylist() for c in _COLUMNS}
    for key in sorted(set(rows_a) | set(rows_b)):
        ia, ib = rows_a.get(key), rows_b.get(key)
        if ia is None or ib is None:
            if ia is None:
                out.only_b += 1
            else:
                out.only_a += 1
            out.fields["(row)"] += 1
            if "(row)" not in first_per_field:
                first_per_field["(row)"] = Finding(
                    "D1-trace-differs", "error", key[0], key[1], "(row)", ia is not None, ib is not None,
                    f"request {key[1]!r} has a row at step {key[0]} only in trace {'A' if ia is not None else 'B'}")
            continue
        out.rows_compared += 1
        for c in _COLUMNS:
            va, vb = col_a[c][ia], col_b[c][ib]
            if va != vb:
                out.fields[c] += 1
                if c not in first_per_field:
                    first_per_field[c] = Finding("D1-trace-differs", "error", key[0], key[1], c, va, vb,
                                                 f"{c}: {va!r} in A, {vb!r} in B")


def _outcome_key(trace) -> tuple:
    return tuple(trace.outcome.get(k) for k in ("status", "step", "kind"))


def _rows(table: pa.Table) -> dict[tuple[int, str], int]:
    steps = table["step"].to_pylist()
    rids = table["request_id"].to_pylist()
    return {(s, r): i for i, (s, r) in enumerate(zip(steps, rids))}
