"""Wasted steps: a request scheduled although the outputs already in flight or applied end it.

Codes: S9 (a warning: no token is wrong, but the step's tokens are booked, executed and thrown
away), X12 (a warning: draft slots verified with padding the drafter never proposed).
Vectorised over a frame's columns (frames.py; `max_tokens` is the life's limit for the row's
turn, read from the trace's workload: limits.py, -1 where not known); the message texts are in
the catalogue.

The rule is vLLM 0.32.0's skip in the running-queue visit (vllm/v1/core/sched/scheduler.py,
`schedule`, the first test of the `while req_index < len(self.running)` loop; the reference's
`running_demand` and models/decisions.py `reaches_max_tokens_in_flight` state it once):

    num_output_placeholders > 0 and
    num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens + max_tokens

C counts the placeholders in flight and C - P = num_tokens - 1 for a decoding request, so this
is num_tokens + 1 >= prompt + max_tokens: the applied outputs plus the one token the step in
flight surely emits (every draft rejected) reach max_tokens, and the request needs no other
step. Worked example, prompt 5, max_tokens 3, no drafts: step 1 is the prefill (token 1),
steps 2 and 3 decode; before step 4's schedule, tokens 1 and 2 are applied and step 3 is in
flight: C = 7, P = 1, and 7 + 2 - 1 = 8 >= 5 + 3. Step 3's token is the third and last, so a
scheduler that books step 4 books it for nothing (its output comes back to a finished request
and is ignored). vLLM skips only in the running
loop, so only rows scheduled from it (cached, re-entering) are held to the rule; a step whose
drafts turn out accepted may still end the request early, which no scheduler can know: that is
not flagged.

The second shape needs no limit: a request scheduled after an output applied before this
schedule() already finished it (a stop token or max_tokens) in the same turn (a streaming
session's next turn starts with a longer prompt: everything computed so far plus the chunk).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import LENGTH, LOOKBACK, NEW, RESUMED, STOP, Frame
from specreplay.traces import schema

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_padding_verified(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """X12: every draft slot a request verifies holds a draft its drafter proposed. When the
    drafter skipped the request after the step before (vLLM skips the whole batch once the longest
    sequence plus k no longer fits max_model_len, and a discarded row gets none) or proposed fewer
    than k, vLLM pads the row with zeros and the scheduler still books, and the worker verifies,
    all k slots: they are rejected (or accepted by chance) at the cost of a draft slot each. First
    per request; the count is the step's unfilled slots (`truth_unfilled_draft_slots`, null where
    the runner does not say what its drafter proposed: vLLM's own)."""
    c = frame.c
    unfilled = c["truth_unfilled_draft_slots"]
    for i in chk.first_per_request("X12-padding-verified", frame, unfilled > 0):
        yield chk.finding(
            frame,
            "X12-padding-verified",
            i,
            "scheduled_spec_decode_tokens",
            0,
            int(unfilled[i]),
        )


def check_wasted_steps(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S9, at every row that books a step for nothing: past max_tokens with the output in
    flight (vLLM's skip rule), or after an applied output already finished the request."""
    c = frame.c
    step, scheduled, kind = c["step"], c["sched_num_scheduled_tokens"], c["sched_kind"]
    computed, placeholders = c["sched_num_computed_tokens"], c["sched_num_output_placeholders"]
    prompt, limit = c["sched_num_prompt_tokens"], c["max_tokens"]
    from_running = (kind != NEW) & (kind != RESUMED)  # vLLM's skip is in the running-queue visit only
    past_max = (
        from_running
        & (limit >= 0)
        & (placeholders > 0)
        & (computed.astype(np.int64) + 2 - placeholders >= prompt.astype(np.int64) + limit)
    )
    # An earlier output of the life, applied before this step's schedule(), ended it (nearest wins).
    ended_by = np.full(frame.size, -1, dtype=np.int64)
    finish = c["apply_finish_reason"]
    finished_here = ~c["apply_step_is_null"] & ((finish == STOP) | (finish == LENGTH))
    for lag in range(LOOKBACK, 0, -1):
        ended = (
            frame.near[lag - 1]
            & frame.gather(finished_here, lag)
            & (frame.at("apply_step", lag) < step)
            & (
                frame.at("sched_num_prompt_tokens", lag) == prompt
            )  # the same turn: a streaming session's next one has a longer prompt
        )
        ended_by = np.where(ended, frame.back[lag - 1], ended_by)
    wasted = frame.own & (scheduled > 0) & (past_max | (ended_by >= 0))
    for i in np.flatnonzero(wasted):
        if past_max[i]:
            yield chk.finding(
                frame,
                "S9-step-past-max-tokens",
                i,
                "num_scheduled_tokens",
                0,
                int(scheduled[i]),
                reason="max_tokens",
                max_tokens=int(limit[i]),
                sched_num_computed_tokens=int(computed[i]),
                sched_num_output_placeholders=int(placeholders[i]),
                sched_num_prompt_tokens=int(prompt[i]),
            )
        else:
            j = int(ended_by[i])
            yield chk.finding(
                frame,
                "S9-step-past-max-tokens",
                i,
                "num_scheduled_tokens",
                0,
                int(scheduled[i]),
                reason="finished",
                output_step=int(step[j]),
                apply_step=int(c["apply_step"][j]),
                apply_finish_reason=schema.FINISH_REASONS[finish[j]],
            )
