"""The worker observer: watches a GPU model runner execute each step and writes the worker view.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. `attach_runner` wraps a runner instance's `execute_model`,
`_update_states`, `_prepare_inputs` and `sample_tokens`, the four calls the reference runner shares
with vLLM's `GPUModelRunner`, and hands each observer what the call left behind. The worker columns
are derived here once, whichever runner ran:

    worker_num_scheduled_tokens / _draft_slots   the SchedulerOutput as the worker ran it
    worker_edited_output                         the worker changed it (draft slots dropped)
    worker_num_computed_tokens, _correction      num_computed_tokens after _update_states
                                                 (optimistic) and after the deferred correction
    worker_in_prev_map, worker_cached_drafts     a scatter source row from the previous step
    worker_row, _draft_ids, _negative_inputs,    from _prepare_inputs: the batch row, the drafts
    worker_first_position                        fed to the rejection sampler (before the clamp)
    truth_unfilled_draft_slots                   of those, the slots no draft of the drafter's
                                                 fills (reference runner only: its drafts_proposed)
    worker_num_emitted, worker_num_accepted      from sample_tokens' valid sampled counts
    worker_kept_finished                         on the row of the step announcing r finished: r's
                                                 cached state (the same object) or batch row
                                                 outlived that step's _update_states

Only two readings differ between runners (`ReferenceReader` / `VllmReader`: the prepared
inputs, the worker's own edits). The observers write through a
`RowWriter`: the in-process recorder, or a live engine's sink.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from specreplay.replay.observers.guard import GUARD


class RowWriter(Protocol):
    """Where a worker-side observer's values go: row (step, request id) of the trace."""

    def write(self, step: int, rid: str, values: dict[str, Any]) -> None: ...

    def step_done(self, step: int) -> None: ...


class RecorderWriter:
    """In-process: straight into the recorder's rows of a step still in flight."""

    def __init__(self, recorder: Any) -> None:
        self.rec = recorder

    def write(self, step: int, rid: str, values: dict[str, Any]) -> None:
        at = self.rec.rows_of_step.get(step, {}).get(rid)
        if at is not None:  # else the worker ran a request the scheduler did not list: X1 sees it
            self.rec.fill(at, values)

    def step_done(self, step: int) -> None:
        self.rec.step_done(step)

    def write_columns(self, step: int, rids: list[str], columns: dict[str, list]) -> None:
        """Many rows of `step` at once: row of `rids[i]` gets `columns[name][i]` (in bulk)."""
        index = self.rec.rows_of_step.get(step, {})
        at = list(map(index.get, rids))
        if None in at:  # the worker ran a request the scheduler did not list: X1 sees it
            keep = [i for i, a in enumerate(at) if a is not None]
            at = [at[i] for i in keep]
            columns = {name: [values[i] for i in keep] for name, values in columns.items()}
        self.rec.fill_columns(at, columns)


def write_rows(writer: RowWriter, step: int, rows: list[tuple[str, dict[str, Any]]]) -> None:
    """A step's worker rows (trace id, values), in bulk where the writer takes columns: one
    write per set of names the rows carry (nearly always one), so a name a row lacks stays as
    it was, as when each row is written alone."""
    if not rows:
        return
    if not hasattr(writer, "write_columns"):
        for rid, row in rows:
            writer.write(step, rid, row)
        return
    groups: dict[tuple[str, ...], list[tuple[str, dict[str, Any]]]] = {}
    for rid, row in rows:
        groups.setdefault(tuple(row), []).append((rid, row))
    for names, group in groups.items():
        writer.write_columns(step, [rid for rid, _ in group], {n: [row[n] for _, row in group] for n in names})


class RunnerReader(Protocol):
    """The readings of a runner that differ between the reference runner and vLLM's."""

    def inputs(self, runner: Any, so: Any, result: Any) -> list[tuple[str, list[int], int, int | None]]:
        """After _prepare_inputs: per batch row, (request id, drafts fed to the rejection sampler
        before the clamp, negative input ids, first position written)."""
        ...

    def edited(self, runner: Any) -> set[str]:
        """Requests whose SchedulerOutput entries the worker itself changed this step."""
        ...


class ReferenceReader:
    """Reads the reference runner: its `PreparedInputs` and `edited`."""

    @staticmethod
    def inputs(runner: Any, so: Any, inputs: Any) -> list[tuple[str, list[int], int, int | None]]:
        return [(rid, inputs.draft_ids[x], inputs.negatives[x], inputs.starts[x]) for x, rid in enumerate(inputs.rows)]

    @staticmethod
    def edited(runner: Any) -> set[str]:
        return runner.edited


class VllmReader:
    """Reads vLLM 0.32.0's GPUModelRunner: after `_prepare_inputs`, the spec-decode metadata
    (drafts gathered before the clamp, so the -1 placeholders are still there), the query start
    locations and the positions buffer. Its edits show as counts that differ from the booked ones."""

    @staticmethod
    def edited(runner: Any) -> set[str]:
        return set()

    @staticmethod
    def inputs(runner: Any, so: Any, result: Any) -> list[tuple[str, list[int], int, int | None]]:
        batch = runner.input_batch
        ids = batch.req_ids[: batch.num_reqs]
        metadata = result[1] if isinstance(result, tuple) and len(result) > 1 else None
        drafts: dict[str, list[int]] = {}
        if metadata is not None:
            flat = metadata.draft_token_ids.tolist()
            at = 0
            for rid, n in zip(ids, metadata.num_draft_tokens):
                drafts[rid] = flat[at : at + n]
                at += n
        starts = runner.query_start_loc.np[: len(ids)].tolist()
        total = sum(so.num_scheduled_tokens.values())
        positions = runner.positions[:total].tolist() if total else []
        rows = []
        for x, rid in enumerate(ids):
            fed = drafts.get(rid, [])
            rows.append(
                (rid, fed, sum(1 for t in fed if t < 0), positions[starts[x]] if starts[x] < len(positions) else None)
            )
        return rows


class RunnerObserver:
    """The hooks `attach_runner` calls, in a step's order; an observer overrides what it needs."""

    def on_execute(self, runner: Any, so: Any) -> None:
        """execute_model was called with `so` (before any edit by the worker)."""

    def on_states(self, runner: Any, so: Any) -> None:
        """_update_states returned."""

    def on_inputs(self, rows: list[tuple[str, list[int], int, int | None]], runner: Any, so: Any, result: Any) -> None:
        """_prepare_inputs returned `result`; `rows` is the reader's account of it."""

    def on_executed(self, runner: Any, so: Any) -> None:
        """execute_model returned (the deferred correction has run)."""

    def on_sampled(self, runner: Any, output: Any = None) -> None:
        """sample_tokens returned `output`."""

    def flush(self) -> None:
        """The step is over on the worker (after sample_tokens, or an empty execute_model)."""


class WorkerObserver(RunnerObserver):
    """The worker view of each step a runner executes."""

    def __init__(self, writer: RowWriter, reader: RunnerReader, external_id: Any = None) -> None:
        self.writer = writer
        self.reader = reader
        self.ext = external_id or (lambda rid: rid)
        self.step: int | None = None
        self.rows: dict[str, dict[str, Any]] = {}
        self.optimistic: dict[str, int] = {}
        self.finishing: dict[str, Any] = {}  # finished ids announced this step -> their state before it
        self.kept: dict[str, bool] = {}

    def on_execute(self, runner: Any, so: Any) -> None:
        """execute_model called: what the scheduler booked, before any edit by the worker."""
        self.step = getattr(so, "_specreplay_step", None)
        self.booked = {
            rid: (n, len(so.scheduled_spec_decode_tokens.get(rid, ()))) for rid, n in so.num_scheduled_tokens.items()
        }
        drafts = runner._draft_token_ids  # async: [rows, k] on the device; sync: a list or None
        self.width = int(drafts.shape[-1]) if runner.use_async_scheduling and drafts is not None else 0
        self.rows, self.optimistic = {}, {}
        # vLLM drops a finished request's state and row in the _update_states of the step that
        # announces it (a resubmitted id then starts from a new state).
        self.finishing = {rid: runner.requests.get(rid) for rid in so.finished_req_ids}

    def on_states(self, runner: Any, so: Any) -> None:
        """_update_states returned: the optimistic count, the previous-step map, any edit."""
        batch = runner.input_batch
        again = {data.req_id for data in so.scheduled_new_reqs}  # a resubmitted id's new life has a row
        self.kept = {
            rid: (st is not None and runner.requests.get(rid) is st)
            or (rid in batch.req_id_to_index and rid not in again)
            for rid, st in self.finishing.items()
        }
        prev = runner.input_batch.prev_req_id_to_index or {}
        edited = self.reader.edited(runner)
        for rid, n in so.num_scheduled_tokens.items():
            st = runner.requests[rid]
            slots = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            self.optimistic[rid] = st.num_computed_tokens
            self.rows[rid] = {
                "worker_num_scheduled_tokens": n,
                "worker_num_draft_slots": slots,
                "worker_in_prev_map": rid in prev,
                "worker_cached_drafts": self.width if rid in prev else 0,
                "worker_num_output_tokens": len(st.output_token_ids),
                "worker_edited_output": rid in edited or self.booked.get(rid) != (n, slots),
            }

    def on_inputs(self, rows: list[tuple[str, list[int], int, int | None]], runner: Any, so: Any, result: Any) -> None:
        # The reference runner says what its drafter really proposed after the step before (the
        # rest of a row's k is zeros); vLLM's keeps no such count: the column stays null there. A
        # request the step before ran is known either way (0 where it verifies no slot); one it
        # did not run (new, re-entering, resumed) is not: its slots are S5's and X5's.
        proposed = getattr(runner, "drafts_proposed", None)
        for x, (rid, fed, negatives, first_position) in enumerate(rows):
            row = self.rows.get(rid)
            if row is not None:
                row.update(
                    worker_row=x,
                    worker_draft_ids=fed,
                    worker_negative_inputs=negatives,
                    worker_first_position=first_position,
                )
                if proposed is not None and rid in proposed:
                    row["truth_unfilled_draft_slots"] = max(0, len(fed) - proposed[rid])

    def on_executed(self, runner: Any, so: Any) -> None:
        """execute_model returned: the deferred correction has run."""
        for rid, row in self.rows.items():
            st = runner.requests.get(rid)
            if st is not None:
                row["worker_correction"] = self.optimistic[rid] - st.num_computed_tokens
                row["worker_num_computed_tokens"] = st.num_computed_tokens

    def on_sampled(self, runner: Any, output: Any = None) -> None:
        batch = runner.input_batch
        ids = batch.req_ids[: batch.num_reqs]
        counts = runner.valid_sampled_token_count_cpu
        counts = [int(c) for c in counts[: len(ids)]] if counts is not None else None
        if counts is None:
            counts = sync_counts(output, ids)
        sampled = batch.prev_req_id_to_index or {}
        for x, rid in enumerate(ids):
            row = self.rows.get(rid)
            if row is not None:
                emitted = counts[x] if counts is not None else (1 if rid in sampled else 0)
                row["worker_num_emitted"] = emitted
                row["worker_num_accepted"] = emitted - 1 if emitted else None

    def flush(self) -> None:
        """The step's worker rows, for the requests the worker ran."""
        if self.step is None:
            return
        for rid, kept in self.kept.items():
            self.writer.write(self.step, self.ext(rid), {"worker_kept_finished": kept})
        self.kept = {}
        ran = [(rid, row) for rid, row in self.rows.items() if "worker_row" in row]  # else the worker dropped it
        for _, row in ran:
            row.setdefault("worker_num_emitted", 0)
            row.setdefault("worker_num_accepted", None)
        write_rows(self.writer, self.step, [(self.ext(rid), row) for rid, row in ran])
        self.writer.step_done(self.step)
        self.rows = {}


def sync_counts(output: Any, ids: list[str]) -> list[int] | None:
    """Tokens emitted per row, read from a sync-mode ModelRunnerOutput (its sampled token ids
    are host lists; vLLM keeps no valid count and no previous-step map without async)."""
    sampled = getattr(output, "sampled_token_ids", None)
    index = getattr(output, "req_id_to_index", None)
    if not isinstance(sampled, list) or not isinstance(index, dict):
        return None
    return [len(sampled[index[rid]]) if rid in index and index[rid] < len(sampled) else 0 for rid in ids]


def attach_runner(runner: Any, observers: list[RunnerObserver], reader: RunnerReader) -> None:
    """Wrap the runner instance's four calls and call every observer's hooks around them.
    `reader`: ReferenceReader or VllmReader, for `_prepare_inputs`' result."""
    execute, update_states, prepare, sample = (
        runner.execute_model,
        runner._update_states,
        runner._prepare_inputs,
        runner.sample_tokens,
    )

    def each(hook: str, *args: Any) -> None:
        # An observer's exception is specreplay's, never the runner's (observers/guard.py).
        for obs in observers:
            GUARD.call("worker observer", getattr(obs, hook), *args)

    @functools.wraps(execute)
    def execute_model(so, *a, **kw):
        each("on_execute", runner, so)
        result = execute(so, *a, **kw)
        each("on_executed", runner, so)
        if so.total_num_scheduled_tokens == 0:
            each("flush")  # empty step: no sample_tokens follows
        return result

    @functools.wraps(update_states)
    def _update_states(so, *a, **kw):
        result = update_states(so, *a, **kw)
        each("on_states", runner, so)
        return result

    @functools.wraps(prepare)
    def _prepare_inputs(so, *a, **kw):
        result = prepare(so, *a, **kw)
        inputs = GUARD.call("worker observer", reader.inputs, runner, so, result)
        if inputs is not None:
            each("on_inputs", inputs, runner, so, result)
        return result

    @functools.wraps(sample)
    def sample_tokens(*a, **kw):
        result = sample(*a, **kw)
        each("on_sampled", runner, result)
        each("flush")
        return result

    runner.execute_model, runner._update_states, runner._prepare_inputs = execute_model, _update_states, _prepare_inputs
    runner.sample_tokens = sample_tokens


def observe_v1(runner: Any, writer: RowWriter, external_id: Any = None) -> WorkerObserver:
    """The V1 worker observer on a live vLLM GPUModelRunner (runner family v1, engines/registry.py)."""
    observer = WorkerObserver(writer, VllmReader, external_id)
    attach_runner(runner, [observer], VllmReader)
    return observer


def observe_reference(runner: Any, writer: RowWriter, truth: RunnerObserver) -> None:
    """The reference V1 runner's observers: this worker observer and the KV truth, reading the
    reference runner's host values (engines/registry.py RunnerFamily.observe_reference)."""
    attach_runner(runner, [WorkerObserver(writer, ReferenceReader), truth], ReferenceReader)
