"""Trace against trace: the first (step, request, field) where two traces part, and what differs after.

Where it sits: traces -> **diff**. Rows are matched on (step, request_id); every schema column
is compared. Differences come back as findings (code `D1-trace-differs`, scheduler = trace A's
value, worker = trace B's) so the CLI renders them like any other finding.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from specreplay.replay.findings import Finding
from specreplay.traces import schema
from specreplay.traces.trace import Trace

_KEY = ("step", "request_id")


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


def diff_traces(a: Trace, b: Trace) -> TraceDiff:
    out = TraceDiff()
    columns = [c for c in schema.COLUMN_NAMES if c not in _KEY]
    rows_a = _rows(a)
    rows_b = _rows(b)
    first_per_field: dict[str, Finding] = {}
    col_a = {c: a.table[c].to_pylist() for c in columns}
    col_b = {c: b.table[c].to_pylist() for c in columns}
    for key in sorted(set(rows_a) | set(rows_b), key=lambda k: (k[0], rows_a.get(k, rows_b.get(k)))):
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
        for c in columns:
            va, vb = col_a[c][ia], col_b[c][ib]
            if va != vb:
                out.fields[c] += 1
                if c not in first_per_field:
                    first_per_field[c] = Finding("D1-trace-differs", "error", key[0], key[1], c, va, vb,
                                                 f"{c}: {va!r} in A, {vb!r} in B")
    # Messages may be worded differently by different engines; status, step and kind must agree.
    if _outcome_key(a) != _outcome_key(b):
        out.fields["(outcome)"] += 1
        first_per_field["(outcome)"] = Finding("D1-trace-differs", "error", max(a.num_steps, b.num_steps), None,
                                               "(outcome)", a.outcome.get("status"), b.outcome.get("status"),
                                               f"run outcome: {a.outcome} in A, {b.outcome} in B")
    out.findings = sorted(first_per_field.values(), key=lambda f: (f.step, schema.COLUMN_NAMES.index(f.field)
                                                                    if f.field in schema.COLUMN_NAMES else 99))
    return out


def _outcome_key(trace: Trace) -> tuple:
    return tuple(trace.outcome.get(k) for k in ("status", "step", "kind"))


def _rows(trace: Trace) -> dict[tuple[int, str], int]:
    steps = trace.table["step"].to_pylist()
    rids = trace.table["request_id"].to_pylist()
    return {(s, r): i for i, (s, r) in enumerate(zip(steps, rids))}
