"""The recorder: both views of every step, appended column by column, then one Arrow table.

Where it sits: **record** -> traces -> replay -> diff. The engine calls `record_schedule` at
E1(m), `record_worker` at E3(m) and `record_apply` at E4(j); `table()` builds the trace table in
`specreplay.traces.schema` order. Values go straight into per-column lists (no per-row objects),
and `record_apply` patches the rows of an earlier step in place by index.

With a journal (traces.journal), rows that can no longer change (every step up to the oldest one
whose output is not applied yet) are appended to it every `flush_every` steps, and `flush(everything=True)`
writes the rest when the run dies with an exception: a crash keeps what was recorded.
"""

from __future__ import annotations

import time

import pyarrow as pa

from specreplay.replay.models.messages import SchedulerOutput
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.models.request import Request, Status
from specreplay.replay.models.runner import WorkerView
from specreplay.replay.models.scheduler import ApplyReport, Scheduler
from specreplay.traces import schema
from specreplay.traces.journal import JournalWriter


#: Steps between journal flushes by default, and the longest a flush waits whatever the step
#: count (a step of thousands of requests can take a tenth of a second): a crash loses at most
#: about half a second of recording.
FLUSH_EVERY = 16
FLUSH_SECONDS = 0.5


class Recorder:
    def __init__(self, oracle: Oracle | None, journal: JournalWriter | None = None,
                 flush_every: int = FLUSH_EVERY) -> None:
        """`oracle`: the workload's expected tokens, or None (a live engine: no ground truth).
        `journal`: where settled rows go while recording (None: memory only)."""
        self.oracle = oracle
        self.journal = journal
        self.flush_every = flush_every
        self.flushed = 0  # rows already in the journal
        self.last_flush_step = 0
        self.last_flush_time = time.monotonic()
        self.step_start: dict[int, int] = {}  # first row of each step
        self.recorded_step = 0  # the last step whose scheduler and worker views were both recorded
        self.cols: dict[str, list] = {name: [] for name in schema.COLUMN_NAMES}
        self.rows_of_step: dict[int, dict[str, int]] = {}  # steps whose output is not yet applied
        self.known: dict[str, Request] = {}  # every request ever added, finished ones included
        self.prev_scheduled: set[str] = set()
        self._pre: list[tuple] = []
        # Control events since the last schedule(), written on the next step's rows.
        self.request_events: dict[str, str] = {}
        self.step_events: list[str] = []

    def add_request(self, req: Request) -> None:
        self.known[req.request_id] = req

    def mark_request_event(self, rid: str, event: str) -> None:
        """A control event changed request `rid` (schema.EVENTS) before the coming schedule().
        Of two, the row keeps the one that says more (a new life over an abort over a cut)."""
        held = self.request_events.get(rid, "")
        if _EVENT_RANK[event] >= _EVENT_RANK[held]:
            self.request_events[rid] = event

    def mark_step_event(self, label: str) -> None:
        """An engine-level control event (pause, resume, cache reset) before the coming schedule()."""
        self.step_events.append(label)

    # ------------------------------------------------------------------ E1(m)
    def snapshot(self, sched: Scheduler) -> None:
        """Pre values of every live request, taken right before schedule()."""
        self._pre = [
            (req, req.num_computed_tokens, req.num_output_placeholders, req.num_tokens,
             req.num_output_tokens, len(spec), bool(spec) and min(spec) == -1 == max(spec),  # all -1
             req.num_in_flight_tokens, req.num_stale_output_tokens)
            for req, spec in ((req, req.spec_token_ids) for req in sched.requests.values())
        ]

    def record_schedule(self, out: SchedulerOutput, sched: Scheduler) -> None:
        c = self.cols
        step = out.step
        new_ids = {d.req_id for d in out.scheduled_new_reqs}
        resumed = out.scheduled_cached_reqs.resumed_req_ids
        preempted = {rid for rid, why in sched.skip_reasons.items() if why == "preempted"}
        announced = out.finished_req_ids
        rows = list(self._pre)
        self.step_start[step] = len(c["step"])
        live = {item[0].request_id for item in rows}
        for rid in sorted(announced - live, key=lambda r: self.known[r].order if r in self.known else 0):
            req = self.known.get(rid)
            if req is not None:
                rows.append((req, req.num_computed_tokens, req.num_output_placeholders, req.num_tokens,
                             req.num_output_tokens, len(req.spec_token_ids), False, req.num_in_flight_tokens,
                             req.num_stale_output_tokens))
        nst, spec = out.num_scheduled_tokens, out.scheduled_spec_decode_tokens
        skips = sched.skip_reasons
        events, self.request_events = self.request_events, {}
        scheduler_cols: list[tuple] = []
        for req, pre_c, pre_p, pre_t, pre_out, spec_len, spec_ph, in_flight, stale in rows:
            rid = req.request_id
            n = nst.get(rid, 0)
            finished = req.status.finished
            if n:
                kind = ("new" if rid in new_ids else "resumed" if rid in resumed
                        else "cached" if rid in self.prev_scheduled else "reentering")
                skip = ""
            else:
                kind = "unscheduled"
                if finished:
                    skip = "finished"
                elif rid in skips:
                    skip = skips[rid]
                elif req.status == Status.RUNNING:
                    skip = "budget"
                else:
                    skip = "waiting"
            # One tuple per row in _SCHEDULE_COLUMNS order; the columns are filled below in bulk.
            scheduler_cols.append((rid, req.life, events.get(rid, ""), req.status.trace_status,
                                   kind, skip, n, len(spec.get(rid, ())), pre_c, pre_p, pre_t, pre_out,
                                   req.num_prompt_tokens, spec_len, spec_ph, bool(n) and req.is_prefill_chunk,
                                   rid in announced, rid in preempted, in_flight, stale))
        first = len(c["step"])
        count = len(scheduler_cols)
        c["step"].extend([step] * count)
        c["step_total_scheduled_tokens"].extend([out.total_num_scheduled_tokens] * count)
        c["step_event"].extend(["; ".join(self.step_events)] * count)
        self.step_events = []
        if count:
            for name, values in zip(_SCHEDULE_COLUMNS, zip(*scheduler_cols)):
                c[name].extend(values)
        nones = [None] * count
        for name in _LATER_COLUMNS:
            c[name].extend(nones)
        index = {row[0]: first + i for i, row in enumerate(scheduler_cols)}
        self.rows_of_step[step] = index
        self.prev_scheduled = set(out.num_scheduled_tokens)

    # ------------------------------------------------------------------ E2(m) / E3(m)
    def record_worker(self, step: int, view: WorkerView) -> None:
        c = self.cols
        index = self.rows_of_step[step]
        for i, rid in enumerate(view.req_ids):
            at = index.get(rid)
            if at is None:
                continue  # the worker ran a request the scheduler did not list: X1 will see it
            c["worker_row"][at] = view.row[i]
            c["worker_num_scheduled_tokens"][at] = view.num_scheduled[i]
            c["worker_num_draft_slots"][at] = view.num_drafts[i]
            c["worker_num_computed_tokens"][at] = view.num_computed[i]
            c["worker_first_position"][at] = view.first_position[i]
            c["worker_correction"][at] = view.correction[i]
            c["worker_in_prev_map"][at] = view.in_prev_map[i]
            c["worker_cached_drafts"][at] = view.cached_drafts[i]
            c["worker_draft_ids"][at] = view.draft_ids[i]
            c["worker_negative_inputs"][at] = view.negative_inputs[i]
            c["worker_num_accepted"][at] = view.accepted[i]
            c["worker_num_emitted"][at] = view.emitted[i]
            c["worker_num_output_tokens"][at] = view.num_output_tokens[i]
            c["worker_edited_output"][at] = view.edited[i]
            c["truth_num_computed_tokens"][at] = view.truth_before[i]
            c["truth_kv_after"][at] = view.truth_after[i]
            c["truth_kv_ok"][at] = view.kv_ok[i]
        for rid, (valid, ok) in view.idle_truth.items():
            at = index.get(rid)
            if at is not None:
                c["truth_num_computed_tokens"][at] = valid
                c["truth_kv_after"][at] = valid
                c["truth_kv_ok"][at] = ok
        self.recorded_step = step  # both views of this step are in

    # ------------------------------------------------------------------ E4(j)
    def record_apply(self, step: int, reports: dict[str, ApplyReport], apply_step: int) -> list[int]:
        """Fill the apply columns of step `step`'s rows; returns the row indexes it filled."""
        c = self.cols
        index = self.rows_of_step.pop(step, {})
        filled = []
        for rid, report in reports.items():
            at = index.get(rid)
            if at is None:
                continue
            filled.append(at)
            req = self.known[rid]
            prompt_len = report.num_prompt_tokens if report.num_prompt_tokens >= 0 else None
            first = (report.first_output_index if report.first_output_index >= 0
                     else req.num_output_tokens - len(report.tokens))
            if report.finish_reason and not req.status.finished:
                self.mark_request_event(rid, "stream_turn")  # a streaming turn ended; the session goes on
            c["apply_step"][at] = apply_step
            c["apply_outcome"][at] = report.outcome
            c["apply_life"][at] = report.life
            c["apply_num_scheduled_tokens"][at] = report.num_scheduled_tokens
            c["apply_num_draft_slots"][at] = report.num_draft_slots
            c["apply_num_rejected"][at] = report.num_rejected
            c["apply_num_tokens"][at] = len(report.tokens)
            c["apply_token_mismatches"][at] = (None if self.oracle is None
                                               else self.oracle.mismatches(rid, first, report.tokens, prompt_len))
            c["apply_num_computed_tokens"][at] = report.num_computed_tokens
            c["apply_num_output_placeholders"][at] = report.num_output_placeholders
            c["apply_finish_reason"][at] = report.finish_reason
        # Outputs update_from_output skipped (the request finished or was aborted meanwhile).
        scheduled = c["sched_num_scheduled_tokens"]
        for rid, at in index.items():
            if rid not in reports and scheduled[at]:
                c["apply_step"][at] = apply_step
                c["apply_outcome"][at] = "ignored"
        return filled

    def record_abort(self, step: int, rid: str) -> int | None:
        """An abort applied in step `step`'s iteration: marked on that step's row (returned)."""
        at = self.rows_of_step.get(step, {}).get(rid)
        if at is not None:
            self.cols["apply_finish_reason"][at] = "aborted"
        return at

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


_EVENT_RANK = {"": 0, "stream_update": 1, "stream_turn": 2, "reset_preempt": 2, "abort": 3, "resubmit": 4}

#: The per-row scheduler columns `record_schedule` fills, in the order of its row tuples.
_SCHEDULE_COLUMNS = ("request_id", "sched_life", "sched_event", "sched_status", "sched_kind", "sched_skip",
                     "sched_num_scheduled_tokens", "sched_num_draft_slots", "sched_num_computed_tokens", "sched_num_output_placeholders",
                     "sched_num_tokens", "sched_num_output_tokens", "sched_num_prompt_tokens", "sched_spec_len",
                     "sched_spec_placeholders", "sched_is_prefill_chunk", "sched_finished_announced",
                     "sched_preempted", "sched_num_in_flight_tokens", "sched_num_stale_output_tokens")
_APPLY_COLUMNS = tuple(n for n in schema.COLUMN_NAMES if n.startswith("apply_"))
_WORKER_COLUMNS = tuple(n for n in schema.COLUMN_NAMES if n.startswith("worker_"))
_TRUTH_COLUMNS = tuple(n for n in schema.COLUMN_NAMES if n.startswith("truth_"))
#: Columns filled after the schedule (apply, worker, truth): null until then.
_LATER_COLUMNS = _APPLY_COLUMNS + _WORKER_COLUMNS + _TRUTH_COLUMNS
