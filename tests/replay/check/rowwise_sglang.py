"""SGLang's invariants (the G codes) stated row by row, for the equivalence test.

The row-by-row statement of replay/check/rules_sglang.py, in the plain style of rowwise_checker.py
(which takes these into its CHECKS): each request's rows in step order, one at a time, the
values an invariant needs from earlier rows kept in locals. G7 is the crash rule's
(rowwise_checker.check_crash). The iteration order the rules assume (scheduling snapshot, forward,
processing of a result written on the row of the batch it belongs to) is the module docstring's
of rules_sglang.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.limits import embedded_prompts

if TYPE_CHECKING:
    from tests.replay.check.rowwise_checker import TraceRows

#: How far back a row can be another row's processed result (rowwise_checker.LOOKBACK).
LOOKBACK = 4


def _f(rows: TraceRows, code: str, i: int, field: str, expected, actual, **detail) -> Finding:
    from tests.replay.check.rowwise_checker import _f as finding

    return finding(rows, code, i, field, expected, actual, **detail)


def _processed(rows: TraceRows, idx: list[int], k: int) -> int | None:
    """The row whose result the iteration of row idx[k] processed: itself, or the request's row before."""
    c = rows.col
    i = idx[k]
    step = c["step"][i]
    if c["apply_step"][i] == step:
        return i
    if k and c["step"][idx[k - 1]] >= step - LOOKBACK and c["apply_step"][idx[k - 1]] == step:
        return idx[k - 1]
    return None


def _n(value) -> int:
    """A count as the checker reads a null one (0)."""
    return 0 if value is None else value


def check_committed_within_allocated(rows: TraceRows) -> Iterator[Finding]:
    """G1: committed <= allocated for a request not finished, after scheduling and after processing."""
    c = rows.col
    for idx in rows.by_request.values():
        for k, i in enumerate(idx):
            if c["sched_status"][i] == "finished":
                continue
            committed, allocated = c["sched_kv_committed_len"][i], _n(c["sched_kv_allocated_len"][i])
            result_step = None
            bad = committed is not None and committed > allocated
            j = _processed(rows, idx, k)
            if not bad and j is not None and c["apply_finish_reason"][j] in (None, ""):
                if c["apply_skip_reason"][j] != "finished" and c["apply_kv_committed_len"][j] is not None:
                    committed, allocated = c["apply_kv_committed_len"][j], _n(c["apply_kv_allocated_len"][j])
                    bad, result_step = committed > allocated, c["step"][j]
            if bad:
                yield _f(
                    rows,
                    "G1-committed-past-allocated",
                    i,
                    "kv_committed_len",
                    allocated,
                    committed,
                    result_step=result_step,
                    retracted=c["sched_status"][i] == "preempted",
                )
                break


def check_committed_within_written(rows: TraceRows) -> Iterator[Finding]:
    """G2: at the end of each iteration, committed <= the KV-valid prefix (the latest truth)."""
    c = rows.col
    for idx in rows.by_request.values():
        truth, truth_step = -1, -1
        for k, i in enumerate(idx):
            if c["truth_kv_after"][i] is not None:
                truth = -1 if c["truth_kv_ok"][i] is False else c["truth_kv_after"][i]
                truth_step = c["step"][i]
            j = _processed(rows, idx, k)
            if j is not None and c["apply_kv_committed_len"][j] is not None:
                committed, result_step = c["apply_kv_committed_len"][j], c["step"][j]
            elif c["sched_kv_committed_len"][i] is not None:
                committed, result_step = c["sched_kv_committed_len"][i], None
            else:
                continue
            if c["step"][i] == rows.crash_step or truth < 0 or committed <= truth:
                continue
            yield _f(
                rows,
                "G2-committed-past-written",
                i,
                "kv_committed_len",
                truth,
                committed,
                result_step=result_step,
                truth_step=truth_step,
            )
            break


def _stale_finding(rows: TraceRows, j: int, why: str, cut_step: int, before: tuple[int, int]) -> Finding:
    c = rows.col
    applied = c["apply_outcome"][j] == "applied"
    return _f(
        rows,
        "G3-stale-result-applied",
        j,
        "apply_outcome",
        "ignored",
        c["apply_outcome"][j],
        apply_step=c["apply_step"][j],
        reason=why,
        cut_step=cut_step,
        apply_num_tokens=_n(c["apply_num_tokens"][j]) if applied else 0,
        apply_skip_reason=c["apply_skip_reason"][j],
        kv_before=before,
        kv_after=(_n(c["apply_kv_committed_len"][j]), _n(c["apply_kv_allocated_len"][j])),
    )


def check_stale_results(rows: TraceRows) -> Iterator[Finding]:
    """G3: a result processed after its request finished or was retracted is skipped and changes nothing."""
    c = rows.col

    def changed(j: int, reason: str, before: tuple[int, int]) -> bool:
        after = (_n(c["apply_kv_committed_len"][j]), _n(c["apply_kv_allocated_len"][j]))
        return c["apply_outcome"][j] != "ignored" or c["apply_skip_reason"][j] != reason or after != before

    for idx in rows.by_request.values():
        finished = None  # (apply step, committed, allocated) of the processing that finished it
        for k, i in enumerate(idx):
            step = c["step"][i]
            if c["sched_event"][i] == "stream_turn":
                finished = None  # a streaming session's next turn: a new Req, after the turn before finished
            if finished is not None and c["apply_step"][i] is not None and c["apply_kv_committed_len"][i] is not None:
                before = (finished[1], finished[2])
                if c["apply_step"][i] >= finished[0] and changed(i, "finished", before):
                    yield _stale_finding(rows, i, "finished", finished[0], before)
                    break
            j = _processed(rows, idx, k)
            cut = c["sched_preempted"][i] or c["sched_status"][i] == "finished"
            if cut and j is not None and j != i and c["apply_kv_committed_len"][j] is not None:
                why = "retracted" if c["sched_preempted"][i] else "finished"
                before = (_n(c["sched_kv_committed_len"][i]), _n(c["sched_kv_allocated_len"][i]))
                if changed(j, why, before):
                    yield _stale_finding(rows, j, why, step, before)
                    break
            if c["apply_finish_reason"][i] not in (None, "") and c["apply_step"][i] is not None:
                finished = (
                    c["apply_step"][i],
                    _n(c["apply_kv_committed_len"][i]),
                    _n(c["apply_kv_allocated_len"][i]),
                )


def check_retracted_next_life(rows: TraceRows) -> Iterator[Finding]:
    """G4: a retraction keeps the outputs, nothing changes them until the next life samples, whose
    first forward is an extend ending at prompt + those outputs, with committed there."""
    c = rows.col
    embedded = embedded_prompts(rows.trace.workload)  # an input_embeds request keeps no output
    for (rid, _life), idx in rows.by_request.items():
        kept_at, cut_at, sampled_at, scheduled_at = 0, -1, -1, -1  # from the request's earlier rows
        for k, i in enumerate(idx):
            step = c["step"][i]
            outputs = c["sched_num_output_tokens"][i]
            prev = idx[k - 1] if k and c["step"][idx[k - 1]] >= step - LOOKBACK else None
            contiguous = prev is not None and c["step"][prev] == step - 1
            kept = outputs
            if contiguous:
                near = [j for j in idx[max(0, k - 2) : k] if c["step"][j] >= step - LOOKBACK]
                appended = sum(
                    _n(c["apply_num_tokens"][j])
                    for j in near
                    if c["apply_step"][j] == step - 1 and c["apply_outcome"][j] == "applied"
                )
                kept = c["sched_num_output_tokens"][prev] + appended
            if rid in embedded and c["sched_preempted"][i]:
                kept = 0
            scheduled = c["sched_num_scheduled_tokens"][i] > 0
            samples = scheduled and not c["sched_is_prefill_chunk"][i]
            waiting = cut_at >= 0 and cut_at > sampled_at
            prompt = c["sched_num_prompt_tokens"][i]
            mode = c["step_forward_mode"][i]
            committed = c["sched_kv_committed_len"][i]
            fill = None
            if c["worker_row"][i] is not None:
                first, n = c["worker_first_position"][i], c["worker_num_scheduled_tokens"][i]
                fill = _n(first) + (-1 if n is None else n)
            found = None
            if c["sched_preempted"][i] and contiguous and outputs != kept:
                found = ("dropped", kept, outputs, "output_ids", step, kept)
            elif waiting and outputs != kept_at:
                found = ("spliced", kept_at, outputs, "output_ids", cut_at, kept_at)
            elif waiting and scheduled and scheduled_at < cut_at and mode != "extend":
                found = ("not_extend", "extend", mode or "none", "forward_mode", cut_at, kept_at)
            elif waiting and samples and fill is not None and fill != prompt + kept_at:
                found = ("fill", prompt + kept_at, fill, "output_ids", cut_at, kept_at)
            elif waiting and samples and committed is not None and committed != prompt + kept_at:
                found = ("committed", prompt + kept_at, committed, "kv_committed_len", cut_at, kept_at)
            if found is not None:
                what, expected, actual, field, retracted_at, outputs_kept = found
                yield _f(
                    rows,
                    "G4-retracted-next-life",
                    i,
                    field,
                    expected,
                    actual,
                    reason=what,
                    retracted_at=retracted_at,
                    outputs_kept=outputs_kept,
                )
                break
            if c["sched_preempted"][i]:
                kept_at, cut_at = kept, step
            if scheduled:
                scheduled_at = step
            if samples:
                sampled_at = step


def check_overcommit_at_finish(rows: TraceRows) -> Iterator[Finding]:
    """G5: a checkpointed release keeps no position valid only after the forward launched at the
    release's iteration for the finished request."""
    c = rows.col
    for idx in rows.by_request.values():
        for k, i in enumerate(idx):
            j = _processed(rows, idx, k)
            if (
                j is None
                or j == i
                or c["apply_owned_kv_len"][j] is None
                or c["apply_release_checkpointed"][j] is not True
            ):
                continue
            truth = c["truth_num_computed_tokens"][i]
            if c["truth_kv_ok"][i] is False:  # wrong KV content: K1's
                continue
            if c["sched_num_scheduled_tokens"][i] > 0 and truth is not None and c["apply_owned_kv_len"][j] > truth:
                yield _f(
                    rows,
                    "G5-overcommit-at-finish",
                    i,  # at the wasted forward's row
                    "owned_kv_len",
                    truth,
                    c["apply_owned_kv_len"][j],
                    result_step=c["step"][j],
                    wasted_step=c["step"][i],
                    apply_step=c["apply_step"][j],
                    finish=c["apply_finish_reason"][j] or "",
                )
                break


def check_future_map_order(rows: TraceRows) -> Iterator[Finding]:
    """G6: a decode runs at its latest forward's seq_len + 1; a verify at the seq_len that forward
    published; within the life (no retraction since that forward)."""
    c = rows.col
    for idx in rows.by_request.values():
        expected, ran_at, cut_at = -1, -1, -1
        for i in idx:
            ran = c["worker_row"][i] is not None and c["worker_seq_len"][i] is not None
            mode = c["step_forward_mode"][i]
            reads = ran and mode in ("decode", "target_verify") and ran_at >= 0 and cut_at < ran_at
            if reads and c["worker_seq_len"][i] != expected:
                yield _f(
                    rows,
                    "G6-future-map-order",
                    i,
                    "seq_len",
                    expected,
                    c["worker_seq_len"][i],
                    published_step=ran_at,
                    sched_seq_len=c["sched_seq_len"][i],
                    verify=mode == "target_verify",
                )
                break
            if ran:
                published = c["worker_new_seq_len"][i]
                expected = c["worker_seq_len"][i] + 1 if published is None else published
                ran_at = c["step"][i]
            if c["sched_preempted"][i]:
                cut_at = c["step"][i]


def _last_row(rows: TraceRows, rid: str) -> tuple[int, int | None]:
    """(the step of `rid`'s last row, its latest life); with no row, the run's last step and None."""
    lives = [life for (name, life) in rows.by_request if name == rid]
    if not lives:
        return rows.trace.outcome.step or 0, None
    return rows.col["step"][rows.by_request[(rid, max(lives))][-1]], max(lives)


#: The G codes' row-by-row statements, by the code that heads each rule (rowwise_checker.CHECKS).
def check_delivered_within_max_tokens(rows: TraceRows) -> Iterator[Finding]:
    """G8: per request the client received (the outcome), no more than its max_tokens, every
    turn's summed for a streaming session; at the step of its last row."""
    from specreplay.replay.check.catalogue import BY_CODE
    from specreplay.replay.check.limits import max_tokens_by_life

    limits = max_tokens_by_life(rows.trace.workload)
    received = rows.trace.outcome.engine_output_tokens or {}
    for rid in sorted(received):
        turns = limits.get((str(rid), 0), ())
        if not turns or received[rid] <= sum(turns):
            continue
        step, life = _last_row(rows, rid)
        yield BY_CODE["G8-delivered-past-max-tokens"].finding(
            step, rid, life, "output_tokens", sum(turns), received[rid]
        )


def check_client_received_sampled(rows: TraceRows) -> Iterator[Finding]:
    """G9: per request, each token id its client received (the outcome) at output index i is the
    token the worker last sampled at position prompt + i (a row's sampled ids sit at P + n - d,
    P + n - d + 1, ...); the first that is not, at the step of its last row. A streaming session's
    client gets its turns in turn order (their prompts grow), each but the last cut at its max_tokens."""
    from specreplay.replay.check.catalogue import BY_CODE
    from specreplay.replay.check.limits import max_tokens_by_life

    received = rows.trace.outcome.engine_output_ids
    if not received:
        return
    limits = max_tokens_by_life(rows.trace.workload)
    table = rows.trace.table.to_pylist()
    for rid in sorted(received):
        by_turn: dict[int, dict[int, int]] = {}
        for row in table:
            where = (row["worker_first_position"], row["worker_num_scheduled_tokens"], row["sched_num_prompt_tokens"])
            if row["request_id"] == rid and row["worker_sampled_ids"] and None not in where:
                start = (
                    row["worker_first_position"]
                    + row["worker_num_scheduled_tokens"]
                    - (row["worker_num_draft_slots"] or 0)
                    - row["sched_num_prompt_tokens"]
                )
                outputs = by_turn.setdefault(row["sched_num_prompt_tokens"], {})
                for j, token in enumerate(row["worker_sampled_ids"]):
                    outputs[start + j] = token
        turns = limits.get((str(rid), 0), ())
        expected: list = []
        for n, prompt in enumerate(sorted(by_turn)):
            outputs = by_turn[prompt]
            if n == len(by_turn) - 1 or n >= len(turns):
                width = max(outputs) + 1 if outputs else 0
            else:
                width = turns[n]
            expected.extend(outputs.get(i) for i in range(width))
        ids = received[rid]
        for i, token in enumerate(ids):
            if i < len(expected) and expected[i] == token:
                continue
            step, life = _last_row(rows, rid)
            yield BY_CODE["G9-client-tokens"].finding(
                step,
                rid,
                life,
                "output_token_ids",
                expected[i] if i < len(expected) else None,
                token,
                output_index=i,
                client_tokens=len(ids),
            )
            break


def check_turn_starts_within_computed(rows: TraceRows) -> Iterator[Finding]:
    """G10: a streaming session turn's first forward starts no later than the end of the KV the
    request's latest earlier forward kept (an extend's or a decode's tokens; a verify's bonus and
    accepted drafts)."""
    c = rows.col
    for idx in rows.by_request.values():
        frontier = frontier_step = None  # the latest forward's end, and its step
        turn_step = None  # the step of the latest stream_turn row
        for i in idx:
            step = c["step"][i]
            if c["sched_event"][i] == "stream_turn":
                turn_step = step
            first, n = c["worker_first_position"][i], c["worker_num_scheduled_tokens"][i]
            if first is None or n is None:
                continue
            opens = turn_step is not None and frontier_step is not None and frontier_step < turn_step
            if opens and first > frontier:
                yield _f(
                    rows,
                    "G10-turn-past-computed",
                    i,
                    "worker_first_position",
                    frontier,
                    first,
                    frontier_step=frontier_step,
                    turn_step=turn_step,
                )
                break
            accepted = c["worker_num_accepted"][i]
            frontier = first + (n if accepted is None else accepted + 1)
            frontier_step = step


CHECKS = {
    "G1-committed-past-allocated": check_committed_within_allocated,
    "G2-committed-past-written": check_committed_within_written,
    "G3-stale-result-applied": check_stale_results,
    "G4-retracted-next-life": check_retracted_next_life,
    "G5-overcommit-at-finish": check_overcommit_at_finish,
    "G6-future-map-order": check_future_map_order,
    "G8-delivered-past-max-tokens": check_delivered_within_max_tokens,
    "G9-client-tokens": check_client_received_sampled,
    "G10-turn-past-computed": check_turn_starts_within_computed,
}
