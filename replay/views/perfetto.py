"""Perfetto / Chrome trace-event export: scheduler and worker tracks per request, side by side.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> **views** -> cli, for the Perfetto UI (ui.perfetto.dev opens the JSON). One engine step
is one millisecond. Per request: a process with a `scheduler` and a `worker` thread track holding
one slice per step the request was in (what it was given, what ran), flow arrows from the step that
scheduled work to the step whose `update_from_output` applied it, counter tracks for
`num_computed_tokens` (both sides) and `num_output_placeholders`, and instant markers where findings
fire. Exports are windowed by steps: at most `max_steps` steps and `max_rows` request-steps (about
700 bytes of JSON each) per file, cut at a step boundary, so a long trace stays under the viewer's
limits (`--steps` picks the next window). On a Model Runner V2 trace the worker slices carry
MRV2's own state (the slot, the device count, where the verified drafts came from) and the
worker's counter is the device `num_computed_tokens`. On an SGLang trace the counters are
SGLang's own lengths, as its scheduler and worker keep them: `kv_committed_len` and
`kv_allocated_len` (scheduler, after the iteration's scheduling), the `seq_len` the worker ran
with after the FutureMap's resolution and, under EAGLE v2, the one it published; the slices carry
the forward mode, the row's place in the request pool and what the worker emitted. (vLLM's
`num_output_placeholders` and the worker's `num_computed_tokens` have no SGLang meaning: no such
counters.) A flow arrow goes, as on vLLM, from the iteration that launched a batch to the one whose
`process_batch_result` applied it: the next one under the overlap schedule.
"""

from __future__ import annotations

from typing import Any

from specreplay.replay.views.timeline import (
    MRV2_COLUMNS,
    amount,
    draft_provenance,
    runner_family_of,
    sched_cell,
    short_code,
)
from specreplay.traces.families import WorkerView, traits

STEP_US = 1000  # one engine step = 1 ms on the timeline
SCHED_TID, WORKER_TID = 1, 2
MAX_STEPS = 2000
MAX_ROWS = 20_000  # about 14 MB of JSON

_COLUMNS = (
    "step",
    "request_id",
    "sched_status",
    "sched_kind",
    "sched_skip",
    "sched_num_scheduled_tokens",
    "sched_num_draft_slots",
    "sched_preempted",
    "sched_num_computed_tokens",
    "sched_num_output_placeholders",
    "apply_step",
    "apply_outcome",
    "apply_num_rejected",
    "worker_row",
    "worker_num_scheduled_tokens",
    "worker_num_draft_slots",
    "worker_num_computed_tokens",
    "worker_draft_ids",
    "worker_num_accepted",
    "step_event",
    "sched_event",
    "sched_life",
)

_NAMES = {
    "N": "new",
    "R": "re-entering",
    "U": "resumed",
    "b": "skipped: budget",
    "m": "skipped: max_tokens",
    "f": "skipped: prefill first (SGLang)",
    "0": "nothing to schedule",
    "w": "waiting",
    "P": "preempted",
    "p": "preempted (waiting)",
    "F": "finished",
}


def export_events(
    trace, findings: list, steps: tuple[int, int] | None = None, max_steps: int = MAX_STEPS, max_rows: int = MAX_ROWS
) -> dict[str, Any]:
    """The trace-event document for steps `steps` (default: from the first step), at most
    `max_steps` steps and `max_rows` rows of them."""
    first = steps[0] if steps else 1
    last = steps[1] if steps else first + max_steps - 1
    last = min(last, first + max_steps - 1)
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    flows: list[tuple[int, int, int, str]] = []  # (pid, scheduled step, applied step, id)
    view = traits(runner_family_of(trace)).view
    extra = {WorkerView.SLOTS: MRV2_COLUMNS + _MRV2_SLICE, WorkerView.SGLANG_ROWS: _SGLANG_COLUMNS}.get(view, ())
    batches = trace.batches(columns=_COLUMNS + extra)
    import pyarrow.compute as pc

    slices: dict[int, set[int]] = {}  # pid -> steps with a scheduler slice (flow ends bind to them)
    rows_taken, current = 0, None
    marked_steps: set[int] = set()
    for batch in batches:
        keep = pc.and_(pc.greater_equal(batch.column("step"), first), pc.less_equal(batch.column("step"), last))
        for row in batch.filter(keep).to_pylist():
            rid, step = row["request_id"], row["step"]
            if step != current:
                if rows_taken >= max_rows:  # the row budget is spent: end the window before this step
                    last = current
                    break
                current = step
            rows_taken += 1
            if row["step_event"] and step not in marked_steps:  # pause, resume, cache reset: engine-wide
                marked_steps.add(step)
                events.append(
                    {
                        "name": row["step_event"],
                        "ph": "i",
                        "s": "g",
                        "ts": (step - first) * STEP_US,
                        "pid": 0,
                        "tid": 0,
                        "cat": "control event",
                    }
                )
            pid = pids.get(rid)
            if pid is None:
                pid = pids[rid] = len(pids) + 1
                events += [
                    _meta(pid, 0, "process_name", f"request {rid}"),
                    _meta(pid, 0, "process_sort_index", pid),
                    _meta(pid, SCHED_TID, "thread_name", "scheduler"),
                    _meta(pid, WORKER_TID, "thread_name", "worker"),
                ]
            events += _row_events(row, pid, (step - first) * STEP_US, view)
            slices.setdefault(pid, set()).add(step)
            # An arrow per output update_from_output used; one popped while the engine drained
            # (no schedule() since its own) has no later step to point at.
            if (
                row["sched_num_scheduled_tokens"]
                and row["apply_outcome"] not in (None, "ignored")
                and row["apply_step"] > step
            ):
                flows.append((pid, step, row["apply_step"], f"{rid}@{step}"))
        if current is not None and last == current and rows_taken >= max_rows:
            break
    events += _flow_events(flows, slices, first)
    for f in findings:
        pid = pids.get(f.request_id) if f.request_id is not None else None
        if first <= f.step <= last and pid is not None:
            events.append(
                {
                    "name": f.code,
                    "ph": "i",
                    "s": "t",
                    "ts": (f.step - first) * STEP_US + STEP_US // 4,
                    "pid": pid,
                    "tid": SCHED_TID if short_code(f.code)[0] == "S" else WORKER_TID,
                    "cat": "finding",
                    "args": {"severity": f.severity, "field": f.field, "message": f.message},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"specreplay": "one engine step = 1 ms", "first_step": first, "last_step": last},
    }


#: What an MRV2 worker slice shows beyond the lanes' columns.
_MRV2_SLICE = ("worker_device_computed_after", "worker_cpu_computed", "worker_num_rejected")
#: SGLang's own lengths and what its worker did (the "(SGLang)" columns, traces/schema.py).
_SGLANG_COLUMNS = (
    "step_forward_mode",
    "sched_kv_committed_len",
    "sched_kv_allocated_len",
    "sched_seq_len",
    "sched_req_pool_idx",
    "sched_num_in_flight_tokens",
    "apply_skip_reason",
    "worker_first_position",
    "worker_seq_len",
    "worker_new_seq_len",
    "worker_sampled_ids",
)


def _row_events(
    row: dict[str, Any], pid: int, ts: int, view: WorkerView = WorkerView.PERSISTENT_BATCH
) -> list[dict[str, Any]]:
    """One row's scheduler slice, worker slice (if it ran) and counters."""
    if view is WorkerView.SGLANG_ROWS:
        return _sglang_row_events(row, pid, ts)
    mrv2 = view is WorkerView.SLOTS
    step = row["step"]
    events = [
        {
            "name": _describe(row),
            "ph": "X",
            "ts": ts,
            "dur": STEP_US,
            "pid": pid,
            "tid": SCHED_TID,
            "cat": "scheduler",
            "args": {
                "step": step,
                "kind": row["sched_kind"],
                "skip": row["sched_skip"],
                "num_scheduled_tokens": row["sched_num_scheduled_tokens"],
                "num_draft_slots": row["sched_num_draft_slots"],
                "num_computed_tokens": row["sched_num_computed_tokens"],
                "num_output_placeholders": row["sched_num_output_placeholders"],
                "control_event": row["sched_event"],
                "life": row["sched_life"],
            },
        }
    ]
    if row["worker_row"] is not None:
        negative = any(t < 0 for t in row["worker_draft_ids"] or ())
        name = "ran " + amount(row["worker_num_scheduled_tokens"], row["worker_num_draft_slots"])
        args = {
            "step": step,
            "row": row["worker_row"],
            "num_scheduled_tokens": row["worker_num_scheduled_tokens"],
            "num_draft_slots": row["worker_num_draft_slots"],
            "num_computed_tokens": row["worker_num_computed_tokens"],
            "draft_ids": row["worker_draft_ids"],
            "accepted": row["worker_num_accepted"],
        }
        computed = row["worker_num_computed_tokens"]
        if mrv2:
            computed = row["worker_device_computed_before"]
            args |= {
                "slot": row["worker_slot"],
                "num_computed_tokens": computed,
                "device_computed_after": row["worker_device_computed_after"],
                "cpu_mirror": row["worker_cpu_computed"],
                "drafts_proposed_at": row["worker_draft_proposed_step"],
                "drafts_proposed_for": row["worker_draft_proposed_for"],
                "drafts_base": row["worker_draft_base"],
                "rejected": row["worker_num_rejected"],
            }
            mark = draft_provenance(row)[0] if row["worker_num_draft_slots"] else ""
            name += {"?": " (nothing proposed)", "x": " (another's drafts)", "~": " (drafts elsewhere)"}.get(mark, "")
        events.append(
            {
                "name": name + (" (-1 drafts)" if negative else ""),
                "ph": "X",
                "ts": ts,
                "dur": STEP_US,
                "pid": pid,
                "tid": WORKER_TID,
                "cat": "worker",
                "args": args,
            }
        )
        events.append(_counter(pid, ts, "num_computed_tokens (worker)", computed))
    events.append(_counter(pid, ts, "num_computed_tokens (scheduler)", row["sched_num_computed_tokens"]))
    events.append(_counter(pid, ts, "num_output_placeholders", row["sched_num_output_placeholders"]))
    return events


def _sglang_row_events(row: dict[str, Any], pid: int, ts: int) -> list[dict[str, Any]]:
    """An SGLang row's slices and counters: SGLang's lengths in place of vLLM's counters."""
    step = row["step"]
    scheduler = {
        "step": step,
        "kind": row["sched_kind"],
        "skip": row["sched_skip"],
        "num_scheduled_tokens": row["sched_num_scheduled_tokens"],
        "num_draft_slots": row["sched_num_draft_slots"],
        "kv_committed_len": row["sched_kv_committed_len"],
        "kv_allocated_len": row["sched_kv_allocated_len"],
        "seq_len": row["sched_seq_len"],
        "req_pool_idx": row["sched_req_pool_idx"],
        "in_flight_tokens": row["sched_num_in_flight_tokens"],
        "result": row["apply_outcome"],
        "result_skipped": row["apply_skip_reason"] or None,
        "control_event": row["sched_event"],
    }
    events = [_slice(_describe(row), pid, ts, SCHED_TID, "scheduler", scheduler)]
    events.append(_counter(pid, ts, "kv_committed_len (scheduler)", row["sched_kv_committed_len"]))
    events.append(_counter(pid, ts, "kv_allocated_len (scheduler)", row["sched_kv_allocated_len"]))
    if row["worker_row"] is None:
        return events
    worker = {
        "step": step,
        "row": row["worker_row"],
        "forward_mode": row["step_forward_mode"],
        "first_position": row["worker_first_position"],
        "num_tokens_written": row["worker_num_scheduled_tokens"],
        "seq_len": row["worker_seq_len"],
        "new_seq_len": row["worker_new_seq_len"],
        "draft_ids": row["worker_draft_ids"],
        "accepted": row["worker_num_accepted"],
        "emitted": row["worker_sampled_ids"],
    }
    name = f"{row['step_forward_mode'] or 'ran'} " + amount(
        row["worker_num_scheduled_tokens"], row["worker_num_draft_slots"]
    )
    events.append(_slice(name, pid, ts, WORKER_TID, "worker", worker))
    events.append(_counter(pid, ts, "seq_len (worker)", row["worker_seq_len"]))
    if row["worker_new_seq_len"] is not None:  # EAGLE v2: what it published to the FutureMap
        events.append(_counter(pid, ts, "new_seq_len (worker)", row["worker_new_seq_len"]))
    return events


def _slice(name: str, pid: int, ts: int, tid: int, cat: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "X", "ts": ts, "dur": STEP_US, "pid": pid, "tid": tid, "cat": cat, "args": args}


def _flow_events(
    flows: list[tuple[int, int, int, str]], slices: dict[int, set[int]], first: int
) -> list[dict[str, Any]]:
    """An arrow from each scheduled step to the step that applied its output, both in the window."""
    events = []
    flow_id = 0
    for pid, start, end, name in flows:
        if end not in slices.get(pid, ()):  # applied outside the window (or after the request's last row)
            continue
        flow_id += 1  # an integer: Perfetto reads a string id as hex and drops what does not parse
        events.append(
            {
                "name": "output applied",
                "cat": "apply",
                "ph": "s",
                "id": flow_id,
                "pid": pid,
                "tid": SCHED_TID,
                "ts": (start - first) * STEP_US + STEP_US // 2,
            }
        )
        events.append(
            {
                "name": "output applied",
                "cat": "apply",
                "ph": "f",
                "bp": "e",
                "id": flow_id,
                "pid": pid,
                "tid": SCHED_TID,
                "ts": (end - first) * STEP_US + STEP_US // 2,
                "args": {"scheduled_at": name},
            }
        )
    return events


def _describe(row: dict[str, Any]) -> str:
    """A scheduler slice's name, from the row's own values (cells are cut to the terminal's width)."""
    n, k = row["sched_num_scheduled_tokens"], row["sched_num_draft_slots"]
    if n:
        kind = {"new": "new", "reentering": "re-entering", "resumed": "resumed"}.get(row["sched_kind"], "scheduled")
        return f"{kind} {amount(n, k)}"
    return _NAMES.get(sched_cell(row).text, "unscheduled")


def _meta(pid: int, tid: int, name: str, value: Any) -> dict[str, Any]:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def _counter(pid: int, ts: int, name: str, value: Any) -> dict[str, Any]:
    return {"name": name, "ph": "C", "ts": ts, "pid": pid, "args": {"value": 0 if value is None else value}}
