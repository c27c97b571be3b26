"""SGLang's invariants: its scheduler's KV bookkeeping against the worker's writes, across overlap.

Where it sits: inside check, one rule family beside the others; the codes run on SGLang traces
only (runner family `sglang`, catalogue `runners`). Their source, written from SGLang 0.5.23's
own code, is docs/reference.md section 10. Codes:

    G1  kv_committed_len <= kv_allocated_len while the request is not finished (after the
        scheduling, and after process_batch_result)
    G2  kv_committed_len <= the KV-valid prefix the worker wrote (the KV truth), at the end of
        every iteration: the forwards that wrote a committed position have landed by then
    G3  a result processed after its request finished or was retracted changes nothing (#23456)
    G4  a retracted request keeps its outputs, and its next life starts with an extend over
        prompt + those outputs, nothing dropped or spliced in between
    G5  a release keeps (radix insert) no position whose KV only a forward launched after the
        request finished computed (#24590's shape under overlap; a warning: the KV is valid)
    G6  each decode / verify runs with the seq_len the request's latest earlier forward of the
        same life published through the FutureMap
    G7  SGLang's own invariant checker failed (the crash rule's, rules_run.py; which check it
        was is read here: `own_check`)
    G8  the client received at most max_tokens tokens (after the run, from the outcome)
    G9  each token id the client received is the one the worker sampled at that output's position
        (after the run, from the outcome's ids and the rows' sampled ids)
    G10 a streaming session's next turn starts its prefill no later than the KV its forwards
        computed: the session hands on no position that no forward wrote

One SGLang loop iteration is one step, in this order for both loops: the scheduling (a row's
`sched_*` values are the snapshot after it), the forward (`worker_*`, `truth_*`), then the
processing of a result (`apply_*`, written on the row of the batch the result belongs to: the
row itself without overlap, the request's row of the step before under overlap). So a request's
state at the end of iteration m is what the processing in m left (`processed`), else its
scheduling snapshot. Vectorised over a frame's columns (frames.py); the messages are in the catalogue.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import (
    APPLIED,
    DECODE,
    EXTEND,
    FINISHED,
    IGNORED,
    PREEMPTED,
    SKIPPED_FINISHED,
    SKIPPED_RETRACTED,
    STREAM_TURN,
    VERIFY,
    Frame,
)
from specreplay.traces import schema

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def processed(frame: Frame) -> np.ndarray:
    """For each row, the row of the same request whose result was processed in the row's
    iteration: the row itself (no overlap), the row one step before (overlap); -1: none."""
    c = frame.c
    step = c["step"]
    here = ~c["apply_step_is_null"] & (c["apply_step"] == step)
    before = frame.near[0] & ~frame.at("apply_step_is_null", 1) & (frame.at("apply_step", 1) == step)
    return np.where(here, np.arange(frame.size), np.where(before, frame.back[0], -1))


def _at(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`values` at `rows` (-1 rows read row 0: mask them)."""
    return values[np.maximum(rows, 0)]


# ====================================================================== G1
def check_committed_within_allocated(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """G1, first per request: a request not finished commits no more KV than it holds, in the
    scheduling snapshot and after the iteration's processing (a retracted one holds none and
    commits none)."""
    c = frame.c
    live = frame.own & (c["sched_status"] != FINISHED)
    snap = live & ~c["sched_kv_committed_len_is_null"] & (c["sched_kv_committed_len"] > c["sched_kv_allocated_len"])
    proc = processed(frame)
    after = (
        live
        & (proc >= 0)
        & (_at(c["apply_finish_reason"], proc) <= 0)  # a finish releases: allocated 0, committed kept
        & (_at(c["apply_skip_reason"], proc) != SKIPPED_FINISHED)
        & ~_at(c["apply_kv_committed_len_is_null"], proc)
        & (_at(c["apply_kv_committed_len"], proc) > _at(c["apply_kv_allocated_len"], proc))
    )
    for i in chk.first_per_request("G1-committed-past-allocated", frame, snap | after):
        if snap[i]:
            committed, allocated, result_step = c["sched_kv_committed_len"][i], c["sched_kv_allocated_len"][i], None
        else:
            j = int(proc[i])
            committed, allocated = c["apply_kv_committed_len"][j], c["apply_kv_allocated_len"][j]
            result_step = int(c["step"][j])
        yield chk.finding(
            frame,
            "G1-committed-past-allocated",
            i,
            "kv_committed_len",
            int(allocated),
            int(committed),
            result_step=result_step,
            retracted=bool(c["sched_status"][i] == PREEMPTED),
        )


# ====================================================================== G2
def check_committed_within_written(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """G2, first per request: at the end of an iteration, kv_committed_len is at most the KV-valid
    prefix (truth_kv_after of the iteration's forward, or the latest before it where none ran for
    the request). Where the KV truth is broken (truth_kv_ok false) K1 reports it, not this."""
    c = frame.c
    step = c["step"]
    have = ~c["truth_kv_after_is_null"]
    valid = np.where(c["truth_kv_not_ok"], -1, c["truth_kv_after"].astype(np.int64))
    truth = np.where(have, valid, chk.last_before("G2 truth", frame, have, valid))
    truth_step = np.where(have, step, chk.last_before("G2 truth step", frame, have, step))
    proc = processed(frame)
    from_apply = (proc >= 0) & ~_at(c["apply_kv_committed_len_is_null"], proc)
    committed = np.where(from_apply, _at(c["apply_kv_committed_len"], proc), c["sched_kv_committed_len"]).astype(
        np.int64
    )
    known = from_apply | ~c["sched_kv_committed_len_is_null"]
    live = step != (chk.crash_step if chk.crash_step is not None else -1)  # a crash step's forward never landed
    violated = frame.own & known & live & (truth >= 0) & (committed > truth)
    for i in chk.first_per_request("G2-committed-past-written", frame, violated):
        yield chk.finding(
            frame,
            "G2-committed-past-written",
            i,
            "kv_committed_len",
            int(truth[i]),
            int(committed[i]),
            result_step=int(step[proc[i]]) if from_apply[i] else None,
            truth_step=int(truth_step[i]),
        )


# ====================================================================== G3
def check_stale_results(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """G3, first per request: a result processed after its request finished (a processing
    before finished it, or the scheduling of the processing's own iteration released it: an
    aborted chunked prefill) or was retracted (that scheduling retracted it) is skipped, for
    that reason, and its request's kv lengths stay what they were. A finish by an earlier
    processing is judged from the result's own row (its request may have no row left where the
    result is processed: it was released); the others from the processing iteration's row."""
    c = frame.c
    step, rows = c["step"], np.arange(frame.size)
    finish = (c["apply_finish_reason"] > 0) & ~c["apply_step_is_null"]
    finished_at = chk.last_before("G3 finished at", frame, finish, c["apply_step"])
    finished_committed = chk.last_before("G3 committed", frame, finish, c["apply_kv_committed_len"])
    finished_allocated = chk.last_before("G3 allocated", frame, finish, c["apply_kv_allocated_len"])

    def changed(
        result: np.ndarray, reason: int | np.ndarray, committed: np.ndarray, allocated: np.ndarray
    ) -> np.ndarray:
        r = np.maximum(result, 0)
        return (
            (c["apply_outcome"][r] != IGNORED)
            | (c["apply_skip_reason"][r] != reason)
            | (c["apply_kv_committed_len"][r] != committed)
            | (c["apply_kv_allocated_len"][r] != allocated)
        )

    # A: an earlier row's processing finished the request before this row's result came back.
    late = frame.own & ~c["apply_step_is_null"] & ~c["apply_kv_committed_len_is_null"] & (finished_at >= 0)
    late &= c["apply_step"] >= finished_at
    # A streaming session's next turn (a new Req under the id) starts after its turn before finished.
    turn = c["sched_event"] == STREAM_TURN
    turn_start = np.where(turn, step, chk.last_before("G3 turn", frame, turn, step))
    late &= finished_at >= turn_start
    late &= changed(rows, SKIPPED_FINISHED, finished_committed, finished_allocated)
    # B: the scheduling of the iteration that processes the step before's result retracted or
    # released the request.
    proc = processed(frame)
    cut = frame.own & (proc >= 0) & (proc != rows) & ~_at(c["apply_kv_committed_len_is_null"], proc)
    cut &= c["sched_preempted"] | (c["sched_status"] == FINISHED)
    reason = np.where(c["sched_preempted"], SKIPPED_RETRACTED, SKIPPED_FINISHED)
    cut &= changed(proc, reason, c["sched_kv_committed_len"], c["sched_kv_allocated_len"])
    for i in chk.first_per_request("G3-stale-result-applied", frame, late | cut):
        if late[i]:
            j, why, cut_step = i, "finished", int(finished_at[i])
            before = (int(finished_committed[i]), int(finished_allocated[i]))
        else:
            j, why, cut_step = int(proc[i]), ("retracted" if c["sched_preempted"][i] else "finished"), int(step[i])
            before = (int(c["sched_kv_committed_len"][i]), int(c["sched_kv_allocated_len"][i]))
        applied = c["apply_outcome"][j] == APPLIED
        skipped = int(c["apply_skip_reason"][j])
        yield chk.finding(
            frame,
            "G3-stale-result-applied",
            j,
            "apply_outcome",
            "ignored",
            schema.APPLY_OUTCOMES[int(c["apply_outcome"][j])],
            apply_step=int(c["apply_step"][j]),
            reason=why,
            cut_step=cut_step,
            apply_num_tokens=int(c["apply_num_tokens"][j]) if applied else 0,
            apply_skip_reason=schema.APPLY_SKIP_REASONS[skipped] if skipped >= 0 else None,
            kv_before=before,
            kv_after=(int(c["apply_kv_committed_len"][j]), int(c["apply_kv_allocated_len"][j])),
        )


# ====================================================================== G4
def check_retracted_next_life(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """G4, first per request: a retraction keeps the request's outputs (as many as the results
    processed before it appended; none of an input_embeds request's); until its next life
    samples, nothing changes them; that life's first forward is an extend, and the extend that
    samples ends at prompt + those outputs, with kv_committed_len there."""
    c = frame.c
    step = c["step"]
    outputs = c["sched_num_output_tokens"].astype(np.int64)
    # The outputs when the retraction's scheduling started: the snapshot of the step before, plus
    # what the processing of that step appended (its own result, or under overlap the one before).
    appended = np.zeros(frame.size, dtype=np.int64)
    for lag in (1, 2):
        by = frame.near[lag - 1] & (frame.at("apply_step", lag) == step - 1)
        by &= frame.at("apply_outcome", lag) == APPLIED
        appended += np.where(by, frame.at("apply_num_tokens", lag), 0)
    contiguous = frame.near[0] & (frame.at("step", 1) == step - 1)
    kept = np.where(contiguous, frame.at("sched_num_output_tokens", 1) + appended, outputs)
    # A request whose prompt came as embeddings keeps none: SGLang cannot re-prefill embeddings
    # followed by output ids, so reset_for_retract discards them and the next life generates anew.
    if chk.embedded:
        kept = np.where(np.array(chk.is_embedded, dtype=bool)[c["request"]] & c["sched_preempted"], 0, kept)
    retracted = c["sched_preempted"]
    scheduled = c["sched_num_scheduled_tokens"] > 0
    samples = scheduled & ~c["sched_is_prefill_chunk"]
    kept_at = chk.last_before("G4 kept", frame, retracted, kept)
    cut_at = chk.last_before("G4 retracted at", frame, retracted, step)
    sampled_at = chk.last_before("G4 sampled at", frame, samples, step)
    scheduled_at = chk.last_before("G4 scheduled at", frame, scheduled, step)
    waiting = frame.own & (cut_at >= 0) & (cut_at > sampled_at)  # since its retraction, nothing sampled yet
    prompt = c["sched_num_prompt_tokens"].astype(np.int64)
    committed = c["sched_kv_committed_len"]
    fill = c["worker_first_position"].astype(np.int64) + c["worker_num_scheduled_tokens"]
    checks = (
        # (expected, actual, where it fails, what)
        (kept, outputs, frame.own & retracted & contiguous & (outputs != kept), "dropped"),
        (kept_at, outputs, waiting & (outputs != kept_at), "spliced"),
        (
            EXTEND,
            c["step_forward_mode"],
            waiting & scheduled & (scheduled_at < cut_at) & (c["step_forward_mode"] != EXTEND),
            "not_extend",
        ),
        (
            prompt + kept_at,
            fill,
            waiting & samples & ~c["worker_row_is_null"] & (fill != prompt + kept_at),
            "fill",
        ),
        (
            prompt + kept_at,
            committed,
            waiting & samples & ~c["sched_kv_committed_len_is_null"] & (committed != prompt + kept_at),
            "committed",
        ),
    )
    violated = np.zeros(frame.size, dtype=bool)
    for _e, _a, where, _what in checks:
        violated |= where
    for i in chk.first_per_request("G4-retracted-next-life", frame, violated):
        expected, actual, _w, what = next(check for check in checks if check[2][i])
        retracted_at = int(step[i]) if what == "dropped" else int(cut_at[i])
        yield chk.finding(
            frame,
            "G4-retracted-next-life",
            i,
            "forward_mode" if what == "not_extend" else "kv_committed_len" if what == "committed" else "output_ids",
            _plain(expected, i, what == "not_extend"),
            _plain(actual, i, what == "not_extend"),
            reason=what,
            retracted_at=retracted_at,
            outputs_kept=int(kept[i]) if what == "dropped" else int(kept_at[i]),
        )


def _plain(value: int | np.ndarray, i: int, mode: bool) -> int | str:
    """A G4 evidence value at row i (a forward mode by its name)."""
    v = int(value if isinstance(value, int) else value[i])
    return (schema.FORWARD_MODES[v] if v >= 0 else "none") if mode else v


# ====================================================================== G5
def check_overcommit_at_finish(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """G5 (a warning), first per request: a finish whose release inserted into the radix cache
    (checkpointed) keeps no more positions than were valid before the forward the same iteration
    had already launched for the request (under overlap, one step after the finishing result's):
    that forward ran for a request that had finished, and what it wrote is the radix cache's
    only by the overlap's timing. Where the KV truth is broken (truth_kv_ok false) K1 reports it,
    not this."""
    c = frame.c
    proc = processed(frame)
    result = np.where((proc >= 0) & (proc != np.arange(frame.size)), proc, -1)
    r = np.maximum(result, 0)
    released = (result >= 0) & ~c["apply_owned_kv_len_is_null"][r] & (c["apply_release_checkpointed"][r] == 1)
    wasted = frame.own & released & (c["sched_num_scheduled_tokens"] > 0) & ~c["truth_num_computed_tokens_is_null"]
    wasted &= ~c["truth_kv_not_ok"]  # a KV that holds wrong content is K1's, whatever the release keeps
    violated = wasted & (c["apply_owned_kv_len"][r] > c["truth_num_computed_tokens"])
    for i in chk.first_per_request("G5-overcommit-at-finish", frame, violated):
        j = int(result[i])
        # Dated at the wasted forward (row i), where the damage is done: the step that scheduled
        # a decode for a request its in-flight result was already finishing. The result that
        # finished it (row j) and where it was processed are in the facts.
        yield chk.finding(
            frame,
            "G5-overcommit-at-finish",
            int(i),
            "owned_kv_len",
            int(c["truth_num_computed_tokens"][i]),
            int(c["apply_owned_kv_len"][j]),
            result_step=int(c["step"][j]),
            wasted_step=int(c["step"][i]),  # the finding's own step since 0.3; kept for readers of 0.2's JSON until 0.4
            apply_step=int(c["apply_step"][j]),
            finish=schema.FINISH_REASONS[int(c["apply_finish_reason"][j])] if c["apply_finish_reason"][j] >= 0 else "",
        )


# ====================================================================== G6
def check_future_map_order(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """G6, first per request: a decode runs at the seq_len after the one its latest earlier
    forward ran with; a verify (spec v2) at the seq_len that forward published (an extend
    publishes its own, a verify seq_len + accept length), within the request's life (no
    retraction since: G4 holds the re-prefill)."""
    c = frame.c
    step = c["step"]
    ran = ~c["worker_row_is_null"] & ~c["worker_seq_len_is_null"]
    published = np.where(c["worker_new_seq_len_is_null"], c["worker_seq_len"] + 1, c["worker_new_seq_len"])
    expected = chk.last_before("G6 next seq_len", frame, ran, published)
    ran_at = chk.last_before("G6 ran at", frame, ran, step)
    cut_at = chk.last_before("G6 retracted at", frame, c["sched_preempted"], step)
    mode = c["step_forward_mode"]
    reads = frame.own & ran & ((mode == DECODE) | (mode == VERIFY)) & (ran_at >= 0) & (cut_at < ran_at)
    violated = reads & (c["worker_seq_len"] != expected)
    for i in chk.first_per_request("G6-future-map-order", frame, violated):
        yield chk.finding(
            frame,
            "G6-future-map-order",
            i,
            "seq_len",
            int(expected[i]),
            int(c["worker_seq_len"][i]),
            published_step=int(ran_at[i]),
            sched_seq_len=None if c["sched_seq_len_is_null"][i] else int(c["sched_seq_len"][i]),
            verify=bool(mode[i] == VERIFY),
        )


# ====================================================================== G8
def check_delivered_within_max_tokens(_frame: Frame | None, chk: Checker) -> Iterable[Finding]:
    """G8, once per request, after the run: the client received at most the request's
    max_tokens tokens (`max_new_tokens`; the outcome's `engine_output_tokens`, what SGLang's
    output streamer sent). SGLang's scheduler may append more than that to `output_ids` (a verify
    round's accepted run crosses it) and relies on `finished_len` to cut what the client gets: a
    finish that leaves it unset sends everything (0.5.23: an abort taken in the round that crossed
    max_new_tokens, `update_finish_state`'s `to_finish` branch, schedule_batch.py:2011-2014)."""
    received = chk.outcome.engine_output_tokens or {}
    for rid, count in sorted(received.items()):
        limits = chk.limits.get((str(rid), 0), ())
        # A streaming session's turns share the id: its client may receive every turn's max_tokens.
        if not limits or int(count) <= sum(limits):
            continue
        yield chk.run_finding(
            "G8-delivered-past-max-tokens",
            chk.last_step_of(str(rid)),
            str(rid),
            "output_tokens",
            int(sum(limits)),
            int(count),
        )


# ====================================================================== G9
def check_client_received_sampled(_frame: Frame | None, chk: Checker) -> Iterable[Finding]:
    """G9, once per request, after the run: each token id its client received (the outcome's
    `engine_output_ids`, what SGLang's output streamer sent) is, at its output index i, the token
    the worker sampled at position prompt + i (its last sample there: `Checker.sampled`). The
    streamer sends `output_ids_through_stop[send_token_offset:]` and moves the offset; an offset
    that is not moved with the output (reset while the output is kept, or kept while the output
    is discarded and generated anew: #39645's retracted `input_embeds` request) hands the client
    tokens twice, skips some, or splices two generations. A client that received fewer tokens
    than were sampled (an abort, a finish) is no finding here; more than max_tokens is G8's.
    A streaming session's client receives its turns one after another under one id: each turn
    but the last its max_tokens outputs, then the last turn's (`expected_by_client`)."""
    received = chk.outcome.engine_output_ids
    sampled = chk.sampled
    if not received or sampled is None:
        return
    for rid, ids in sorted(received.items()):
        expected = expected_by_client(sampled.get(str(rid), {}), chk.limits.get((str(rid), 0), ()))
        at = next((i for i, t in enumerate(ids) if i >= len(expected) or expected[i] != t), None)
        if at is None:
            continue
        yield chk.run_finding(
            "G9-client-tokens",
            chk.last_step_of(str(rid)),
            str(rid),
            "output_token_ids",
            expected[at] if at < len(expected) else None,
            int(ids[at]),
            output_index=at,
            client_tokens=len(ids),
        )


def expected_by_client(turns: dict[int, dict[int, int]], limits: tuple[int, ...]) -> list[int | None]:
    """What a client should have received, in order: per turn (by prompt length, the order they
    ran in), the token the worker sampled at each output index (None where none was), a turn
    before the last cut at its max_tokens (it finished there: its session went on). Example:
    turns {6: {0: 5, 1: 7}, 9: {0: 2}} with limits (2, 4): [5, 7, 2]."""
    out: list[int | None] = []
    prompts = sorted(turns)
    for n, prompt in enumerate(prompts):
        outputs = turns[prompt]
        last = n == len(prompts) - 1
        if last or n >= len(limits):
            out += [outputs.get(i) for i in range(max(outputs, default=-1) + 1)]
        else:
            out += [outputs.get(i) for i in range(limits[n])]
    return out


# ====================================================================== G10
def check_turn_starts_within_computed(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """G10, first per request: the first forward of a streaming session's next turn (after a
    `stream_turn` row: a new Req on the session's KV record) starts at a position no later than
    the frontier of the request's latest earlier forward (its first position plus the positions it
    kept: every token of an extend or a decode; a verify's bonus and accepted drafts). Past it,
    the turn takes positions as computed that no forward wrote: the session handed on more
    committed KV than there is (a turn that ended on a verify's correction token, whose KV only
    a next round would write). Read from the worker's inputs alone, so it holds on a recording
    without a KV truth; where there is one, K1 reports the content."""
    c = frame.c
    step = c["step"]
    forward = frame.own & ~c["worker_first_position_is_null"] & ~c["worker_num_scheduled_tokens_is_null"]
    first = c["worker_first_position"].astype(np.int64)
    kept = np.where(
        c["worker_num_accepted_is_null"], c["worker_num_scheduled_tokens"], c["worker_num_accepted"] + 1
    ).astype(np.int64)
    frontier = chk.last_before("G10 frontier", frame, forward, first + kept)
    frontier_step = chk.last_before("G10 frontier step", frame, forward, step)
    turn = c["sched_event"] == STREAM_TURN
    turn_at = np.where(turn, step, chk.last_before("G10 turn", frame, turn, step))
    opens = forward & (turn_at >= 0) & (frontier_step < turn_at)  # the turn's first forward
    violated = opens & (frontier >= 0) & (first > frontier)
    for i in chk.first_per_request("G10-turn-past-computed", frame, violated):
        yield chk.finding(
            frame,
            "G10-turn-past-computed",
            i,
            "worker_first_position",
            int(frontier[i]),
            int(first[i]),
            frontier_step=int(frontier_step[i]),
            turn_step=int(turn_at[i]),
        )


# ====================================================================== G7: which of SGLang's own checks failed
@dataclass(frozen=True)
class OwnCheck:
    """One of SGLang 0.5.23's own invariant checks, as its failure reads in a crash's message."""

    name: str  # what it checks, in a few words
    source: str  # where it fails, in SGLang 0.5.23: the file under srt/ and the line
    function: str  # the method that checks (and, for an idle-time check, its caller)
    pattern: str  # how its failure message starts (a regular expression)


#: SGLang's invariant checks the driver turns on (families/sglang/setup.py CHECKS), and their
#: failures: an assert, or (its strict idle mode, on by default) a ValueError.
OWN_CHECKS = (
    OwnCheck(
        "busy-time pool accounting (available + evictable + protected + requests' own = total)",
        "managers/scheduler_components/invariant_checker.py:344",
        "self_check_during_busy",
        r"(AssertionError: )?(Full|SWA) Pool Mem Leak Detected",
    ),
    OwnCheck(
        "0 <= kv_committed_len <= kv_allocated_len <= row width for every request holding KV",
        "managers/scheduler_components/invariant_checker.py:359",
        "_check_kv_page_invariants",
        r"(AssertionError: )?assert 0 <= kv\.kv_committed_len <= kv\.kv_allocated_len",
    ),
    OwnCheck(
        "no KV page both held by a request and in the free pool (use after free)",
        "managers/scheduler_components/invariant_checker.py:420",
        "_check_kv_page_invariants",
        r"(ValueError: )?KV page use-after-free",
    ),
    OwnCheck(
        "no page twice in the free pool (double free)",
        "managers/scheduler_components/invariant_checker.py:408",
        "_check_kv_page_invariants",
        r"(ValueError: )?KV double free",
    ),
    OwnCheck(
        "idle-time req_to_token row accounting (every row free once idle)",
        "managers/scheduler_components/invariant_checker.py:445",
        "_check_req_pool, from scheduler.py:5297 on_idle",
        r"(ValueError: )?req_to_token_pool memory leak detected",
    ),
    OwnCheck(
        "idle-time KV pool accounting (available + evictable = total once idle)",
        "managers/scheduler_components/invariant_checker.py:454",
        "_report_leak, from scheduler.py:5296 on_idle",
        r"(ValueError: )?[\w-]+ memory leak detected",
    ),
)
#: Any other failure raised inside SGLang's invariant checker module (srt/...).
CHECKER_MODULE = "managers/scheduler_components/invariant_checker.py"


def own_check(message: str | None, where: str | None) -> OwnCheck | None:
    """Which of SGLang's own invariant checks a crash's outcome (its message and source line,
    engines/crash.py) is the failure of; None: another crash."""
    text = message or ""
    for check in OWN_CHECKS:
        if re.match(check.pattern, text):
            return check
    if CHECKER_MODULE in text or CHECKER_MODULE in (where or ""):
        return OwnCheck("another check of SGLang's invariant checker", CHECKER_MODULE, "", "")
    return None
