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
    # On the output's own row: applied to its own life, and how it was treated.
    paired_here = (
        (c["sched_num_scheduled_tokens"] > 0)
        & ~c["apply_step_is_null"]
        & ~c["apply_life_is_null"]
        & (c["apply_life"] == c["sched_life"])
    )
    as_stale = (outcome == STALE_DELIVERED) | (outcome == DROPPED)
    as_fresh = outcome == APPLIED
    violated = np.zeros(frame.size, dtype=bool)
    culprit = np.full(frame.size, -1, dtype=np.int64)
    for lag in range(LOOKBACK, 0, -1):  # nearest last, so it wins
        # as far back as the context reaches
        paired = (
            frame.own & frame.near[lag - 1] & frame.gather(paired_here, lag) & (frame.at("apply_step", lag) == step)
        )
        stale = cuts > frame.at("cuts", lag)
        wrong = paired & np.where(stale, frame.gather(as_fresh, lag), frame.gather(as_stale, lag))
        violated |= wrong
        culprit = np.where(wrong, frame.back[lag - 1], culprit)
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
