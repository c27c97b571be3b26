"""The batch: what schedule() booked against its budget, and what the worker ran and handed back.

Codes: S6 (token budget and max_model_len), X1 (batch membership), X10 (the SchedulerOutput read
back by update_from_output is the one the worker was given), X11 (the worker executes what was
booked). Vectorised over a frame's columns (frames.py); the message texts are in the catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import Frame

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_budget(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S6: no request scheduled past max_model_len; per step, the declared total is the sum of
    the requests' scheduled tokens and within max_num_batched_tokens."""
    c = frame.c
    budget = chk.config.get("max_num_batched_tokens", 1 << 30)
    max_len = chk.config.get("max_model_len", 1 << 30)
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


def check_executed_work(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """X11: the worker runs the tokens and draft slots the scheduler booked."""
    c = frame.c
    booked, booked_slots = c["sched_num_scheduled_tokens"], c["sched_num_draft_slots"]
    ran, ran_slots = c["worker_num_scheduled_tokens"], c["worker_num_draft_slots"]
    violated = ~c["worker_num_scheduled_tokens_is_null"] & ((ran != booked) | (ran_slots != booked_slots))
    for i in np.flatnonzero(frame.own & violated):
        yield chk.finding(
            frame,
            "X11-executed-other-work",
            i,
            "num_scheduled_tokens",
            int(booked[i]),
            int(ran[i]),
            sched_num_draft_slots=int(booked_slots[i]),
            worker_num_draft_slots=int(ran_slots[i]),
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
