"""Each invariant: a trace that keeps it and a mutated trace that breaks it; the re-entry results."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.traces import schema


def codes(trace) -> set[str]:
    return {f.code for f in check_trace(trace)}


def mutate(trace, column: str, step: int, request_id: str, value):
    t = trace.table
    steps, rids = t["step"].to_pylist(), t["request_id"].to_pylist()
    values = t[column].to_pylist()
    hit = [i for i, (s, r) in enumerate(zip(steps, rids)) if s == step and r == request_id]
    assert hit, (step, request_id)
    values[hit[0]] = value
    field = schema.SCHEMA.field(column)
    arr = (
        pa.array(values, pa.string()).dictionary_encode().cast(field.type)
        if pa.types.is_dictionary(field.type)
        else pa.array(values, field.type)
    )
    return dataclasses.replace(trace, table=t.set_column(t.schema.get_field_index(column), field, arr))


# (code, column, step, request, value): applied to the clean sched-clear trace.
BREAKS = [
    ("S1-placeholders-nonnegative", "sched_num_output_placeholders", 5, "3", -1),
    ("S2-placeholder-count", "sched_num_output_placeholders", 5, "3", 7),
    ("S3-scheduler-computed-tokens", "truth_num_computed_tokens", 5, "3", 2),
    ("S4-decode-identity", "sched_num_tokens", 5, "3", 40),
    ("S5-draft-provenance", "sched_num_draft_slots", 4, "10", 3),
    ("S6-token-budget", "step_total_scheduled_tokens", 3, "1", 41),
    ("S7-draft-slot-count", "sched_num_draft_slots", 5, "2", 1),
    ("X1-batch-membership", "worker_row", 5, "2", None),
    ("X2-sched-worker-computed", "worker_num_computed_tokens", 5, "2", 99),
    ("X2-worker-kv-position", "worker_first_position", 5, "2", 30),
    ("X2-worker-position-mismatch", "worker_first_position", 5, "3", 99),
    ("X3-output-length", "worker_num_output_tokens", 5, "2", 1),
    ("X5-placeholder-drafts", "worker_draft_ids", 5, "2", [-1, -1, -1]),
    ("X10-scheduler-output-mutated", "apply_num_draft_slots", 5, "2", 0),
    ("X11-executed-other-work", "worker_num_scheduled_tokens", 5, "2", 1),
    ("T1-wrong-token", "apply_token_mismatches", 5, "2", 1),
    ("K1-kv-content", "truth_kv_ok", 5, "2", False),
]


def test_the_clean_trace_keeps_every_invariant(reentry_traces):
    assert check_trace(reentry_traces["sched-clear"]) == []


@pytest.mark.parametrize("code, column, step, rid, value", BREAKS, ids=[b[0] for b in BREAKS])
def test_each_invariant_fires_on_a_trace_that_breaks_it(reentry_traces, code, column, step, rid, value):
    broken = mutate(reentry_traces["sched-clear"], column, step, rid, value)
    assert code in codes(broken)


def test_crash_is_an_error_finding(reentry_traces):
    findings = check_trace(reentry_traces["noclamp"])
    crash = [f for f in findings if f.code == "X5-negative-input-id"]
    assert crash and crash[0].step == 4 and crash[0].request_id == "10" and crash[0].severity == "error"


def test_upstream_wastes_draft_slots_of_request_10_but_counters_agree(reentry_traces):
    findings = check_trace(reentry_traces["upstream"])
    assert {(f.code, f.step, f.request_id, f.severity) for f in findings} == {
        ("S5-draft-provenance", 4, "10", "warning"),
        ("X5-placeholder-drafts", 4, "10", "warning"),
    }


def test_pr30796_breaks_the_counters_of_request_10(reentry_traces):
    errors = [f for f in check_trace(reentry_traces["pr30796"]) if f.severity == "error"]
    assert {f.request_id for f in errors} == {"10"}
    assert {
        "X10-scheduler-output-mutated",
        "S3-scheduler-computed-tokens",
        "S2-placeholder-count",
        "X2-worker-kv-position",
        "T1-wrong-token",
    } <= {f.code for f in errors}


def test_pr30796_copy_leaves_the_worker_ahead_of_its_kv(reentry_traces):
    errors = {f.code for f in check_trace(reentry_traces["pr30796-copy"]) if f.severity == "error"}
    assert "X2-sched-worker-computed" in errors and "X10-scheduler-output-mutated" not in errors


def test_a_run_that_hits_the_step_limit_is_an_error():
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import reentry

    trace = run_workload(dataclasses.replace(reentry(), max_steps=3), resolve("upstream", allow_import=False))
    assert trace.outcome.to_dict() == {"status": "step_limit", "step": 3}
    found = [f for f in check_trace(trace) if f.code == "E2-run-incomplete"]
    assert found and found[0].severity == "error" and found[0].worker == 11


def test_malformed_scheduler_output_is_an_engine_crash():
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import reentry_sync

    trace = run_workload(reentry_sync(), resolve("pr30796", allow_import=False))
    assert trace.outcome.status == "crashed" and trace.outcome.kind == "malformed-scheduler-output"
    assert "E1-engine-crash" in codes(trace)


def test_padded_admission_cut_by_the_long_prefill_threshold_is_vllms_assert():
    """Real vLLM 0.32 asserts (scheduler.py, `num_new_tokens == 1 + num_spec_tokens`) when a
    1-token admission padded to 1 + k is then cut by a smaller long_prefill_token_threshold;
    the reference reproduces the crash and the checker reports it."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from tests.conftest import padded_admission_cut_by_threshold

    trace = run_workload(padded_admission_cut_by_threshold(), resolve("upstream", allow_import=False))
    assert (trace.outcome.status, trace.outcome.step, trace.outcome.kind) == ("crashed", 2, "scheduler-assert")
    assert "E1-engine-crash" in codes(trace)
