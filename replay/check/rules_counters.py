"""The scheduler's counters against what they count: placeholders, the decode identity, computed
tokens (scheduler, worker, device position and KV truth), the worker's output length, the
in-flight and stale token counts.

Codes: S1, S2, S3, S4, X2 (three codes), X3, L3. Each rule is vectorised over a frame's columns
(frames.py) and reports through the checker (framework.py); the message texts are in the
catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import (
    FINISHED,
    LOOKBACK,
    NEW,
    PREEMPTED,
    RESUMED,
    RUNNING,
    UNSCHEDULED,
    WAITING,
    Frame,
)

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_placeholders_nonnegative(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S1: num_output_placeholders never negative, before schedule() or when an output is applied."""
    c = frame.c
    placeholders, applied = c["sched_num_output_placeholders"], c["apply_num_output_placeholders"]
    applied_negative = ~c["apply_num_output_placeholders_is_null"] & (applied < 0)
    for i in np.flatnonzero(frame.own & ((placeholders < 0) | applied_negative)):
        column = "sched_num_output_placeholders" if placeholders[i] < 0 else "apply_num_output_placeholders"
        yield chk.finding(
            frame, "S1-placeholders-nonnegative", i, "num_output_placeholders", None, int(c[column][i]), column=column
        )


def check_placeholder_count(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S2 (async only): placeholders = 1 + draft slots for each step in flight (not prefill chunks)."""
    if not chk.is_async:
        return
    c = frame.c
    placeholders = c["sched_num_output_placeholders"]
    expected = np.zeros(frame.size, dtype=np.int64)
    for lag in range(1, LOOKBACK + 1):
        counted = frame.flying[lag - 1] & ~frame.at("sched_is_prefill_chunk", lag)
        expected += np.where(counted, 1 + frame.at("sched_num_draft_slots", lag), 0)
    status, kind = c["sched_status"], c["sched_kind"]
    drained = (status == PREEMPTED) | ((status == WAITING) & (kind == UNSCHEDULED))
    expected = np.where(drained & (placeholders == 0), 0, expected)
    eligible = (status != FINISHED) & ~c["sched_preempted"]
    violated = eligible & (placeholders != expected) & (placeholders >= 0)
    for i in chk.first_per_request("S2-placeholder-count", frame, violated):
        yield chk.finding(
            frame,
            "S2-placeholder-count",
            i,
            "num_output_placeholders",
            int(expected[i]),
            int(placeholders[i]),
            steps_in_flight=tuple(frame.flying_steps(i, non_chunk_only=True)),
        )


def check_decode_identity(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S4: num_tokens + placeholders - num_computed_tokens is 1 for a decoding request (never below 1)."""
    c = frame.c
    scheduled, preempted, chunk = c["sched_num_scheduled_tokens"], c["sched_preempted"], c["sched_is_prefill_chunk"]
    # Is the request decoding before each row? Set by its last row that scheduled tokens (a
    # final chunk or a decode: yes; a non-final prefill chunk: no), cleared by a preemption;
    # carried across frames per request.
    own = frame.own_by_request()
    reqs = c["request"][own]
    pos = np.arange(len(own))
    starts = np.r_[True, reqs[1:] != reqs[:-1]] if len(own) else np.zeros(0, dtype=bool)
    event = (scheduled[own] > 0) | preempted[own]
    state = ~preempted[own] & ~chunk[own]
    last_event = np.maximum.accumulate(np.where(event, pos, -1)) if len(own) else pos
    before = np.r_[-1, last_event[:-1]] if len(own) else pos
    segment_start = np.maximum.accumulate(np.where(starts, pos, 0)) if len(own) else pos
    seen = before >= segment_start
    decoding = np.zeros(frame.size, dtype=bool)
    decoding[own] = np.where(seen, state[np.maximum(before, 0)], chk.decoding[reqs])
    ends = np.r_[starts[1:], True] if len(own) else starts
    settled = ends & (last_event >= segment_start)
    chk.decoding[reqs[settled]] = state[last_event[settled]]

    tokens, placeholders, computed = (
        c["sched_num_tokens"],
        c["sched_num_output_placeholders"],
        c["sched_num_computed_tokens"],
    )
    gap = tokens + placeholders - computed
    kind = c["sched_kind"]
    eligible = (c["sched_status"] == RUNNING) & ~preempted & (kind != NEW) & (kind != RESUMED)
    violated = eligible & ((gap < 1) | (decoding & (gap != 1)))
    for i in chk.first_per_request("S4-decode-identity", frame, violated):
        yield chk.finding(
            frame,
            "S4-decode-identity",
            i,
            "num_tokens + placeholders - num_computed_tokens",
            1,
            int(gap[i]),
            sched_num_tokens=int(tokens[i]),
            sched_num_output_placeholders=int(placeholders[i]),
            sched_num_computed_tokens=int(computed[i]),
            decoding=bool(decoding[i]),
        )


def rejected_in_flight(frame: Frame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the draft rejections of the request's steps in flight when its step was
    scheduled (the scheduler takes them off C only when it applies those outputs), and whether
    one of them is unknown (an output in flight never applied: aborted, finished, a crash)."""
    rejected = np.zeros(frame.size, dtype=np.int64)
    unknown = np.zeros(frame.size, dtype=bool)
    for lag in range(1, LOOKBACK + 1):
        flying = frame.flying[lag - 1]
        unknown |= flying & frame.at("apply_num_rejected_is_null", lag)
        rejected += np.where(flying, frame.at("apply_num_rejected", lag), 0)
    return rejected, unknown


def check_computed_tokens(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S3 (the scheduler's count, once its in-flight rejections are off, against the KV truth)
    and X2 (the worker's count against the scheduler's; the worker's first position against the
    truth and against its own count)."""
    c = frame.c
    rejected, unknown = rejected_in_flight(frame)
    computed = c["sched_num_computed_tokens"]
    eligible = (c["sched_num_scheduled_tokens"] > 0) & ~c["worker_num_computed_tokens_is_null"] & ~unknown
    settled = computed - rejected
    worker, position, truth = (
        c["worker_num_computed_tokens"],
        c["worker_first_position"],
        c["truth_num_computed_tokens"],
    )
    has_truth = ~c["truth_num_computed_tokens_is_null"]
    for i in chk.first_per_request("S3-scheduler-computed-tokens", frame, eligible & has_truth & (settled != truth)):
        yield chk.finding(
            frame,
            "S3-scheduler-computed-tokens",
            i,
            "num_computed_tokens",
            int(truth[i]),
            int(settled[i]),
            sched_num_computed_tokens=int(computed[i]),
            rejected_in_flight=int(rejected[i]),
        )
    for i in chk.first_per_request("X2-sched-worker-computed", frame, eligible & (worker != settled)):
        yield chk.finding(
            frame,
            "X2-sched-worker-computed",
            i,
            "num_computed_tokens",
            int(settled[i]),
            int(worker[i]),
            sched_num_computed_tokens=int(computed[i]),
            rejected_in_flight=int(rejected[i]),
        )
    # The position codes need the position (a row's worker group filled without it: none to judge).
    placed = eligible & ~c["worker_first_position_is_null"]
    for i in chk.first_per_request("X2-worker-kv-position", frame, placed & has_truth & (position != truth)):
        yield chk.finding(
            frame,
            "X2-worker-kv-position",
            i,
            "num_computed_tokens",
            int(truth[i]),
            int(position[i]),
            sched_num_computed_tokens=int(computed[i]),
        )
    for i in chk.first_per_request("X2-worker-position-mismatch", frame, placed & (position != worker)):
        yield chk.finding(
            frame, "X2-worker-position-mismatch", i, "num_computed_tokens", int(position[i]), int(worker[i])
        )


def check_output_length(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """X3 (async only): the worker's output tokens = the scheduler's applied outputs + placeholders."""
    if not chk.is_async:
        return
    c = frame.c
    outputs, placeholders = c["sched_num_output_tokens"], c["sched_num_output_placeholders"]
    held = c["worker_num_output_tokens"]
    expected = outputs + placeholders
    violated = ~c["worker_num_output_tokens_is_null"] & (c["sched_num_scheduled_tokens"] > 0) & (held != expected)
    for i in chk.first_per_request("X3-output-length", frame, violated):
        yield chk.finding(
            frame,
            "X3-output-length",
            i,
            "num_output_tokens",
            int(expected[i]),
            int(held[i]),
            sched_num_output_tokens=int(outputs[i]),
            sched_num_output_placeholders=int(placeholders[i]),
        )


def check_in_flight_tokens(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """L3: vLLM counts in-flight and stale outputs in scheduled tokens (a prefill chunk, or 1 +
    draft slots), per step, drained in schedule order."""
    c = frame.c
    cuts = c["cuts"]
    in_flight = np.zeros(frame.size, dtype=np.int64)
    stale = np.zeros(frame.size, dtype=np.int64)
    # The counters are read before schedule(): a preemption by this very schedule() is not in them.
    cuts_before = cuts - c["sched_preempted"]
    for lag in range(1, LOOKBACK + 1):
        pending, before = frame.pending[lag - 1], frame.at("sched_num_scheduled_tokens", lag)
        in_flight += np.where(pending, before, 0)
        stale += np.where(pending & (frame.at("cuts", lag) < cuts_before), before, 0)
    counted_in_flight, counted_stale = c["sched_num_in_flight_tokens"], c["sched_num_stale_output_tokens"]
    eligible = c["sched_status"] != FINISHED
    violated = eligible & ((counted_in_flight != in_flight) | (counted_stale != stale))
    for i in chk.first_per_request("L3-in-flight-tokens", frame, violated):
        if counted_in_flight[i] != in_flight[i]:
            yield chk.finding(
                frame, "L3-in-flight-tokens", i, "num_in_flight_tokens", int(in_flight[i]), int(counted_in_flight[i])
            )
        else:
            yield chk.finding(
                frame, "L3-in-flight-tokens", i, "num_stale_output_tokens", int(stale[i]), int(counted_stale[i])
            )
