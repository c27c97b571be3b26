"""The invariant checker: scheduler view against worker view and ground truth, from a trace alone.

Where it sits: traces -> replay -> **diff**. The checker reads only a trace's rows and metadata, so
it works on any trace, whatever recorded it. Each invariant below has a stable code, a severity and
the reference section it comes from (../shared/reference/vllm-async-spec-state.md, section 4.2).
A violated invariant of the implementation under test is a finding, never an exception.

Severity: error = the views or the ground truth disagree, a token is lost, duplicated or wrong,
or a negative id reaches the model; warning = work is wasted (draft slots verified with nothing
behind them, tokens executed that the scheduler did not book).

How it runs: rows stream in batches (a trace's row groups), are cut at step boundaries, and each
chunk is checked with vectorised numpy over its columns. What an invariant needs from earlier
steps is carried between chunks: the rows of the last `LOOKBACK` steps (the outputs that can still
be in flight) and a few per-request values (the decode state, the last status, which codes already
fired). So memory is bounded by the row group size, not the trace. The row-by-row statement of
every invariant lives in tests/replay/rowwise_checker.py, and a test holds the two to the same
findings on every scenario, implementation and many mutated traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specreplay.replay.check.findings import Finding
from specreplay.traces import schema
from specreplay.traces.trace import Trace
from specreplay.traces.validate import as_numpy, enum_codes

#: How many steps back an unapplied output can be in flight (two batches, plus slack for
#: empty steps, which the engine pops without a forward).
LOOKBACK = 4

#: The columns the checker reads.
NEEDED = (
    "step", "request_id", "step_total_scheduled_tokens", "sched_status", "sched_kind",
    "sched_num_scheduled_tokens", "sched_num_draft_slots", "sched_num_computed_tokens",
    "sched_num_output_placeholders", "sched_num_tokens", "sched_num_output_tokens",
    "sched_spec_len", "sched_is_prefill_chunk", "sched_preempted", "apply_step",
    "apply_num_scheduled_tokens", "apply_num_draft_slots", "apply_num_rejected", "apply_num_tokens",
    "apply_token_mismatches", "apply_num_output_placeholders", "worker_row", "worker_num_scheduled_tokens",
    "worker_num_draft_slots", "worker_num_computed_tokens", "worker_first_position",
    "worker_cached_drafts", "worker_draft_ids", "worker_num_output_tokens",
    "truth_num_computed_tokens", "truth_kv_ok", "sched_life", "sched_event", "sched_num_in_flight_tokens",
    "sched_num_stale_output_tokens", "apply_outcome", "apply_life",
)

RUNNING, PREEMPTED, WAITING, FINISHED = (schema.STATUSES.index(s) for s in ("running", "preempted", "waiting", "finished"))
NEW, RESUMED, UNSCHEDULED = (schema.KINDS.index(k) for k in ("new", "resumed", "unscheduled"))
RESET_PREEMPT, STREAM_TURN = schema.EVENTS.index("reset_preempt"), schema.EVENTS.index("stream_turn")
APPLIED, STALE_DELIVERED, DROPPED, IGNORED = (schema.APPLY_OUTCOMES.index(o) for o in schema.APPLY_OUTCOMES)

# (short name, column, value for null, keep a null mask)
_INTS = (
    ("total", "step_total_scheduled_tokens", 0, False), ("n", "sched_num_scheduled_tokens", 0, False),
    ("k", "sched_num_draft_slots", 0, False), ("C", "sched_num_computed_tokens", 0, False),
    ("P", "sched_num_output_placeholders", 0, False), ("T", "sched_num_tokens", 0, False),
    ("out", "sched_num_output_tokens", 0, False), ("spec", "sched_spec_len", 0, False),
    ("apply_step", "apply_step", -1, True), ("apply_n", "apply_num_scheduled_tokens", -1, False),
    ("apply_k", "apply_num_draft_slots", -1, True), ("apply_rej", "apply_num_rejected", 0, True),
    ("apply_tokens", "apply_num_tokens", 0, False), ("apply_mism", "apply_token_mismatches", 0, False),
    ("apply_P", "apply_num_output_placeholders", 0, True), ("w_row", "worker_row", -1, True),
    ("w_n", "worker_num_scheduled_tokens", -1, True), ("w_k", "worker_num_draft_slots", -1, False),
    ("w_C", "worker_num_computed_tokens", 0, True), ("w_pos", "worker_first_position", 0, False),
    ("w_cached", "worker_cached_drafts", 0, False), ("w_out", "worker_num_output_tokens", 0, True),
    ("truth", "truth_num_computed_tokens", 0, True), ("life", "sched_life", 0, False),
    ("in_flight", "sched_num_in_flight_tokens", 0, False), ("stale", "sched_num_stale_output_tokens", 0, False),
    ("apply_life", "apply_life", -1, True),
)
_BOOLS = (("chunk", "sched_is_prefill_chunk"), ("preempted", "sched_preempted"))


@dataclass(frozen=True)
class Invariant:
    code: str
    severity: str
    statement: str
    source: str
    check: Callable[["Frame", "Checker"], Iterable[Finding]]


class Frame:
    """One chunk of rows as numpy columns: the carried context rows (history only, the last
    LOOKBACK steps before the chunk) followed by the chunk's own rows (`own`), in step order.
    `lags[L]` is each row's L-th earlier row of the same request (-1: none in the frame) and
    `flying[L]` says whether that row's output was still in flight when this row's step was
    scheduled (not applied yet, not cut off by a preemption, a cache reset or LOOKBACK).
    Rows are grouped per request life: a resubmitted id is another request here."""

    def __init__(self, cols: dict[str, np.ndarray], num_context: int) -> None:
        self.c = cols
        size = len(cols["step"])
        self.size = size
        self.own = np.arange(size) >= num_context
        self.num_context = num_context
        order = np.argsort(_dense(cols["req"]), kind="stable")  # per request, rows stay in step order
        prev = np.full(size, -1, dtype=np.int64)
        same = cols["req"][order[1:]] == cols["req"][order[:-1]]
        prev[order[1:][same]] = order[:-1][same]
        self.order = order
        step = cols["step"]
        self.lags: list[np.ndarray] = []
        self.flying: list[np.ndarray] = []
        lag = prev
        alive = np.ones(size, dtype=bool)
        later = np.arange(size)  # the row one step nearer (the row itself for lag 1)
        # In-flight outputs cut off before this row's schedule(): a cache reset, a streaming turn's end.
        reset = (cols["event"] == RESET_PREEMPT) | (cols["event"] == STREAM_TURN)
        for _ in range(LOOKBACK):
            at = np.maximum(lag, 0)
            alive = alive & (lag >= 0) & (step[at] >= step - LOOKBACK) & ~cols["preempted"][at] & ~reset[later]
            self.lags.append(lag)
            self.flying.append(alive & (cols["n"][at] > 0)
                               & (cols["apply_step_null"][at] | (cols["apply_step"][at] >= step)))
            later = at
            lag = np.where(lag >= 0, prev[at], -1)

    def at(self, name: str, lag: int) -> np.ndarray:
        """Column `name` of each row's `lag`-th earlier row (garbage where there is none: mask it)."""
        return self.c[name][np.maximum(self.lags[lag - 1], 0)]

    def flying_steps(self, i: int, non_chunk_only: bool = False) -> list[int]:
        out = []
        for lag in range(LOOKBACK, 0, -1):
            j = int(self.lags[lag - 1][i])
            if self.flying[lag - 1][i] and not (non_chunk_only and self.c["chunk"][j]):
                out.append(int(self.c["step"][j]))
        return out


class Checker:
    """Streams batches of one trace through every invariant; `findings()` at the end."""

    def __init__(self, config: dict[str, Any], outcome: dict[str, Any]) -> None:
        self.config = config
        self.outcome = outcome
        self.is_async = bool(config.get("async_scheduling", True))
        self.crash_step = outcome.get("step") if outcome.get("status") == "crashed" else None
        self.ids: dict[tuple[str, int], int] = {}
        self.names: list[str] = []
        # Per request (by code): carried from chunk to chunk.
        self.decoding = np.zeros(0, dtype=bool)
        self.epoch = np.zeros(0, dtype=np.int64)  # cuts (preemptions, cache resets) so far
        self.last_status = np.full(0, -1, dtype=np.int8)
        self.fired: dict[str, np.ndarray] = {}
        self.context: dict[str, np.ndarray] | None = None  # rows of the last LOOKBACK steps checked
        self.pending: list[dict[str, np.ndarray]] = []  # rows of a step that may not be whole yet
        self.found: list[Finding] = []

    # ------------------------------------------------------------------ streaming
    def feed(self, batch: pa.Table | pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        cols = self._columns(batch)
        # The batch's last step may continue in the next batch: hold it back until it is whole.
        cut = int(np.searchsorted(cols["step"], cols["step"][-1], side="left"))
        if cut == 0:
            self.pending.append(cols)
            return
        whole = self.pending + [_slice(cols, 0, cut)]
        self.pending = [_slice(cols, cut, None)]
        self._check_chunk(whole)

    def findings(self) -> list[Finding]:
        if self.pending:
            self._check_chunk(self.pending)
            self.pending = []
        for check in (check_crash, check_run_completes):
            self.found.extend(check(None, self))
        self.found.sort(key=lambda f: (f.step, f.request_id or "", _RANK.get(f.code, len(_RANK)), f.code))
        return self.found

    def _columns(self, batch: pa.Table | pa.RecordBatch) -> dict[str, np.ndarray]:
        # Native widths (int32, int16): arithmetic below widens where it must; no copies to int64.
        cols: dict[str, np.ndarray] = {"step": as_numpy(batch.column("step"))}
        ids = batch.column("request_id")
        ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        encoded = pc.dictionary_encode(ids)
        names = encoded.dictionary.to_pylist()
        index = as_numpy(encoded.indices).astype(np.int64)
        lives = as_numpy(batch.column("sched_life")).astype(np.int64)
        if lives.any():
            # A resubmitted id: each (id, life) is its own request to the invariants.
            pairs, inverse = np.unique(index * (1 << 16) + (lives & 0xFFFF), return_inverse=True)
            lookup = np.array([self._id((names[p >> 16], p & 0xFFFF)) for p in pairs.tolist()], dtype=np.int64)
            cols["req"] = lookup[inverse.reshape(-1)]
        else:
            lookup = np.array([self._id((name, 0)) for name in names], dtype=np.int64)
            cols["req"] = lookup[index]
        cols["status"] = enum_codes(batch.column("sched_status"), schema.STATUSES)
        cols["kind"] = enum_codes(batch.column("sched_kind"), schema.KINDS)
        cols["event"] = enum_codes(batch.column("sched_event"), schema.EVENTS)
        cols["outcome"] = enum_codes(batch.column("apply_outcome"), schema.APPLY_OUTCOMES)
        cols["epoch"] = np.zeros(batch.num_rows, dtype=np.int64)  # filled per chunk
        for short, name, fill, keep_mask in _INTS:
            col = batch.column(name)
            if keep_mask:
                cols[short + "_null"] = as_numpy(col.is_null())
            cols[short] = as_numpy(pc.fill_null(col, fill) if col.null_count else col)
        for short, name in _BOOLS:
            cols[short] = as_numpy(batch.column(name))
        cols["kv_false"] = as_numpy(pc.fill_null(pc.invert(batch.column("truth_kv_ok")), False))
        drafts = batch.column("worker_draft_ids")
        drafts = drafts.combine_chunks() if isinstance(drafts, pa.ChunkedArray) else drafts
        cols["d_len"] = as_numpy(pc.fill_null(pc.list_value_length(drafts), 0)).astype(np.int64)
        flat = as_numpy(pc.list_flatten(drafts))
        parents = as_numpy(pc.list_parent_indices(drafts))
        cols["d_neg"] = np.bincount(parents[flat < 0], minlength=batch.num_rows)
        return cols

    def _id(self, key: tuple[str, int]) -> int:
        """The code of a (request id, life); findings name the request id."""
        code = self.ids.get(key)
        if code is None:
            code = self.ids[key] = len(self.names)
            self.names.append(key[0])
        return code

    def _check_chunk(self, parts: list[dict[str, np.ndarray]]) -> None:
        grow = len(self.names) - len(self.decoding)
        if grow > 0:
            self.decoding = np.concatenate([self.decoding, np.zeros(grow, dtype=bool)])
            self.epoch = np.concatenate([self.epoch, np.zeros(grow, dtype=np.int64)])
            self.last_status = np.concatenate([self.last_status, np.full(grow, -1, dtype=np.int8)])
            for code in self.fired:
                self.fired[code] = np.concatenate([self.fired[code], np.zeros(grow, dtype=bool)])
        cols = _concat(([] if self.context is None else [self.context]) + parts)
        frame = Frame(cols, 0 if self.context is None else len(self.context["step"]))
        self._count_cuts(frame)
        for inv in INVARIANTS:
            if inv.code not in ("E1-engine-crash", "E2-run-incomplete"):
                self.found.extend(inv.check(frame, self))
        own = frame.order[frame.own[frame.order]]
        ends = np.r_[cols["req"][own[1:]] != cols["req"][own[:-1]], True]
        self.last_status[cols["req"][own[ends]]] = cols["status"][own[ends]]
        # The rows of the last LOOKBACK + 1 steps the trace has (steps a pause left out do not count).
        steps = np.unique(cols["step"][-min(len(cols["step"]), 1 << 16):])
        keep = int(np.searchsorted(cols["step"], min(steps[-(LOOKBACK + 1):][0], cols["step"][-1] - LOOKBACK),
                                   side="left"))
        self.context = {name: values[keep:].copy() for name, values in cols.items()}

    def _count_cuts(self, frame: Frame) -> None:
        """Each own row's epoch: how many cuts (a preemption, a cache reset, a turn's end) its
        request life has had up to and including its step, carried across chunks. An output
        is stale exactly when the epoch at its apply step is above the epoch it was scheduled in."""
        c = frame.c
        own = frame.order[frame.own[frame.order]]
        if not len(own):
            return
        reqs = c["req"][own]
        cut = (c["preempted"][own] | (c["event"][own] == RESET_PREEMPT) | (c["event"][own] == STREAM_TURN)).astype(np.int64)
        starts = np.r_[True, reqs[1:] != reqs[:-1]]
        total = np.cumsum(cut)
        first = np.flatnonzero(starts)
        before_group = (total[first] - cut[first])[np.cumsum(starts) - 1]
        c["epoch"][own] = self.epoch[reqs] + total - before_group
        ends = np.r_[starts[1:], True]
        self.epoch[reqs[ends]] = c["epoch"][own][ends]

    # ------------------------------------------------------------------ helpers for the checks
    def first_per_request(self, code: str, frame: Frame, violated: np.ndarray) -> np.ndarray:
        """Rows where `code` fires for the first time for their request (one finding per request)."""
        rows = np.flatnonzero(violated & frame.own)
        if not len(rows):
            return rows
        fired = self.fired.setdefault(code, np.zeros(len(self.names), dtype=bool))
        reqs = frame.c["req"][rows]
        _, first = np.unique(reqs, return_index=True)
        rows = rows[first]
        rows = rows[~fired[frame.c["req"][rows]]]
        fired[frame.c["req"][rows]] = True
        return np.sort(rows)

    def finding(self, frame: Frame, code: str, i: int, field: str, sched, worker, message: str) -> Finding:
        return Finding(code, SEVERITY[code], int(frame.c["step"][i]), self.names[frame.c["req"][i]],
                       field, sched, worker, message)


def _dense(codes: np.ndarray) -> np.ndarray:
    """The same grouping with codes 0..R-1 in the narrowest type: a stable argsort of 16-bit
    keys is a radix sort, several times faster than one of int64 keys."""
    mark = np.zeros(int(codes.max()) + 1 if len(codes) else 1, dtype=np.int64)
    mark[codes] = 1
    local = np.cumsum(mark) - 1
    return local[codes].astype(np.uint16 if local[-1] < 1 << 16 else np.uint32)



def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _slice(cols: dict[str, np.ndarray], start: int, stop: int | None) -> dict[str, np.ndarray]:
    return {name: values[start:stop] for name, values in cols.items()}


# ------------------------------------------------------------------ scheduler-internal
def check_placeholders_nonnegative(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    applied_negative = ~c["apply_P_null"] & (c["apply_P"] < 0)
    for i in np.flatnonzero(frame.own & ((c["P"] < 0) | applied_negative)):
        value = int(c["P"][i] if c["P"][i] < 0 else c["apply_P"][i])
        yield chk.finding(frame, "S1-placeholders-nonnegative", i, "num_output_placeholders", value, None,
                          f"num_output_placeholders went negative ({value}); vLLM asserts and the engine dies")


def check_placeholder_count(frame: Frame, chk: Checker) -> Iterable[Finding]:
    if not chk.is_async:
        return
    c = frame.c
    expected = np.zeros(frame.size, dtype=np.int64)
    for lag in range(1, LOOKBACK + 1):
        counted = frame.flying[lag - 1] & ~frame.at("chunk", lag)
        expected += np.where(counted, 1 + frame.at("k", lag), 0)
    drained = (c["status"] == PREEMPTED) | ((c["status"] == WAITING) & (c["kind"] == UNSCHEDULED))
    expected = np.where(drained & (c["P"] == 0), 0, expected)
    eligible = (c["status"] != FINISHED) & ~c["preempted"]
    violated = eligible & (c["P"] != expected) & (c["P"] >= 0)
    for i in chk.first_per_request("S2-placeholder-count", frame, violated):
        got, want = int(c["P"][i]), int(expected[i])
        steps = frame.flying_steps(i, non_chunk_only=True)
        yield chk.finding(frame, "S2-placeholder-count", i, "num_output_placeholders", got, want,
                          f"num_output_placeholders is {got} but the steps in flight "
                          f"({', '.join(str(s) for s in steps) or 'none'}) account for {want}")


def check_decode_identity(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    # Is the request decoding before each row? Set by its last row that scheduled tokens (a
    # final chunk or a decode: yes; a non-final prefill chunk: no), cleared by a preemption;
    # carried across chunks per request.
    own = frame.order[frame.own[frame.order]]
    reqs = c["req"][own]
    pos = np.arange(len(own))
    starts = np.r_[True, reqs[1:] != reqs[:-1]] if len(own) else np.zeros(0, dtype=bool)
    event = (c["n"][own] > 0) | c["preempted"][own]
    state = ~c["preempted"][own] & ~c["chunk"][own]
    last_event = np.maximum.accumulate(np.where(event, pos, -1)) if len(own) else pos
    before = np.r_[-1, last_event[:-1]] if len(own) else pos
    segment_start = np.maximum.accumulate(np.where(starts, pos, 0)) if len(own) else pos
    seen = before >= segment_start
    decoding = np.zeros(frame.size, dtype=bool)
    decoding[own] = np.where(seen, state[np.maximum(before, 0)], chk.decoding[reqs])
    ends = np.r_[starts[1:], True] if len(own) else starts
    settled = ends & (last_event >= segment_start)
    chk.decoding[reqs[settled]] = state[last_event[settled]]

    gap = c["T"] + c["P"] - c["C"]
    eligible = (c["status"] == RUNNING) & ~c["preempted"] & (c["kind"] != NEW) & (c["kind"] != RESUMED)
    violated = eligible & ((gap < 1) | (decoding & (gap != 1)))
    for i in chk.first_per_request("S4-decode-identity", frame, violated):
        yield chk.finding(frame, "S4-decode-identity", i, "num_tokens + placeholders - num_computed_tokens",
                          int(gap[i]), 1, f"num_tokens + num_output_placeholders - num_computed_tokens is {int(gap[i])}, "
                          "expected 1 for a decoding request (its next demand is wrong)")


def check_draft_provenance(frame: Frame, chk: Checker) -> Iterable[Finding]:
    if not chk.is_async:
        return  # sync drafts are real ids from the worker, valid while the request waits
    c = frame.c
    step = c["step"]
    # The previous schedule() call is the previous step the trace has (a pause leaves steps out);
    # the frame's context holds the last LOOKBACK of them.
    steps = np.unique(step)
    at = np.searchsorted(steps, step)
    last = np.where(at > 0, steps[np.maximum(at - 1, 0)], 0)
    has_prev = frame.lags[0] >= 0
    not_scheduled = ~has_prev | (frame.at("step", 1) != last) | (frame.at("n", 1) == 0)
    chunk = ~not_scheduled & frame.at("chunk", 1)
    resumed = ~not_scheduled & ~chunk & (c["kind"] == RESUMED)
    empty = ~not_scheduled & ~chunk & ~resumed & (frame.at("total", 1) == 0)
    for i in np.flatnonzero(frame.own & (c["k"] > 0) & (not_scheduled | chunk | resumed | empty)):
        s, k = int(last[i]), int(c["k"][i])
        why = (f"it was not scheduled at step {s}, so the worker holds no drafts for it" if not_scheduled[i]
               else f"its step {s} was a non-final prefill chunk, which proposes no drafts" if chunk[i]
               else "it resumes from preemption" if resumed[i] else f"step {s} was empty")
        yield chk.finding(frame, "S5-draft-provenance", i, "scheduled_spec_decode_tokens", k, 0,
                          f"scheduled {k} draft slots with no drafts behind them: {why} "
                          "(stale -1 placeholders; the slots are verified and wasted)")


def check_budget(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    budget = chk.config.get("max_num_batched_tokens", 1 << 30)
    max_len = chk.config.get("max_model_len", 1 << 30)
    n, computed = c["n"], c["C"]
    for i in np.flatnonzero(frame.own & (n > 0) & (computed + n > max_len - 1)):
        yield chk.finding(frame, "S6-token-budget", i, "num_scheduled_tokens", int(n[i]),
                          int(max_len - computed[i] - 1), f"schedules past max_model_len {max_len}")
    # Per step (a chunk holds whole steps): the declared total against the sum and the budget.
    start = frame.num_context
    steps, declared = c["step"][start:], c["total"][start:]
    if not len(steps):
        return
    firsts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    totals = np.add.reduceat(n[start:], firsts)
    per_row = np.repeat(totals, np.diff(np.r_[firsts, len(steps)]))
    bad = np.flatnonzero((declared != per_row) | (declared > budget))
    _, first = np.unique(steps[bad], return_index=True)
    for i in bad[first]:
        yield Finding("S6-token-budget", "error", int(steps[i]), None, "total_num_scheduled_tokens", int(declared[i]),
                      int(per_row[i]), f"total_num_scheduled_tokens is {int(declared[i])}; the requests add up to "
                      f"{int(per_row[i])}; budget {budget}")


def check_draft_slot_count(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    width = chk.config.get("num_spec_tokens", 0)
    n, k = c["n"], c["k"]
    # Only drafts from the waiting path: vLLM pads a 1-token admission to 1 + k tokens.
    admitted = (c["kind"] == NEW) | (c["kind"] == RESUMED)
    padded = bool(width) & (c["T"] - c["C"] == 1) & (n == 1 + width)
    room = n + c["C"] - c["T"] - c["P"]
    expected = np.where(admitted, np.where(padded, width, 0), np.maximum(0, np.minimum(c["spec"], room)))
    for i in np.flatnonzero(frame.own & (n > 0) & (k != expected)):
        yield chk.finding(frame, "S7-draft-slot-count", i, "num_draft_slots", int(k[i]), int(expected[i]),
                          f"{int(k[i])} draft slots scheduled inside {int(n[i])} tokens; the counters allow {int(expected[i])}")


def check_computed_tokens(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S3 (scheduler optimistic count vs truth), X2 (worker count vs truth and vs scheduler)."""
    c = frame.c
    rejected = np.zeros(frame.size, dtype=np.int64)
    unknown = np.zeros(frame.size, dtype=bool)
    for lag in range(1, LOOKBACK + 1):
        flying = frame.flying[lag - 1]
        # an in-flight output never applied (aborted, finished, crash): its rejections are unknown
        unknown |= flying & frame.at("apply_rej_null", lag)
        rejected += np.where(flying, frame.at("apply_rej", lag), 0)
    eligible = (c["n"] > 0) & ~c["w_C_null"] & ~unknown
    settled = c["C"] - rejected
    worker, position, truth = c["w_C"], c["w_pos"], c["truth"]
    has_truth = ~c["truth_null"]
    for i in chk.first_per_request("S3", frame, eligible & has_truth & (settled != truth)):
        yield chk.finding(frame, "S3-scheduler-computed-tokens", i, "num_computed_tokens", int(settled[i]), int(truth[i]),
                          f"the scheduler's num_computed_tokens, once its in-flight rejections are taken off, is "
                          f"{int(settled[i])} but the KV cache holds {int(truth[i])} valid tokens")
    for i in chk.first_per_request("X2s", frame, eligible & (worker != settled)):
        yield chk.finding(frame, "X2-sched-worker-computed", i, "num_computed_tokens", int(settled[i]), int(worker[i]),
                          f"scheduler and worker disagree on num_computed_tokens at step {int(c['step'][i])}: "
                          f"{int(settled[i])} vs {int(worker[i])}")
    for i in chk.first_per_request("X2t", frame, eligible & has_truth & (position != truth)):
        p, t = int(position[i]), int(truth[i])
        gap = f"positions {t}..{p - 1} are never written" if p > t else f"positions {p}..{t - 1} are written twice"
        yield chk.finding(frame, "X2-worker-kv-position", i, "num_computed_tokens", int(c["C"][i]), p,
                          f"the worker writes step {int(c['step'][i])} from position {p} but its KV cache holds "
                          f"{t} valid tokens: {gap}")
    for i in chk.first_per_request("X2p", frame, eligible & (position != worker)):
        yield chk.finding(frame, "X2-worker-position-mismatch", i, "num_computed_tokens", int(worker[i]), int(position[i]),
                          f"the worker's CPU num_computed_tokens ({int(worker[i])}) differs from the device position "
                          f"it computes with ({int(position[i])})")


def check_output_length(frame: Frame, chk: Checker) -> Iterable[Finding]:
    if not chk.is_async:
        return
    c = frame.c
    expected = c["out"] + c["P"]
    violated = ~c["w_out_null"] & (c["n"] > 0) & (c["w_out"] != expected)
    for i in chk.first_per_request("X3-output-length", frame, violated):
        got, want = int(c["w_out"][i]), int(expected[i])
        yield chk.finding(frame, "X3-output-length", i, "num_output_tokens", want, got,
                          f"the worker holds {got} output tokens, the scheduler sent {want} (applied + placeholders)")


def check_membership(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    scheduled, in_batch = c["n"] > 0, ~c["w_row_null"]
    live = c["step"] != (chk.crash_step if chk.crash_step is not None else -1)
    for i in np.flatnonzero(frame.own & live & (scheduled != in_batch)):
        yield chk.finding(frame, "X1-batch-membership", i, "worker_row", bool(scheduled[i]), bool(in_batch[i]),
                          "scheduled but not in the worker's batch" if scheduled[i] else "in the worker's batch but not scheduled")


def check_executed_work(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    violated = ~c["w_n_null"] & ((c["w_n"] != c["n"]) | (c["w_k"] != c["k"]))
    for i in np.flatnonzero(frame.own & violated):
        s, w = int(c["n"][i]), int(c["w_n"][i])
        yield chk.finding(frame, "X11-executed-other-work", i, "num_scheduled_tokens", s, w,
                          f"the worker executed {w} tokens ({int(c['w_k'][i])} drafts) where the scheduler "
                          f"booked {s} ({int(c['k'][i])} drafts)")


def check_output_mutated(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    violated = ~c["apply_k_null"] & ((c["apply_n"] != c["n"]) | (c["apply_k"] != c["k"]))
    for i in np.flatnonzero(frame.own & violated):
        n, slots, built_n, built_k = (int(c[name][i]) for name in ("apply_n", "apply_k", "n", "k"))
        yield chk.finding(frame, "X10-scheduler-output-mutated", i, "scheduled_spec_decode_tokens", built_k, slots,
                          f"update_from_output read {n} tokens with {slots} draft slots back from the SchedulerOutput "
                          f"that was built with {built_n} and {built_k}: the worker edited the scheduler's own object")


def check_draft_inputs(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    violated = (c["d_len"] > 0) & ((c["d_neg"] > 0) | (chk.is_async & (c["w_cached"] == 0)))
    for i in np.flatnonzero(frame.own & violated):
        drafts, negative = int(c["d_len"][i]), int(c["d_neg"][i])
        yield chk.finding(frame, "X5-placeholder-drafts", i, "draft_token_ids", drafts, int(c["w_cached"][i]),
                          f"the worker verified {drafts} draft slots with no cached drafts behind them"
                          + (f" ({negative} of them -1, clamped to 0 for the embedding and rejected)" if negative else ""))


def check_tokens(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    for i in chk.first_per_request("T1-wrong-token", frame, c["apply_mism"] != 0):
        bad, applied = int(c["apply_mism"][i]), int(c["apply_tokens"][i])
        yield chk.finding(frame, "T1-wrong-token", i, "output_token_ids", applied, bad,
                          f"{bad} of the {applied} tokens applied from step {int(c['step'][i])} differ "
                          "from the request's expected sequence (a token lost, duplicated or computed at the wrong position)")


def check_kv_truth(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    for i in chk.first_per_request("K1-kv-content", frame, c["kv_false"] & (c["n"] > 0)):
        truth = None if c["truth_null"][i] else int(c["truth"][i])
        yield chk.finding(frame, "K1-kv-content", i, "kv_cache", None, truth,
                          "the KV cache no longer holds the request's expected tokens in every valid position")


# ------------------------------------------------------------------ request lives and control events
def check_output_life(frame: Frame, chk: Checker) -> Iterable[Finding]:
    c = frame.c
    used = (c["outcome"] == APPLIED) | (c["outcome"] == STALE_DELIVERED) | (c["outcome"] == DROPPED)
    violated = used & ~c["apply_life_null"] & (c["apply_life"] != c["life"])
    for i in chk.first_per_request("L1-output-life", frame, violated):
        life, other = int(c["life"][i]), int(c["apply_life"][i])
        what = schema.APPLY_OUTCOMES[c["outcome"][i]]
        yield chk.finding(frame, "L1-output-life", i, "request life", life, other,
                          f"the output of step {int(c['step'][i])}, scheduled for life {life} of the request, was "
                          f"given to life {other} (a new request under the same id) at step {int(c['apply_step'][i])} "
                          f"({what}, {int(c['apply_tokens'][i])} tokens): the old life's tokens and counts land on the new one")


def check_stale_outputs(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """L2, at the row of the step that applied each output: an output scheduled before a cut
    (preemption, cache reset, turn end) of its request and applied after it is stale; any other
    is fresh. Several outputs can land at one step: the nearest wrong one is named."""
    c = frame.c
    step = c["step"]
    violated = np.zeros(frame.size, dtype=bool)
    culprit = np.full(frame.size, -1, dtype=np.int64)
    for lag in range(LOOKBACK, 0, -1):  # nearest last, so it wins
        r = np.maximum(frame.lags[lag - 1], 0)
        near = (frame.lags[lag - 1] >= 0) & (step[r] >= step - LOOKBACK)  # as far back as the context reaches
        paired = (frame.own & near & (c["n"][r] > 0) & ~c["apply_step_null"][r]
                  & (c["apply_step"][r] == step) & ~c["apply_life_null"][r] & (c["apply_life"][r] == c["life"][r]))
        stale = c["epoch"] > c["epoch"][r]
        outcome = c["outcome"][r]
        wrong = paired & ((~stale & ((outcome == STALE_DELIVERED) | (outcome == DROPPED)))
                          | (stale & (outcome == APPLIED)))
        violated |= wrong
        culprit = np.where(wrong, r, culprit)
    for i in chk.first_per_request("L2-stale-output", frame, violated):
        j = int(culprit[i])
        stale = bool(c["epoch"][i] > c["epoch"][j])
        what = schema.APPLY_OUTCOMES[c["outcome"][j]]
        if stale:
            message = (f"the output of step {int(step[j])} was in flight when the request was preempted or its "
                       f"cache reset, yet update_from_output applied it as fresh at step {int(step[i])}: its "
                       f"{int(c['apply_tokens'][j])} tokens and {int(c['apply_rej'][j])} rejections moved the "
                       "reset counters")
        else:
            message = (f"the output of step {int(step[j])} belongs to the request's current life (no preemption "
                       f"or reset since), yet update_from_output treated it as stale ({what}) at step "
                       f"{int(step[i])}: its tokens are lost or its counters never settle")
        yield chk.finding(frame, "L2-stale-output", i, "apply_outcome", what, "stale" if stale else "fresh", message)


def check_in_flight_tokens(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """L3: vLLM counts in-flight and stale outputs in scheduled tokens (a prefill chunk, or 1 +
    draft slots), per step, drained in schedule order."""
    c = frame.c
    step = c["step"]
    in_flight = np.zeros(frame.size, dtype=np.int64)
    stale = np.zeros(frame.size, dtype=np.int64)
    # The counters are read before schedule(): a preemption by this very schedule() is not in them.
    epoch_before = c["epoch"] - c["preempted"]
    for lag in range(1, LOOKBACK + 1):
        r = np.maximum(frame.lags[lag - 1], 0)
        near = (frame.lags[lag - 1] >= 0) & (step[r] >= step - LOOKBACK)
        pending = near & (c["n"][r] > 0) & (c["apply_step_null"][r] | (c["apply_step"][r] >= step))
        in_flight += np.where(pending, c["n"][r], 0)
        stale += np.where(pending & (c["epoch"][r] < epoch_before), c["n"][r], 0)
    eligible = c["status"] != FINISHED
    violated = eligible & ((c["in_flight"] != in_flight) | (c["stale"] != stale))
    for i in chk.first_per_request("L3-in-flight-tokens", frame, violated):
        got_f, got_s, want_f, want_s = int(c["in_flight"][i]), int(c["stale"][i]), int(in_flight[i]), int(stale[i])
        if got_f != want_f:
            field, got, want, name = "num_in_flight_tokens", got_f, want_f, "in flight"
        else:
            field, got, want, name = "num_stale_output_tokens", got_s, want_s, "in flight from before the last preemption or reset"
        yield chk.finding(frame, "L3-in-flight-tokens", i, field, got, want,
                          f"{field} is {got} but the scheduled tokens of its outputs {name} add up to {want}"
                          + (" (a count never goes negative)" if got < 0 else
                             "; counted in steps or sampled tokens instead of scheduled tokens?" if got and want else ""))


def check_run_completes(_frame: Frame | None, chk: Checker) -> Iterable[Finding]:
    if chk.outcome.get("status") == "completed":  # the requests the scheduler held when it went idle
        unfinished = [str(rid) for rid in chk.outcome.get("unfinished", ())]
    else:  # cut by the step limit: requests whose last row is not finished
        unfinished = sorted(chk.names[r] for r in np.flatnonzero(chk.last_status != FINISHED))
    yield from incomplete_findings(chk.outcome, unfinished)


def incomplete_findings(outcome: dict[str, Any], unfinished: list[str]) -> Iterable[Finding]:
    """E2 for a run cut by the step limit, or one that completed with requests held for good."""
    listed = f"({', '.join(unfinished[:5])}{'...' if len(unfinished) > 5 else ''})"
    if outcome.get("status") == "step_limit":
        yield Finding("E2-run-incomplete", "error", outcome.get("step", 0), unfinished[0] if unfinished else None,
                      "outcome", "step_limit", len(unfinished),
                      f"the run hit the step limit with {len(unfinished)} requests unfinished {listed}: "
                      "livelock or starvation")
    elif outcome.get("status") == "completed" and unfinished:
        yield Finding("E2-run-incomplete", "error", int(outcome.get("step", 0)), unfinished[0], "outcome", "completed",
                      len(unfinished), f"the engine went idle for good with {len(unfinished)} requests unfinished "
                      f"{listed}: the scheduler holds them but will never schedule them (in no queue it "
                      "admits from); their clients wait forever")


def check_crash(_frame: Frame | None, chk: Checker) -> Iterable[Finding]:
    if chk.crash_step is None:
        return
    message = chk.outcome.get("message", "engine crashed")
    rid = None
    marker = "request '"
    if marker in message:
        rid = message.split(marker, 1)[1].split("'", 1)[0]
    if chk.outcome.get("kind", "negative-input-id") == "negative-input-id":
        yield Finding("X5-negative-input-id", "error", chk.crash_step, rid, "input_ids", None, -1,
                      f"{message}: on a GPU a device-side assert, the engine dies")
    else:
        yield Finding("E1-engine-crash", "error", chk.crash_step, rid, "scheduler_output", None, None,
                      f"the engine dies at step {chk.crash_step}: {message}")
INVARIANTS: tuple[Invariant, ...] = (
    Invariant("S1-placeholders-nonnegative", "error", "num_output_placeholders >= 0 at all times", "INV-S1", check_placeholders_nonnegative),
    Invariant("S2-placeholder-count", "error", "P = sum over steps in flight of (1 + draft slots)", "INV-S2", check_placeholder_count),
    Invariant("S3-scheduler-computed-tokens", "error", "C minus in-flight rejections = tokens valid in the KV cache", "INV-S3", check_computed_tokens),
    Invariant("S4-decode-identity", "error", "num_tokens + P - C = 1 for a decoding request", "INV-S4", check_decode_identity),
    Invariant("S5-draft-provenance", "warning", "draft slots only for requests whose previous step proposed drafts", "INV-S5", check_draft_provenance),
    Invariant("S6-token-budget", "error", "sum of scheduled tokens = total <= max_num_batched_tokens", "INV-S6", check_budget),
    Invariant("S7-draft-slot-count", "error", "k = max(0, min(len(spec), n + C - T - P))", "INV-S7", check_draft_slot_count),
    Invariant("X1-batch-membership", "error", "the worker's batch holds exactly the scheduled requests", "INV-X1", check_membership),
    Invariant("X3-output-length", "error", "worker output length = applied outputs + placeholders (design B)", "INV-X3", check_output_length),
    Invariant("X5-placeholder-drafts", "warning", "draft inputs are drafts cached for the request at m-1", "INV-X5", check_draft_inputs),
    Invariant("X10-scheduler-output-mutated", "error", "update_from_output reads the SchedulerOutput the worker was given unchanged", "INV-X10", check_output_mutated),
    Invariant("X11-executed-other-work", "warning", "the worker executes what the scheduler booked", "INV-X10", check_executed_work),
    Invariant("L1-output-life", "error", "an output is applied only to the life of the request it was scheduled for", "request lives", check_output_life),
    Invariant("L2-stale-output", "error", "outputs in flight across a preemption or cache reset are stale (delivered without moving counters, or dropped); no other output is", "request lives", check_stale_outputs),
    Invariant("L3-in-flight-tokens", "error", "num_in_flight_tokens / num_stale_output_tokens = scheduled tokens of the outputs in flight / in flight across the last cut, never negative", "request lives", check_in_flight_tokens),
    Invariant("T1-wrong-token", "error", "applied tokens equal the expected sequence", "ground truth", check_tokens),
    Invariant("K1-kv-content", "error", "valid KV positions hold the expected tokens", "ground truth", check_kv_truth),
    Invariant("E1-engine-crash", "error", "the engine does not die (asserts, unexecutable outputs)", "engine", check_crash),
    Invariant("E2-run-incomplete", "error", "every request finishes: within the step limit, and none is held for good by an idle engine", "engine", check_run_completes),
)

#: Codes some checks produce besides their own (documented in `specreplay codes`).
EXTRA_CODES = (
    ("X5-negative-input-id", "error", "no negative id reaches the embedding", "INV-X5"),
    ("X2-sched-worker-computed", "error", "worker C = scheduler C minus rejections of m-1", "INV-X2"),
    ("X2-worker-kv-position", "error", "the worker writes from the first position not yet in its KV", "INV-X2"),
    ("X2-worker-position-mismatch", "error", "CPU num_computed_tokens = device position", "INV-X2 (design B)"),
)


SEVERITY = {inv.code: inv.severity for inv in INVARIANTS} | {code[0]: code[1] for code in EXTRA_CODES}


def all_codes() -> list[tuple[str, str, str, str]]:
    seen = {}
    for inv in INVARIANTS:
        seen.setdefault(inv.code, (inv.code, inv.severity, inv.statement, inv.source))
    for code in EXTRA_CODES:
        seen.setdefault(code[0], code)
    return sorted(seen.values())


def check_trace(trace: Trace, batch_rows: int = 1 << 20) -> list[Finding]:
    """Every invariant over an in-memory trace; findings sorted by step, request, code."""
    return check_batches(trace, trace.table.select(list(NEEDED)).to_batches(max_chunksize=batch_rows))


def check_batches(header, batches: Iterable[pa.Table | pa.RecordBatch]) -> list[Finding]:
    """Every invariant over a trace that arrives in batches in step order (`TraceFile.batches()`):
    memory is bounded by the batch size. `header` gives the config and outcome."""
    checker = Checker(header.config, header.outcome)
    for batch in batches:
        checker.feed(batch)
    return checker.findings()


# Within one step and request, the finding that explains the others comes first: an edited
# output, then the two views disagreeing, then what follows from it (KV, placeholders, tokens).
_RANK = {code: i for i, code in enumerate((
    "X5-negative-input-id", "E1-engine-crash", "E2-run-incomplete", "S5-draft-provenance", "X10-scheduler-output-mutated", "X11-executed-other-work",
    "L1-output-life", "L2-stale-output", "X2-sched-worker-computed", "S3-scheduler-computed-tokens", "X2-worker-kv-position",
    "X2-worker-position-mismatch", "S2-placeholder-count", "S4-decode-identity", "S1-placeholders-nonnegative",
    "L3-in-flight-tokens", "X3-output-length", "X1-batch-membership", "S7-draft-slot-count", "S6-token-budget", "X5-placeholder-drafts",
    "K1-kv-content", "T1-wrong-token"))}
