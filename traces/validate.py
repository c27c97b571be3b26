"""Value validation of trace rows, one batch (row group) at a time.

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli. The reader (`traces.io`) runs every batch it hands out through a
`RowValidator`, and the recorder runs its own rows through one before they are written, so a
recorder bug is caught at record time and a damaged or hostile file at read time. What is checked is
what no recorder can produce: nulls in required columns, negative counts, unknown enum values, null
draft ids, half-filled column groups, steps out of order and duplicate (step, request_id) rows. The
checks are vectorised (pyarrow compute and numpy) and the validator carries what it needs across
batches (the last step and its request ids), so a trace larger than memory is validated in bounded
memory.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specreplay.traces import schema
from specreplay.traces.errors import TraceError

#: Columns whose values are counts and can never be negative in a well-formed trace.
#: (Placeholder counts are deliberately absent: a negative one is a finding, not a broken file.)
NON_NEGATIVE = (
    "step_total_scheduled_tokens",
    "step_cache_evictions",
    "sched_num_scheduled_tokens",
    "sched_num_draft_slots",
    "sched_num_tokens",
    "sched_num_output_tokens",
    "sched_num_prompt_tokens",
    "sched_spec_len",
    "apply_num_scheduled_tokens",
    "apply_num_draft_slots",
    "apply_num_tokens",
    "apply_token_mismatches",
    "worker_num_scheduled_tokens",
    "worker_num_draft_slots",
    "worker_cached_drafts",
    "worker_num_accepted",
    "worker_num_emitted",
    "worker_num_output_tokens",
    "worker_row",
    "worker_first_position",
    "truth_num_computed_tokens",
    "truth_kv_after",
    "truth_kv_foreign_positions",
    "truth_kv_unowned_blocks",
    "truth_kv_unowned_writes",
    "truth_cache_hit_valid",
    "sched_life",
    "apply_life",
)

#: Columns filled together: in any row they are all null or all set.
#: The worker's own groups: what both runner families fill, V1's persistent-batch columns and
#: MRV2's slot columns (schema.RUNNER_COLUMNS), each whole on a row; the ones filled only where
#: something happened (a finish, a preemption, a slot taken, drafts with a known origin) apart.
_WORKER_SOMETIMES = (
    "worker_num_accepted",
    "worker_kept_finished",
    "worker_freed_preempted",
    "worker_slot_prev_owner",
    "worker_slot_last_write_step",
    "worker_draft_proposed_step",
    "worker_draft_proposed_for",
    "worker_draft_base",
)
_WORKER_BOTH = tuple(n for n in schema.RUNNER_COLUMNS["v1"] if n in schema.RUNNER_COLUMNS["v2"])
GROUPS = {
    # The reference SGLang worker fills these too (schema.RUNNER_COLUMNS["sglang"]).
    "worker": tuple(n for n in _WORKER_BOTH if n not in _WORKER_SOMETIMES),
    "worker (V1)": schema.V1_ONLY,
    # Less worker_sampled_ids, which an SGLang row fills without MRV2's slot columns.
    "worker (MRV2)": tuple(
        n for n in schema.MRV2_ONLY if n not in _WORKER_SOMETIMES and n not in schema.RUNNER_COLUMNS["sglang"]
    ),
    "worker draft origin (MRV2)": ("worker_draft_proposed_step", "worker_draft_proposed_for", "worker_draft_base"),
    # apply_token_mismatches needs ground truth: null in a live engine's trace. apply_step and
    # apply_outcome are also set for an output update_from_output ignored (nothing to count).
    "apply": tuple(
        n
        for n in schema.COLUMN_NAMES
        if n.startswith("apply_")
        and n not in ("apply_finish_reason", "apply_token_mismatches", "apply_step", "apply_outcome")
        and n not in schema.SGLANG_ONLY
    ),
    "popped": ("apply_step", "apply_outcome"),
    # SGLang's own (schema.SGLANG_ONLY): the KV lengths after the scheduling and after
    # process_batch_result (a row it skipped too), and what a finish's release recorded.
    "scheduler (SGLang)": ("sched_kv_committed_len", "sched_kv_allocated_len"),
    "apply (SGLang)": ("apply_kv_committed_len", "apply_kv_allocated_len", "apply_skip_reason"),
    "release (SGLang)": (
        "apply_released_committed_len",
        "apply_released_allocated_len",
        "apply_owned_kv_len",
        "apply_release_checkpointed",
    ),
    # The other request a KV finding names is there only when there is one; the drafter's unfilled
    # slots only where the runner knows what it proposed for the request the step before.
    "truth": tuple(
        n
        for n in schema.COLUMN_NAMES
        if n.startswith("truth_")
        and n
        not in (
            "truth_kv_foreign_writer",
            "truth_kv_block_owner",
            "truth_unfilled_draft_slots",
            "truth_cache_hit_valid",
            "truth_cache_hit_writer",
        )
    ),
}


def enum_codes(column: pa.Array | pa.ChunkedArray, allowed: tuple[str, ...]) -> np.ndarray:
    """An enum column as int8 codes into `allowed` (-1 for null); raises ValueError naming the
    first value that is not allowed."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    lookup = []
    used = np.zeros(len(column.dictionary), dtype=bool)
    indices = column.indices
    if len(indices) - indices.null_count:
        used[as_numpy(pc.unique(indices.drop_null())).astype(np.int64)] = True
    for position, value in enumerate(column.dictionary.to_pylist()):
        if value in allowed:
            lookup.append(allowed.index(value))
        elif used[position]:
            raise ValueError(value)
        else:
            lookup.append(-1)  # an unused dictionary entry: harmless
    table = np.array(lookup + [-1], dtype=np.int8)
    codes = as_numpy(pc.fill_null(indices, len(lookup))).astype(np.int64)
    return table[codes]


class RowValidator:
    """Validates consecutive batches of one trace; raises `TraceError` with one line."""

    def __init__(self, where: str, version: int = schema.SCHEMA_VERSION) -> None:
        self.where = where
        # A file of an older schema version has the columns added since all null: no group holds them.
        held = set(schema.columns_of_version(version))
        self.groups = {group: kept for group, names in GROUPS.items() if (kept := tuple(n for n in names if n in held))}
        self.last_step: int | None = None
        self.last_step_ids: set[str] = set()

    def fail(self, message: str) -> None:
        raise TraceError(f"{self.where}: {message}")

    def check(self, table: pa.Table | pa.RecordBatch) -> None:
        for field in schema.SCHEMA_FIELDS:
            if not field.nullable and table.column(field.name).null_count:
                self.fail(f"column {field.name} has null values; it is required")
        if table.num_rows == 0:
            return
        for name in NON_NEGATIVE:
            col = table.column(name)
            if col.null_count == len(col):
                continue
            low = pc.min(col).as_py()
            if low is not None and low < 0:
                self.fail(f"column {name} holds {low}, expected a count >= 0")
        for name, allowed in schema.ENUMS.items():
            try:
                enum_codes(table.column(name), allowed)
            except ValueError as exc:
                self.fail(
                    f"column {name} holds unknown value {exc.args[0]!r}; "
                    f"expected one of {', '.join(repr(a) for a in allowed)}"
                )
        if pc.list_flatten(table.column("worker_draft_ids")).null_count:
            self.fail("column worker_draft_ids holds null draft ids")
        for group, names in self.groups.items():
            counts = {table.column(n).null_count for n in names}
            if counts == {0} or counts == {table.num_rows}:
                continue  # all set or all null: nothing to compare row by row
            first = _nulls(table.column(names[0]))
            for name in names[1:]:
                if not np.array_equal(first, _nulls(table.column(name))):
                    self.fail(
                        f"column {name} is null where {names[0]} is not (or the reverse); "
                        f"the {group} columns of a row are filled together"
                    )
        mismatches = table.column("apply_token_mismatches")
        if mismatches.null_count < len(mismatches):
            applied = table.column("apply_step")
            if pc.any(pc.and_(pc.is_valid(mismatches), pc.is_null(applied))).as_py():
                self.fail(
                    "column apply_token_mismatches is set where the apply columns are null; "
                    "only an applied output has tokens to compare"
                )
        outcome = table.column("apply_outcome")
        if outcome.null_count < len(outcome):
            counted = pc.is_valid(table.column("apply_num_tokens"))
            ignored = pc.fill_null(pc.equal(pc.cast(outcome, pa.string()), "ignored"), True)
            if not pc.all(pc.equal(counted, pc.invert(ignored))).as_py():
                self.fail(
                    "column apply_num_tokens is null where apply_outcome says the output was used "
                    "(or set where it was ignored); the apply columns are filled for used outputs only"
                )
        self._check_order(table)

    def _check_order(self, table: pa.Table | pa.RecordBatch) -> None:
        steps = as_numpy(table.column("step")).astype(np.int64)
        if steps.min() < 1:
            self.fail(f"column step holds {int(steps.min())}, steps start at 1")
        if (len(steps) > 1 and (steps[1:] < steps[:-1]).any()) or (
            self.last_step is not None and steps[0] < self.last_step
        ):
            self.fail("rows are not in step order; the trace was reordered or damaged")
        ids = table.column("request_id")
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        encoded = pc.dictionary_encode(ids)
        codes = as_numpy(encoded.indices)
        # Grouped by id (a stable sort keeps each id's rows in step order), a duplicate is the
        # same step twice side by side. 16-bit keys make the stable sort a radix sort.
        narrow = codes.astype(np.uint16 if len(encoded.dictionary) <= 1 << 16 else np.uint32)
        order = np.argsort(narrow, kind="stable")
        same_id = narrow[order[1:]] == narrow[order[:-1]]
        if (same_id & (steps[order[1:]] == steps[order[:-1]])).any():
            self.fail("duplicate (step, request_id) rows; the trace is damaged")
        first_step = int(steps[0])
        if first_step == self.last_step and self.last_step_ids:
            head = ids.slice(0, int(np.searchsorted(steps, first_step, side="right"))).to_pylist()
            if self.last_step_ids.intersection(head):
                self.fail("duplicate (step, request_id) rows; the trace is damaged")
        last_step = int(steps[-1])
        tail = ids.slice(int(np.searchsorted(steps, last_step, side="left"))).to_pylist()
        if last_step == self.last_step:
            self.last_step_ids.update(tail)
        else:
            self.last_step_ids = set(tail)
        self.last_step = last_step


def as_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column (or a chunked one) as a numpy array, copying where Arrow's layout requires it
    (nulls, booleans, several chunks). The validator, the checker and the trace diff use it."""
    return column.to_numpy() if isinstance(column, pa.ChunkedArray) else column.to_numpy(zero_copy_only=False)


def _nulls(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return as_numpy(column.is_null())
