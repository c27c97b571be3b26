"""S9 (a step booked past max_tokens) and S8 (a token lost at the step it is lost): each flagged at
the right request and step on a variant that breaks it, clean on upstream, the same on the
row-by-row statement, and S9 left unchecked where the trace gives no limits."""

from __future__ import annotations

import dataclasses

import pytest

from specreplay.replay.check.checker import check_report, check_trace, unchecked_codes
from specreplay.replay.check.limits import max_tokens_by_life
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.replay.workloads.workload import RequestSpec, Workload
from tests.replay.check.broken_outputs import (
    DropsSecondOutput,
    LosesDraftsKeepsList,
    NoMaxTokensSkip,
    NoMaxTokensSkipSync,
    TrimsAcceptedDrafts,
)
from tests.replay.check.test_checker_equivalence import same_findings

S8, S9 = "S8-token-lost", "S9-step-past-max-tokens"


def _impl(cls) -> Implementation:
    return Implementation(cls.__name__, cls.__doc__, scheduler=cls)


def _upstream() -> Implementation:
    return resolve("upstream", allow_import=False)


def _one_request(max_tokens: int = 3, k: int = 0, acceptance: str = "none", **config) -> Workload:
    """One request, prompt 5: step 1 is its prefill, each later step one decode (k = 0)."""
    return Workload(
        requests=(RequestSpec("0", prompt_len=5, max_tokens=max_tokens),),
        config=EngineConfig(num_spec_tokens=k, **config),
        acceptance=acceptance,
    )


def _codes(trace, code):
    return [f for f in check_trace(trace) if f.code == code]


# ------------------------------------------------------------------ S9: wasted steps
def test_a_step_past_max_tokens_is_flagged_at_its_request_and_step():
    # Prompt 5, max_tokens 3: before step 4, tokens 1 and 2 are applied and step 3 (the third
    # and last token) is in flight: C = 7, P = 1, 7 + 2 - 1 >= 5 + 3. Step 4 is for nothing.
    trace = run_workload(_one_request(), _impl(NoMaxTokensSkip))
    (f,) = _codes(trace, S9)
    assert (f.step, f.request_id, f.life, f.severity) == (4, "0", 0, "warning")
    assert (f.expected, f.actual) == (0, 1)  # the one token booked for nothing
    assert f.facts() == {
        "reason": "max_tokens",
        "max_tokens": 3,
        "sched_num_computed_tokens": 7,
        "sched_num_output_placeholders": 1,
        "sched_num_prompt_tokens": 5,
    }
    assert "max_tokens 3" in f.message and "for nothing" in f.message
    rows = trace.table.to_pylist()
    wasted = next(r for r in rows if r["step"] == 4)
    assert wasted["apply_outcome"] == "ignored"  # its output came back to a finished request


def test_upstream_skips_that_step():
    trace = run_workload(_one_request(), _upstream())
    assert not _codes(trace, S9)
    assert [r["sched_skip"] for r in trace.table.to_pylist() if r["step"] == 4] == ["max_tokens"]


def test_drafts_that_may_all_be_rejected_are_not_waste():
    # k = 3, every draft accepted: a step whose drafts end the request early is one no scheduler
    # can know of in advance (vLLM's rule assumes every draft rejected); nothing is flagged.
    trace = run_workload(_one_request(max_tokens=9, k=3, acceptance="all"), _upstream())
    assert any(r["apply_outcome"] == "ignored" for r in trace.table.to_pylist())  # a step was wasted
    assert not _codes(trace, S9)


def test_sync_scheduling_never_has_a_step_in_flight_to_skip_for():
    # NoMaxTokensSkip is an AsyncScheduler variant: it does not apply to a sync workload (this test
    # used to run the plain Scheduler in its place). The same override on the sync Scheduler:
    sync_form = NoMaxTokensSkipSync
    workload = _one_request(async_scheduling=False)
    assert _impl(NoMaxTokensSkip).why_not(workload.config) is not None
    trace = run_workload(workload, _impl(sync_form))
    assert trace.impl.scheduler.endswith("NoMaxTokensSkipSync")
    assert not _codes(trace, S9)


def test_a_resubmitted_life_and_a_streaming_turn_are_held_to_their_own_limits():
    # streaming-append: turns of max_tokens 6, 5 and 4; the variant wastes a step past each
    # finishing request's limit, and every finding names the limit of its own turn.
    trace = run_workload(build_scenario("streaming-append"), _impl(NoMaxTokensSkip))
    found = _codes(trace, S9)
    assert found and all(f.facts()["reason"] == "max_tokens" for f in found)
    limits = max_tokens_by_life(trace.workload)
    rows = {(r["step"], r["request_id"]): r for r in trace.table.to_pylist()}
    for f in found:
        row = rows[(f.step, f.request_id)]
        assert f.facts()["max_tokens"] in limits[(f.request_id, f.life)]
        assert row["sched_num_computed_tokens"] + 2 - row["sched_num_output_placeholders"] >= (
            row["sched_num_prompt_tokens"] + f.facts()["max_tokens"]
        )
    assert not _codes(run_workload(build_scenario("streaming-append"), _upstream()), S9)


def test_limits_per_life_and_turn_from_the_workload():
    workload = {
        "requests": [{"id": "s", "max_tokens": 6, "streaming": True}, {"id": "r", "max_tokens": 4}],
        "events": [
            {"step": 30, "kind": "resubmit", "request": "s", "max_tokens": 9},
            {"step": 3, "kind": "stream_append", "request": "s", "tokens": 2, "max_tokens": 5},
            {"step": 8, "kind": "resubmit", "request": "r"},
            {"step": 9, "kind": "pause"},
        ],
    }
    assert max_tokens_by_life(workload) == {("s", 0): (6, 5), ("s", 1): (9,), ("r", 0): (4,), ("r", 1): (4,)}
    assert max_tokens_by_life({}) == {} and max_tokens_by_life(None) == {}


def test_without_limits_the_rule_does_not_run_and_says_so():
    trace = run_workload(_one_request(), _impl(NoMaxTokensSkip))
    bare = dataclasses.replace(trace, workload={"name": "no requests"})
    report = check_report(bare, bare.batches())
    assert S9 not in {f.code for f in report.findings}
    assert S9 in report.unchecked and S9 in unchecked_codes(bare)
    assert S9 not in check_report(trace, trace.batches()).unchecked


# ------------------------------------------------------------------ S8: a token lost at its step
def test_trimmed_accepted_drafts_are_flagged_at_the_step_that_emitted_them():
    # k = 3, every draft accepted: step 2 emits 4 tokens; the variant appends 1 when it applies
    # step 2's output at step 3. S8 names step 2; the wrong tokens (T1) show only from step 3.
    trace = run_workload(_one_request(max_tokens=12, k=3, acceptance="all"), _impl(TrimsAcceptedDrafts))
    findings = check_trace(trace)
    (f,) = [f for f in findings if f.code == S8]
    assert (f.step, f.request_id, f.severity) == (2, "0", "error")
    assert (f.expected, f.actual) == (4, 1)
    assert f.facts()["apply_step"] == 3
    t1 = [g for g in findings if g.code == "T1-wrong-token"]
    assert t1 and t1[0].step > f.step
    assert findings[0] == f  # the explaining finding comes first


def test_a_token_lost_behind_an_untouched_output_list_is_flagged_where_it_is_lost():
    # The variant appends 1 of step 2's 4 tokens from a copy, leaving the output's list whole:
    # the applied count is the request's growth, so S8 names step 2, not T1 a step later only.
    trace = run_workload(_one_request(max_tokens=12, k=3, acceptance="all"), _impl(LosesDraftsKeepsList))
    findings = check_trace(trace)
    (f,) = [f for f in findings if f.code == S8]
    assert (f.step, f.request_id, f.expected, f.actual) == (2, "0", 4, 1)
    assert findings[0] == f
    row = next(r for r in trace.table.to_pylist() if r["step"] == 2)
    assert len(row["apply_sampled_token_ids"]) == 4 and row["apply_num_tokens"] == 1  # the list, the growth


def test_a_dropped_output_is_flagged_with_nothing_applied():
    trace = run_workload(_one_request(max_tokens=12, k=3, acceptance="all"), _impl(DropsSecondOutput))
    (f,) = _codes(trace, S8)
    assert (f.step, f.request_id, f.expected, f.actual) == (2, "0", 4, 0)


@pytest.mark.parametrize("acceptance", ["all", "none", "alternate"])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_upstream_applies_every_token_it_should(acceptance, async_scheduling):
    workload = _one_request(max_tokens=12, k=3, acceptance=acceptance, async_scheduling=async_scheduling)
    assert not _codes(run_workload(workload, _upstream()), S8)


def test_a_cut_at_a_stop_or_max_tokens_is_no_loss():
    # Every draft accepted, max_tokens 7: the last output is cut after the 7th token.
    trace = run_workload(_one_request(max_tokens=7, k=3, acceptance="all"), _upstream())
    rows = trace.table.to_pylist()
    assert any(r["apply_finish_reason"] == "length" and r["apply_num_tokens"] < r["worker_num_emitted"] for r in rows)
    assert not _codes(trace, S8)


def test_a_stale_output_applied_as_fresh_is_l2s_not_s8s():
    from tests.replay.engines.test_control_events import StaleAsFresh

    findings = check_trace(run_workload(build_scenario("pause-clear"), _impl(StaleAsFresh)))
    assert "L2-stale-output" in {f.code for f in findings}
    assert S8 not in {f.code for f in findings}


# ------------------------------------------------------------------ the row-by-row statement agrees
@pytest.mark.parametrize("cls", [NoMaxTokensSkip, TrimsAcceptedDrafts, DropsSecondOutput, LosesDraftsKeepsList])
def test_the_row_by_row_statement_finds_the_same(cls):
    traces = [run_workload(build_scenario(name), _impl(cls)) for name in ("reentry", "streaming-append", "resubmit")]
    traces += [run_workload(build_scenario("random", seed=seed), _impl(cls)) for seed in (1, 3)]
    fired = set()
    for trace in traces:
        same_findings(trace)
        fired |= {f.code for f in check_trace(trace)}
    assert (S9 if cls is NoMaxTokensSkip else S8) in fired


def test_a_step_after_an_applied_finish_is_flagged(reentry_traces):
    # Request 2's output of step 2, applied at step 3, marked as its stop: steps 4 and 5 of the
    # same turn (same prompt) are booked for a finished request.
    from tests.replay.check.test_checker import mutate

    trace = mutate(reentry_traces["sched-clear"], "apply_finish_reason", 2, "2", "stop")
    found = [f for f in _codes(trace, S9) if f.request_id == "2"]
    assert [(f.step, f.facts()["reason"]) for f in found] == [(4, "finished"), (5, "finished")]
    assert found[0].facts() == {"reason": "finished", "output_step": 2, "apply_step": 3, "apply_finish_reason": "stop"}
    same_findings(trace)
    assert not [f for f in _codes(reentry_traces["sched-clear"], S9)]
