"""The invariants stated row by row: the executable specification of replay/checker.py.

specreplay's checker (replay/checker.py) is vectorised and streams a trace by row groups; this
module states every invariant the plain way, one row at a time over the whole trace, and
tests/replay/test_checker_equivalence.py holds the two to the same findings. It is the checker
specreplay 0.1 shipped (too slow for long traces: about 60x the time to read the trace).

Where it sits: tests, beside traces -> replay -> **diff**. `check_trace` reads only the trace's table and
metadata, so it works on any trace, whatever recorded it. Each invariant is one function below
with a stable code, a severity and the reference section it comes from
(../shared/reference/vllm-async-spec-state.md, section 4.2). A violated invariant of the
implementation under test is a finding, never an exception.

Severity: error = the views or the ground truth disagree, a token is lost, duplicated or wrong,
or a negative id reaches the model; warning = work is wasted (draft slots verified with nothing
behind them, tokens executed that the scheduler did not book).
"""

from __future__ import annotations

from typing import Callable, Iterator

# Severities and the order of findings within a step and request are the product's own: what is
# stated here is the rules, not their presentation.
from specreplay.replay.check.checker import _RANK, INVARIANTS, SEVERITY, incomplete_findings
from specreplay.replay.check.findings import Finding
from specreplay.traces.trace import Trace

_NEEDED = (
    "step", "request_id", "step_total_scheduled_tokens", "sched_status", "sched_kind",
    "sched_num_scheduled_tokens", "sched_num_draft_slots", "sched_num_computed_tokens",
    "sched_num_output_placeholders", "sched_num_tokens", "sched_num_output_tokens",
    "sched_spec_len", "sched_is_prefill_chunk", "sched_preempted", "apply_step",
    "apply_num_scheduled_tokens", "apply_num_draft_slots", "apply_num_rejected", "apply_num_tokens", "apply_token_mismatches",
    "apply_num_output_placeholders", "worker_row", "worker_num_scheduled_tokens",
    "worker_num_draft_slots", "worker_num_computed_tokens", "worker_first_position",
    "worker_cached_drafts", "worker_draft_ids", "worker_num_output_tokens", "worker_num_emitted",
    "worker_in_prev_map", "truth_num_computed_tokens", "truth_kv_ok", "sched_life", "sched_event",
    "sched_num_in_flight_tokens", "sched_num_stale_output_tokens", "apply_outcome", "apply_life",
)


class TraceRows:
    """Column lists of a trace plus per-request row indexes in step order."""

    def __init__(self, trace: Trace) -> None:
        table = trace.table
        self.trace = trace
        self.config = trace.config
        self.col = {name: table[name].to_pylist() for name in _NEEDED}
        self.num_rows = table.num_rows
        # One entry per request life: a resubmitted id is another request to the invariants.
        self.by_request: dict[tuple[str, int], list[int]] = {}
        for i, (rid, life) in enumerate(zip(self.col["request_id"], self.col["sched_life"])):
            self.by_request.setdefault((rid, life), []).append(i)
        # Per row: cuts (a preemption, a cache reset, a streaming turn's end) of its request life so far.
        self.epoch = [0] * self.num_rows
        for idx in self.by_request.values():
            cuts = 0
            for i in idx:
                cuts += self.col["sched_preempted"][i] or self.col["sched_event"][i] in ("reset_preempt", "stream_turn")
                self.epoch[i] = cuts
        self.is_async = bool(self.config.get("async_scheduling", True))
        self.crash_step = trace.outcome.get("step") if trace.outcome.get("status") == "crashed" else None

    def __getitem__(self, name: str) -> list:
        return self.col[name]

    def scheduled(self, i: int) -> bool:
        return self.col["sched_num_scheduled_tokens"][i] > 0

    def in_flight(self, rows: list[int], upto: int) -> list[int]:
        """Rows of one request's earlier steps whose output was not applied when schedule() of
        row `upto`'s step ran, and that were not superseded by a preemption since. `rows` are
        the request's row indexes in step order and `upto` is one of them. With at most two
        batches in flight only the last few steps can qualify, so the scan looks back
        `LOOKBACK` steps (constant work per row, not the request's whole history)."""
        c = self.col
        step = c["step"][upto]
        out = []
        k = self._position(rows, upto) - 1
        later = upto
        while k >= 0:
            j = rows[k]
            sj = c["step"][j]
            if sj < step - LOOKBACK or c["sched_preempted"][j] or c["sched_event"][later] in ("reset_preempt", "stream_turn"):
                break
            later = j
            applied = c["apply_step"][j]
            if c["sched_num_scheduled_tokens"][j] and (applied is None or applied >= step):
                out.append(j)
            k -= 1
        out.reverse()
        return out

    def _position(self, rows: list[int], row: int) -> int:
        # rows is sorted (row indexes grow with steps): bisect instead of list.index
        from bisect import bisect_left

        return bisect_left(rows, row)


#: How many steps back an unapplied output can be in flight (two batches, plus slack for
#: empty steps, which the engine pops without a forward).
LOOKBACK = 4


def _f(rows: TraceRows, code: str, i: int, field: str, sched, worker, message: str) -> Finding:
    return Finding(code, SEVERITY[code], rows["step"][i], rows["request_id"][i], field, sched, worker, message)


# ------------------------------------------------------------------ scheduler-internal
def check_placeholders_nonnegative(rows: TraceRows) -> Iterator[Finding]:
    for i in range(rows.num_rows):
        for name in ("sched_num_output_placeholders", "apply_num_output_placeholders"):
            value = rows[name][i]
            if value is not None and value < 0:
                yield _f(rows, "S1-placeholders-nonnegative", i, "num_output_placeholders", value, None,
                         f"num_output_placeholders went negative ({value}); vLLM asserts and the engine dies")
                break


def check_placeholder_count(rows: TraceRows) -> Iterator[Finding]:
    if not rows.is_async:
        return
    c = rows.col
    for rid, idx in rows.by_request.items():
        for i in idx:
            if c["sched_status"][i] == "finished" or c["sched_preempted"][i]:
                continue
            flying = [j for j in rows.in_flight(idx, i) if not c["sched_is_prefill_chunk"][j]]
            expected = sum(1 + c["sched_num_draft_slots"][j] for j in flying)
            if c["sched_status"][i] == "preempted" or (c["sched_status"][i] == "waiting" and c["sched_kind"][i] == "unscheduled"):
                expected = 0 if c["sched_num_output_placeholders"][i] == 0 else expected
            got = c["sched_num_output_placeholders"][i]
            if got != expected and got >= 0:
                yield _f(rows, "S2-placeholder-count", i, "num_output_placeholders", got, expected,
                         f"num_output_placeholders is {got} but the steps in flight "
                         f"({', '.join(str(c['step'][j]) for j in flying) or 'none'}) account for {expected}")
                break


def check_decode_identity(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for rid, idx in rows.by_request.items():
        decoding = False
        for i in idx:
            if c["sched_status"][i] in ("running",) and not c["sched_preempted"][i] and c["sched_kind"][i] not in ("new", "resumed"):
                gap = c["sched_num_tokens"][i] + c["sched_num_output_placeholders"][i] - c["sched_num_computed_tokens"][i]
                if gap < 1 or (decoding and gap != 1):
                    yield _f(rows, "S4-decode-identity", i, "num_tokens + placeholders - num_computed_tokens",
                             gap, 1, f"num_tokens + num_output_placeholders - num_computed_tokens is {gap}, "
                             "expected 1 for a decoding request (its next demand is wrong)")
                    break
            if c["sched_num_scheduled_tokens"][i] > 0:
                decoding = not c["sched_is_prefill_chunk"][i]
            if c["sched_preempted"][i]:
                decoding = False


def check_draft_provenance(rows: TraceRows) -> Iterator[Finding]:
    if not rows.is_async:
        return  # sync drafts are real ids from the worker, valid while the request waits
    c = rows.col
    # The previous schedule() call: the previous step the trace has (a pause leaves steps out).
    steps = sorted(set(c["step"]))
    before = {s: (steps[n - 1] if n else 0) for n, s in enumerate(steps)}
    for rid, idx in rows.by_request.items():
        prev = None
        for i in idx:
            k = c["sched_num_draft_slots"][i]
            if k > 0:
                step = c["step"][i]
                last = before[step]
                why = None
                if prev is None or c["step"][prev] != last or c["sched_num_scheduled_tokens"][prev] == 0:
                    why = f"it was not scheduled at step {last}, so the worker holds no drafts for it"
                elif c["sched_is_prefill_chunk"][prev]:
                    why = f"its step {last} was a non-final prefill chunk, which proposes no drafts"
                elif c["sched_kind"][i] == "resumed":
                    why = "it resumes from preemption"
                elif c["step_total_scheduled_tokens"][prev] == 0:
                    why = f"step {last} was empty"
                if why:
                    yield _f(rows, "S5-draft-provenance", i, "scheduled_spec_decode_tokens", k, 0,
                             f"scheduled {k} draft slots with no drafts behind them: {why} "
                             "(stale -1 placeholders; the slots are verified and wasted)")
            prev = i


def check_budget(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    budget = rows.config.get("max_num_batched_tokens", 1 << 30)
    max_len = rows.config.get("max_model_len", 1 << 30)
    totals: dict[int, int] = {}
    for i in range(rows.num_rows):
        s = c["step"][i]
        totals[s] = totals.get(s, 0) + c["sched_num_scheduled_tokens"][i]
        n = c["sched_num_scheduled_tokens"][i]
        if n and c["sched_num_computed_tokens"][i] + n > max_len - 1:
            yield _f(rows, "S6-token-budget", i, "num_scheduled_tokens", n, max_len - c["sched_num_computed_tokens"][i] - 1,
                     f"schedules past max_model_len {max_len}")
    reported: set[int] = set()
    for i in range(rows.num_rows):
        s = c["step"][i]
        declared = c["step_total_scheduled_tokens"][i]
        if s not in reported and (declared != totals[s] or declared > budget):
            reported.add(s)
            yield Finding("S6-token-budget", "error", s, None, "total_num_scheduled_tokens", declared, totals[s],
                          f"total_num_scheduled_tokens is {declared}; the requests add up to {totals[s]}; "
                          f"budget {budget}")


def check_draft_slot_count(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    width = rows.config.get("num_spec_tokens", 0)
    for i in range(rows.num_rows):
        n = c["sched_num_scheduled_tokens"][i]
        if not n:
            continue
        k = c["sched_num_draft_slots"][i]
        if c["sched_kind"][i] in ("new", "resumed"):
            # Only drafts from the waiting path: vLLM pads a 1-token admission to 1 + k tokens.
            need = c["sched_num_tokens"][i] - c["sched_num_computed_tokens"][i]
            expected = width if (width and need == 1 and n == 1 + width) else 0
        else:
            room = n + c["sched_num_computed_tokens"][i] - c["sched_num_tokens"][i] - c["sched_num_output_placeholders"][i]
            expected = max(0, min(c["sched_spec_len"][i], room))
        if k != expected:
            yield _f(rows, "S7-draft-slot-count", i, "num_draft_slots", k, expected,
                     f"{k} draft slots scheduled inside {n} tokens; the counters allow {expected}")


def check_computed_tokens(rows: TraceRows) -> Iterator[Finding]:
    """S3 (scheduler optimistic count vs truth), X2 (worker count vs truth and vs scheduler)."""
    c = rows.col
    for rid, idx in rows.by_request.items():
        fired: set[str] = set()
        for i in idx:
            if not rows.scheduled(i) or c["worker_num_computed_tokens"][i] is None:
                continue
            truth = c["truth_num_computed_tokens"][i]
            flying = rows.in_flight(idx, i)
            if any(c["apply_num_rejected"][j] is None for j in flying):
                continue  # an in-flight output never applied (aborted, finished, crash): unknown
            settled = c["sched_num_computed_tokens"][i] - sum(c["apply_num_rejected"][j] for j in flying)
            worker = c["worker_num_computed_tokens"][i]
            position = c["worker_first_position"][i]
            step = c["step"][i]
            if "S3" not in fired and truth is not None and settled != truth:
                fired.add("S3")
                yield _f(rows, "S3-scheduler-computed-tokens", i, "num_computed_tokens", settled, truth,
                         f"the scheduler's num_computed_tokens, once its in-flight rejections are taken off, is "
                         f"{settled} but the KV cache holds {truth} valid tokens")
            if "X2s" not in fired and worker != settled:
                fired.add("X2s")
                yield _f(rows, "X2-sched-worker-computed", i, "num_computed_tokens", settled, worker,
                         f"scheduler and worker disagree on num_computed_tokens at step {step}: "
                         f"{settled} vs {worker}")
            if "X2t" not in fired and truth is not None and position != truth:
                fired.add("X2t")
                gap = (f"positions {truth}..{position - 1} are never written" if position > truth
                       else f"positions {position}..{truth - 1} are written twice")
                yield _f(rows, "X2-worker-kv-position", i, "num_computed_tokens", c["sched_num_computed_tokens"][i], position,
                         f"the worker writes step {step} from position {position} but its KV cache holds {truth} valid tokens: {gap}")
            if "X2p" not in fired and position != worker:
                fired.add("X2p")
                yield _f(rows, "X2-worker-position-mismatch", i, "num_computed_tokens", worker, position,
                         f"the worker's CPU num_computed_tokens ({worker}) differs from the device position it computes with ({position})")


def check_output_length(rows: TraceRows) -> Iterator[Finding]:
    if not rows.is_async:
        return
    c = rows.col
    for rid, idx in rows.by_request.items():
        for i in idx:
            got = c["worker_num_output_tokens"][i]
            if got is None or not rows.scheduled(i):
                continue
            expected = c["sched_num_output_tokens"][i] + c["sched_num_output_placeholders"][i]
            if got != expected:
                yield _f(rows, "X3-output-length", i, "num_output_tokens", expected, got,
                         f"the worker holds {got} output tokens, the scheduler sent {expected} (applied + placeholders)")
                break


def check_membership(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for i in range(rows.num_rows):
        if c["step"][i] == rows.crash_step:
            continue
        scheduled = rows.scheduled(i)
        in_batch = c["worker_row"][i] is not None
        if scheduled != in_batch:
            yield _f(rows, "X1-batch-membership", i, "worker_row", scheduled, in_batch,
                     "scheduled but not in the worker's batch" if scheduled else "in the worker's batch but not scheduled")


def check_executed_work(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for i in range(rows.num_rows):
        w = c["worker_num_scheduled_tokens"][i]
        if w is None:
            continue
        s = c["sched_num_scheduled_tokens"][i]
        if w != s or c["worker_num_draft_slots"][i] != c["sched_num_draft_slots"][i]:
            yield _f(rows, "X11-executed-other-work", i, "num_scheduled_tokens", s, w,
                     f"the worker executed {w} tokens ({c['worker_num_draft_slots'][i]} drafts) where the scheduler "
                     f"booked {s} ({c['sched_num_draft_slots'][i]} drafts)")


def check_output_mutated(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for i in range(rows.num_rows):
        slots, n = c["apply_num_draft_slots"][i], c["apply_num_scheduled_tokens"][i]
        if slots is None:
            continue
        built = (c["sched_num_scheduled_tokens"][i], c["sched_num_draft_slots"][i])
        if (n, slots) != built:
            yield _f(rows, "X10-scheduler-output-mutated", i, "scheduled_spec_decode_tokens", built[1], slots,
                     f"update_from_output read {n} tokens with {slots} draft slots back from the SchedulerOutput "
                     f"that was built with {built[0]} and {built[1]}: the worker edited the scheduler's own object")


def check_draft_inputs(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for i in range(rows.num_rows):
        drafts = c["worker_draft_ids"][i]
        if not drafts:
            continue
        negative = sum(1 for t in drafts if t < 0)
        if negative or (rows.is_async and not c["worker_cached_drafts"][i]):
            yield _f(rows, "X5-placeholder-drafts", i, "draft_token_ids", len(drafts), c["worker_cached_drafts"][i],
                     f"the worker verified {len(drafts)} draft slots with no cached drafts behind them"
                     + (f" ({negative} of them -1, clamped to 0 for the embedding and rejected)" if negative else ""))


def check_tokens(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for rid, idx in rows.by_request.items():
        for i in idx:
            bad = c["apply_token_mismatches"][i]
            if bad:
                yield _f(rows, "T1-wrong-token", i, "output_token_ids", c["apply_num_tokens"][i], bad,
                         f"{bad} of the {c['apply_num_tokens'][i]} tokens applied from step {c['step'][i]} differ "
                         "from the request's expected sequence (a token lost, duplicated or computed at the wrong position)")
                break


def check_kv_truth(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for rid, idx in rows.by_request.items():
        for i in idx:
            if c["truth_kv_ok"][i] is False and rows.scheduled(i):
                yield _f(rows, "K1-kv-content", i, "kv_cache", None, c["truth_num_computed_tokens"][i],
                         "the KV cache no longer holds the request's expected tokens in every valid position")
                break


# ------------------------------------------------------------------ request lives and control events
def check_output_life(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            if c["apply_outcome"][i] in ("applied", "stale_delivered", "dropped") and c["apply_life"][i] != c["sched_life"][i]:
                life, other = c["sched_life"][i], c["apply_life"][i]
                yield _f(rows, "L1-output-life", i, "request life", life, other,
                         f"the output of step {c['step'][i]}, scheduled for life {life} of the request, was "
                         f"given to life {other} (a new request under the same id) at step {c['apply_step'][i]} "
                         f"({c['apply_outcome'][i]}, {c['apply_num_tokens'][i]} tokens): the old life's tokens and "
                         "counts land on the new one")
                break


def check_stale_outputs(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for idx in rows.by_request.values():
        done = False
        for position, i in enumerate(idx):
            # The outputs this row's step applied, nearest first (as the lags are walked).
            for j in reversed(idx[max(0, position - LOOKBACK):position]):
                if not (rows.scheduled(j) and c["step"][j] >= c["step"][i] - LOOKBACK and c["apply_step"][j] == c["step"][i] and c["apply_life"][j] == c["sched_life"][j]):
                    continue
                stale = rows.epoch[i] > rows.epoch[j]
                what = c["apply_outcome"][j]
                if stale and what == "applied":
                    message = (f"the output of step {c['step'][j]} was in flight when the request was preempted or its "
                               f"cache reset, yet update_from_output applied it as fresh at step {c['step'][i]}: its "
                               f"{c['apply_num_tokens'][j]} tokens and {c['apply_num_rejected'][j]} rejections moved the "
                               "reset counters")
                elif not stale and what in ("stale_delivered", "dropped"):
                    message = (f"the output of step {c['step'][j]} belongs to the request's current life (no preemption "
                               f"or reset since), yet update_from_output treated it as stale ({what}) at step "
                               f"{c['step'][i]}: its tokens are lost or its counters never settle")
                else:
                    continue
                yield _f(rows, "L2-stale-output", i, "apply_outcome", what, "stale" if stale else "fresh", message)
                done = True
                break
            if done:
                break


def check_in_flight_tokens(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for idx in rows.by_request.values():
        for position, i in enumerate(idx):
            if c["sched_status"][i] == "finished":
                continue
            pending = [j for j in idx[max(0, position - LOOKBACK):position] if rows.scheduled(j)
                       and c["step"][j] >= c["step"][i] - LOOKBACK and (c["apply_step"][j] is None or c["apply_step"][j] >= c["step"][i])]
            want_f = sum(c["sched_num_scheduled_tokens"][j] for j in pending)
            # Read before schedule(): a preemption by this very schedule() is not in the counters yet.
            before = rows.epoch[i] - c["sched_preempted"][i]
            want_s = sum(c["sched_num_scheduled_tokens"][j] for j in pending if rows.epoch[j] < before)
            got_f, got_s = c["sched_num_in_flight_tokens"][i], c["sched_num_stale_output_tokens"][i]
            if got_f == want_f and got_s == want_s:
                continue
            if got_f != want_f:
                field, got, want, name = "num_in_flight_tokens", got_f, want_f, "in flight"
            else:
                field, got, want, name = ("num_stale_output_tokens", got_s, want_s,
                                          "in flight from before the last preemption or reset")
            yield _f(rows, "L3-in-flight-tokens", i, field, got, want,
                     f"{field} is {got} but the scheduled tokens of its outputs {name} add up to {want}"
                     + (" (a count never goes negative)" if got < 0 else
                        "; counted in steps or sampled tokens instead of scheduled tokens?" if got and want else ""))
            break


def check_run_completes(rows: TraceRows) -> Iterator[Finding]:
    outcome = rows.trace.outcome
    c = rows.col
    if outcome.get("status") == "completed":  # the requests the scheduler still held when the engine went idle
        unfinished = [str(rid) for rid in outcome.get("unfinished", ())]
    else:
        unfinished = sorted(rid for (rid, _), idx in rows.by_request.items() if c["sched_status"][idx[-1]] != "finished")
    yield from incomplete_findings(outcome, unfinished)


def check_crash(rows: TraceRows) -> Iterator[Finding]:
    if rows.crash_step is None:
        return
    message = rows.trace.outcome.get("message", "engine crashed")
    rid = None
    marker = "request '"
    if marker in message:
        rid = message.split(marker, 1)[1].split("'", 1)[0]
    if rows.trace.outcome.get("kind", "negative-input-id") == "negative-input-id":
        yield Finding("X5-negative-input-id", "error", rows.crash_step, rid, "input_ids", None, -1,
                      f"{message}: on a GPU a device-side assert, the engine dies")
    else:
        yield Finding("E1-engine-crash", "error", rows.crash_step, rid, "scheduler_output", None, None,
                      f"the engine dies at step {rows.crash_step}: {message}")


#: The row-by-row statement of each product invariant, by code: the codes, severities and
#: statements are the product's (replay.checker.INVARIANTS); only the rules are restated here.
CHECKS: dict[str, Callable[[TraceRows], Iterator[Finding]]] = {
    "S1-placeholders-nonnegative": check_placeholders_nonnegative,
    "S2-placeholder-count": check_placeholder_count,
    "S3-scheduler-computed-tokens": check_computed_tokens,
    "S4-decode-identity": check_decode_identity,
    "S5-draft-provenance": check_draft_provenance,
    "S6-token-budget": check_budget,
    "S7-draft-slot-count": check_draft_slot_count,
    "X1-batch-membership": check_membership,
    "X3-output-length": check_output_length,
    "X5-placeholder-drafts": check_draft_inputs,
    "X10-scheduler-output-mutated": check_output_mutated,
    "X11-executed-other-work": check_executed_work,
    "L1-output-life": check_output_life,
    "L2-stale-output": check_stale_outputs,
    "L3-in-flight-tokens": check_in_flight_tokens,
    "T1-wrong-token": check_tokens,
    "K1-kv-content": check_kv_truth,
    "E1-engine-crash": check_crash,
    "E2-run-incomplete": check_run_completes,
}


def check_trace(trace: Trace) -> list[Finding]:
    """Every invariant over the whole trace; findings sorted by step, request, code."""
    rows = TraceRows(trace)
    findings: list[Finding] = []
    for inv in INVARIANTS:  # every product invariant must have its statement here (KeyError otherwise)
        findings.extend(CHECKS[inv.code](rows))
    findings.sort(key=lambda f: (f.step, f.request_id or "", _RANK.get(f.code, len(_RANK)), f.code))
    return findings
