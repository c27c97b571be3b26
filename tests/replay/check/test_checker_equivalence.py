"""The vectorised, streaming checker finds exactly what the row-by-row statement of the invariants
finds, evidence included (expected, actual, life, detail): on every scenario and implementation, on
random workloads, on thousands of mutated traces, and whatever the batch size the rows arrive in."""

from __future__ import annotations

import dataclasses
import random

import pyarrow as pa
import pytest

from specreplay.replay.check.checker import NEEDED, check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces import schema
from specreplay.traces.validate import GROUPS, NON_NEGATIVE, RowValidator
from tests.replay.check import rowwise_checker

IMPLS = ("upstream", "pr30796", "pr30796-copy", "sched-clear", "noclamp")


def same_findings(trace) -> None:
    expected = rowwise_checker.check_trace(trace)
    assert check_trace(trace) == expected
    for batch_rows in (1, 5, 64):  # steps cut across batches, context carried between them
        assert check_trace(trace, batch_rows=batch_rows) == expected


def _applicable(workload, names) -> list:
    """The workload through each implementation that applies to it (sched-clear, an AsyncScheduler
    variant, does not apply to the synchronous ones: random-7, reentry-sync)."""
    impls = [resolve(name, allow_import=False) for name in names]
    return [run_workload(workload, impl) for impl in impls if impl.why_not(workload.config) is None]


@pytest.fixture(scope="module")
def recorded():
    traces = []
    for seed in (3, 7, 23, 38, 50):
        traces += _applicable(build_scenario("random", seed=seed), IMPLS)
    for name in ("reentry", "reentry-sync"):
        traces += _applicable(build_scenario(name), IMPLS)
    # Control events and request lives: the scenarios, random seeds that draw events (a crash
    # on a resubmission, pauses, resets, streaming sessions), and variants that break L1-L3.
    from tests.replay.engines.test_control_events import NoPlaceholderAssert, StaleAsFresh, StaleInSteps, _impl

    for name in ("pause-clear", "abort-inflight", "resubmit", "streaming-append", "streaming-preempt"):
        traces += [
            run_workload(build_scenario(name), resolve(impl, allow_import=False)) for impl in ("upstream", "life-guard")
        ]
        traces += [
            run_workload(build_scenario(name), _impl(cls)) for cls in (NoPlaceholderAssert, StaleAsFresh, StaleInSteps)
        ]
    for seed in (28, 31, 44, 64, 85, 99):
        traces.append(run_workload(build_scenario("random", seed=seed), resolve("upstream", allow_import=False)))
    return traces


def test_same_findings_on_recorded_traces(recorded):
    codes = {f.code for t in recorded for f in rowwise_checker.check_trace(t)}
    assert {
        "L1-output-life",
        "L2-stale-output",
        "L3-in-flight-tokens",
        "E1-engine-crash",
        "E2-run-incomplete",
        "X10-scheduler-output-mutated",
        "S5-draft-provenance",
    } <= codes  # findings to agree on
    for trace in recorded:
        same_findings(trace)


def test_same_findings_on_the_step_limit_and_crash_outcomes():
    from tests.conftest import padded_admission_cut_by_threshold

    limited = run_workload(
        dataclasses.replace(build_scenario("reentry"), max_steps=3), resolve("upstream", allow_import=False)
    )
    crashed = run_workload(padded_admission_cut_by_threshold(), resolve("upstream", allow_import=False))
    for trace in (limited, crashed):
        assert rowwise_checker.check_trace(trace)
        same_findings(trace)


#: Columns the checker reads that the mutations leave alone: a row's identity, the text columns
#: (a mutation draws numbers) and the finish reason (`_value` draws no finish reasons).
_KEPT = {
    "step",
    "request_id",
    "truth_kv_foreign_writer",
    "truth_kv_block_owner",
    "truth_cache_hit_writer",
    "worker_draft_proposed_for",
    "worker_slot_prev_owner",
    "apply_finish_reason",
}
#: Columns the checker reads, with values a mutation may put there (None only where nullable):
#: derived from the checker's own list, so a column it starts reading is mutated too.
_MUTABLE = [name for name in NEEDED if name not in _KEPT]


def _value(rng: random.Random, name: str, current):
    field = schema.SCHEMA.field(name)
    if name == "sched_status":
        return rng.choice(schema.STATUSES)
    if name == "sched_kind":
        return rng.choice(schema.KINDS)
    if name == "sched_event":
        return rng.choice(schema.EVENTS)
    if name == "apply_outcome":  # an output with apply columns was used: not "ignored"
        return rng.choice(("applied", "stale_delivered", "dropped"))
    if name == "sched_life":
        return rng.choice((0, 1))
    if name in schema.ENUMS:  # the other enum columns (SGLang's skip reason and forward mode)
        return rng.choice(schema.ENUMS[name])
    if pa.types.is_boolean(field.type):
        return rng.random() < 0.5
    if pa.types.is_list(field.type):
        return [rng.choice((-1, 0, 5)) for _ in range(rng.randint(0, 3))]
    base = current if isinstance(current, int) else 0
    value = base + rng.choice((-2, -1, 1, 2, 3))
    return max(0, value) if name in NON_NEGATIVE else value


def mutated(trace, rng: random.Random, edits: int):
    """`edits` random edits: a value changed, or a row's whole worker, apply or truth group set
    to null (the reader rejects half-filled groups, so the checker never sees one)."""
    names = set(_MUTABLE) | {n for group in GROUPS.values() for n in group} | {"apply_life"}
    columns = {name: trace.table[name].to_pylist() for name in names}
    for _ in range(edits):
        row = rng.randrange(trace.table.num_rows)
        if rng.random() < 0.2:
            group = rng.choice(sorted(GROUPS))
            # The popped and apply groups go null together: an output never popped was not used.
            nulled = (
                GROUPS["apply"] + GROUPS["popped"] + ("apply_token_mismatches", "apply_life")
                if group in ("apply", "popped")
                else GROUPS[group]
            )
            for name in nulled:
                columns[name][row] = None
            continue
        name = rng.choice(_MUTABLE)
        group = next((g for g in GROUPS.values() if name in g), ())
        if name in ("apply_token_mismatches", "apply_outcome"):
            group = GROUPS["apply"]
        if any(columns[n][row] is None for n in group):
            continue  # a null group stays null
        columns[name][row] = _value(rng, name, columns[name][row])
    table = trace.table
    for name, values in columns.items():
        field = schema.SCHEMA.field(name)
        arr = (
            pa.array(values, pa.string()).dictionary_encode().cast(field.type)
            if pa.types.is_dictionary(field.type)
            else pa.array(values, field.type)
        )
        table = table.set_column(table.schema.get_field_index(name), field, arr)
    return dataclasses.replace(trace, table=table)


def test_same_findings_on_mutated_traces(recorded):
    rng = random.Random(20261130)
    fired = set()
    for case in range(400):
        trace = mutated(rng.choice(recorded), rng, edits=rng.randint(1, 6))
        RowValidator(f"case {case}").check(trace.table)  # what the reader would hand the checker
        expected = rowwise_checker.check_trace(trace)
        fired |= {f.code for f in expected}
        got = check_trace(trace, batch_rows=rng.choice((1, 3, 17, 1 << 20)))
        assert got == expected, f"case {case}"
    assert len(fired) >= 19, sorted(fired)  # the mutations reach (almost) every invariant
