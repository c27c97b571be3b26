"""Findings as evidence: for every catalogue code, a hand-built trace on which its rule fires, and
the finding it yields: where, the evidence (expected, actual, life, detail), the 0.1 values
(scheduler, worker) and the message rendered from the evidence, pinned to the text specreplay 0.1
printed. Each trace is a recorded scenario with one value edited (the mutation), or a recorded run
that crashes or stops short."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any, NamedTuple

import pytest

from specreplay.replay.check.catalogue import BY_CODE, CATALOGUE
from specreplay.replay.check.checker import Checker, check_trace
from specreplay.replay.check.findings import BASE_KEYS, Finding
from specreplay.replay.check.limits import max_tokens_by_life


class Case(NamedTuple):
    code: str
    trace: tuple  # ("clear" | "resubmit", column, step, request, value): that trace with one value edited; or a run
    step: int
    request_id: str | None
    field: str
    scheduler: Any
    worker: Any
    expected: Any
    actual: Any
    life: int | None
    detail: dict[str, Any]
    message: str


CASES = [
    Case(
        "S1-placeholders-nonnegative",
        ("clear", "sched_num_output_placeholders", 5, "3", -1),
        5,
        "3",
        "num_output_placeholders",
        -1,
        None,
        expected=None,
        actual=-1,
        life=0,
        detail={"column": "sched_num_output_placeholders"},
        message="num_output_placeholders went negative (-1); vLLM asserts and the engine dies",
    ),
    Case(
        "S2-placeholder-count",
        ("clear", "sched_num_output_placeholders", 5, "3", 7),
        5,
        "3",
        "num_output_placeholders",
        7,
        4,
        expected=4,
        actual=7,
        life=0,
        detail={"steps_in_flight": (4,)},
        message="num_output_placeholders is 7 but the steps in flight (4) account for 4",
    ),
    Case(
        "S3-scheduler-computed-tokens",
        ("clear", "truth_num_computed_tokens", 5, "3", 2),
        5,
        "3",
        "num_computed_tokens",
        15,
        2,
        expected=2,
        actual=15,
        life=0,
        detail={"rejected_in_flight": 0, "sched_num_computed_tokens": 15},
        message="the scheduler's num_computed_tokens, once its in-flight rejections are taken off, is 15 but the KV cache holds 2 valid tokens",
    ),
    Case(
        "S4-decode-identity",
        ("clear", "sched_num_tokens", 5, "3", 40),
        5,
        "3",
        "num_tokens + placeholders - num_computed_tokens",
        29,
        1,
        expected=1,
        actual=29,
        life=0,
        detail={
            "decoding": True,
            "sched_num_computed_tokens": 15,
            "sched_num_output_placeholders": 4,
            "sched_num_tokens": 40,
        },
        message="num_tokens + num_output_placeholders - num_computed_tokens is 29, expected 1 for a decoding request (its next demand is wrong)",
    ),
    Case(
        "S5-draft-provenance",
        ("clear", "sched_num_draft_slots", 4, "10", 3),
        4,
        "10",
        "scheduled_spec_decode_tokens",
        3,
        0,
        expected=0,
        actual=3,
        life=0,
        detail={"previous_step": 3, "reason": "not_scheduled"},
        message="scheduled 3 draft slots with no drafts behind them: it was not scheduled at step 3, so the worker holds no drafts for it (stale -1 placeholders; the slots are verified and wasted)",
    ),
    Case(
        "S6-token-budget",
        ("clear", "step_total_scheduled_tokens", 3, "1", 41),
        3,
        None,
        "total_num_scheduled_tokens",
        41,
        40,
        expected=40,
        actual=41,
        life=None,
        detail={"max_num_batched_tokens": 40},
        message="total_num_scheduled_tokens is 41; the requests add up to 40; budget 40",
    ),
    Case(
        "S7-draft-slot-count",
        ("clear", "sched_num_draft_slots", 5, "2", 1),
        5,
        "2",
        "num_draft_slots",
        1,
        3,
        expected=3,
        actual=1,
        life=0,
        detail={"sched_num_scheduled_tokens": 4},
        message="1 draft slots scheduled inside 4 tokens; the counters allow 3",
    ),
    Case(
        "X1-batch-membership",
        ("clear", "worker_row", 5, "2", None),
        5,
        "2",
        "worker_row",
        True,
        False,
        expected=True,
        actual=False,
        life=0,
        detail={},
        message="scheduled but not in the worker's batch",
    ),
    Case(
        "X2-sched-worker-computed",
        ("clear", "worker_num_computed_tokens", 5, "2", 99),
        5,
        "2",
        "num_computed_tokens",
        15,
        99,
        expected=15,
        actual=99,
        life=0,
        detail={"rejected_in_flight": 0, "sched_num_computed_tokens": 15},
        message="scheduler and worker disagree on num_computed_tokens at step 5: 15 vs 99",
    ),
    Case(
        "X2-worker-kv-position",
        ("clear", "worker_first_position", 5, "2", 30),
        5,
        "2",
        "num_computed_tokens",
        15,
        30,
        expected=15,
        actual=30,
        life=0,
        detail={"sched_num_computed_tokens": 15},
        message="the worker writes step 5 from position 30 but its KV cache holds 15 valid tokens: positions 15..29 are never written",
    ),
    Case(
        "X2-worker-position-mismatch",
        ("clear", "worker_first_position", 5, "3", 99),
        5,
        "3",
        "num_computed_tokens",
        15,
        99,
        expected=99,
        actual=15,
        life=0,
        detail={},
        message="the worker's CPU num_computed_tokens (15) differs from the device position it computes with (99)",
    ),
    Case(
        "X3-output-length",
        ("clear", "worker_num_output_tokens", 5, "2", 1),
        5,
        "2",
        "num_output_tokens",
        13,
        1,
        expected=13,
        actual=1,
        life=0,
        detail={"sched_num_output_placeholders": 4, "sched_num_output_tokens": 9},
        message="the worker holds 1 output tokens, the scheduler sent 13 (applied + placeholders)",
    ),
    Case(
        "X5-placeholder-drafts",
        ("clear", "worker_draft_ids", 5, "2", (-1, -1, -1)),
        5,
        "2",
        "draft_token_ids",
        3,
        3,
        expected=3,
        actual=3,
        life=0,
        detail={"worker_num_negative_draft_ids": 3},
        message="the worker verified 3 draft slots with no cached drafts behind them (3 of them -1, clamped to 0 for the embedding and rejected)",
    ),
    Case(
        "X11-executed-other-work",
        ("clear", "worker_num_scheduled_tokens", 5, "2", 1),
        5,
        "2",
        "num_scheduled_tokens",
        4,
        1,
        expected=4,
        actual=1,
        life=0,
        detail={
            "sched_num_draft_slots": 3,
            "worker_num_draft_slots": 3,
            "worker_cached_drafts": 3,
            "reason": "not_only_draft_slots",
        },
        message="the worker executed 1 tokens (3 drafts) where the scheduler booked 4 (3 drafts)",
    ),
    Case(
        "K1-kv-content",
        ("clear", "truth_kv_ok", 5, "2", False),
        5,
        "2",
        "kv_cache",
        None,
        15,
        expected=True,
        actual=False,
        life=0,
        detail={"truth_num_computed_tokens": 15},
        message="the KV cache no longer holds the request's expected tokens in every valid position",
    ),
    Case(
        "K2-kv-foreign-tokens",
        ("clear", "truth_kv_foreign_positions", 5, "2", 3),
        5,
        "2",
        "kv_cache",
        0,
        3,
        expected=0,
        actual=3,
        life=0,
        detail={"other_request": None},
        message="3 valid KV positions of the request hold tokens written by another request: KV it still held "
        "was written by another (a block handed over, or a write past the writer's own slots)",
    ),
    Case(
        "K3-kv-unowned-block",
        ("clear", "truth_kv_unowned_blocks", 5, "2", 1),
        5,
        "2",
        "block_table",
        0,
        1,
        expected=0,
        actual=1,
        life=0,
        detail={"other_request": None},
        message="the block table the worker ran the request with holds 1 blocks the scheduler does not hold for "
        "it: the first is free",
    ),
    Case(
        "K4-kv-write-unowned",
        ("clear", "truth_kv_unowned_writes", 5, "2", 2),
        5,
        "2",
        "kv_cache",
        0,
        2,
        expected=0,
        actual=2,
        life=0,
        detail={"other_request": None},
        message="the step wrote 2 KV positions into blocks the request no longer holds (the first is free)",
    ),
    Case(
        "K5-finished-state-kept",
        ("clear", "worker_kept_finished", 5, "2", True),
        5,
        "2",
        "requests",
        False,
        True,
        expected=False,
        actual=True,
        life=0,
        detail={},
        message="the worker still holds the request's cached state or batch row after the step that announced it "
        "finished (a resubmitted id would inherit it)",
    ),
    Case(
        "L1-output-life",
        ("clear", "apply_life", 4, "3", 1),
        4,
        "3",
        "request life",
        0,
        1,
        expected=0,
        actual=1,
        life=0,
        detail={"apply_num_tokens": 3, "apply_outcome": "applied", "apply_step": 5},
        message="the output of step 4, scheduled for life 0 of the request, was given to life 1 (a new request under the same id) at step 5 (applied, 3 tokens): the old life's tokens and counts land on the new one",
    ),
    Case(
        "L2-stale-output",
        ("clear", "apply_outcome", 4, "3", "dropped"),
        5,
        "3",
        "apply_outcome",
        "dropped",
        "fresh",
        expected="fresh",
        actual="dropped",
        life=0,
        detail={"apply_num_rejected": 0, "apply_num_tokens": 3, "output_step": 4},
        message="the output of step 4 belongs to the request's current life (no preemption or reset since), yet update_from_output treated it as stale (dropped) at step 5: its tokens are lost or its counters never settle",
    ),
    Case(
        "L3-in-flight-tokens",
        ("clear", "sched_num_in_flight_tokens", 5, "3", 99),
        5,
        "3",
        "num_in_flight_tokens",
        99,
        4,
        expected=4,
        actual=99,
        life=0,
        detail={},
        message="num_in_flight_tokens is 99 but the scheduled tokens of its outputs in flight add up to 4; counted in steps or sampled tokens instead of scheduled tokens?",
    ),
    Case(
        "X5-negative-input-id",
        ("noclamp",),
        4,
        "10",
        "input_ids",
        None,
        -1,
        expected=None,
        actual=-1,
        life=0,
        detail={"outcome_message": "input id -1 reached the embedding for request '10' at step 4"},
        message="input id -1 reached the embedding for request '10' at step 4: on a GPU a device-side assert, the engine dies",
    ),
    Case(
        "E1-engine-crash",
        ("padded",),
        2,
        "3",
        "scheduler_output",
        None,
        None,
        expected=None,
        actual=None,
        life=0,
        detail={
            "outcome_message": "scheduler assert: request '3' padded to 5 tokens for spec decode but cut to 4 (long_prefill_token_threshold)"
        },
        message="the engine dies at step 2: scheduler assert: request '3' padded to 5 tokens for spec decode but cut to 4 (long_prefill_token_threshold)",
    ),
    Case(
        "E2-run-incomplete",
        ("limit",),
        3,
        "0",
        "outcome",
        "step_limit",
        11,
        expected=0,
        actual=11,
        life=0,
        detail={"status": "step_limit", "unfinished": ("0", "1", "10", "2", "3", "4", "5", "6", "7", "8", "9")},
        message="the run hit the step limit with 11 requests unfinished (0, 1, 10, 2, 3...): livelock or starvation",
    ),
    Case(
        "X10-scheduler-output-mutated",
        ("clear", "apply_num_draft_slots", 4, "2", 0),
        4,
        "2",
        "scheduled_spec_decode_tokens",
        3,
        0,
        expected=3,
        actual=0,
        life=0,
        detail={"apply_num_scheduled_tokens": 4, "sched_num_scheduled_tokens": 4},
        message="update_from_output read 4 tokens with 0 draft slots back from the SchedulerOutput that was built with 4 and 3: the worker edited the scheduler's own object",
    ),
    Case(
        "T1-wrong-token",
        ("clear", "apply_token_mismatches", 4, "2", 1),
        4,
        "2",
        "output_token_ids",
        3,
        1,
        expected=0,
        actual=1,
        life=0,
        detail={"apply_num_tokens": 3},
        message="1 of the 3 tokens applied from step 4 differ from the request's expected sequence (a token lost, duplicated or computed at the wrong position)",
    ),
    Case(
        "S8-token-lost",
        ("clear", "apply_num_tokens", 3, "2", 2),
        3,
        "2",
        "output_token_ids",
        2,
        4,
        expected=4,
        actual=2,
        life=0,
        detail={"apply_step": 4, "sched_num_scheduled_tokens": 4},
        message="the worker emitted 4 tokens at step 3 but update_from_output applied 2 of them at step 4, with no stop, max_tokens or max_model_len to cut them: 2 lost (the next step starts at the wrong position)",
    ),
    Case(
        "X12-padding-verified",
        ("drafter-skip",),
        4,
        "b",
        "scheduled_spec_decode_tokens",
        None,
        3,
        expected=0,
        actual=3,
        life=0,
        detail={},
        message="the worker verified 3 draft slots holding padding: the drafter proposed nothing for them after the step before (it skipped the request or proposed fewer than k), so the slots were booked and verified for nothing",
    ),
    Case(
        "S9-step-past-max-tokens",
        ("clear", "sched_num_computed_tokens", 5, "2", 17),
        5,
        "2",
        "num_scheduled_tokens",
        4,
        0,
        expected=0,
        actual=4,
        life=0,
        detail={
            "max_tokens": 12,
            "reason": "max_tokens",
            "sched_num_computed_tokens": 17,
            "sched_num_output_placeholders": 4,
            "sched_num_prompt_tokens": 3,
        },
        message="scheduled 4 tokens for nothing: the output in flight already takes it to max_tokens 12 (17 computed + 2 - 4 placeholders >= 3 prompt + 12); vLLM's running loop skips it, and this step's output comes back to a finished request",
    ),
    Case(
        "S10-needless-preemption",
        ("clear", "sched_preempted", 6, "1", True),
        6,
        "1",
        "preempted",
        True,
        False,
        expected=False,
        actual=True,
        life=0,
        detail={"held_blocks": 2, "scheduled_requests": 1},
        message="preempted at step 6 although no request the step scheduled or preempted needed a KV block it did not already hold (1 scheduled, each within its own blocks): the 2 or more blocks it held are freed for nothing, and it prefills again",
    ),
    Case(
        "S11-preemption-frees-nothing",
        ("deferred-free",),
        17,
        "1",
        "sched_preempt_blocks_returned",
        2,
        0,
        expected=2,
        actual=0,
        life=0,
        detail={"preempted_in_step": 3},
        message="preempted for KV blocks at step 17, but its preemption returned 0 of the 2 blocks it alone held to the free pool (its free was deferred): the allocation it was preempted for cannot use them, so the step preempts again or schedules less (3 preempted at this step), and its KV is thrown away for nothing",
    ),
    Case(
        "K6-cache-hit-content",
        ("stale-hit",),
        12,
        "a",
        "prefix_cache",
        8,
        4,
        expected=8,
        actual=4,
        life=1,
        detail={"other_request": "b"},
        message="the request's prefix-cache hit covers 8 tokens, but only the first 4 hold the KV of its own tokens: "
        "position 4 holds what request 'b' wrote there (a cached block whose KV is not what its hash names: a "
        "rejected draft's, or a stale block's)",
    ),
    Case(
        "S2-placeholder-count",
        ("resubmit", "sched_num_output_placeholders", 12, "1", 9),
        12,
        "1",
        "num_output_placeholders",
        9,
        4,
        expected=4,
        actual=9,
        life=1,
        detail={"steps_in_flight": (11,)},
        message="num_output_placeholders is 9 but the steps in flight (11) account for 4",
    ),
]


@cache
def _run(name: str):
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import build_scenario
    from tests.conftest import padded_admission_cut_by_threshold

    if name == "padded":  # real vLLM's assert on a padded admission cut by the threshold: E1
        return run_workload(padded_admission_cut_by_threshold(), resolve("upstream", allow_import=False))
    if name == "drafter-skip":  # the drafter skipped for the batch near max_model_len: X12
        from specreplay.replay.workloads.notation import workload_from_notation

        workload = workload_from_notation("a:p40,t8 b:p4,t20 | k3 sync len 48")
        return run_workload(workload, resolve("upstream", allow_import=False))
    if name == "stale-hit":  # a cached block handed out again with its hash, then hit: K6
        from specreplay.replay.workloads.notation import workload_from_notation
        from tests.replay.models.test_prefix_cache_truth import REUSED, VARIANTS

        workload = workload_from_notation(REUSED)
        return run_workload(workload, resolve(f"{VARIANTS}:KeepsHashOnReuse", allow_import=True))
    if name == "deferred-free":  # a preemption's free deferred behind the step in flight: S11
        from tests.replay.check.test_preemption_returns import DEFERS, four_requests

        return run_workload(four_requests(), DEFERS)
    if name == "limit":  # reentry cut by the step limit: E2
        workload = dataclasses.replace(build_scenario("reentry"), max_steps=3)
        return run_workload(workload, resolve("upstream", allow_import=False))
    return run_workload(build_scenario(name), resolve("upstream", allow_import=False))


def build(case: Case, reentry_traces):
    from tests.replay.check.test_checker import mutate

    kind, *edit = case.trace
    if kind == "noclamp":  # a -1 draft reaches the embedding: X5-negative-input-id
        return reentry_traces["noclamp"]
    base = {"clear": lambda: reentry_traces["sched-clear"], "resubmit": lambda: _run("resubmit")}.get(kind)
    if base is None:
        return _run(kind)
    column, step, rid, value = edit
    return mutate(base(), column, step, rid, list(value) if isinstance(value, tuple) else value)


def test_the_cases_cover_every_catalogue_code():
    # Model Runner V2's codes run on MRV2 traces only: their evidence is held in test_mrv2_codes.py
    assert {case.code for case in CASES} == {row.code for row in CATALOGUE if "v1" in row.runners}


@pytest.mark.parametrize("case", CASES, ids=[f"{c.code}-{c.trace[0]}" for c in CASES])
def test_a_firing_rule_yields_its_finding_with_the_evidence(case, reentry_traces):
    trace = build(case, reentry_traces)
    hits = [f for f in check_trace(trace) if f.code == case.code]
    assert hits, case.code
    f = hits[0]
    assert (f.severity, f.step, f.request_id, f.field) == (
        BY_CODE[case.code].severity,
        case.step,
        case.request_id,
        case.field,
    )
    assert (f.expected, f.actual, f.life, f.facts()) == (case.expected, case.actual, case.life, case.detail)
    assert (f.scheduler, f.worker) == (case.scheduler, case.worker)
    assert f.message == case.message
    # The evidence is filled: what the trace holds, and the request's life where there is a request.
    assert f.actual is not None or case.code == "E1-engine-crash"
    assert (f.life is None) == (f.request_id is None)
    # Rendered from the evidence by the catalogue row, in one place.
    row = BY_CODE[case.code]
    again = row.finding(f.step, f.request_id, f.life, f.field, f.expected, f.actual, **f.facts())
    assert again == f


@pytest.mark.parametrize("case", CASES, ids=[f"{c.code}-{c.trace[0]}" for c in CASES])
def test_a_checker_of_one_row_reports_only_that_code(case, reentry_traces):
    trace = build(case, reentry_traces)
    limits = max_tokens_by_life(trace.workload)  # S9 reads each life's max_tokens from the workload
    checker = Checker(trace.config, trace.outcome, invariants=[BY_CODE[case.code]], limits=limits)
    checker.feed(trace.table)
    found = checker.findings()
    assert found and {f.code for f in found} == {case.code}
    assert found[0] == next(f for f in check_trace(trace) if f.code == case.code)


def test_findings_serialise_with_the_evidence_and_keep_the_01_keys(reentry_traces):
    findings = check_trace(reentry_traces["pr30796"])
    assert len(findings) >= 5
    for f in findings:
        doc = json.loads(json.dumps(f.to_dict()))  # plain Python values only: no numpy scalars
        assert tuple(doc)[: len(BASE_KEYS)] == BASE_KEYS
        assert {"expected", "actual", "life", "detail"} <= set(doc)
        assert doc["detail"] == json.loads(json.dumps(f.facts()))
        assert tuple(f.to_dict(evidence=False)) == BASE_KEYS


def test_a_finding_built_the_01_way_still_works():
    f = Finding("D1-trace-differs", "error", 3, "10", "sched_spec_len", 2, 3, "sched_spec_len: 2 in A, 3 in B")
    assert (f.expected, f.actual, f.life, f.detail) == (None, None, None, ())
    assert f.to_dict(evidence=False) == {
        "code": "D1-trace-differs",
        "severity": "error",
        "step": 3,
        "request_id": "10",
        "field": "sched_spec_len",
        "scheduler": 2,
        "worker": 3,
        "message": "sched_spec_len: 2 in A, 3 in B",
    }
