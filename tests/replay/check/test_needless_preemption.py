"""S10 (a preemption that gains nothing): flagged at each request a step preempted while no
request of the step needed a KV block it did not hold, on variants that preempt so; clean on
upstream under real KV pressure; the same on the row-by-row statement. A stall that never
finishes is E2's."""

from __future__ import annotations

from specreplay.replay.check.catalogue import CATALOGUE
from specreplay.replay.check.checker import check_trace
from specreplay.replay.check.framework import Checker
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import RequestSpec, Workload
from tests.replay.check.broken_preemption import PreemptsEveryone, PreemptsEveryoneDropping, PreemptsUnderWatermark
from tests.replay.check.test_checker_equivalence import same_findings

S10 = "S10-needless-preemption"


def _impl(cls) -> Implementation:
    return Implementation(cls.__name__, cls.__doc__, scheduler=cls)


def _three(num_blocks: int, max_steps: int = 400) -> Workload:
    """Three requests, prompt 20, max_tokens 30, k = 0, 16-token blocks: each holds 2 blocks after
    its prefill (step 1), 4 at the end; `num_blocks` decides whether they all fit at once."""
    return Workload(
        requests=tuple(RequestSpec(str(i), 1, 20, 30) for i in range(3)),
        config=EngineConfig(num_spec_tokens=0, block_size=16, num_blocks=num_blocks, max_num_batched_tokens=64),
        acceptance="none",
        max_steps=max_steps,
    )


def _codes(trace, code):
    return [f for f in check_trace(trace) if f.code == code]


def _without_s10(trace):
    """The trace's findings with every rule but S10's."""
    checker = Checker(trace.config, trace.outcome, invariants=[row for row in CATALOGUE if row.code != S10])
    checker.feed(trace.table)
    return checker.findings()


def test_a_cascade_that_preempts_everyone_for_zero_blocks_is_flagged_at_each_request():
    # Step 1 prefills all three (2 blocks each, 20 tokens); at step 2 each would decode its 21st
    # token inside its 2 blocks, yet the whole running queue is preempted. They prefill again and
    # the run still finishes: without S10 nothing says so.
    trace = run_workload(_three(num_blocks=64), _impl(PreemptsEveryone))
    assert trace.outcome.status == "completed"
    found = _codes(trace, S10)
    at_2 = [f for f in found if f.step == 2]
    assert [(f.request_id, f.severity) for f in at_2] == [("0", "warning"), ("1", "warning"), ("2", "warning")]
    assert (at_2[0].expected, at_2[0].actual) == (False, True)
    assert at_2[0].facts() == {"held_blocks": 2, "scheduled_requests": 0}
    assert "needed a KV block" in at_2[0].message
    assert _without_s10(trace) == []  # the rule off: the run reads as ok
    same_findings(trace)


def test_a_watermark_that_preempts_while_the_blocks_suffice_is_flagged():
    trace = run_workload(_three(num_blocks=12), _impl(PreemptsUnderWatermark))
    assert trace.outcome.status == "completed"
    found = _codes(trace, S10)
    assert found and all(f.severity == "warning" for f in found)
    assert _without_s10(trace) == []
    same_findings(trace)


def test_upstream_preempts_only_for_a_block_it_needs():
    trace = run_workload(_three(num_blocks=9), resolve("upstream", allow_import=False))
    assert any(trace.table["sched_preempted"].to_pylist())  # KV pressure: vLLM does preempt here
    assert check_trace(trace) == []


def test_preemptions_that_never_let_the_run_finish_are_e2():
    # Drop mode: the output of each resumed prefill comes back stale and is dropped, so no token
    # is ever kept and the run hits the step limit.
    trace = run_workload(_three(num_blocks=64, max_steps=60), _impl(PreemptsEveryoneDropping))
    assert trace.outcome.status == "step_limit"
    assert [f.severity for f in check_trace(trace) if f.code == "E2-run-incomplete"] == ["error"]
