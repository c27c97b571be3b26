"""The physical KV model: a paged buffer the runner writes through its block tables, the ground truth
read back from the blocks, and the findings about blocks freed, reused or kept around a step in
flight (K2-K5), each at the step and naming both requests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.loop import EngineLoop
from specreplay.replay.engines.run import _run, run_workload, trace_header
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces.io import read_trace
from tests.replay.check import rowwise_checker

VARIANTS = "tests.replay.models.kv_variants"
KV_CODES = {"K2-kv-foreign-tokens", "K3-kv-unowned-block", "K4-kv-write-unowned", "K5-finished-state-kept"}


def run_loop(workload, impl_name: str):
    """The run's trace and its loop (whose scheduler and runner a test may read)."""
    impl = resolve(impl_name, allow_import=True)
    loop = EngineLoop(workload, impl)
    header = trace_header(workload, impl.describe(loop.parts.observed, "reference"), "cpu", loop.outcome)
    return _run(loop, header, None, None, 16), loop


def findings_of(trace, code: str) -> list:
    found = check_trace(trace)
    assert found == rowwise_checker.check_trace(trace)  # the row-by-row statement agrees
    return [f for f in found if f.code == code]


def test_a_block_freed_with_a_step_in_flight_and_given_to_another_request_is_flagged_at_that_step():
    """EarlyFreeScheduler frees request 4's blocks at schedule(6), its step 5 still in flight, and
    hands block 18 to request 6 in that same step: request 6's step-6 writes land in positions
    request 4 still holds as valid. K2 at step 6 on request 4, naming request 6."""
    trace, loop = run_loop(build_scenario("random", 0), f"{VARIANTS}:EarlyFreeScheduler")
    sched = loop.sched
    step, victim, freed = sched.released[0]
    taken = [(s, rid) for s, rid, blocks in sched.given if s >= step and rid != victim and set(blocks) & set(freed)]
    assert taken, "the freed blocks went to nobody: the scenario no longer shows the bug"
    given_at, receiver = taken[0]
    first = findings_of(trace, "K2-kv-foreign-tokens")[0]
    assert (first.step, first.request_id, first.facts()["other_request"]) == (given_at, victim, receiver)
    assert (first.step, first.request_id, receiver) == (6, "4", "6")  # the run this docstring tells
    assert "request '6'" in first.message


def test_a_request_going_on_through_freed_blocks_writes_into_another_requests_blocks():
    """When the in-flight step's drafts were rejected, the early-freed request is scheduled again
    with its old block table: K3 (its table points at blocks another request holds) and K4 (its
    step writes there) at the same step, naming the holder. Without prefix caching: vLLM puts a
    freed block that holds no hash at the head of the free queue, so another request takes it
    before the early-freed one runs again (with caching, the freed blocks of cached prefixes go
    to the tail, and this seed's request takes its own blocks back first)."""
    workload = build_scenario("random", 191)
    workload = dataclasses.replace(workload, config=dataclasses.replace(workload.config, enable_prefix_caching=False))
    trace, _ = run_loop(workload, f"{VARIANTS}:EarlyFreeScheduler")
    k3 = findings_of(trace, "K3-kv-unowned-block")
    k4 = findings_of(trace, "K4-kv-write-unowned")
    assert k3 and k4
    assert (k4[0].step, k4[0].request_id) in {(f.step, f.request_id) for f in k3}
    owner = k4[0].facts()["other_request"]
    assert owner and owner != k4[0].request_id


def test_a_worker_keeping_a_finished_request_one_step_too_long_is_flagged_at_the_announcing_step():
    trace = run_workload(build_scenario("random", 0), resolve(f"{VARIANTS}:LingeringRunner", allow_import=True))
    t = trace.table
    announced = {
        (step, rid)
        for step, rid, flag in zip(
            t["step"].to_pylist(), t["request_id"].to_pylist(), t["sched_finished_announced"].to_pylist()
        )
        if flag
    }
    flagged = {(f.step, f.request_id) for f in findings_of(trace, "K5-finished-state-kept")}
    assert flagged and flagged == announced


@pytest.mark.parametrize("name", ["reentry", "reentry-sync", "abort-inflight", "resubmit", "streaming-append"])
def test_upstream_and_sched_clear_keep_their_blocks(name):
    for impl in ("upstream", "sched-clear"):
        implementation, workload = resolve(impl, allow_import=False), build_scenario(name)
        if implementation.why_not(workload.config) is not None:  # sched-clear on reentry-sync: not applicable
            continue
        trace = run_workload(workload, implementation)
        assert not {f.code for f in check_trace(trace)} & KV_CODES


def test_upstream_writes_into_blocks_freed_with_the_step_in_flight_and_stays_clean():
    """vLLM frees a finished request's blocks while its last step may still be in flight; the
    physical model lets that step's writes land after the scheduler reused the blocks, and the
    stream order keeps the new owner's writes last: no finding."""
    for seed in range(6):
        trace, loop = run_loop(build_scenario("random", seed), "upstream")
        assert not {f.code for f in check_trace(trace)} & KV_CODES
        assert loop.runner.kv_in_flight == [] or loop.config.async_scheduling  # sync: landed at once


def test_the_truth_reads_the_blocks_back():
    """Mid-run (the re-entry workload stopped at step 6, its requests still live: a run that
    ends announces them finished and the runner drops them), every position a live request's
    truth counts as valid holds its expected token in the physical buffer, written by it."""
    trace, loop = run_loop(dataclasses.replace(build_scenario("reentry"), max_steps=6), "upstream")
    runner, bs = loop.runner, loop.config.block_size
    runner.commit_kv()
    checked = 0
    for rid, st in runner.requests.items():
        expected = loop.parts.oracle.expected(rid, len(st.prompt_token_ids))
        for p in range(min(st.num_computed_tokens, len(st.block_ids) * bs)):
            slot = st.block_ids[p // bs] * bs + p % bs
            assert int(runner.kv_tokens[slot]) == expected[p]
            assert runner.kv_writers[int(runner.kv_writer[slot])] == rid
            checked += 1
    assert checked


def test_a_v2_trace_reads_with_the_kv_columns_null_and_checks_without_them():
    golden = read_trace(Path(__file__).parents[2] / "traces" / "data" / "reentry-v2.parquet")
    for name in ("truth_kv_foreign_positions", "truth_kv_unowned_blocks", "worker_kept_finished"):
        assert golden.table[name].null_count == golden.num_rows
    assert not {f.code for f in check_trace(golden)} & KV_CODES
