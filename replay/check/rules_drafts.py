"""Speculative decoding's draft slots: where they come from, how many the counters allow, and
what the worker verifies in them.

Codes: S5 (draft provenance), S7 (draft slot count), X5 (draft inputs with nothing cached
behind them, or negative ids). Vectorised over a frame's columns (frames.py); the message texts
are in the catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import NEW, RESUMED, Frame

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_draft_provenance(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S5 (async only): draft slots only for a request whose previous schedule() ran a step of it
    that proposes drafts (scheduled, not a non-final prefill chunk, not empty; not resuming)."""
    if not chk.is_async:
        return  # sync drafts are real ids from the worker, valid while the request waits
    c = frame.c
    step, slots = c["step"], c["sched_num_draft_slots"]
    # The previous schedule() call is the previous step the trace has (a pause leaves steps out);
    # the frame's context holds the last LOOKBACK of them.
    steps = np.unique(step)
    at = np.searchsorted(steps, step)
    last = np.where(at > 0, steps[np.maximum(at - 1, 0)], 0)
    has_prev = frame.lags[0] >= 0
    not_scheduled = ~has_prev | (frame.at("step", 1) != last) | (frame.at("sched_num_scheduled_tokens", 1) == 0)
    chunk = ~not_scheduled & frame.at("sched_is_prefill_chunk", 1)
    resumed = ~not_scheduled & ~chunk & (c["sched_kind"] == RESUMED)
    empty = ~not_scheduled & ~chunk & ~resumed & (frame.at("step_total_scheduled_tokens", 1) == 0)
    for i in np.flatnonzero(frame.own & (slots > 0) & (not_scheduled | chunk | resumed | empty)):
        reason = (
            "not_scheduled"
            if not_scheduled[i]
            else "prefill_chunk"
            if chunk[i]
            else "resumed"
            if resumed[i]
            else "empty_step"
        )
        yield chk.finding(
            frame,
            "S5-draft-provenance",
            i,
            "scheduled_spec_decode_tokens",
            0,
            int(slots[i]),
            previous_step=int(last[i]),
            reason=reason,
        )


def check_draft_slot_count(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S7: k = max(0, min(len(spec), n + C - T - P)); an admission (new, resumed) has no drafts
    unless vLLM padded a 1-token admission to 1 + num_spec_tokens."""
    c = frame.c
    width = chk.config.num_spec_tokens if chk.config.num_spec_tokens is not None else 0
    scheduled, slots = c["sched_num_scheduled_tokens"], c["sched_num_draft_slots"]
    computed, tokens, kind = c["sched_num_computed_tokens"], c["sched_num_tokens"], c["sched_kind"]
    # Only drafts from the waiting path: vLLM pads a 1-token admission to 1 + k tokens.
    admitted = (kind == NEW) | (kind == RESUMED)
    padded = bool(width) & (tokens - computed == 1) & (scheduled == 1 + width)
    room = scheduled + computed - tokens - c["sched_num_output_placeholders"]
    expected = np.where(admitted, np.where(padded, width, 0), np.maximum(0, np.minimum(c["sched_spec_len"], room)))
    for i in np.flatnonzero(frame.own & (scheduled > 0) & (slots != expected)):
        yield chk.finding(
            frame,
            "S7-draft-slot-count",
            i,
            "num_draft_slots",
            int(expected[i]),
            int(slots[i]),
            sched_num_scheduled_tokens=int(scheduled[i]),
        )


def check_draft_inputs(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """X5: the drafts the worker verifies are drafts it cached for the request (async), and none
    is negative (a -1 placeholder is clamped to 0 for the embedding, then rejected)."""
    c = frame.c
    drafts, negative, cached = c["worker_num_draft_ids"], c["worker_num_negative_draft_ids"], c["worker_cached_drafts"]
    # No V1 cache count on the row (V1's worker group null): only the negative ids can be judged.
    known = ~c["worker_cached_drafts_is_null"]
    violated = (drafts > 0) & ((negative > 0) | (chk.is_async & known & (cached == 0)))
    for i in np.flatnonzero(frame.own & violated):
        yield chk.finding(
            frame,
            "X5-placeholder-drafts",
            i,
            "draft_token_ids",
            int(cached[i]) if known[i] else None,
            int(drafts[i]),
            worker_num_negative_draft_ids=int(negative[i]),
        )
