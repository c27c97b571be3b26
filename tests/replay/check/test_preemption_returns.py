"""S11 (a preemption that frees nothing): the recorder counts, around each preemption inside
schedule(), the blocks the victim held alone and the free blocks the pool gained; a scheduler that
defers the free behind the step in flight and preempts such a victim anyway (vLLM #49674) cascades
down the running queue, flagged at each victim, on the reference and on vLLM's own scheduler alike.
Upstream under KV pressure, with and without blocks shared through the prefix cache: no finding.
"""

from __future__ import annotations

import pytest

from specreplay.replay.check.catalogue import CATALOGUE
from specreplay.replay.check.checker import check_trace
from specreplay.replay.check.framework import Checker
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.request_spec import Prefix
from specreplay.replay.workloads.workload import RequestSpec, Workload
from tests.replay.check.broken_preemption import DefersFreesInFlight, defers_frees_on
from tests.replay.check.test_checker_equivalence import same_findings

S11 = "S11-preemption-frees-nothing"
DEFERS = Implementation(
    "defers-frees", DefersFreesInFlight.__doc__, scheduler=DefersFreesInFlight, real_scheduler=defers_frees_on
)
COLUMNS = ("step", "request_id", "sched_preempted", "sched_preempt_blocks_alone", "sched_preempt_blocks_returned")


def four_requests(num_blocks: int = 10) -> Workload:
    """Request 0 (prompt 31) needs its third block at its second decode; 1-3 (prompt 17) hold 2
    blocks each. 9 usable blocks: the step that needs one more preempts from the tail. No prefix
    cache: a parked block keeps its hash, and what a resumed request's hit on one leads to (the
    deferred free returns a block it holds) is not what this test is about."""
    requests = (RequestSpec("0", 1, 31, 30),) + tuple(RequestSpec(str(i), 1, 17, 30) for i in range(1, 4))
    config = EngineConfig(
        num_spec_tokens=0,
        block_size=16,
        num_blocks=num_blocks,
        max_num_batched_tokens=128,
        enable_prefix_caching=False,
    )
    return Workload(requests=requests, config=config, acceptance="none", max_steps=400)


def _shared_prefix() -> Workload:
    """Four requests on one 32-token prefix (2 blocks held by all), 7 usable blocks: upstream
    preempts two at one step, each giving back only the block it holds alone."""
    requests = (RequestSpec("0", 1, 15, 30, prefix="sys"),) + tuple(
        RequestSpec(str(i), 2, 1, 30, prefix="sys") for i in range(1, 4)
    )
    config = EngineConfig(num_spec_tokens=0, block_size=16, num_blocks=8, max_num_batched_tokens=128)
    return Workload(requests=requests, prefixes=(Prefix("sys", 32),), config=config, acceptance="none", max_steps=400)


def _preemptions(trace) -> list[tuple]:
    """(step, request, blocks held alone, blocks returned) of every preempted row."""
    rows = zip(*(trace.table[name].to_pylist() for name in COLUMNS))
    return [(step, rid, alone, returned) for step, rid, preempted, alone, returned in rows if preempted]


def _without_s11(trace):
    checker = Checker(trace.config, trace.outcome, invariants=[row for row in CATALOGUE if row.code != S11])
    checker.feed(trace.table)
    return checker.findings()


def _assert_cascade(trace) -> None:
    assert trace.outcome.status == "completed"
    # Request 0 needs a block at step 17: 3, 2 and 1 go one after another, each returning none of
    # its 2 blocks; at step 19 the cascade takes 0, 1 and 2 (3 blocks each).
    assert _preemptions(trace) == [
        (17, "1", 2, 0),
        (17, "2", 2, 0),
        (17, "3", 2, 0),
        (19, "0", 3, 0),
        (19, "1", 3, 0),
        (19, "2", 3, 0),
    ]
    found = check_trace(trace)
    assert {f.code for f in found} == {S11}
    assert [(f.step, f.request_id, f.severity) for f in found] == [
        (17, "1", "warning"),
        (17, "2", "warning"),
        (17, "3", "warning"),
        (19, "0", "warning"),
        (19, "1", "warning"),
        (19, "2", "warning"),
    ]
    assert (found[0].expected, found[0].actual, found[0].facts()) == (2, 0, {"preempted_in_step": 3})
    assert "returned 0 of the 2 blocks it alone held" in found[0].message
    assert _without_s11(trace) == []  # the rule off: the cascade reads as ok


def test_a_deferred_free_cascades_down_the_running_queue_and_is_flagged_at_each_victim():
    trace = run_workload(four_requests(), DEFERS)
    _assert_cascade(trace)
    same_findings(trace)


def test_upstream_returns_every_block_a_victim_held_alone():
    trace = run_workload(four_requests(), resolve("upstream", allow_import=False))
    assert _preemptions(trace) == [(17, "3", 2, 2), (19, "2", 3, 3)]
    assert check_trace(trace) == []


def test_blocks_shared_through_the_prefix_cache_are_not_the_victims_alone():
    # Each victim holds the 2 prefix blocks with the others and 1 of its own: it returns that one.
    trace = run_workload(_shared_prefix(), resolve("upstream", allow_import=False))
    assert trace.config.enable_prefix_caching
    assert _preemptions(trace) == [(18, "2", 1, 1), (18, "3", 1, 1)]
    assert check_trace(trace) == []


def test_rows_not_preempted_leave_the_columns_null():
    trace = run_workload(four_requests(), resolve("upstream", allow_import=False))
    preempted = trace.table["sched_preempted"].to_pylist()
    for name in COLUMNS[3:]:
        values = trace.table[name].to_pylist()
        assert all((v is None) != p for v, p in zip(values, preempted))


@pytest.mark.vllm
def test_vllm_own_deferral_without_the_victim_check_cascades_the_same():
    # vLLM's scheduler with its #45357 fence on and PR #49675's victim check out: the same
    # preemptions, counts and findings as the reference variant; upstream vLLM returns them all.
    _assert_cascade(run_workload(four_requests(), DEFERS, engine="vllm-scheduler"))
    upstream = run_workload(four_requests(), resolve("upstream", allow_import=False), engine="vllm-scheduler")
    assert _preemptions(upstream) == [(17, "3", 2, 2), (19, "2", 3, 3)]
    assert check_trace(upstream) == []
    shared = run_workload(_shared_prefix(), resolve("upstream", allow_import=False), engine="vllm-scheduler")
    assert _preemptions(shared) == [(18, "2", 1, 1), (18, "3", 1, 1)]
    assert check_trace(shared) == []
