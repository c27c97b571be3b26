"""Preemption: a request is preempted for KV blocks only when the step needs a block it lacks,
and a preemption gives its blocks back where the allocation that preempted it can use them.

Codes: S10 and S11 (warnings: no token is wrong, but the preempted request's KV is thrown away and
prefilled again, for nothing). Vectorised over a frame's columns (frames.py); the message text is
in the catalogue.

S10 (`check_needless_preemption`, below): a step that preempts while no request needed a block.

The rule is vLLM 0.32.0's preemption (vllm/v1/core/sched/scheduler.py, `schedule`, the
`while True` loop around `allocate_slots` in the running-queue visit; the reference's
`allocate_or_preempt`): a running request R is preempted, or R preempts others from the back of
the running queue, only when `allocate_slots` fails for R, and for one KV cache group of full
attention it fails only when R needs blocks it does not hold:

    ceil(min(C + n + lookahead, max_model_len) / block_size) > blocks R holds

with C and n R's counters at this schedule() (pre C; n the tokens it is given). The trace
records no block counts, so what a request holds is bounded from below by what it has run:
every step since its last cut (a preemption, a cache reset; a streaming turn keeps its blocks)
allocated for `C + n + lookahead` of the row, and blocks are kept until the cut. So a request
surely needs no block at step m when

    ceil(min(C + n + lookahead, L) / bs) <= ceil(min(E + lookahead, L) / bs)

where E is the largest `C + n` of its earlier rows since the last cut (no earlier row: it holds
nothing, and any step of it needs a block). R is a request the step schedules, or one it
preempts; for the latter n is not recorded (it got none), and its demand is bounded from above
by what the running visit would give it before any cap, `T + len(spec) + P - C`. A step that
preempts while none of these requests needs a block preempted for nothing: S10 at each request
it preempted (allocation never fails there, so upstream never does this).

Worked example, block size 16, no lookahead: requests a and b decode at C = 20 and 24 (each
ran a 20-token prefill, b four decode steps more: E = 24, 2 blocks held) with one token each:
C + n = 21 and 25 fit the 2 blocks they hold; a step that preempts b there freed 2 blocks no
request of the step needed. What a preemption gains when some request did need a block (the
free pool) is not recorded: such a step is never flagged. A run whose preemptions never let it
finish is `E2-run-incomplete`.

S11 (`check_preemption_returns`): vLLM preempts a victim so that the allocation it retries can
take the victim's blocks, and `KVCacheManager.free` puts every block no other request holds back in
the free queue at once (a block shared through the prefix cache stays with its other holders). A
free deferred behind a step in flight (vLLM #45357's fence, with a KV-consumer connector and async
scheduling) gives back nothing this step: preempting such a victim cannot help, the allocation
fails again and the next victim goes, down the running queue (vLLM #49674, vllm-ascend #16315; PR
#49675 stops the loop before a victim whose free would be deferred, as vLLM 0.32.0 does). The
recorder counts, around each preemption inside schedule(), the blocks the victim held alone
(`sched_preempt_blocks_alone`) and the free blocks the pool gained (`sched_preempt_blocks_returned`);
S11 is every preempted request whose preemption returned fewer than it held alone. Null columns (an
older trace, SGLang's rows, a pool not read) read as 0 and 0: nothing to judge.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import RESET_PREEMPT, Frame

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker

S10 = "S10-needless-preemption"
S11 = "S11-preemption-frees-nothing"


def _blocks(tokens: np.ndarray, lookahead: int, max_model_len: int, block_size: int) -> np.ndarray:
    """The blocks `tokens` (each row's) take with the lookahead slots, capped at max_model_len."""
    return -(-np.minimum(tokens + lookahead, max_model_len) // block_size)


def check_needless_preemption(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S10, at every request preempted at a step where no request it scheduled or preempted
    needed a KV block it did not already hold."""
    block_size = chk.config.block_size
    if not block_size or block_size <= 0:
        return  # the block layout is not recorded: nothing to bound
    lookahead = chk.config.num_lookahead_tokens or 0
    max_model_len = chk.config.max_model_len or (1 << 62)
    c = frame.c
    carried = chk.carried.setdefault(S10, np.zeros(len(chk.names), dtype=np.int64))
    own = frame.own_by_request()
    if not len(own):
        return
    reqs = c["request"][own]
    n = c["sched_num_scheduled_tokens"][own].astype(np.int64)
    computed = c["sched_num_computed_tokens"][own].astype(np.int64)
    preempted = c["sched_preempted"][own]
    reset = c["sched_event"][own] == RESET_PREEMPT  # the blocks went before this row's schedule()
    # E: the largest C + n of the request's earlier rows since its last cut (0: none), carried.
    ext = np.where(n > 0, np.maximum(computed + n, 0), 0)
    starts = np.r_[True, reqs[1:] != reqs[:-1]]
    cut = reset | (np.r_[False, preempted[:-1]] & ~starts)  # a cut before the row
    segment = np.cumsum(starts | cut) - 1
    span = int(ext.max()) + 1
    running_max = np.maximum.accumulate(segment * span + ext) - segment * span  # per segment, inclusive
    before = np.where(starts | cut, 0, np.r_[0, running_max[:-1]])
    # Rows before the request's first cut in the frame continue what earlier frames saw (carried).
    cuts = np.cumsum(cut)
    first = np.flatnonzero(starts)
    continues = cuts == (cuts[first] - cut[first])[np.cumsum(starts) - 1]
    held_ext = np.where(continues, np.maximum(before, carried[reqs]), before)
    last = np.r_[first[1:] - 1, len(own) - 1]
    kept = np.where(continues[last], np.maximum(running_max[last], carried[reqs[last]]), running_max[last])
    carried[reqs[last]] = np.where(preempted[last], 0, kept)
    if not preempted.any():
        return  # the carry is kept; no step of this frame preempted anything to judge
    # Each candidate's need: its own n where scheduled, the visit's uncapped demand where preempted.
    demand = (
        c["sched_num_tokens"][own].astype(np.int64)
        + c["sched_spec_len"][own]
        + c["sched_num_output_placeholders"][own]
        - computed
    )
    wanted = np.where(preempted, np.maximum(n, demand), n)
    held = np.where(held_ext > 0, _blocks(held_ext, lookahead, max_model_len, block_size), 0)
    needs = (n > 0) | preempted
    needs &= _blocks(computed + wanted, lookahead, max_model_len, block_size) > held
    # Per step: one that preempted while no request of it needed a block.
    steps, at = np.unique(c["step"][own], return_inverse=True)
    any_need = np.bincount(at, weights=needs, minlength=len(steps)) > 0
    any_preempted = np.bincount(at, weights=preempted, minlength=len(steps)) > 0
    scheduled = np.bincount(at, weights=n > 0, minlength=len(steps)).astype(np.int64)
    needless = any_preempted & ~any_need
    if not needless.any():
        return
    for k in np.flatnonzero(preempted & needless[at]):
        yield chk.finding(
            frame,
            S10,
            int(own[k]),
            "preempted",
            False,
            True,
            held_blocks=int(held[k]),
            scheduled_requests=int(scheduled[at[k]]),
        )


def check_preemption_returns(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """S11, at every request whose preemption returned fewer blocks to the free pool than it held
    alone: the allocation it was preempted for could not use them."""
    c = frame.c
    own = np.flatnonzero(frame.own)
    alone = c["sched_preempt_blocks_alone"][own]
    returned = c["sched_preempt_blocks_returned"][own]
    preempted = c["sched_preempted"][own]
    kept = np.flatnonzero(preempted & (returned < alone))
    if not len(kept):
        return
    steps = c["step"][own]
    preempted_steps, preempted_counts = np.unique(steps[preempted], return_counts=True)
    per_step = dict(zip(preempted_steps.tolist(), preempted_counts.tolist()))
    for k in kept:
        yield chk.finding(
            frame,
            S11,
            int(own[k]),
            "sched_preempt_blocks_returned",
            int(alone[k]),
            int(returned[k]),
            preempted_in_step=per_step[int(steps[k])],
        )
