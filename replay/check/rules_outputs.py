"""Outputs applied: what update_from_output took from each output against what the worker emitted.

Code: S8 (a token lost at the step it is lost). Vectorised over a frame's columns (frames.py);
the message text is in the catalogue.

The worker emits 1 + accepted drafts for a request that samples (`worker_num_emitted`; 0 for a
non-final prefill chunk, whose sample is discarded). update_from_output appends them all
(`apply_num_tokens`) unless it has reason to cut: the request finished at this output (a stop
token, max_tokens or max_model_len: vLLM cuts the list after the finishing token, and the apply
says so in `apply_finish_reason`). An output applied fresh (`apply_outcome` applied) with fewer
tokens than the worker emitted, and no finish, lost the rest: the request's next step starts
from the wrong position and the wrong-token check (T1) sees it only at the output after. Three
steps: the worker emits 3 tokens at step 4 (2 drafts accepted); update_from_output, at step 5,
appends 1 and finishes nothing -> S8 at step 4, request r (the step whose tokens were lost);
T1 at step 5, the first output computed from the wrong position.

How it pairs an output with its apply is L2's way (rules_lives.py): from the row of the step
whose iteration applied it (`apply_step`), looking back; the finding goes to the output's own
row. What L2 judges stays L2's: an output stale by the checker's count (a cut between its
schedule and its apply) is not held to this rule, and outputs not applied fresh
(stale-delivered, dropped, ignored, given to another life) neither: L1 and L2 say what is
wrong with those.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import APPLIED, LENGTH, LOOKBACK, STOP, Frame

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_tokens_applied(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S8, first per request: a fresh output applied with fewer tokens than the worker emitted
    for it, and no finish to cut it. Outputs applied in the iteration of their own step (sync
    scheduling, or the last batch drained) pair with the row itself."""
    c = frame.c
    step, cuts = c["step"], c["cuts"]
    applied, emitted, finish = c["apply_num_tokens"], c["worker_num_emitted"], c["apply_finish_reason"]
    # What can be judged on the output's own row: a fresh apply to its own life, of fewer tokens
    # than the worker emitted, with no finish to cut them. Gathered once per lag below.
    short = (
        (c["sched_num_scheduled_tokens"] > 0)
        & ~c["apply_step_is_null"]
        & (c["apply_outcome"] == APPLIED)
        & ~c["apply_life_is_null"]
        & (c["apply_life"] == c["sched_life"])
        & ~c["worker_num_emitted_is_null"]
        & (finish != STOP)
        & (finish != LENGTH)
        & (applied < emitted)
    )
    violated = np.zeros(frame.size, dtype=bool)
    culprit = np.full(frame.size, -1, dtype=np.int64)
    rows = np.arange(frame.size)
    for lag in range(LOOKBACK, -1, -1):  # nearest last, so it wins; lag 0: the row itself
        lost = (
            frame.own
            & frame.gather(short, lag)
            & (frame.at("apply_step", lag) == step)
            & (frame.at("cuts", lag) == cuts)  # fresh: no cut since it was scheduled (else L2's to judge)
        )
        if lag:
            lost &= frame.near[lag - 1]
        violated |= lost
        culprit = np.where(lost, rows if lag == 0 else frame.back[lag - 1], culprit)
    for i in chk.first_per_request("S8-token-lost", frame, violated):
        j = int(culprit[i])  # the finding names the step whose output lost tokens (maybe a context row)
        yield chk.finding(
            frame,
            "S8-token-lost",
            j,
            "output_token_ids",
            int(emitted[j]),
            int(applied[j]),
            apply_step=int(step[i]),
            sched_num_scheduled_tokens=int(c["sched_num_scheduled_tokens"][j]),
        )
