"""The invariants stated row by row: the executable specification of the checker's rules.

specreplay's checker (replay/check/: a catalogue of codes, rule families in rules_*.py, a
framework that streams a trace by row groups) is vectorised; this module states every rule the
plain way, one row at a time over the whole trace, and tests/replay/check/test_checker_equivalence.py
holds the two to the same findings, evidence included. It is the checker specreplay 0.1 shipped
(too slow for long traces: about 60x the time to read the trace).

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> **check** ->
workflows -> views -> cli. `check_trace` reads only the trace's table and metadata, so it works on
any trace, whatever recorded it. Each invariant is one function below with a stable code, a severity
and the reference section it comes from (docs/reference.md, section 4.2). A violated invariant of
the implementation under test is a finding, never an exception.

Severity: error = the views or the ground truth disagree, a token is lost, duplicated or wrong,
or a negative id reaches the model; warning = work is wasted (draft slots verified with nothing
behind them, tokens executed that the scheduler did not book beyond the drafts vLLM's ngram_gpu
drafter trims).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

# Severities, the order of findings within a step and request, and how a finding is rendered from
# its evidence (message, scheduler and worker values) are the product's own, the catalogue's: what
# is stated here is the rules and the evidence they find, not its presentation.
from specreplay.replay.check.catalogue import BY_CODE, INVARIANTS, RANK
from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import NEEDED
from specreplay.replay.check.limits import max_tokens_by_life
from specreplay.replay.check.rules_sglang import own_check
from specreplay.traces.trace import Trace
from tests.replay.check import rowwise_sglang

# The checker's columns (derived from the schema and its loader), whatever states the rules.
_NEEDED = NEEDED


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
        # Per row: its life's max_tokens for the turn it is in (None: not known). A streaming
        # session's next turn starts with a longer prompt, so each change of prompt length is a turn.
        limits = max_tokens_by_life(trace.workload)
        self.max_tokens: list[int | None] = [None] * self.num_rows
        for key, idx in self.by_request.items():
            turn, prompt = 0, None
            for i in idx:
                if prompt is not None and self.col["sched_num_prompt_tokens"][i] != prompt:
                    turn += 1
                prompt = self.col["sched_num_prompt_tokens"][i]
                turns = limits.get(key, ())
                self.max_tokens[i] = turns[turn] if turn < len(turns) else None
        self.is_async = self.config.async_scheduling is not False
        self.drafter = trace.impl.drafter
        self.crash_step = trace.outcome.step if trace.outcome.status == "crashed" else None

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
            if (
                sj < step - LOOKBACK
                or c["sched_preempted"][j]
                or c["sched_event"][later] in ("reset_preempt", "stream_turn")
            ):
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


def _f(rows: TraceRows, code: str, i: int, field: str, expected, actual, **detail) -> Finding:
    """The finding of `code` at row i, from its evidence (rendered by the catalogue)."""
    return BY_CODE[code].finding(
        rows["step"][i], rows["request_id"][i], rows["sched_life"][i], field, expected, actual, **detail
    )


def _latest_life(rows: TraceRows, rid: str | None) -> int | None:
    lives = [life for (name, life) in rows.by_request if name == rid]
    return max(lives) if lives else None


# ------------------------------------------------------------------ scheduler-internal
def check_placeholders_nonnegative(rows: TraceRows) -> Iterator[Finding]:
    for i in range(rows.num_rows):
        for name in ("sched_num_output_placeholders", "apply_num_output_placeholders"):
            value = rows[name][i]
            if value is not None and value < 0:
                yield _f(rows, "S1-placeholders-nonnegative", i, "num_output_placeholders", None, value, column=name)
                break


def check_placeholder_count(rows: TraceRows) -> Iterator[Finding]:
    if not rows.is_async:
        return
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            if c["sched_status"][i] == "finished" or c["sched_preempted"][i]:
                continue
            flying = [j for j in rows.in_flight(idx, i) if not c["sched_is_prefill_chunk"][j]]
            expected = sum(1 + c["sched_num_draft_slots"][j] for j in flying)
            if c["sched_status"][i] == "preempted" or (
                c["sched_status"][i] == "waiting" and c["sched_kind"][i] == "unscheduled"
            ):
                expected = 0 if c["sched_num_output_placeholders"][i] == 0 else expected
            got = c["sched_num_output_placeholders"][i]
            if got != expected and got >= 0:
                yield _f(
                    rows,
                    "S2-placeholder-count",
                    i,
                    "num_output_placeholders",
                    expected,
                    got,
                    steps_in_flight=tuple(c["step"][j] for j in flying),
                )
                break


def check_decode_identity(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for idx in rows.by_request.values():
        decoding = False
        for i in idx:
            if (
                c["sched_status"][i] in ("running",)
                and not c["sched_preempted"][i]
                and c["sched_kind"][i] not in ("new", "resumed")
            ):
                gap = (
                    c["sched_num_tokens"][i] + c["sched_num_output_placeholders"][i] - c["sched_num_computed_tokens"][i]
                )
                if gap < 1 or (decoding and gap != 1):
                    yield _f(
                        rows,
                        "S4-decode-identity",
                        i,
                        "num_tokens + placeholders - num_computed_tokens",
                        1,
                        gap,
                        sched_num_tokens=c["sched_num_tokens"][i],
                        sched_num_output_placeholders=c["sched_num_output_placeholders"][i],
                        sched_num_computed_tokens=c["sched_num_computed_tokens"][i],
                        decoding=decoding,
                    )
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
    for idx in rows.by_request.values():
        prev = None
        for i in idx:
            k = c["sched_num_draft_slots"][i]
            if k > 0:
                step = c["step"][i]
                last = before[step]
                why = None
                if prev is None or c["step"][prev] != last or c["sched_num_scheduled_tokens"][prev] == 0:
                    why = "not_scheduled"  # the worker holds no drafts for it
                elif c["sched_is_prefill_chunk"][prev]:
                    why = "prefill_chunk"  # a non-final chunk proposes no drafts
                elif c["sched_kind"][i] == "resumed":
                    why = "resumed"
                elif c["step_total_scheduled_tokens"][prev] == 0:
                    why = "empty_step"
                if why:
                    yield _f(
                        rows,
                        "S5-draft-provenance",
                        i,
                        "scheduled_spec_decode_tokens",
                        0,
                        k,
                        previous_step=last,
                        reason=why,
                    )
            prev = i


def check_budget(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    budget = rows.config.max_num_batched_tokens or 1 << 30
    max_len = rows.config.max_model_len or 1 << 30
    totals: dict[int, int] = {}
    for i in range(rows.num_rows):
        s = c["step"][i]
        totals[s] = totals.get(s, 0) + c["sched_num_scheduled_tokens"][i]
        n = c["sched_num_scheduled_tokens"][i]
        if n and c["sched_num_computed_tokens"][i] + n > max_len - 1:
            yield _f(
                rows,
                "S6-token-budget",
                i,
                "num_scheduled_tokens",
                max_len - c["sched_num_computed_tokens"][i] - 1,
                n,
                max_model_len=max_len,
            )
    reported: set[int] = set()
    for i in range(rows.num_rows):
        s = c["step"][i]
        declared = c["step_total_scheduled_tokens"][i]
        if s not in reported and (declared != totals[s] or declared > budget):
            reported.add(s)
            yield BY_CODE["S6-token-budget"].finding(
                s, None, None, "total_num_scheduled_tokens", totals[s], declared, max_num_batched_tokens=budget
            )


def check_draft_slot_count(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    width = rows.config.num_spec_tokens or 0
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
            room = (
                n + c["sched_num_computed_tokens"][i] - c["sched_num_tokens"][i] - c["sched_num_output_placeholders"][i]
            )
            expected = max(0, min(c["sched_spec_len"][i], room))
        if k != expected:
            yield _f(rows, "S7-draft-slot-count", i, "num_draft_slots", expected, k, sched_num_scheduled_tokens=n)


def check_computed_tokens(rows: TraceRows) -> Iterator[Finding]:
    """S3 (scheduler optimistic count vs truth), X2 (worker count vs truth and vs scheduler)."""
    c = rows.col
    for idx in rows.by_request.values():
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
            computed, rejected = c["sched_num_computed_tokens"][i], sum(c["apply_num_rejected"][j] for j in flying)
            if "S3" not in fired and truth is not None and settled != truth:
                fired.add("S3")
                yield _f(
                    rows,
                    "S3-scheduler-computed-tokens",
                    i,
                    "num_computed_tokens",
                    truth,
                    settled,
                    sched_num_computed_tokens=computed,
                    rejected_in_flight=rejected,
                )
            if "X2s" not in fired and worker != settled:
                fired.add("X2s")
                yield _f(
                    rows,
                    "X2-sched-worker-computed",
                    i,
                    "num_computed_tokens",
                    settled,
                    worker,
                    sched_num_computed_tokens=computed,
                    rejected_in_flight=rejected,
                )
            if "X2t" not in fired and truth is not None and position is not None and position != truth:
                fired.add("X2t")
                yield _f(
                    rows,
                    "X2-worker-kv-position",
                    i,
                    "num_computed_tokens",
                    truth,
                    position,
                    sched_num_computed_tokens=computed,
                )
            if "X2p" not in fired and position is not None and position != worker:
                fired.add("X2p")
                yield _f(rows, "X2-worker-position-mismatch", i, "num_computed_tokens", position, worker)


def check_output_length(rows: TraceRows) -> Iterator[Finding]:
    if not rows.is_async:
        return
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            got = c["worker_num_output_tokens"][i]
            if got is None or not rows.scheduled(i):
                continue
            expected = c["sched_num_output_tokens"][i] + c["sched_num_output_placeholders"][i]
            if got != expected:
                yield _f(
                    rows,
                    "X3-output-length",
                    i,
                    "num_output_tokens",
                    expected,
                    got,
                    sched_num_output_tokens=c["sched_num_output_tokens"][i],
                    sched_num_output_placeholders=c["sched_num_output_placeholders"][i],
                )
                break


def check_membership(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for i in range(rows.num_rows):
        if c["step"][i] == rows.crash_step:
            continue
        scheduled = rows.scheduled(i)
        in_batch = c["worker_row"][i] is not None
        if scheduled != in_batch:
            yield _f(rows, "X1-batch-membership", i, "worker_row", scheduled, in_batch)


def _not_a_drafter_trim(rows: TraceRows, i: int) -> str | None:
    """Why row i's executed work is not vLLM 0.32.0's ngram_gpu trim (None: it is): that trim
    cuts only a request run the step before (drafts cached for it), only trailing draft slots,
    feeds only the real drafts it keeps, edits only the worker's copy, and runs only with the
    ngram_gpu drafter (the trace's drafter; a trace that names none: vLLM's own runner, the one
    without ground truth)."""
    c = rows.col
    booked, booked_slots = c["sched_num_scheduled_tokens"][i], c["sched_num_draft_slots"][i]
    ran, ran_slots = c["worker_num_scheduled_tokens"][i], c["worker_num_draft_slots"][i]
    cached = c["worker_cached_drafts"][i] or 0
    fed = c["worker_draft_ids"][i] or []
    if cached <= 0:
        return "no_cached_drafts"
    if not (0 <= ran_slots < booked_slots and booked - ran == booked_slots - ran_slots):
        return "not_only_draft_slots"
    if len(fed) != ran_slots or any(t < 0 for t in fed) or ran_slots > cached:
        return "drafts_fed"
    read_slots = c["apply_num_draft_slots"][i]
    if read_slots is not None and (c["apply_num_scheduled_tokens"][i], read_slots) != (booked, booked_slots):
        return "scheduler_output_edited"
    trims = rows.drafter == "ngram_gpu" if rows.drafter else c["truth_num_computed_tokens"][i] is None
    if not trims:
        return "runner_never_trims"
    return None


def check_executed_work(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for i in range(rows.num_rows):
        w = c["worker_num_scheduled_tokens"][i]
        if w is None:
            continue
        s = c["sched_num_scheduled_tokens"][i]
        if w == s and c["worker_num_draft_slots"][i] == c["sched_num_draft_slots"][i]:
            continue
        reason = _not_a_drafter_trim(rows, i)
        if reason is not None:
            yield _f(
                rows,
                "X11-executed-other-work",
                i,
                "num_scheduled_tokens",
                s,
                w,
                sched_num_draft_slots=c["sched_num_draft_slots"][i],
                worker_num_draft_slots=c["worker_num_draft_slots"][i],
                worker_cached_drafts=c["worker_cached_drafts"][i],
                reason=reason,
            )


def check_output_mutated(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for i in range(rows.num_rows):
        slots, n = c["apply_num_draft_slots"][i], c["apply_num_scheduled_tokens"][i]
        if slots is None:
            continue
        built = (c["sched_num_scheduled_tokens"][i], c["sched_num_draft_slots"][i])
        if (n, slots) != built:
            yield _f(
                rows,
                "X10-scheduler-output-mutated",
                i,
                "scheduled_spec_decode_tokens",
                built[1],
                slots,
                sched_num_scheduled_tokens=built[0],
                apply_num_scheduled_tokens=n,
            )


def check_draft_inputs(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for i in range(rows.num_rows):
        drafts = c["worker_draft_ids"][i]
        if not drafts:
            continue
        negative = sum(1 for t in drafts if t < 0)
        cached = c["worker_cached_drafts"][i]  # None: no V1 cache count on the row, only negatives judged
        if negative or (rows.is_async and cached is not None and not cached):
            yield _f(
                rows,
                "X5-placeholder-drafts",
                i,
                "draft_token_ids",
                c["worker_cached_drafts"][i],
                len(drafts),
                worker_num_negative_draft_ids=negative,
            )


def check_tokens(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            bad = c["apply_token_mismatches"][i]
            if bad:
                yield _f(
                    rows, "T1-wrong-token", i, "output_token_ids", 0, bad, apply_num_tokens=c["apply_num_tokens"][i]
                )
                break


def check_kv_truth(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            if c["truth_kv_ok"][i] is False and rows.scheduled(i):
                yield _f(
                    rows,
                    "K1-kv-content",
                    i,
                    "kv_cache",
                    True,
                    False,
                    truth_num_computed_tokens=c["truth_num_computed_tokens"][i],
                )
                break


# ------------------------------------------------------------------ the physical KV cache
def check_foreign_tokens(rows: TraceRows) -> Iterator[Finding]:
    """K2: a request's valid KV positions hold no other request's tokens."""
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            if c["truth_kv_foreign_positions"][i]:
                yield _f(
                    rows,
                    "K2-kv-foreign-tokens",
                    i,
                    "kv_cache",
                    0,
                    c["truth_kv_foreign_positions"][i],
                    other_request=c["truth_kv_foreign_writer"][i],
                )
                break


def check_cache_hits(rows: TraceRows) -> Iterator[Finding]:
    """K6: every position a prefix-cache hit covers holds the request's own token when read."""
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            cached, valid = c["sched_num_cached_tokens"][i], c["truth_cache_hit_valid"][i]
            if valid is not None and cached is not None and valid < cached:
                writer = c["truth_cache_hit_writer"][i]
                yield _f(rows, "K6-cache-hit-content", i, "prefix_cache", cached, valid, other_request=writer or None)
                break


def check_block_ownership(rows: TraceRows) -> Iterator[Finding]:
    """K3: a request runs on blocks the scheduler holds for it; K4: its step writes only there."""
    c = rows.col
    for code, column, field in (
        ("K3-kv-unowned-block", "truth_kv_unowned_blocks", "block_table"),
        ("K4-kv-write-unowned", "truth_kv_unowned_writes", "kv_cache"),
    ):
        for idx in rows.by_request.values():
            for i in idx:
                if c[column][i]:
                    yield _f(rows, code, i, field, 0, c[column][i], other_request=c["truth_kv_block_owner"][i])
                    break


def check_finished_state(rows: TraceRows) -> Iterator[Finding]:
    """K5: the worker no longer holds a request's state or row once its finish is announced."""
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            if c["worker_kept_finished"][i]:
                yield _f(rows, "K5-finished-state-kept", i, "requests", False, True)
                break


def check_padding_verified(rows: TraceRows) -> Iterator[Finding]:
    """X12: every draft slot a request verifies holds a draft its drafter proposed (first per request)."""
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            unfilled = c["truth_unfilled_draft_slots"][i]
            if unfilled is not None and unfilled > 0:
                yield _f(rows, "X12-padding-verified", i, "scheduled_spec_decode_tokens", 0, unfilled)
                break


# ------------------------------------------------------------------ Model Runner V2
def check_device_computed(rows: TraceRows) -> Iterator[Finding]:
    """M1: the device count a step runs from, and its advance at post_update, against the scheduler."""
    c = rows.col
    for idx in rows.by_request.values():
        fired: set[str] = set()
        for i in idx:
            before = c["worker_device_computed_before"][i]
            if not rows.scheduled(i) or before is None:
                continue
            flying = rows.in_flight(idx, i)
            computed = c["sched_num_computed_tokens"][i]
            if "before" not in fired and all(c["apply_num_rejected"][j] is not None for j in flying):
                rejected = sum(c["apply_num_rejected"][j] for j in flying)
                if before != computed - rejected:
                    fired.add("before")
                    yield _f(
                        rows,
                        "M1-device-computed",
                        i,
                        "num_computed_tokens",
                        computed - rejected,
                        before,
                        sched_num_computed_tokens=computed,
                        rejected_in_flight=rejected,
                    )
            after, rejected_here = c["worker_device_computed_after"][i], c["apply_num_rejected"][i]
            fresh = c["apply_outcome"][i] == "applied" and c["apply_finish_reason"][i] in (None, "")
            if "after" in fired or after is None or rejected_here is None or not fresh:
                continue
            n = c["sched_num_scheduled_tokens"][i]
            if after - before != n - rejected_here:
                fired.add("after")
                yield _f(
                    rows,
                    "M1-device-advance",
                    i,
                    "num_computed_tokens",
                    before + n - rejected_here,
                    after,
                    worker_device_computed_before=before,
                    sched_num_scheduled_tokens=n,
                    apply_num_rejected=rejected_here,
                )


def check_cpu_mirror(rows: TraceRows) -> Iterator[Finding]:
    """M2: the CPU mirror is the scheduler's C."""
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            mirror = c["worker_cpu_computed"][i]
            if rows.scheduled(i) and mirror is not None and mirror != c["sched_num_computed_tokens"][i]:
                yield _f(
                    rows,
                    "M2-cpu-mirror",
                    i,
                    "num_computed_tokens_np",
                    c["sched_num_computed_tokens"][i],
                    mirror,
                    worker_device_computed_before=c["worker_device_computed_before"][i],
                )
                break


def check_positions_from_device(rows: TraceRows) -> Iterator[Finding]:
    """M6: the step's first position is the device count it runs from."""
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            position, device = c["worker_first_position"][i], c["worker_device_computed_before"][i]
            if rows.scheduled(i) and position is not None and device is not None and position != device:
                yield _f(
                    rows,
                    "M6-position-device-count",
                    i,
                    "positions",
                    device,
                    position,
                    worker_cpu_computed=c["worker_cpu_computed"][i],
                    sched_num_computed_tokens=c["sched_num_computed_tokens"][i],
                )
                break


def check_draft_origin(rows: TraceRows) -> Iterator[Finding]:
    """M3: verified drafts are the request's own, from its last step in the batch, at its position."""
    c = rows.col
    for idx in rows.by_request.values():
        last = None  # the step of the request's latest earlier row in the worker's batch
        for i in idx:
            ran = c["worker_slot"][i] is not None
            k = c["worker_num_draft_slots"][i]
            if ran and k is not None and k > 0:
                proposed, origin = c["worker_draft_proposed_step"][i], c["worker_draft_proposed_for"][i]
                base, before = c["worker_draft_base"][i], c["worker_device_computed_before"][i]
                reason = (
                    "padding"
                    if proposed is None
                    else "other_request"
                    if origin != c["request_id"][i]
                    else "not_last_step"
                    if proposed != last
                    else "moved_past"
                    if base is not None and before is not None and base != before
                    else None
                )
                if reason:
                    yield _f(
                        rows,
                        "M3-draft-origin",
                        i,
                        "draft_tokens",
                        None,
                        k,
                        reason=reason,
                        last_worker_step=last,
                        worker_draft_proposed_step=proposed,
                        worker_draft_proposed_for=origin,
                        worker_draft_base=base,
                        worker_device_computed_before=before,
                    )
            if ran:
                last = c["step"][i]


def check_preempted_as_new(rows: TraceRows) -> Iterator[Finding]:
    """M4: a preempted request's slot is freed; its next run is new, its prefill all its tokens."""
    c = rows.col
    for idx in rows.by_request.values():
        since = False  # was the latest event (a preemption, a step in the batch) a preemption?
        for i in idx:
            preempted, ran = c["sched_preempted"][i], c["worker_slot"][i] is not None
            if preempted and c["worker_freed_preempted"][i] is False:
                yield _f(rows, "M4-preempted-as-new", i, "worker_freed_preempted", True, False, reason="kept")
                break
            prefill, tokens = c["worker_prefill_len"][i], c["sched_num_tokens"][i]
            if ran and since and (c["worker_new_life"][i] is not True or prefill != tokens):
                reason = "not_new" if c["worker_new_life"][i] is not True else "prefill"
                yield _f(
                    rows,
                    "M4-preempted-as-new",
                    i,
                    "worker_prefill_len",
                    tokens,
                    prefill,
                    reason=reason,
                    sched_num_prompt_tokens=c["sched_num_prompt_tokens"][i],
                )
                break
            if preempted or ran:
                since = bool(preempted)


def check_slot_holder(rows: TraceRows) -> Iterator[Finding]:
    """M5: no request runs on a slot another request took since (takers of a step first)."""
    c = rows.col
    order = sorted(
        (i for i in range(rows.num_rows) if c["worker_slot"][i] is not None),
        key=lambda i: (c["worker_slot"][i], c["step"][i], not _took(c, i), i),
    )
    holder: dict[int, tuple[tuple[str, int], int]] = {}  # slot -> (request life, step it took the slot)
    fired: set[tuple[str, int]] = set()
    for i in order:
        key, slot = (c["request_id"][i], c["sched_life"][i]), c["worker_slot"][i]
        if _took(c, i):
            holder[slot] = (key, c["step"][i])
        elif slot in holder and holder[slot][0] != key and key not in fired:
            fired.add(key)
            (rid, _life), taken_at = holder[slot]
            yield _f(rows, "M5-slot-holder", i, "worker_slot", rid, slot, holder=rid, taken_at=taken_at)


def _took(c: dict, i: int) -> bool:
    return c["worker_new_life"][i] is True or c["worker_slot_prev_owner"][i] is not None


# ------------------------------------------------------------------ request lives and control events
def check_output_life(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for idx in rows.by_request.values():
        for i in idx:
            if (
                c["apply_outcome"][i] in ("applied", "stale_delivered", "dropped")
                and c["apply_life"][i] != c["sched_life"][i]
            ):
                yield _f(
                    rows,
                    "L1-output-life",
                    i,
                    "request life",
                    c["sched_life"][i],
                    c["apply_life"][i],
                    apply_step=c["apply_step"][i],
                    apply_outcome=c["apply_outcome"][i],
                    apply_num_tokens=c["apply_num_tokens"][i],
                )
                break


def check_stale_outputs(rows: TraceRows) -> Iterator[Finding]:
    c = rows.col
    for idx in rows.by_request.values():
        done = False
        for position, i in enumerate(idx):
            # The outputs this row's step applied, nearest first (as the lags are walked).
            for j in reversed(idx[max(0, position - LOOKBACK) : position]):
                if not (
                    rows.scheduled(j)
                    and c["step"][j] >= c["step"][i] - LOOKBACK
                    and c["apply_step"][j] == c["step"][i]
                    and c["apply_life"][j] == c["sched_life"][j]
                ):
                    continue
                stale = rows.epoch[i] > rows.epoch[j]
                what = c["apply_outcome"][j]
                if not ((stale and what == "applied") or (not stale and what in ("stale_delivered", "dropped"))):
                    continue
                yield _f(
                    rows,
                    "L2-stale-output",
                    i,
                    "apply_outcome",
                    "stale" if stale else "fresh",
                    what,
                    output_step=c["step"][j],
                    apply_num_tokens=c["apply_num_tokens"][j],
                    apply_num_rejected=c["apply_num_rejected"][j],
                )
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
            pending = [
                j
                for j in idx[max(0, position - LOOKBACK) : position]
                if rows.scheduled(j)
                and c["step"][j] >= c["step"][i] - LOOKBACK
                and (c["apply_step"][j] is None or c["apply_step"][j] >= c["step"][i])
            ]
            want_f = sum(c["sched_num_scheduled_tokens"][j] for j in pending)
            # Read before schedule(): a preemption by this very schedule() is not in the counters yet.
            before = rows.epoch[i] - c["sched_preempted"][i]
            want_s = sum(c["sched_num_scheduled_tokens"][j] for j in pending if rows.epoch[j] < before)
            got_f, got_s = c["sched_num_in_flight_tokens"][i], c["sched_num_stale_output_tokens"][i]
            if got_f == want_f and got_s == want_s:
                continue
            if got_f != want_f:
                yield _f(rows, "L3-in-flight-tokens", i, "num_in_flight_tokens", want_f, got_f)
            else:
                yield _f(rows, "L3-in-flight-tokens", i, "num_stale_output_tokens", want_s, got_s)
            break


def check_tokens_applied(rows: TraceRows) -> Iterator[Finding]:
    """S8: a fresh output (no cut between its schedule and the step that applied it) applied
    with fewer tokens than the worker emitted, and no stop or length finish to cut it; found
    from the applying row (nearest output first), first per request, named at the output's row."""
    c = rows.col
    for idx in rows.by_request.values():
        done = False
        for position, i in enumerate(idx):
            for j in reversed(idx[max(0, position - LOOKBACK) : position + 1]):  # itself, then earlier
                if not (
                    rows.scheduled(j)
                    and c["step"][j] >= c["step"][i] - LOOKBACK
                    and c["apply_step"][j] == c["step"][i]
                    and c["apply_outcome"][j] == "applied"
                    and c["apply_life"][j] == c["sched_life"][j]
                    and rows.epoch[i] == rows.epoch[j]
                    and c["worker_num_emitted"][j] is not None
                    and c["apply_finish_reason"][j] not in ("stop", "length")
                    and c["apply_num_tokens"][j] < c["worker_num_emitted"][j]
                ):
                    continue
                yield _f(
                    rows,
                    "S8-token-lost",
                    j,
                    "output_token_ids",
                    c["worker_num_emitted"][j],
                    c["apply_num_tokens"][j],
                    apply_step=c["step"][i],
                    sched_num_scheduled_tokens=c["sched_num_scheduled_tokens"][j],
                )
                done = True
                break
            if done:
                break


def check_wasted_steps(rows: TraceRows) -> Iterator[Finding]:
    """S9: every scheduled row that books a step for nothing. From the running loop (not new,
    not resumed) with the life's limit known: vLLM's max-tokens skip held (P > 0 and
    C + 2 - P >= prompt + max_tokens). Any row: an earlier output of the same turn (same prompt
    length), applied before this schedule(), finished it with a stop or a length (nearest named)."""
    c = rows.col
    for idx in rows.by_request.values():
        for position, i in enumerate(idx):
            n = c["sched_num_scheduled_tokens"][i]
            if not n:
                continue
            limit = rows.max_tokens[i]
            computed, placeholders = c["sched_num_computed_tokens"][i], c["sched_num_output_placeholders"][i]
            prompt = c["sched_num_prompt_tokens"][i]
            if (
                c["sched_kind"][i] not in ("new", "resumed")
                and limit is not None
                and placeholders > 0
                and computed + 2 - placeholders >= prompt + limit
            ):
                yield _f(
                    rows,
                    "S9-step-past-max-tokens",
                    i,
                    "num_scheduled_tokens",
                    0,
                    n,
                    reason="max_tokens",
                    max_tokens=limit,
                    sched_num_computed_tokens=computed,
                    sched_num_output_placeholders=placeholders,
                    sched_num_prompt_tokens=prompt,
                )
                continue
            for j in reversed(idx[max(0, position - LOOKBACK) : position]):
                if (
                    c["step"][j] >= c["step"][i] - LOOKBACK
                    and c["apply_step"][j] is not None
                    and c["apply_step"][j] < c["step"][i]
                    and c["apply_finish_reason"][j] in ("stop", "length")
                    and c["sched_num_prompt_tokens"][j] == c["sched_num_prompt_tokens"][i]
                ):
                    yield _f(
                        rows,
                        "S9-step-past-max-tokens",
                        i,
                        "num_scheduled_tokens",
                        0,
                        n,
                        reason="finished",
                        output_step=c["step"][j],
                        apply_step=c["apply_step"][j],
                        apply_finish_reason=c["apply_finish_reason"][j],
                    )
                    break


def check_needless_preemption(rows: TraceRows) -> Iterator[Finding]:
    """S10: a step that preempts while no request it scheduled or preempted needed a KV block it
    did not hold. A request holds at least the blocks of the largest C + n (plus the lookahead,
    capped at max_model_len) of its rows since its last preemption or cache reset; a scheduled
    row needs ceil(min(C + n + lookahead, L) / block_size) blocks, a preempted one those of its
    uncapped demand T + len(spec) + P - C (or n, if more). Each request the step preempted."""
    config = rows.config
    bs = config.block_size
    if not bs or bs <= 0:
        return
    la = config.num_lookahead_tokens or 0
    cap = config.max_model_len or (1 << 62)
    c = rows.col

    def blocks(tokens: int) -> int:
        return -(-min(tokens + la, cap) // bs)

    needs: dict[int, bool] = {}  # step -> some request of it needed a block
    preempted: dict[int, list[tuple[int, int]]] = {}  # step -> (row, blocks held) of its preempted requests
    scheduled: dict[int, int] = {}
    for idx in rows.by_request.values():
        extent = 0  # the largest C + n since the last cut (0: none)
        for i in idx:
            step, n, computed = c["step"][i], c["sched_num_scheduled_tokens"][i], c["sched_num_computed_tokens"][i]
            if c["sched_event"][i] == "reset_preempt":
                extent = 0
            held = blocks(extent) if extent > 0 else 0
            cut = c["sched_preempted"][i]
            if n > 0 or cut:
                wanted = n
                if cut:
                    demand = c["sched_num_tokens"][i] + c["sched_spec_len"][i] + c["sched_num_output_placeholders"][i]
                    wanted = max(n, demand - computed)
                needs[step] = needs.get(step, False) or blocks(computed + wanted) > held
            if n > 0:
                scheduled[step] = scheduled.get(step, 0) + 1
                extent = max(extent, computed + n, 0)
            if cut:
                preempted.setdefault(step, []).append((i, held))
                extent = 0
    for step, victims in preempted.items():
        if needs.get(step):
            continue
        for i, held in victims:
            yield _f(
                rows,
                "S10-needless-preemption",
                i,
                "preempted",
                False,
                True,
                held_blocks=held,
                scheduled_requests=scheduled.get(step, 0),
            )


def check_preemption_returns(rows: TraceRows) -> Iterator[Finding]:
    """S11: a request preempted at a step whose preemption returned fewer blocks to the free pool
    than it held alone (both columns null: not read, nothing to judge)."""
    c = rows.col
    preempted_at: dict[int, int] = {}
    for i in range(rows.num_rows):
        if c["sched_preempted"][i]:
            preempted_at[c["step"][i]] = preempted_at.get(c["step"][i], 0) + 1
    for i in range(rows.num_rows):
        alone, returned = c["sched_preempt_blocks_alone"][i] or 0, c["sched_preempt_blocks_returned"][i] or 0
        if c["sched_preempted"][i] and returned < alone:
            yield _f(
                rows,
                "S11-preemption-frees-nothing",
                i,
                "sched_preempt_blocks_returned",
                alone,
                returned,
                preempted_in_step=preempted_at[c["step"][i]],
            )


def check_run_completes(rows: TraceRows) -> Iterator[Finding]:
    outcome = rows.trace.outcome
    c = rows.col
    if outcome.status == "completed":  # the requests the scheduler still held when the engine went idle
        unfinished = [str(rid) for rid in outcome.unfinished or ()]
    else:
        unfinished = sorted(
            rid for (rid, _), idx in rows.by_request.items() if c["sched_status"][idx[-1]] != "finished"
        )
    e2 = BY_CODE["E2-run-incomplete"]
    if outcome.status == "step_limit":
        rid = unfinished[0] if unfinished else None
        yield e2.finding(
            outcome.step or 0,
            rid,
            _latest_life(rows, rid),
            "outcome",
            0,
            len(unfinished),
            status="step_limit",
            unfinished=tuple(unfinished),
        )
    elif outcome.status == "completed" and unfinished:
        yield e2.finding(
            int(outcome.step or 0),
            unfinished[0],
            _latest_life(rows, unfinished[0]),
            "outcome",
            0,
            len(unfinished),
            status="completed",
            unfinished=tuple(unfinished),
        )


def check_crash(rows: TraceRows) -> Iterator[Finding]:
    if rows.crash_step is None:
        return
    message = rows.trace.outcome.message if rows.trace.outcome.message is not None else "engine crashed"
    rid = rows.trace.outcome.request  # the request the crash names (engines/crash.py), else vLLM's phrase
    marker = "request '"
    if rid is None and marker in message:
        rid = message.split(marker, 1)[1].split("'", 1)[0]
    if rid is None:  # the first request at the crash step that fed a draft id no embedding row holds
        vocab = rows.trace.config.vocab_size
        c = rows.col
        for i in range(len(c["step"])):
            drafts = c["worker_draft_ids"][i] or []
            if c["step"][i] == rows.crash_step and any(t < 0 or (vocab and t >= vocab) for t in drafts):
                rid = c["request_id"][i]
                break
    life = _latest_life(rows, rid)
    outcome = rows.trace.outcome
    check = own_check(outcome.message, outcome.where) if rows.trace.impl.runner_family == "sglang" else None
    if check is not None:  # G7: SGLang's own invariant checker failed
        yield BY_CODE["G7-sglang-own-check"].finding(
            rows.crash_step,
            rid,
            life,
            "invariant_checker",
            None,
            check.name,
            check=check.name,
            check_source=check.source,
            check_function=check.function,
            outcome_message=message,
            where=outcome.where,
        )
    elif rows.trace.outcome.kind in (None, "negative-input-id"):
        yield BY_CODE["X5-negative-input-id"].finding(
            rows.crash_step, rid, life, "input_ids", None, -1, outcome_message=message
        )
    elif rows.trace.outcome.exception is not None:  # the implementation raised (engines/crash.py)
        outcome = rows.trace.outcome
        yield BY_CODE["E1-engine-crash"].finding(
            rows.crash_step,
            rid,
            life,
            "exception",
            None,
            outcome.exception,
            outcome_message=message,
            where=outcome.where,
            side=outcome.side,
        )
    else:
        yield BY_CODE["E1-engine-crash"].finding(
            rows.crash_step, rid, life, "scheduler_output", None, None, outcome_message=message
        )


#: The row-by-row statement of each product rule, by the code that heads it in the catalogue: the
#: codes, severities, statements and messages are the product's (replay/check/catalogue.py); only
#: the rules are restated here.
CHECKS: dict[str, Callable[[TraceRows], Iterator[Finding]]] = {
    "S1-placeholders-nonnegative": check_placeholders_nonnegative,
    "S2-placeholder-count": check_placeholder_count,
    "S3-scheduler-computed-tokens": check_computed_tokens,
    "S4-decode-identity": check_decode_identity,
    "S5-draft-provenance": check_draft_provenance,
    "S6-token-budget": check_budget,
    "S7-draft-slot-count": check_draft_slot_count,
    "S8-token-lost": check_tokens_applied,
    "S9-step-past-max-tokens": check_wasted_steps,
    "S10-needless-preemption": check_needless_preemption,
    "S11-preemption-frees-nothing": check_preemption_returns,
    "X1-batch-membership": check_membership,
    "X3-output-length": check_output_length,
    "X5-placeholder-drafts": check_draft_inputs,
    "X12-padding-verified": check_padding_verified,
    "X10-scheduler-output-mutated": check_output_mutated,
    "X11-executed-other-work": check_executed_work,
    "L1-output-life": check_output_life,
    "L2-stale-output": check_stale_outputs,
    "L3-in-flight-tokens": check_in_flight_tokens,
    "T1-wrong-token": check_tokens,
    "K1-kv-content": check_kv_truth,
    "K2-kv-foreign-tokens": check_foreign_tokens,
    "K3-kv-unowned-block": check_block_ownership,
    "K6-cache-hit-content": check_cache_hits,
    "K5-finished-state-kept": check_finished_state,
    "E1-engine-crash": check_crash,
    "E2-run-incomplete": check_run_completes,
    "M1-device-computed": check_device_computed,
    "M2-cpu-mirror": check_cpu_mirror,
    "M3-draft-origin": check_draft_origin,
    "M4-preempted-as-new": check_preempted_as_new,
    "M5-slot-holder": check_slot_holder,
    "M6-position-device-count": check_positions_from_device,
    **rowwise_sglang.CHECKS,  # SGLang's G codes (G7: check_crash)
}


def check_trace(trace: Trace) -> list[Finding]:
    """Every invariant over the whole trace; findings sorted by step, request, code."""
    rows = TraceRows(trace)
    findings: list[Finding] = []
    family = rows.trace.impl.runner_family or "v1"  # the codes about the runner the trace recorded
    for inv in INVARIANTS:  # every product rule must have its statement here (KeyError otherwise)
        findings.extend(f for f in CHECKS[inv.code](rows) if family in BY_CODE[f.code].runners)
    findings.sort(key=lambda f: (f.step, f.request_id or "", RANK.get(f.code, len(RANK)), f.code))
    return findings
