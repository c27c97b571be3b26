"""The batch: what schedule() booked against its budget, and what the worker ran and handed back.

Codes: S6 (token budget and max_model_len), X1 (batch membership), X10 (the SchedulerOutput read
back by update_from_output is the one the worker was given), X11 (the worker executes what was
booked, less the drafts vLLM's ngram_gpu drafter could not propose). Vectorised over a frame's
columns (frames.py); the message texts are in the catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import Frame

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def check_budget(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S6: no request scheduled past max_model_len; per step, the declared total is the sum of
    the requests' scheduled tokens and within max_num_batched_tokens."""
    c = frame.c
    budget = _or(chk.config.max_num_batched_tokens, 1 << 30)  # not recorded: nothing to hold it to
    max_len = _or(chk.config.max_model_len, 1 << 30)
    scheduled, computed = c["sched_num_scheduled_tokens"], c["sched_num_computed_tokens"]
    for i in np.flatnonzero(frame.own & (scheduled > 0) & (computed + scheduled > max_len - 1)):
        yield chk.finding(
            frame,
            "S6-token-budget",
            i,
            "num_scheduled_tokens",
            int(max_len - computed[i] - 1),
            int(scheduled[i]),
            max_model_len=max_len,
        )
    # Per step (a frame holds whole steps): the declared total against the sum and the budget.
    start = frame.num_context
    steps, declared = c["step"][start:], c["step_total_scheduled_tokens"][start:]
    if not len(steps):
        return
    firsts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    totals = np.add.reduceat(scheduled[start:], firsts)
    per_row = np.repeat(totals, np.diff(np.r_[firsts, len(steps)]))
    bad = np.flatnonzero((declared != per_row) | (declared > budget))
    _, first = np.unique(steps[bad], return_index=True)
    for i in bad[first]:
        yield chk.step_finding(
            "S6-token-budget",
            int(steps[i]),
            "total_num_scheduled_tokens",
            int(per_row[i]),
            int(declared[i]),
            max_num_batched_tokens=budget,
        )


def check_membership(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """X1: the worker's batch holds exactly the requests with scheduled tokens (but at a crash step)."""
    c = frame.c
    scheduled, in_batch = c["sched_num_scheduled_tokens"] > 0, ~c["worker_row_is_null"]
    live = c["step"] != (chk.crash_step if chk.crash_step is not None else -1)
    for i in np.flatnonzero(frame.own & live & (scheduled != in_batch)):
        yield chk.finding(frame, "X1-batch-membership", i, "worker_row", bool(scheduled[i]), bool(in_batch[i]))


#: Why a row's executed work differs from the booked work by more than vLLM's ngram_gpu trim
#: (`trim_mismatch`); index 0: it is that trim.
TRIM_MISMATCHES = (
    None,
    "no_cached_drafts",  # no row in the worker's batch the step before (new, resumed, re-entering)
    "not_only_draft_slots",  # other tokens than trailing draft slots differ, or more than booked ran
    "drafts_fed",  # the drafts fed are not the kept slots' real ids, from the drafts cached
    "scheduler_output_edited",  # update_from_output read the cut back: vLLM cuts only its own copy
    "runner_never_trims",  # not the ngram_gpu drafter's runner (the trace's drafter, else: it has ground truth)
)


def trim_mismatch(c: dict[str, np.ndarray], drafter: str | None = None) -> np.ndarray:
    """Per row, the index into TRIM_MISMATCHES of the first way its executed work is not vLLM
    0.32.0's ngram_gpu trim of the drafts it could not propose (0: it is that trim).

    What the trim does, in vllm/v1/spec_decode/ngram_proposer_gpu.py (`ngram_gpu` below) and
    vllm/v1/worker/gpu_model_runner.py (`runner`): `_update_states` (runner:1316-1327) calls
    `update_scheduler_for_invalid_drafts` (ngram_gpu:472-513) for each cached request still in
    the persistent batch, i.e. run the step before (the unscheduled ones left it at
    runner:1218-1233; new, resumed and re-entering ones join it only later, runner:1430-1441 and
    1487-1489, so they are never cut), that has draft slots. It keeps as many slots as the
    leading valid drafts the drafter proposed for it the step before (ngram_gpu:200-206, cached
    at runner:4813-4823), takes the other slots off num_scheduled_tokens[r] and the total, and
    pops r's entry when none is left. It edits the worker's own copy of the SchedulerOutput
    (runner:3951-3966), so the scheduler reads back what it booked. With k = 3, booked 4 tokens
    with 3 slots: the drafter had 2 valid drafts -> the worker runs 3 tokens with those 2
    drafts; it had none -> 1 token, no drafts (every row of the live re-entry run's step 2).

    The trace does not hold the valid count, so a row passes when its cut has that shape: a
    request with drafts cached from the previous step, fewer trailing draft slots and nothing
    else, every draft fed a real id among those cached, the scheduler's copy untouched, and a
    runner that cuts: one whose drafter is ngram_gpu (`drafter`, from the trace's metadata: a live
    vLLM's, or a replay of its recording); for a trace that names no drafter, vLLM's own runner,
    the one whose rows have no ground truth. The first of these a row fails is its reason."""
    booked, booked_slots = c["sched_num_scheduled_tokens"], c["sched_num_draft_slots"]
    ran, ran_slots = c["worker_num_scheduled_tokens"], c["worker_num_draft_slots"]
    cached = c["worker_cached_drafts"]
    only_slots = (ran_slots >= 0) & (ran_slots < booked_slots) & (booked - ran == booked_slots - ran_slots)
    fed_kept = (
        (c["worker_num_draft_ids"] == ran_slots) & (c["worker_num_negative_draft_ids"] == 0) & (ran_slots <= cached)
    )
    read_back = c["apply_num_draft_slots_is_null"] | (
        (c["apply_num_scheduled_tokens"] == booked) & (c["apply_num_draft_slots"] == booked_slots)
    )
    trims = np.full(len(booked), drafter == "ngram_gpu") if drafter else c["truth_num_computed_tokens_is_null"]
    return np.select(
        [cached <= 0, ~only_slots, ~fed_kept, ~read_back, ~trims],
        [1, 2, 3, 4, 5],
        0,
    )


def check_executed_work(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """X11: the worker runs the tokens and draft slots the scheduler booked, less the draft
    slots vLLM's ngram_gpu drafter cuts because it had no valid draft for them (`trim_mismatch`):
    that cut is the drafter's normal work, not booked work lost, and is not reported."""
    c = frame.c
    booked, booked_slots = c["sched_num_scheduled_tokens"], c["sched_num_draft_slots"]
    ran, ran_slots = c["worker_num_scheduled_tokens"], c["worker_num_draft_slots"]
    differs = ~c["worker_num_scheduled_tokens_is_null"] & ((ran != booked) | (ran_slots != booked_slots))
    why = trim_mismatch(c, chk.drafter)
    for i in np.flatnonzero(frame.own & differs & (why > 0)):
        yield chk.finding(
            frame,
            "X11-executed-other-work",
            i,
            "num_scheduled_tokens",
            int(booked[i]),
            int(ran[i]),
            sched_num_draft_slots=int(booked_slots[i]),
            worker_num_draft_slots=int(ran_slots[i]),
            worker_cached_drafts=None if c["worker_cached_drafts_is_null"][i] else int(c["worker_cached_drafts"][i]),
            reason=TRIM_MISMATCHES[why[i]],
        )


def check_output_mutated(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """X10: update_from_output reads back the token and draft-slot counts the SchedulerOutput was
    built with (the worker must not edit the scheduler's object)."""
    c = frame.c
    built, built_slots = c["sched_num_scheduled_tokens"], c["sched_num_draft_slots"]
    read, read_slots = c["apply_num_scheduled_tokens"], c["apply_num_draft_slots"]
    violated = ~c["apply_num_draft_slots_is_null"] & ((read != built) | (read_slots != built_slots))
    for i in np.flatnonzero(frame.own & violated):
        yield chk.finding(
            frame,
            "X10-scheduler-output-mutated",
            i,
            "scheduled_spec_decode_tokens",
            int(built_slots[i]),
            int(read_slots[i]),
            sched_num_scheduled_tokens=int(built[i]),
            apply_num_scheduled_tokens=int(read[i]),
        )
