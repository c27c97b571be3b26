"""Model Runner V2's codes (replay/check/rules_mrv2.py) on the real MRV2, recorded live.

Each M code fires on a subclass of the real MRV2 runner that breaks its invariant
(tests/replay/check/mrv2_variants.py), and on nothing the upstream runner does: the reentry
scenario (the whole checker passes: no finding at all), a KV-pressure workload with preemptions,
and a slot reused while its finished owner's last step is in flight. Eight engines in all, one
small workload each, shared by the module's tests; the row-by-row statement (rowwise_checker.py) agrees on every trace.
Branches no variant reaches are held by mutating a recorded upstream trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from specreplay.replay.check import coverage
from specreplay.replay.check.catalogue import BY_CODE
from specreplay.replay.check.checker import NEEDED, Checker, check_report, check_trace, unchecked_codes
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.replay.workloads.workload import RequestSpec, Workload
from tests.replay.check import rowwise_checker
from tests.replay.check.truthless import without_ground_truth

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("mrv2")]

V1_RUNNER_CODES = [
    "X2-sched-worker-computed",
    "X2-worker-position-mismatch",
    "X3-output-length",
    "S5-draft-provenance",
    "X5-placeholder-drafts",
]
MRV2_CODES = {
    "M1-device-computed",
    "M1-device-advance",
    "M2-cpu-mirror",
    "M3-draft-origin",
    "M4-preempted-as-new",
    "M5-slot-holder",
}


def _config(**changes) -> EngineConfig:
    base = dict(
        max_num_batched_tokens=64,
        max_num_seqs=8,
        num_spec_tokens=3,
        async_scheduling=True,
        block_size=32,
        num_blocks=50,
        max_model_len=96,
    )
    return EngineConfig(**(base | changes))


#: Two decoding requests: drafts rejected at every step (the live model accepts few).
TWO = Workload(
    (RequestSpec("0", 1, 3, 10), RequestSpec("1", 1, 3, 10)), _config(), name="two", acceptance="all", max_steps=200
)
#: Three requests of 44 tokens in 3 blocks of 32: preempted for KV blocks, each back as a new
#: request on a freed slot.
PREEMPTING = Workload(
    tuple(RequestSpec(str(i), 1, 20, 24) for i in range(3)),
    _config(num_blocks=4),
    name="preempting",
    acceptance="all",
    max_steps=300,
)
#: Request 0 finishes when step 3 is applied; its step 4, ignored, is in flight when step 5 announces
#: the finish, and request 1, arriving then, takes its slot; request 2 runs throughout.
LATE = Workload(
    (RequestSpec("0", 1, 3, 4), RequestSpec("2", 1, 3, 12), RequestSpec("1", 5, 3, 6)),
    _config(),
    name="late",
    acceptance="all",
    max_steps=200,
)


@functools.cache
def _recorded(impl: str, workload: str):
    workloads = {w.name: w for w in (TWO, PREEMPTING, LATE, build_scenario("reentry"))}
    name = impl if impl == "upstream" else f"tests.replay.check.mrv2_variants:{impl}"
    # Unforced (families/vllm/forced_logits.py): the evidence below is the dummy model's and n-gram's.
    with unforced():
        trace = run_workload(workloads[workload], resolve(name, allow_import=True), engine="vllm", runner="v2")
    assert trace.impl.runner_family == "v2"
    assert trace.outcome.status == "completed", trace.outcome
    return trace


@contextlib.contextmanager
def unforced():
    from specreplay.replay.families.vllm.forced_logits import UNFORCED_ENV

    saved = os.environ.get(UNFORCED_ENV)
    os.environ[UNFORCED_ENV] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(UNFORCED_ENV)
        else:
            os.environ[UNFORCED_ENV] = saved


def codes(trace) -> set[str]:
    return {f.code for f in check_trace(trace)}


def findings_of(trace, code: str) -> list:
    return [f for f in check_trace(trace) if f.code == code]


# ------------------------------------------------------------------ upstream: no finding
def test_the_upstream_reentry_on_mrv2_passes_the_whole_checker():
    trace = _recorded("upstream", "reentry")
    assert check_trace(trace) == []
    # request 10 re-enters after the budget skipped it and verifies drafts: real ones, its own
    rows = trace.table.filter(pc.equal(trace.table["request_id"], "10")).to_pylist()
    reentry = next(r for r in rows[1:] if r["sched_num_scheduled_tokens"] and r["sched_kind"] == "reentering")
    assert reentry["worker_num_draft_slots"] == 3 and reentry["worker_draft_proposed_for"] == "10"
    assert reentry["worker_draft_base"] == reentry["worker_device_computed_before"]
    unchecked = unchecked_codes(trace)
    assert [c for c in unchecked if c not in coverage.TRUTH_INPUTS] == V1_RUNNER_CODES
    report = check_report(trace, trace.batches(NEEDED))
    assert report.unchecked == unchecked and not report.findings


def test_upstream_preemptions_have_no_mrv2_error():
    """Preempted requests come back as new lives on fresh slots, and nothing is flagged but the
    waste prefix caching brings: request 1 comes back at step 12 with its 32 tokens still cached,
    needs 1 token, and vLLM pads that admission to 1 + k with placeholder drafts, which the fresh
    slot's zeroed draft row verifies (M3, a warning: the slots are wasted)."""
    trace = _recorded("upstream", "preempting")
    rows = trace.table.to_pylist()
    assert sum(r["sched_preempted"] for r in rows) >= 2
    assert all(r["worker_freed_preempted"] for r in rows if r["sched_preempted"])
    assert any(r["worker_new_life"] and r["worker_prefill_len"] > r["sched_num_prompt_tokens"] for r in rows)
    found = check_trace(trace)
    assert [(f.code, f.step, f.request_id, f.facts()["reason"]) for f in found] == [
        ("M3-draft-origin", 12, "1", "padding")
    ]
    padded = next(r for r in rows if (r["step"], r["request_id"]) == (12, "1"))
    assert (padded["sched_num_cached_tokens"], padded["sched_num_scheduled_tokens"]) == (32, 4)


def test_upstream_slot_reuse_while_the_previous_owner_s_last_step_is_in_flight_is_no_finding():
    trace = _recorded("upstream", "late")
    rows = {(r["step"], r["request_id"]): r for r in trace.table.to_pylist()}
    taken = rows[(5, "1")]
    assert (taken["worker_slot_prev_owner"], taken["worker_slot_last_write_step"]) == ("0", 4)
    assert rows[(4, "0")]["apply_step"] >= 5  # step 4's output was still in flight at step 5
    assert check_trace(trace) == []


# ------------------------------------------------------------------ each code against a runner that breaks it
def test_a_runner_that_never_takes_rejections_off_the_device_count():
    trace = _recorded("NO_ROLLBACK", "two")
    advance = findings_of(trace, "M1-device-advance")
    assert advance and all(f.actual == f.facts()["worker_device_computed_before"] + 4 for f in advance)
    before = findings_of(trace, "M1-device-computed")
    assert before and before[0].step > advance[0].step  # the next step runs from the wrong position
    assert codes(trace) == {"M1-device-advance", "M1-device-computed"}


def test_a_cpu_mirror_that_holds_the_device_count():
    trace = _recorded("EXACT_MIRROR", "two")
    found = findings_of(trace, "M2-cpu-mirror")
    assert found and all(f.actual == f.facts()["worker_device_computed_before"] < f.expected for f in found)
    assert codes(trace) == {"M2-cpu-mirror"}


def test_a_device_count_resynced_to_the_scheduler_verifies_drafts_of_a_position_it_moved_past():
    trace = _recorded("RESYNC", "two")
    found = findings_of(trace, "M3-draft-origin")
    assert found and {f.facts()["reason"] for f in found} == {"moved_past"}
    assert codes(trace) == {"M3-draft-origin", "M1-device-computed"}


def test_a_runner_that_keeps_a_preempted_request_s_slot():
    trace = _recorded("KEEPS_PREEMPTED", "preempting")
    found = findings_of(trace, "M4-preempted-as-new")
    assert found and all(f.facts()["reason"] == "kept" for f in found)
    assert codes(trace) - {"M3-draft-origin"} == {"M4-preempted-as-new"}  # M3: upstream's padded re-admission


def test_positions_built_from_the_cpu_mirror_are_caught_from_the_recorded_inputs_alone():
    """Issue 45, item 2: the evidence is in the worker's recorded inputs (its first position and
    the device count it ran from), so the finding needs neither forced tokens (this run is
    unforced) nor the KV truth (the columns the truth fills are taken out first, as an attached
    recording of a deployment has none)."""
    trace = _recorded("MIRROR_POSITIONS", "two")
    found = findings_of(trace, "M6-position-device-count")
    assert found, codes(trace)
    for f in found:  # ahead of the device count by the rejections in flight: where the mirror is
        assert f.actual == f.facts()["worker_cpu_computed"] > f.expected, f.facts()
    assert "M6-position-device-count" in codes(without_ground_truth(trace))
    assert not findings_of(_recorded("upstream", "two"), "M6-position-device-count")


def test_a_forward_that_raises_leaves_the_step_s_inputs_and_names_the_request_that_fed_them():
    """Issue 45, item 1: the embedding lookup raises inside the forward (a draft id past the
    vocabulary). The worker's rows of that step are written from the inputs it prepared before the
    forward (slots, positions, the ids fed, the device count), so the trace shows what was fed and
    by whom, and E1-engine-crash names that request (the exception names none)."""
    from tests.replay.check.mrv2_variants import FOREIGN_ID

    name = "tests.replay.check.mrv2_variants:FOREIGN_DRAFT"
    with unforced():
        trace = run_workload(TWO, resolve(name, allow_import=True), engine="vllm", runner="v2")
    assert trace.outcome.status == "crashed" and trace.outcome.request is None, trace.outcome
    crash = trace.outcome.step
    rows = [r for r in trace.table.to_pylist() if r["step"] == crash]
    fed = [r for r in rows if FOREIGN_ID in (r["worker_draft_ids"] or [])]
    assert len(fed) == 1, rows
    culprit = fed[0]
    assert culprit["worker_slot"] is not None and culprit["worker_first_position"] is not None
    assert culprit["worker_device_computed_before"] is not None
    (e1,) = [f for f in check_trace(trace) if f.code == "E1-engine-crash"]
    assert (e1.step, e1.request_id) == (crash, culprit["request_id"]), e1
    expected = rowwise_checker.check_trace(trace)  # the row-by-row statement names the same request
    for batch_rows in (1, 5, 1 << 20):
        assert check_trace(trace, batch_rows=batch_rows) == expected, batch_rows


def test_a_runner_that_puts_a_new_request_on_a_running_one_s_slot():
    trace = _recorded("SHARES_SLOTS", "late")
    (found,) = findings_of(trace, "M5-slot-holder")
    assert (found.step, found.request_id, found.facts()["holder"], found.facts()["taken_at"]) == (5, "2", "1", 5)


#: Every recording of this module: (implementation, workload), one engine each.
RECORDED = (
    ("upstream", "reentry"),
    ("upstream", "preempting"),
    ("upstream", "late"),
    ("NO_ROLLBACK", "two"),
    ("EXACT_MIRROR", "two"),
    ("RESYNC", "two"),
    ("KEEPS_PREEMPTED", "preempting"),
    ("SHARES_SLOTS", "late"),
    ("MIRROR_POSITIONS", "two"),
)


#: The first finding of each MRV2 code on the recording that breaks it, evidence and message whole:
#: (implementation, workload, code, step, request, field, expected, actual, detail, message).
EVIDENCE = (
    (
        "NO_ROLLBACK",
        "two",
        "M1-device-advance",
        2,
        "0",
        "num_computed_tokens",
        4,
        7,
        {"apply_num_rejected": 3, "sched_num_scheduled_tokens": 4, "worker_device_computed_before": 3},
        "post_update took the device count from 3 to 7; the scheduler's 4 tokens less 3 rejected make 4",
    ),
    (
        "NO_ROLLBACK",
        "two",
        "M1-device-computed",
        3,
        "0",
        "num_computed_tokens",
        4,
        7,
        {"rejected_in_flight": 3, "sched_num_computed_tokens": 7},
        "the device num_computed_tokens the step runs from is 7, but the scheduler's C 7 less 3 rejected in "
        "flight is 4: the step computes from the wrong position",
    ),
    (
        "EXACT_MIRROR",
        "two",
        "M2-cpu-mirror",
        3,
        "0",
        "num_computed_tokens_np",
        7,
        4,
        {"worker_device_computed_before": 4},
        "the CPU mirror num_computed_tokens_np is 4, not the scheduler's C 7 (device 4): the CPU-side bounds "
        "MRV2 derives from it (seq_lens_cpu_upper_bound, prefill progress) are off",
    ),
    (
        "RESYNC",
        "two",
        "M3-draft-origin",
        3,
        "0",
        "draft_tokens",
        None,
        3,
        {
            "last_worker_step": 2,
            "reason": "moved_past",
            "worker_device_computed_before": 7,
            "worker_draft_base": 4,
            "worker_draft_proposed_for": "0",
            "worker_draft_proposed_step": 2,
        },
        "verified 3 draft slots whose drafts are not its own next tokens: they follow position 4, but it runs "
        "from 7: it has moved since they were proposed (the slots are wasted)",
    ),
    (
        "KEEPS_PREEMPTED",
        "preempting",
        "M4-preempted-as-new",
        6,
        "1",
        "worker_freed_preempted",
        True,
        False,
        {"reason": "kept"},
        "listed preempted, but the worker kept its slot and state (MRV2 frees a preempted request like a finished one)",
    ),
    (
        "SHARES_SLOTS",
        "late",
        "M5-slot-holder",
        5,
        "2",
        "worker_slot",
        "1",
        6,
        {"holder": "1", "taken_at": 5},
        "runs on slot 6, which request '1' took at step 5: two requests write one slot's state (its count, "
        "tokens, drafts)",
    ),
    (
        "MIRROR_POSITIONS",
        "two",
        "M6-position-device-count",
        3,
        "0",
        "positions",
        4,
        7,
        {"sched_num_computed_tokens": 7, "worker_cpu_computed": 7},
        "the step's positions start at 7, but the device count it runs from is 4 (the CPU mirror holds 7): its "
        "tokens are embedded at the wrong positions and its KV written to the wrong slots",
    ),
)


@pytest.mark.parametrize("case", EVIDENCE, ids=[case[2] for case in EVIDENCE])
def test_each_mrv2_code_s_finding_carries_its_evidence(case):
    impl, workload, code, step, rid, field, expected, actual, detail, message = case
    f = findings_of(_recorded(impl, workload), code)[0]
    assert (f.step, f.request_id, f.field, f.expected, f.actual, f.life, f.facts()) == (
        step,
        rid,
        field,
        expected,
        actual,
        0,
        detail,
    )
    assert f.message == message
    row = BY_CODE[code]
    assert f.severity == row.severity and row.runners == ("v2",)
    assert row.finding(f.step, f.request_id, f.life, f.field, f.expected, f.actual, **f.facts()) == f
    # a checker of that one row reports only it (its rule's other code stays out)
    trace = _recorded(impl, workload)
    checker = Checker(trace.config, trace.outcome, invariants=[row], runner_family="v2")
    checker.feed(trace.table)
    assert {g.code for g in checker.findings()} == {code}


def test_the_row_by_row_statement_agrees_on_every_mrv2_trace():
    for impl, workload in RECORDED:
        trace = _recorded(impl, workload)
        expected = rowwise_checker.check_trace(trace)
        for batch_rows in (1, 5, 1 << 20):
            assert check_trace(trace, batch_rows=batch_rows) == expected, (impl, workload, batch_rows)


# ------------------------------------------------------------------ the branches no variant reaches
def _edited(trace, where, **values):
    """`trace` with the columns `values` set on the rows `where(row)` picks."""
    rows = trace.table.to_pylist()
    for row in rows:
        if where(row):
            row.update(values)
    return dataclasses.replace(trace, table=pa.Table.from_pylist(rows, schema=trace.table.schema))


def test_m4_a_preempted_request_back_not_new_or_with_a_short_prefill():
    trace = _recorded("upstream", "preempting")
    back = [r for r in trace.table.to_pylist() if r["worker_new_life"] and r["worker_prefill_len"] > 20]
    first = back[0]

    def at(row):
        return (row["step"], row["request_id"]) == (first["step"], first["request_id"])

    (found,) = findings_of(_edited(trace, at, worker_new_life=False), "M4-preempted-as-new")
    assert (found.step, found.facts()["reason"]) == (first["step"], "not_new")
    (found,) = findings_of(_edited(trace, at, worker_prefill_len=20), "M4-preempted-as-new")
    assert (found.expected, found.actual, found.facts()["reason"]) == (first["sched_num_tokens"], 20, "prefill")


def test_m3_padding_another_request_s_drafts_and_an_older_step_s():
    trace = _recorded("upstream", "reentry")
    step2 = lambda row: row["step"] == 2 and row["request_id"] == "3"  # noqa: E731
    for values, reason in (
        (dict(worker_draft_proposed_step=None, worker_draft_proposed_for=None, worker_draft_base=None), "padding"),
        (dict(worker_draft_proposed_for="4"), "other_request"),
        (dict(worker_draft_proposed_step=0), "not_last_step"),
    ):
        (found,) = findings_of(_edited(trace, step2, **values), "M3-draft-origin")
        assert (found.step, found.request_id, found.facts()["reason"]) == (2, "3", reason)


def test_the_mrv2_codes_do_not_run_on_a_v1_trace_and_the_v1_runner_codes_do_not_run_on_mrv2():
    trace = _recorded("NO_ROLLBACK", "two")
    as_v1 = dataclasses.replace(trace, impl=dataclasses.replace(trace.impl, runner_family="v1"))
    assert not codes(as_v1) & MRV2_CODES
    assert not set(unchecked_codes(as_v1)) & (MRV2_CODES | set(V1_RUNNER_CODES))
    assert {"M1-device-advance", "M1-device-computed"} <= codes(trace)  # as recorded (v2), the MRV2 codes run


def test_the_row_by_row_statement_agrees_on_mutated_mrv2_traces():
    import random

    from specreplay.traces.validate import RowValidator
    from tests.replay.check.test_checker_equivalence import mutated

    traces = [_recorded(*case) for case in RECORDED]
    rng = random.Random(20261202)
    fired = set()
    for case in range(120):
        trace = mutated(rng.choice(traces), rng, edits=rng.randint(1, 6))
        RowValidator(f"case {case}").check(trace.table)
        expected = rowwise_checker.check_trace(trace)
        fired |= {f.code for f in expected}
        assert check_trace(trace, batch_rows=rng.choice((1, 3, 17, 1 << 20))) == expected, f"case {case}"
    assert MRV2_CODES <= fired, sorted(MRV2_CODES - fired)
