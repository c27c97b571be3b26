"""Request lives and control events: each output goes to the life it was scheduled for, and an
output in flight across a cut (a preemption, a cache reset, a streaming turn's end) is stale.

Codes: L1 (output life), L2 (stale outputs). L3, the in-flight and stale token counts, is a
counter: rules_counters.py. Vectorised over a frame's columns (frames.py; `cuts` counts each
life's cuts so far); the message texts are in the catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import APPLIED, DROPPED, LOOKBACK, STALE_DELIVERED, Frame
from specreplay.traces import schema

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_output_life(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """L1: an output used (applied, delivered stale or dropped) is given to the life it was scheduled for."""
    c = frame.c
    outcome, life, given_to = c["apply_outcome"], c["sched_life"], c["apply_life"]
    used = (outcome == APPLIED) | (outcome == STALE_DELIVERED) | (outcome == DROPPED)
    violated = used & ~c["apply_life_is_null"] & (given_to != life)
    for i in chk.first_per_request("L1-output-life", frame, violated):
        yield chk.finding(
            frame,
            "L1-output-life",
            i,
            "request life",
            int(life[i]),
            int(given_to[i]),
            apply_step=int(c["apply_step"][i]),
            apply_outcome=schema.APPLY_OUTCOMES[outcome[i]],
            apply_num_tokens=int(c["apply_num_tokens"][i]),
        )


def check_stale_outputs(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """L2, at the row of the step that applied each output: an output scheduled before a cut
    (preemption, cache reset, turn end) of its request and applied after it is stale; any other
    is fresh. Several outputs can land at one step: the nearest wrong one is named."""
    c = frame.c
    step, cuts, outcome = c["step"], c["cuts"], c["apply_outcome"]
    violated = np.zeros(frame.size, dtype=bool)
    culprit = np.full(frame.size, -1, dtype=np.int64)
    for lag in range(LOOKBACK, 0, -1):  # nearest last, so it wins
        r = np.maximum(frame.lags[lag - 1], 0)
        near = (frame.lags[lag - 1] >= 0) & (step[r] >= step - LOOKBACK)  # as far back as the context reaches
        paired = (
            frame.own
            & near
            & (c["sched_num_scheduled_tokens"][r] > 0)
            & ~c["apply_step_is_null"][r]
            & (c["apply_step"][r] == step)
            & ~c["apply_life_is_null"][r]
            & (c["apply_life"][r] == c["sched_life"][r])
        )
        stale = cuts > cuts[r]
        wrong = paired & (
            (~stale & ((outcome[r] == STALE_DELIVERED) | (outcome[r] == DROPPED))) | (stale & (outcome[r] == APPLIED))
        )
        violated |= wrong
        culprit = np.where(wrong, r, culprit)
    for i in chk.first_per_request("L2-stale-output", frame, violated):
        j = int(culprit[i])
        yield chk.finding(
            frame,
            "L2-stale-output",
            i,
            "apply_outcome",
            "stale" if cuts[i] > cuts[j] else "fresh",
            schema.APPLY_OUTCOMES[outcome[j]],
            output_step=int(step[j]),
            apply_num_tokens=int(c["apply_num_tokens"][j]),
            apply_num_rejected=int(c["apply_num_rejected"][j]),
        )
