"""Situations: what a run reached, read from its trace's columns: the coverage explore steers by.

Where it sits: inside check, beside the checker; `explore` (workflows/explore.py) counts, per
situation, the workloads whose trace reached it, and draws more of the profiles that reach new
ones. Everything here is derived from the recorded columns and the trace's engine config, never
from an implementation's own report, so a situation means the same whichever engine ran.

Two families:
- `situations(trace)`: scheduler and worker situations (re-entry, preemption with output in
  flight, the drafter skipped near max_model_len, KV slots allocated for lookahead, ...);
- `settings(config)`: the engine settings a workload drew (k, block size, lookahead, a
  max_model_len tight to the requests), so that a search says which part of the space it saw.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from specreplay.traces.header import Config

#: What each situation means (docs/finding-bugs.md lists them).
SITUATIONS: dict[str, str] = {
    "reentry": "a request skipped at one step is scheduled again at the next (sched_kind reentering)",
    "resume": "a preempted request is scheduled again",
    "preempt-in-flight": "a request is preempted with output placeholders in flight",
    "output-never-applied": "a scheduled step's output is never applied, or ignored",
    "output-dropped": "an output is dropped (stale after a preemption or a cache reset)",
    "stale-delivered": "stale output is appended without touching the counters",
    "pause": "the engine is paused",
    "cache-reset": "a prefix-cache reset preempts a running request",
    "resubmission": "an aborted request id is submitted again (a second life)",
    "streaming-turn": "a streaming session gets its next input chunk",
    "chunked-prefill": "a prompt is scheduled in chunks",
    "abort": "a request is aborted",
    "stop": "a request finishes on a stop token",
    "empty-step": "a step schedules no token",
    "budget-skip": "a running request gets no token for want of budget",
    "max-tokens-skip": "a running request is skipped by the max-tokens rule",
    "padded-admission": "an admission padded to 1 + k tokens with placeholder drafts",
    "drafts-with-nothing-behind": "a re-entering request is scheduled with draft slots (no cached drafts behind them)",
    "drafts-cut-at-max-model-len": "a decoding request gets fewer than k draft slots because it is at max_model_len",
    "drafter-skipped": "the drafter is skipped for the whole batch: the longest sequence plus k passes max_model_len",
    "skipped-drafts-verified": "draft slots filled with the zeros a skipped drafter left (no proposal behind them)",
    "lookahead-allocation": "KV slots allocated past a step's scheduled range (num_lookahead_tokens > 0)",
}


def _any(mask: Any) -> bool:
    return bool(pc.any(pc.fill_null(mask, False)).as_py())


def situations(trace: Any) -> frozenset[str]:
    """The situations of `SITUATIONS` a run reached, plus `outcome-<status>` for a run that did not
    complete and `outcome-requests-lost` for one that completed with requests unfinished."""
    t = trace.table
    if t.num_rows == 0:
        return frozenset()
    kind, skip, finish, event, outcome = (
        pc.cast(t[c], "string")
        for c in ("sched_kind", "sched_skip", "apply_finish_reason", "sched_event", "apply_outcome")
    )
    scheduled = pc.greater(t["sched_num_scheduled_tokens"], 0)
    checks = {
        "reentry": pc.equal(kind, "reentering"),
        "resume": pc.equal(kind, "resumed"),
        "preempt-in-flight": pc.and_(t["sched_preempted"], pc.greater(t["sched_num_output_placeholders"], 0)),
        "output-never-applied": pc.and_(scheduled, pc.or_kleene(pc.is_null(outcome), pc.equal(outcome, "ignored"))),
        "output-dropped": pc.equal(outcome, "dropped"),
        "stale-delivered": pc.equal(outcome, "stale_delivered"),
        "pause": pc.match_substring(pc.cast(t["step_event"], "string"), "pause"),
        "cache-reset": pc.equal(event, "reset_preempt"),
        "resubmission": pc.greater(t["sched_life"], 0),
        "streaming-turn": pc.equal(event, "stream_turn"),
        "chunked-prefill": t["sched_is_prefill_chunk"],
        "abort": pc.equal(finish, "aborted"),
        "stop": pc.equal(finish, "stop"),
        "empty-step": pc.equal(t["step_total_scheduled_tokens"], 0),
        "budget-skip": pc.equal(skip, "budget"),
        "max-tokens-skip": pc.equal(skip, "max_tokens"),
        "padded-admission": pc.and_(pc.equal(kind, "new"), pc.greater(t["sched_num_draft_slots"], 0)),
        "drafts-with-nothing-behind": pc.and_(pc.greater(t["sched_num_draft_slots"], 0), pc.equal(kind, "reentering")),
    }
    found = {name for name, mask in checks.items() if _any(mask)}
    found |= _near_the_end(t, trace.config)
    if trace.outcome.status != "completed":
        found.add(f"outcome-{trace.outcome.status}")
    elif trace.outcome.unfinished:
        found.add("outcome-requests-lost")
    return frozenset(found)


def _near_the_end(t: pa.Table, config: Config) -> set[str]:
    """The situations that need the engine config: draft slots cut and the drafter skipped near
    max_model_len, and lookahead allocation.

    The drafter skip is the runner's rule (vLLM's `_input_fits_in_drafter`, the reference's
    `propose_drafts`) read back from the columns: after a step's forward, the drafter runs only
    when the longest row's optimistic sequence length (its num_computed_tokens as scheduled plus
    the tokens the worker ran) plus k fits max_model_len; otherwise every row gets k zero drafts.
    Example (k = 3, max_model_len = 20): a row at C = 15 runs 1 + 3 tokens, 19 + 3 > 20, so no
    row of the step gets a proposal, and at the next step the draft slots the scheduler booked
    for the other rows verify the zeros (`skipped-drafts-verified`).

    Lookahead: the scheduler allocates KV for C + n + num_lookahead_tokens tokens (at most
    max_model_len); the situation is a step whose lookahead reaches a block the scheduled range
    C + n does not touch."""
    k = _or(config.num_spec_tokens, 0)  # a knob the trace did not record: vLLM's default, or no limit
    max_model_len = _or(config.max_model_len, 1 << 30)
    block_size = _or(config.block_size, 16)
    lookahead = _or(config.num_lookahead_tokens, 0)
    cols = t.select(
        [
            "step",
            "request_id",
            "sched_num_computed_tokens",
            "sched_num_scheduled_tokens",
            "sched_num_draft_slots",
            "sched_num_prompt_tokens",
            "worker_num_scheduled_tokens",
            "worker_num_draft_slots",
            "worker_num_emitted",
        ]
    ).to_pylist()
    found: set[str] = set()
    # Steps in order; per step the rows the worker ran (request, sequence length, emitted tokens).
    ran: dict[int, list[tuple[str, int, int, int]]] = {}
    for row in cols:
        c, n = row["sched_num_computed_tokens"], row["sched_num_scheduled_tokens"]
        decoding = n > 0 and c >= row["sched_num_prompt_tokens"]
        if k and decoding and row["sched_num_draft_slots"] < k and c + n >= max_model_len - 1:
            found.add("drafts-cut-at-max-model-len")  # the scheduler trimmed the drafts to fit max_model_len
        if n > 0 and lookahead:
            end = c + n
            if -(-min(end + lookahead, max_model_len) // block_size) > -(-end // block_size):
                found.add("lookahead-allocation")
        worker_n = row["worker_num_scheduled_tokens"]
        if worker_n:
            ran.setdefault(row["step"], []).append(
                (row["request_id"], c + worker_n, row["worker_num_emitted"] or 0, row["worker_num_draft_slots"] or 0)
            )
    if not k:
        return found
    skipped: dict[int, set[str]] = {}  # step whose drafter was skipped -> the rows that sampled
    for step in sorted(ran):
        rows = ran[step]
        # The zeros feed the draft slots of the very next step only (an empty step in between
        # takes the rows out of the previous-step map).
        if any(rid in skipped.get(step - 1, ()) and slots for rid, _, _, slots in rows):
            found.add("skipped-drafts-verified")
        sampling = {rid for rid, _, emitted, _ in rows if emitted}
        if sampling and max(seq_len for _, seq_len, _, _ in rows) + k > max_model_len:
            found.add("drafter-skipped")
            skipped[step] = sampling
    return found


def _or(value: int | None, default: int) -> int:
    return default if value is None else int(value)


def settings(config: dict[str, Any], longest_request: int | None = None) -> frozenset[str]:
    """The engine settings a workload drew, as coverage names: `async` / `sync`, `k=K`,
    `block_size=B`, `lookahead=0|1..k-1|k|k+1`, and `max_model_len=tight` when it is within
    k + 1 tokens of the longest request (`longest_request`: prompt + max_tokens), else `roomy`."""
    k = int(config.get("num_spec_tokens", 0))
    lookahead = int(config.get("num_lookahead_tokens", 0))
    seen = {
        "async" if config.get("async_scheduling", True) else "sync",
        f"k={k}",
        f"block_size={config.get('block_size')}",
    }
    if lookahead == 0:
        seen.add("lookahead=0")
    elif lookahead == k:
        seen.add("lookahead=k")
    elif lookahead == k + 1:
        seen.add("lookahead=k+1")
    else:
        seen.add("lookahead=1..k-1")
    if longest_request is not None:
        tight = int(config.get("max_model_len", 0)) <= longest_request + k + 1
        seen.add("max_model_len=tight" if tight else "max_model_len=roomy")
    return frozenset(seen)


__all__ = ["SITUATIONS", "settings", "situations"]
