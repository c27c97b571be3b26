"""The recorder: the trace's rows, kept column by column, then one Arrow table.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. The observers (observers/scheduler_observer.py,
families/vllm/v1/observer.py, observers/truth.py) write here: the scheduler observer appends one row
per request at E1(m), the worker observer and the KV truth fill that step's worker and truth columns
at E3(m), and the scheduler observer fills its apply columns at E4(j). Values go straight into
per-column lists (no per-row objects); an earlier step's rows are patched in place by index.
`table()` builds the trace table in `specreplay.traces.schema` order.

With a journal (traces.journal), rows that can no longer change (every step up to the oldest one
whose output is not applied yet) are appended to it every `flush_every` steps, and `flush(everything=True)`
writes the rest when the run dies with an exception: a crash keeps what was recorded.
"""

from __future__ import annotations

import time
from collections import deque

import pyarrow as pa

from specreplay.traces import schema
from specreplay.traces.journal import JournalWriter

#: Steps between journal flushes by default, and the longest a flush waits whatever the step
#: count (a step of thousands of requests can take a tenth of a second): a crash loses at most
#: about half a second of recording.
FLUSH_EVERY = 16
FLUSH_SECONDS = 0.5


class Recorder:
    def __init__(self, journal: JournalWriter | None = None, flush_every: int = FLUSH_EVERY) -> None:
        """`journal`: where settled rows go while recording (None: memory only)."""
        self.journal = journal
        self.flush_every = flush_every
        self.flushed = 0  # rows already in the journal
        self.last_flush_step = 0
        self.last_flush_time = time.monotonic()
        self.step_start: dict[int, int] = {}  # first row of each step
        self.recorded_step = 0  # the last step whose scheduler and worker views were both recorded
        self.cols: dict[str, list] = {name: [] for name in schema.COLUMN_NAMES}
        self.rows_of_step: dict[int, dict[str, int]] = {}  # steps whose output is not yet applied

    def append_step(
        self, step: int, total_scheduled: int, step_event: str, rows: list[tuple], evictions: int | None = None
    ) -> dict[str, int]:
        """The scheduler's rows of `step` (tuples in SCHEDULE_COLUMNS order) and its step columns
        (STEP_COLUMNS: the arguments, in order); the later columns are null until the worker and
        the apply fill them. Returns request id -> row index."""
        c = self.cols
        first = len(c["step"])
        count = len(rows)
        self.step_start[step] = first
        c["step"].extend([step] * count)
        c["step_total_scheduled_tokens"].extend([total_scheduled] * count)
        c["step_event"].extend([step_event] * count)
        c["step_cache_evictions"].extend([evictions] * count)
        if count:
            for name, values in zip(SCHEDULE_COLUMNS, zip(*rows)):
                c[name].extend(values)
        nones = [None] * count
        for name in _LATER_COLUMNS:
            c[name].extend(nones)
        index = {row[0]: first + i for i, row in enumerate(rows)}
        self.rows_of_step[step] = index
        return index

    def scheduled_tokens(self, at: int) -> int:
        """Row `at`'s scheduled tokens (a step still in flight: what its output's apply reads)."""
        return self.cols["sched_num_scheduled_tokens"][at]

    def fill(self, at: int, values: dict[str, object]) -> None:
        """Set columns of row `at` (an earlier step's row, patched in place)."""
        c = self.cols
        for name, value in values.items():
            c[name][at] = value

    def fill_columns(self, at: list[int], columns: dict[str, list]) -> None:
        """Set columns of many rows at once: row `at[i]` of column `name` gets `columns[name][i]`
        (a step's worker or truth columns, from the observer's arrays: one C-level scatter per
        column, no per-row dict)."""
        c = self.cols
        for name, values in columns.items():
            deque(map(c[name].__setitem__, at, values), maxlen=0)

    def fill_column_groups(self, groups: list[tuple[list[int], dict[str, list]]]) -> None:
        """Groups of rows filled column by column, in order (an output's apply columns: the rows
        it was given to, then the ignored ones): the same as filling them row by row. A live
        sink's recorder (families/vllm/sink.py) writes each group as one `cols` line."""
        for rows, columns in groups:
            if rows:
                self.fill_columns(rows, columns)

    def step_done(self, step: int) -> None:
        """Both views of `step` are in: a journal flush after an exception may keep it."""
        self.recorded_step = step

    # ------------------------------------------------------------------ the journal
    def settled(self) -> int:
        """Rows that can no longer change: all rows before the oldest step still in flight."""
        if not self.rows_of_step:
            return len(self.cols["step"])
        return self.step_start[min(self.rows_of_step)]

    def maybe_flush(self, step: int) -> None:
        if self.journal is None:
            return
        now = time.monotonic()
        if step - self.last_flush_step >= self.flush_every or now - self.last_flush_time >= FLUSH_SECONDS:
            self.flush()
            self.last_flush_step, self.last_flush_time = step, now

    def flush(self, everything: bool = False) -> None:
        """Append the settled rows to the journal; with `everything` (the run is over), every step
        whose scheduler and worker views were both recorded (a step cut short by an exception is
        left out: its rows would be half there)."""
        if self.journal is None:
            return
        if everything:
            later = [row for step, row in self.step_start.items() if step > self.recorded_step]
            stop = min(later) if later else len(self.cols["step"])
        else:
            stop = self.settled()
        if stop > self.flushed:
            self.journal.append(self.table(self.flushed, stop))
            self.flushed = stop

    # ------------------------------------------------------------------ the table
    def table(self, start: int = 0, stop: int | None = None) -> pa.Table:
        arrays = []
        for field in schema.SCHEMA_FIELDS:
            values = self.cols[field.name][start:stop]
            if pa.types.is_dictionary(field.type):
                arrays.append(pa.array(values, type=pa.string()).dictionary_encode().cast(field.type))
            else:
                arrays.append(pa.array(values, type=field.type))
        return pa.Table.from_arrays(arrays, schema=schema.SCHEMA)


#: The step's columns (append_step's own arguments) and the per-row scheduler columns, in the order
#: of the scheduler observer's row tuples: both schema order (traces/schema.py WRITTEN_BY). SGLang's
#: own step and scheduler columns (schema.SGLANG_ONLY) are not in them: null on a vLLM row, the
#: SGLang observer fills them once its rows are appended (families/sglang/observer.py); nor are a KV
#: connector's (schema.CONNECTOR_ONLY), which the scheduler observer fills on the admissions it booked.
_FILLED_AFTER = (*schema.SGLANG_ONLY, *schema.CONNECTOR_ONLY)
STEP_COLUMNS = tuple(n for n in schema.columns_written_by("step") if n not in _FILLED_AFTER)
SCHEDULE_COLUMNS = tuple(n for n in schema.columns_written_by("scheduler") if n not in _FILLED_AFTER)
#: Columns filled after the rows are appended (apply, worker, truth, SGLang's own): null until then.
_LATER_COLUMNS = tuple(n for n in schema.COLUMN_NAMES if n not in STEP_COLUMNS and n not in SCHEDULE_COLUMNS)
