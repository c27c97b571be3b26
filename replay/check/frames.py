"""Frames: a trace's rows as numpy columns, a chunk of whole steps at a time, with their history.

Where it sits: inside check. The framework (framework.py) cuts the streamed row batches at step
boundaries, loads each batch's columns here (`load_columns`) and hands the rules a `Frame`: the
chunk's own rows after the carried context rows (the last `LOOKBACK` steps before the chunk),
with each row's earlier rows of the same request (`lags`) and whether their outputs were still
in flight (`flying`).

The column names are the trace's (traces/schema.py): a nullable column is read with its nulls
filled (see `INT_COLUMNS`) and, where a rule needs to tell them apart, a `<column>_is_null`
mask. Enum columns hold int8 codes into the schema's tuples (constants below). Besides those, a
frame holds a few columns derived while loading:

    request                         the request life's code (`Checker.names` gives its id); a
                                    resubmitted id is another request
    truth_kv_not_ok                 truth_kv_ok is False (null: not known, so not False)
    worker_kept_finished            null read as False; the two text columns of the KV findings'
                                    other request (TEXT_COLUMNS) as object arrays
    worker_num_draft_ids            the length of worker_draft_ids (null: 0)
    worker_num_negative_draft_ids   how many of worker_draft_ids are negative (-1 placeholders)
    worker_new_life,                int8 (TRISTATE_COLUMNS): 1 true, 0 false, -1 null
      worker_freed_preempted,
      apply_release_checkpointed
    worker_draft_for_other          MRV2: the drafts verified were proposed for another request
                                    (worker_draft_proposed_for is not the row's request_id)
    cuts                            how many cuts (a preemption, a cache reset, a streaming
                                    turn's end) the request life has had up to its row's step,
                                    filled per chunk by the framework
    max_tokens                      the max_tokens of the life's turn at the row (-1: not
                                    known), from the trace's workload (limits.py), filled per
                                    chunk by the framework
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specreplay.traces import schema
from specreplay.traces.validate import as_numpy, enum_codes

#: How many steps back an unapplied output can be in flight (two batches, plus slack for
#: empty steps, which the engine pops without a forward).
LOOKBACK = 4


RUNNING, PREEMPTED, WAITING, FINISHED = (
    schema.STATUSES.index(s) for s in ("running", "preempted", "waiting", "finished")
)
NEW, RESUMED, UNSCHEDULED = (schema.KINDS.index(k) for k in ("new", "resumed", "unscheduled"))
RESET_PREEMPT, STREAM_TURN = schema.EVENTS.index("reset_preempt"), schema.EVENTS.index("stream_turn")
APPLIED, STALE_DELIVERED, DROPPED, IGNORED = (schema.APPLY_OUTCOMES.index(o) for o in schema.APPLY_OUTCOMES)
STOP, LENGTH = schema.FINISH_REASONS.index("stop"), schema.FINISH_REASONS.index("length")
#: SGLang: why process_batch_result skipped a row, and the forward mode of the iteration's batch.
SKIPPED_FINISHED, SKIPPED_RETRACTED = (schema.APPLY_SKIP_REASONS.index(r) for r in ("finished", "retracted"))
EXTEND, DECODE, VERIFY = (schema.FORWARD_MODES.index(m) for m in ("extend", "decode", "target_verify"))

#: Integer columns: (column, the value a null reads as, keep a `<column>_is_null` mask).
INT_COLUMNS = (
    ("step_total_scheduled_tokens", 0, False),
    ("sched_num_scheduled_tokens", 0, False),
    ("sched_num_draft_slots", 0, False),
    ("sched_num_computed_tokens", 0, False),
    ("sched_num_output_placeholders", 0, False),
    ("sched_num_tokens", 0, False),
    ("sched_num_output_tokens", 0, False),
    ("sched_spec_len", 0, False),
    ("apply_step", -1, True),
    ("apply_num_scheduled_tokens", -1, False),
    ("apply_num_draft_slots", -1, True),
    ("apply_num_rejected", 0, True),
    ("apply_num_tokens", 0, False),
    ("apply_token_mismatches", 0, False),
    ("apply_num_output_placeholders", 0, True),
    ("worker_row", -1, True),
    ("worker_num_scheduled_tokens", -1, True),
    ("worker_num_draft_slots", -1, False),
    ("worker_num_computed_tokens", 0, True),
    ("worker_first_position", 0, True),
    ("worker_num_accepted", 0, True),
    ("worker_cached_drafts", 0, True),
    ("truth_unfilled_draft_slots", 0, False),
    ("worker_num_output_tokens", 0, True),
    ("truth_num_computed_tokens", 0, True),
    ("sched_life", 0, False),
    ("sched_num_in_flight_tokens", 0, False),
    ("sched_num_stale_output_tokens", 0, False),
    ("apply_life", -1, True),
    ("sched_num_prompt_tokens", 0, False),
    ("worker_num_emitted", 0, True),
    ("truth_kv_foreign_positions", 0, False),
    ("truth_kv_unowned_blocks", 0, False),
    ("truth_kv_unowned_writes", 0, False),
    ("sched_num_cached_tokens", 0, True),
    ("sched_preempt_blocks_alone", 0, False),
    ("sched_preempt_blocks_returned", 0, False),
    ("truth_cache_hit_valid", -1, True),
    # Model Runner V2's worker view (null on a V1 runner's rows)
    ("worker_slot", -1, True),
    ("worker_device_computed_before", 0, True),
    ("worker_device_computed_after", 0, True),
    ("worker_cpu_computed", 0, True),
    ("worker_num_rejected", 0, True),
    ("worker_draft_proposed_step", -1, True),
    ("worker_draft_base", 0, True),
    ("worker_prefill_len", 0, True),
    ("worker_slot_last_write_step", -1, True),
    # SGLang's views (null on a vLLM row): its KV lengths, the seq_lens the worker ran with and
    # published, and the radix insert bound of a finish's release
    ("sched_kv_committed_len", 0, True),
    ("sched_kv_allocated_len", 0, True),
    ("sched_seq_len", 0, True),
    ("apply_kv_committed_len", 0, True),
    ("apply_kv_allocated_len", 0, True),
    ("apply_owned_kv_len", 0, True),
    ("worker_seq_len", 0, True),
    ("worker_new_seq_len", 0, True),
    ("truth_kv_after", 0, True),
)
#: Text columns a rule names in its evidence (the other request of a KV finding): object arrays.
TEXT_COLUMNS = (
    "truth_kv_foreign_writer",
    "truth_cache_hit_writer",
    "truth_kv_block_owner",
    "worker_draft_proposed_for",
    "worker_slot_prev_owner",
)
#: Boolean columns (never null).
BOOL_COLUMNS = ("sched_is_prefill_chunk", "sched_preempted")
#: Nullable boolean columns, as int8: 1 true, 0 false, -1 null.
TRISTATE_COLUMNS = ("worker_new_life", "worker_freed_preempted", "apply_release_checkpointed")
#: Enum columns, as codes into these tuples (-1 for null).
ENUM_COLUMNS = (
    ("sched_status", schema.STATUSES),
    ("sched_kind", schema.KINDS),
    ("sched_event", schema.EVENTS),
    ("apply_outcome", schema.APPLY_OUTCOMES),
    ("apply_finish_reason", schema.FINISH_REASONS),
    ("apply_skip_reason", schema.APPLY_SKIP_REASONS),
    ("step_forward_mode", schema.FORWARD_MODES),
)

#: The columns `load_columns` reads besides the tables above (identity, and the ones it derives from).
_READ_AS_IS = ("step", "request_id", "sched_life", "truth_kv_ok", "worker_kept_finished", "worker_draft_ids")
#: The columns the checker reads: what `load_columns` loads, in schema order (derived, never listed).
NEEDED = schema.in_schema_order(
    {
        *_READ_AS_IS,
        *(n for n, _ in ENUM_COLUMNS),
        *(n for n, *_ in INT_COLUMNS),
        *BOOL_COLUMNS,
        *TRISTATE_COLUMNS,
        *TEXT_COLUMNS,
    }
)

Columns = dict[str, np.ndarray]


def load_columns(batch: pa.Table | pa.RecordBatch, request_code: Callable[[tuple[str, int]], int]) -> Columns:
    """A batch's columns as numpy, in native widths (int32, int16: the rules widen where they
    must; no copies to int64). `request_code` gives the code of a (request id, life)."""
    cols: Columns = {"step": as_numpy(batch.column("step"))}
    ids = batch.column("request_id")
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    encoded = pc.dictionary_encode(ids)
    names = encoded.dictionary.to_pylist()
    index = as_numpy(encoded.indices).astype(np.int64)
    lives = as_numpy(batch.column("sched_life")).astype(np.int64)
    if lives.any():
        # A resubmitted id: each (id, life) is its own request to the invariants.
        pairs, inverse = np.unique(index * (1 << 16) + (lives & 0xFFFF), return_inverse=True)
        lookup = np.array([request_code((names[p >> 16], p & 0xFFFF)) for p in pairs.tolist()], dtype=np.int64)
        cols["request"] = lookup[inverse.reshape(-1)]
    else:
        lookup = np.array([request_code((name, 0)) for name in names], dtype=np.int64)
        cols["request"] = lookup[index]
    for name, values in ENUM_COLUMNS:
        cols[name] = enum_codes(batch.column(name), values)
    cols["cuts"] = np.zeros(batch.num_rows, dtype=np.int64)  # filled per chunk
    cols["max_tokens"] = np.full(batch.num_rows, -1, dtype=np.int64)  # filled per chunk
    for name, fill, keep_mask in INT_COLUMNS:
        cols[name], is_null = filled(batch.column(name), fill)
        if keep_mask:
            cols[name + "_is_null"] = is_null
    for name in BOOL_COLUMNS:
        cols[name] = as_numpy(batch.column(name))
    for name in TRISTATE_COLUMNS:
        col = batch.column(name)
        cols[name] = (
            np.full(batch.num_rows, -1, dtype=np.int8)
            if col.null_count == batch.num_rows
            else as_numpy(pc.fill_null(pc.cast(col, pa.int8()), -1))
        )
    # MRV2: drafts verified that the observer traced to another request's propose (null: none traced)
    proposed_for = batch.column("worker_draft_proposed_for")
    cols["worker_draft_for_other"] = (
        np.zeros(batch.num_rows, dtype=bool)
        if proposed_for.null_count == batch.num_rows
        else as_numpy(pc.fill_null(pc.not_equal(proposed_for, batch.column("request_id")), False))
    )
    cols["truth_kv_not_ok"] = as_numpy(pc.fill_null(pc.invert(batch.column("truth_kv_ok")), False))
    cols["worker_kept_finished"] = as_numpy(pc.fill_null(batch.column("worker_kept_finished"), False))
    for name in TEXT_COLUMNS:
        col = batch.column(name)
        cols[name] = (
            np.full(batch.num_rows, None, dtype=object)
            if col.null_count == batch.num_rows
            else np.asarray(col.to_pylist(), dtype=object)
        )
    drafts = batch.column("worker_draft_ids")
    drafts = drafts.combine_chunks() if isinstance(drafts, pa.ChunkedArray) else drafts
    cols["worker_num_draft_ids"] = as_numpy(pc.fill_null(pc.list_value_length(drafts), 0)).astype(np.int64)
    flat = as_numpy(pc.list_flatten(drafts))
    parents = as_numpy(pc.list_parent_indices(drafts))
    cols["worker_num_negative_draft_ids"] = np.bincount(parents[flat < 0], minlength=batch.num_rows)
    return cols


def filled(column: pa.Array | pa.ChunkedArray, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as numpy with its nulls read as `fill`, and its null mask. Read from the
    Arrow buffers (values as they lie, the validity bitmap unpacked): a column with no nulls is
    not copied, and one with only nulls (another runner's columns) is made, not converted, which
    is most of what loading a batch costs through pyarrow's `fill_null`."""
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    size = len(column)
    dtype = np.dtype(column.type.to_pandas_dtype())
    if column.null_count == size:
        return np.full(size, fill, dtype=dtype), np.ones(size, dtype=bool)
    validity, data = column.buffers()[:2]
    values = np.frombuffer(data, dtype=dtype)[column.offset : column.offset + size]
    if not column.null_count:
        return values, np.zeros(size, dtype=bool)
    bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
    valid = bits[column.offset : column.offset + size].view(bool)
    return np.where(valid, values, np.array(fill, dtype=dtype)), ~valid


def concat(parts: list[Columns]) -> Columns:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def row_range(cols: Columns, start: int, stop: int | None) -> Columns:
    """Rows start:stop of every column (views, no copies)."""
    return {name: values[start:stop] for name, values in cols.items()}


def dense(codes: np.ndarray) -> np.ndarray:
    """The same grouping with codes 0..R-1 in the narrowest type: a stable argsort of 16-bit
    keys is a radix sort, several times faster than one of int64 keys."""
    mark = np.zeros(int(codes.max()) + 1 if len(codes) else 1, dtype=np.int64)
    mark[codes] = 1
    local = np.cumsum(mark) - 1
    return local[codes].astype(np.uint16 if local[-1] < 1 << 16 else np.uint32)


class Frame:
    """One chunk of rows as numpy columns: the carried context rows (history only, the last
    LOOKBACK steps before the chunk) followed by the chunk's own rows (`own`), in step order.
    `lags[L - 1]` is each row's L-th earlier row of the same request (-1: none in the frame) and
    `flying[L - 1]` says whether that row's output was still in flight when this row's step was
    scheduled (not applied yet, not cut off by a preemption, a cache reset or LOOKBACK); `near`
    and `pending` are the same without the cuts (the row is within LOOKBACK steps; and its
    output had not been applied yet). `at(name, lag)` gathers a column at a lag once per frame.
    Rows are grouped per request life: a resubmitted id is another request here."""

    def __init__(self, cols: Columns, num_context: int) -> None:
        self.c = cols
        size = len(cols["step"])
        self.size = size
        self.own = np.arange(size) >= num_context
        self.num_context = num_context
        self._gathered: dict[tuple[str, int], np.ndarray] = {}
        order = np.argsort(dense(cols["request"]), kind="stable")  # per request, rows stay in step order
        prev = np.full(size, -1, dtype=np.int64)
        same = cols["request"][order[1:]] == cols["request"][order[:-1]]
        prev[order[1:][same]] = order[:-1][same]
        self.order = order
        step = cols["step"]
        self.lags: list[np.ndarray] = []
        self.back: list[np.ndarray] = []  # lags with -1 read as row 0: safe to index with (mask it)
        self.near: list[np.ndarray] = []  # that row exists and is within LOOKBACK steps
        self.pending: list[np.ndarray] = []  # ... and its output was not applied before this step
        self.flying: list[np.ndarray] = []
        lag = prev
        alive = np.ones(size, dtype=bool)
        later = np.arange(size)  # the row one step nearer (the row itself for lag 1)
        # In-flight outputs cut off before this row's schedule(): a cache reset, a streaming turn's end.
        reset = (cols["sched_event"] == RESET_PREEMPT) | (cols["sched_event"] == STREAM_TURN)
        for distance in range(1, LOOKBACK + 1):
            at = np.maximum(lag, 0)
            self.lags.append(lag)
            self.back.append(at)
            near = (lag >= 0) & (self.at("step", distance) >= step - LOOKBACK)
            pending = (
                near
                & (self.at("sched_num_scheduled_tokens", distance) > 0)
                & (self.at("apply_step_is_null", distance) | (self.at("apply_step", distance) >= step))
            )
            alive = alive & near & ~self.at("sched_preempted", distance) & ~reset[later]
            self.near.append(near)
            self.pending.append(pending)
            self.flying.append(alive & pending)
            later = at
            lag = np.where(lag >= 0, prev[at], -1)

    def at(self, name: str, lag: int) -> np.ndarray:
        """Column `name` of each row's `lag`-th earlier row (lag 0: the row itself; garbage where
        there is none: mask it with `near`). Gathered once per frame, whichever rules ask: most
        of the checker's time is these gathers."""
        if lag == 0:
            return self.c[name]
        key = (name, lag)
        values = self._gathered.get(key)
        if values is None:
            values = self._gathered[key] = self.c[name][self.back[lag - 1]]
        return values

    def gather(self, values: np.ndarray, lag: int) -> np.ndarray:
        """`values` (one per row of the frame, computed by a rule) at each row's `lag`-th earlier
        row: a rule combines a row-local condition first, then gathers it once."""
        return values if lag == 0 else values[self.back[lag - 1]]

    def own_by_request(self) -> np.ndarray:
        """The chunk's own rows, grouped per request, each request's rows in step order."""
        return self.order[self.own[self.order]]

    def flying_steps(self, i: int, non_chunk_only: bool = False) -> list[int]:
        """The steps of row `i`'s request whose outputs were in flight at its step, oldest first."""
        out = []
        for lag in range(LOOKBACK, 0, -1):
            j = int(self.lags[lag - 1][i])
            if self.flying[lag - 1][i] and not (non_chunk_only and self.c["sched_is_prefill_chunk"][j]):
                out.append(int(self.c["step"][j]))
        return out
