"""Trace against trace: the first (step, request, field) where two traces part, and what differs after.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> **check** ->
workflows -> views -> cli. Rows are matched on (step, request_id); every schema column is compared.
Differences come back as findings (code `D1-trace-differs`; expected = trace A's value, actual =
trace B's, life = the row's sched_life; scheduler and worker repeat A and B for the 0.1 JSON) so the
CLI renders them like any other finding.

Ground truth is compared where both traces hold it: a trace with none at all (a live engine's
recording) against one with it (its replay) leaves those columns out, named in `no_truth`. Two
traces of different runner families (the cross-runner what-if: an MRV2 recording replayed on V1's
runner) compare the worker columns both runners record; a worker column only one of them fills is
left out, named in `other_runner`. A flight recorder's window (a trace whose header names its
`window`) against anything, its replay first: the columns no window reproduces
(traces/window.py `NOT_REPRODUCED_BY_A_WINDOW`) are counted in `not_reproduced`, never findings.

Both traces stream in step order (row groups from `TraceFile.batches()`, or an in-memory table in
slices) and are compared a run of whole steps at a time, vectorised: when the two sides hold the
same (step, request) rows (the common case) column against column; otherwise the rows both have
are matched on their keys first and the rest counted. Memory stays bounded by the batch size.
tests/replay/check/test_tracediff.py holds it to a row-by-row statement of the same comparison.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specreplay.replay.check.coverage import GROUND_TRUTH, columns_with_values
from specreplay.replay.check.findings import Finding
from specreplay.traces import schema
from specreplay.traces.families import family_name
from specreplay.traces.trace import Trace
from specreplay.traces.validate import as_numpy
from specreplay.traces.window import NOT_REPRODUCED_BY_A_WINDOW

_KEY = ("step", "request_id")
_COLUMNS = [c for c in schema.COLUMN_NAMES if c not in _KEY]


@dataclass
class TraceDiff:
    findings: list[Finding] = field(default_factory=list)  # first difference per field, in order
    fields: Counter = field(default_factory=Counter)  # differing rows per column
    only_a: int = 0
    only_b: int = 0
    rows_compared: int = 0
    left_out: list[str] = field(default_factory=list)  # columns the older trace's schema lacks
    #: Ground-truth columns one trace holds no value in at all (a live engine's recording has
    #: none): not compared, by side ("A" or "B").
    no_truth: dict[str, list[str]] = field(default_factory=dict)
    #: Worker columns only one of two traces of different runner families records (by side).
    other_runner: dict[str, list[str]] = field(default_factory=dict)
    #: A window's trace: the columns no window reproduces that differ, with their differing rows.
    not_reproduced: dict[str, int] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return not self.findings

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None


def diff_traces(a: Trace, b: Trace, batch_rows: int = 1 << 20) -> TraceDiff:
    """Two in-memory traces."""
    return diff_batches(
        a, b, a.table.to_batches(max_chunksize=batch_rows), b.table.to_batches(max_chunksize=batch_rows)
    )


def diff_batches(a, b, batches_a: Iterable, batches_b: Iterable) -> TraceDiff:
    """Two traces arriving in batches in step order; `a` and `b` give the metadata (outcome, steps)."""
    out = TraceDiff()
    first_per_field: dict[str, Finding] = {}
    # A trace of an older schema version lacks the columns added since: they are left out.
    older = min(getattr(t, "schema_version", schema.SCHEMA_VERSION) for t in (a, b))
    columns = [c for c in schema.columns_of_version(older) if c not in _KEY]
    out.left_out = [c for c in _COLUMNS if c not in columns]
    truth: dict[str, set[str]] = {"A": set(), "B": set()}  # ground-truth columns with a value somewhere, per side
    cross = _family(a) != _family(b)
    worker = [c for c in columns if c.startswith("worker_")] if cross else []
    recorded: dict[str, set[str]] = {"A": set(), "B": set()}  # worker columns with a value (cross-runner only)
    for chunk_a, chunk_b in _aligned(iter(batches_a), iter(batches_b)):
        truth["A"] |= columns_with_values(chunk_a)
        truth["B"] |= columns_with_values(chunk_b)
        for side, chunk in (("A", chunk_a), ("B", chunk_b)):
            recorded[side] |= {c for c in worker if chunk.column(c).null_count < chunk.num_rows}
        _compare(chunk_a, chunk_b, out, first_per_field, columns)
    for side, other in (("A", "B"), ("B", "A")):
        # The other runner's own worker view: nothing of it to compare against.
        only = [c for c in worker if c in recorded[side] and c not in recorded[other]]
        if only:
            out.other_runner[side] = only
            for name in only:
                first_per_field.pop(name, None)
                out.fields.pop(name, None)
    for side, other in (("A", "B"), ("B", "A")):
        # A trace without ground truth against one with it: the truth is the other's alone, not a difference.
        missing = [c for c in GROUND_TRUTH if c in columns and c in truth[other] and c not in truth[side]]
        if missing:
            out.no_truth[side] = missing
            for name in missing:
                first_per_field.pop(name, None)
                out.fields.pop(name, None)
    if _window(a) or _window(b):
        # A replay starts from an empty engine, the recorded window did not: what only the
        # history before the window decides is reported apart, not as a difference.
        for name in NOT_REPRODUCED_BY_A_WINDOW:
            if out.fields.get(name):
                out.not_reproduced[name] = out.fields.pop(name)
                first_per_field.pop(name, None)
    # Messages may be worded differently by different engines; status, step and kind must agree.
    if not _outcomes_agree(a, b):
        out.fields["(outcome)"] += 1
        first_per_field["(outcome)"] = _differs(
            max(a.num_steps, b.num_steps),
            None,
            None,
            "(outcome)",
            a.outcome.status,
            b.outcome.status,
            f"run outcome: {a.outcome.to_dict()} in A, {b.outcome.to_dict()} in B",
        )
    out.findings = sorted(
        first_per_field.values(),
        key=lambda f: (f.step, schema.COLUMN_NAMES.index(f.field) if f.field in schema.COLUMN_NAMES else 99),
    )
    return out


def _window(trace) -> bool:
    """A flight recorder's window (workflows/merge.py names its recorded steps in the header)."""
    return bool(getattr(getattr(trace, "impl", None), "window", None))


def _family(trace) -> str:
    """The runner family whose worker view a trace holds (v1 where none is named)."""
    return family_name(getattr(trace, "impl", None))


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
    return schema.empty_table()


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


def _compare(
    ta: pa.Table, tb: pa.Table, out: TraceDiff, first_per_field: dict[str, Finding], columns: list[str]
) -> None:
    ta = ta.sort_by([("step", "ascending"), ("request_id", "ascending")])
    tb = tb.sort_by([("step", "ascending"), ("request_id", "ascending")])
    if not (ta["step"].equals(tb["step"]) and ta["request_id"].equals(tb["request_id"])):
        ta, tb = _match(ta, tb, out, first_per_field)
    out.rows_compared += ta.num_rows
    for name in columns:
        rows = _differing_rows(ta[name], tb[name])
        if not len(rows):
            continue
        out.fields[name] += len(rows)
        if name not in first_per_field:
            i = int(rows[0])
            va, vb = ta[name][i].as_py(), tb[name][i].as_py()
            first_per_field[name] = _differs(
                ta["step"][i].as_py(),
                ta["request_id"][i].as_py(),
                ta["sched_life"][i].as_py(),
                name,
                va,
                vb,
                f"{name}: {va!r} in A, {vb!r} in B",
            )


def _match(
    ta: pa.Table, tb: pa.Table, out: TraceDiff, first_per_field: dict[str, Finding]
) -> tuple[pa.Table, pa.Table]:
    """Where the two sides hold different (step, request) rows: count the rows only one side has
    (the first of them, by step and request, is the `(row)` finding) and return the rows both have,
    aligned, in A's order. Vectorised: once two traces part, every later run comes through here."""
    key_a, key_b = _keys(ta), _keys(tb)
    in_b = pc.index_in(key_a, value_set=key_b)
    matched = as_numpy(in_b.is_valid())
    rows_a = np.flatnonzero(matched)
    rows_b = as_numpy(in_b.drop_null()).astype(np.int64)
    only_a = np.flatnonzero(~matched)
    seen_b = np.zeros(tb.num_rows, dtype=bool)
    seen_b[rows_b] = True
    only_b = np.flatnonzero(~seen_b)
    out.only_a += len(only_a)
    out.only_b += len(only_b)
    if len(only_a) or len(only_b):
        out.fields["(row)"] += len(only_a) + len(only_b)
        if "(row)" not in first_per_field:
            # Both sides are sorted: each side's first lone row is its smallest; take the smaller.
            firsts = (
                [
                    (
                        ta["step"][int(only_a[0])].as_py(),
                        ta["request_id"][int(only_a[0])].as_py(),
                        "A",
                        ta["sched_life"][int(only_a[0])].as_py(),
                    )
                ]
                if len(only_a)
                else []
            )
            if len(only_b):
                firsts.append(
                    (
                        tb["step"][int(only_b[0])].as_py(),
                        tb["request_id"][int(only_b[0])].as_py(),
                        "B",
                        tb["sched_life"][int(only_b[0])].as_py(),
                    )
                )
            step, rid, side, life = min(firsts)
            first_per_field["(row)"] = _differs(
                step,
                rid,
                life,
                "(row)",
                side == "A",
                side == "B",
                f"request {rid!r} has a row at step {step} only in trace {side}",
            )
    return ta.take(pa.array(rows_a)), tb.take(pa.array(rows_b))


def _differs(step: int, request_id: str | None, life: int | None, field: str, in_a, in_b, message: str) -> Finding:
    """A D1 finding: trace A's value is the expected one (the golden's, in the gate), B's the actual."""
    return Finding(
        "D1-trace-differs", "error", step, request_id, field, in_a, in_b, message, expected=in_a, actual=in_b, life=life
    )


def _keys(table: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(
        pc.cast(table["step"], pa.string()), table["request_id"], "\x00"
    ).combine_chunks()


def _differing_rows(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """Indexes of the rows where two aligned columns differ (null equals only null)."""
    a, b = a.combine_chunks(), b.combine_chunks()
    if pa.types.is_dictionary(a.type):
        a, b = a.dictionary_decode(), b.dictionary_decode()
    null_a, null_b = as_numpy(a.is_null()), as_numpy(b.is_null())
    differ = null_a != null_b
    if pa.types.is_list(a.type):
        len_a = as_numpy(pc.fill_null(pc.list_value_length(a), 0))
        len_b = as_numpy(pc.fill_null(pc.list_value_length(b), 0))
        differ |= len_a != len_b
        same_len = ~differ
        # Rows of equal length: their flattened values line up element for element.
        keep = np.flatnonzero(same_len)
        sub_a, sub_b = a.take(pa.array(keep)), b.take(pa.array(keep))
        flat_a, flat_b = as_numpy(pc.list_flatten(sub_a)), as_numpy(pc.list_flatten(sub_b))
        parents = as_numpy(pc.list_parent_indices(sub_a))
        differ[keep[np.unique(parents[flat_a != flat_b])]] = True
        return np.flatnonzero(differ)
    values = pc.fill_null(pc.not_equal(a, b), False)
    differ |= as_numpy(values)
    return np.flatnonzero(differ)


def _outcome_key(trace: Trace) -> tuple[str | None, int | None, str | None]:
    return (trace.outcome.status, trace.outcome.step, trace.outcome.kind)


def _stopped_key(trace: Trace) -> tuple[str | None, int | None, str | None]:
    """As _outcome_key, a completed run's step being its last (its outcome names none)."""
    status, step, kind = _outcome_key(trace)
    return (status, trace.num_steps if step is None and status == "completed" else step, kind)


#: What a run that stopped at its last step without crashing may say: a recording that lost its
#: tail (`partial`: what came after its last whole step is unknown) agrees with a rerun of those
#: steps that stopped there with work left (`step_limit`) or without (`completed`).
_STOPPED = {"partial", "step_limit", "completed"}


def _outcomes_agree(a: Trace, b: Trace) -> bool:
    key_a, key_b = _outcome_key(a), _outcome_key(b)
    if key_a == key_b:
        return True
    partial = "partial" in (key_a[0], key_b[0])
    key_a, key_b = _stopped_key(a), _stopped_key(b)
    return partial and key_a[1:] == key_b[1:] and {key_a[0], key_b[0]} <= _STOPPED
