"""The scheduler's narrow update hooks and a variant's per-request state (`Request.plugin_state`):
each hook, overridden wrongly, breaks exactly what it decides, and the checker says so at the
step where it happens; overridden to keep state, it changes nothing."""

from __future__ import annotations

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.models.request import Request
from specreplay.replay.models.scheduler import AsyncScheduler
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.replay.workloads.workload import Workload

#: One decoding request, drafts accepted every other step: rejections from its second step on.
ONE = workload_from_notation("a:p4,t12 | alternate name one")


def run(workload: Workload | str, impl: type | str = "upstream"):
    if isinstance(impl, type):
        impl = Implementation(impl.__name__, impl.__doc__, scheduler=impl)
    else:
        impl = resolve(impl, allow_import=False)
    trace = run_workload(build_scenario(workload) if isinstance(workload, str) else workload, impl)
    return trace, check_trace(trace), trace.table.to_pandas()


def errors(findings) -> list:
    return sorted((f for f in findings if f.severity == "error"), key=lambda f: (f.step, f.request_id, f.code))


# ---------------------------------------------------------------------- per-request state
def test_request_keeps_its_slots():
    req = Request("a", [1, 2], 4)
    assert not hasattr(req, "__dict__") and req.plugin_state == {}
    assert Request("a", [1, 2], 4).plugin_state is not req.plugin_state


@pytest.mark.parametrize("scenario", ["resubmit", "pause-clear", "streaming-append"])
def test_plugin_state_is_one_per_life_and_changes_nothing(scenario):
    lives: list[tuple[str, dict]] = []  # (id, plugin_state) of each object, in order of first schedule

    class CountSteps(AsyncScheduler):
        """Counts the steps each request is scheduled in, in its own plugin_state."""

        def update_after_schedule(self, out):
            super().update_after_schedule(out)
            for rid in out.num_scheduled_tokens:
                state = self.requests[rid].plugin_state
                if not state:
                    lives.append((rid, state))
                state["steps"] = state.get("steps", 0) + 1

    trace, _, df = run(scenario, CountSteps)
    assert diff_traces(trace, run(scenario)[0]).same  # the state is the variant's own
    scheduled = df[df.sched_num_scheduled_tokens > 0]
    per_life = scheduled.groupby(["request_id", "sched_life"]).size()
    # One state per life (a resubmission is a new object, a preemption or a streaming turn is
    # not), each counting that life's steps only.
    assert sorted((rid, state["steps"]) for rid, state in lives) == sorted(
        (rid, int(n)) for (rid, _), n in per_life.items()
    )
    if scenario == "resubmit":
        assert len({life for rid, life in per_life.index if rid == "0"}) == 2


def test_life_guard_keeps_its_guard_in_plugin_state():
    _, findings, df = run("resubmit", "life-guard")
    assert not errors(findings)
    # Step 11 was scheduled for life 0, which was aborted and resubmitted while it was in flight:
    # its output goes to nobody, and life 1 starts clean at step 12.
    at11 = df[(df.request_id == "0") & (df.step == 11)]
    assert at11.apply_outcome.item() == "ignored"
    assert set(df[(df.request_id == "0") & (df.step >= 12) & (df.sched_num_scheduled_tokens > 0)].sched_life) == {1}


# ---------------------------------------------------------------------- request_for_output
def test_request_for_output_decides_whose_output_it_is():
    class NoOneTakesOutput(AsyncScheduler):
        def request_for_output(self, out, rid):
            return None

    trace, findings, _ = run(ONE, NoOneTakesOutput)
    # No request takes step 1's output (applied after step 2's schedule): its tokens never leave
    # the in-flight count, which step 3's schedule shows.
    first = errors(findings)[0]
    assert (first.code, first.step, first.request_id) == ("L3-in-flight-tokens", 3, "a")
    assert trace.outcome.status == "step_limit"


# ---------------------------------------------------------------------- take_output
def test_take_output_decides_what_is_stale():
    class NeverStale(AsyncScheduler):
        """Drains the in-flight count but never the stale share: outputs in flight across the
        cache reset count as fresh."""

        def take_output(self, req, n, generated):
            req.num_in_flight_tokens -= n
            return False

    _, _, good = run("pause-clear")
    dropped = good[good.apply_outcome == "dropped"]
    trace, findings, _ = run("pause-clear", NeverStale)
    # The reset's dropped outputs (step 13's, applied at step 14) move the counters instead:
    # P goes below 0 at the first of them, vLLM's assert.
    assert trace.outcome.status == "crashed" and trace.outcome.step == int(dropped.apply_step.min()) == 14
    assert "num_output_placeholders" in trace.outcome.message
    assert {f.code for f in errors(findings) if f.step == 14} >= {"E1-engine-crash"}


# ---------------------------------------------------------------------- discard_output
def test_discard_output_that_drops_everything_loses_the_first_token_at_its_step():
    class DropAll(AsyncScheduler):
        def discard_output(self, req, stale, generated):
            return True

    trace, findings, _ = run(ONE, DropAll)
    first = errors(findings)[0]
    # The first output is taken (applied) but nothing is appended: S8 at its own step (the
    # request's growth is the applied count), then the wrong token it leads to at the next.
    assert (first.code, first.step, first.request_id) == ("S8-token-lost", 1, "a")
    assert ("T1-wrong-token", 2, "a") in {(f.code, f.step, f.request_id) for f in errors(findings)}
    assert "E2-run-incomplete" in {f.code for f in findings}  # nothing is ever applied: livelock


def test_discard_output_that_keeps_drop_mode_output_is_flagged_where_it_lands():
    class KeepDropMode(AsyncScheduler):
        """Discards only for finished requests: the reset's drop-mode outputs are applied."""

        def discard_output(self, req, stale, generated):
            return req.status.finished

    _, _, good = run("pause-clear")
    dropped = good[good.apply_outcome == "dropped"]
    _, findings, _ = run("pause-clear", KeepDropMode)
    found = errors(findings)
    at = found[0].step
    assert at == int(dropped.apply_step.min()) == 14
    wrong = {f.request_id for f in found if f.step == at and f.code == "T1-wrong-token"}
    assert wrong and wrong <= set(dropped.request_id)


# ---------------------------------------------------------------------- account_rejections
def test_account_rejections_returns_what_the_trace_records():
    seen: dict[str, int] = {}

    class SumRejections(AsyncScheduler):
        """Adds up, in each request's plugin_state, the rejections the hook returns."""

        def account_rejections(self, req, slots, generated, stale):
            rejected = super().account_rejections(req, slots, generated, stale)
            req.plugin_state["rejected"] = seen[req.request_id] = req.plugin_state.get("rejected", 0) + rejected
            return rejected

    trace, findings, df = run(ONE, SumRejections)
    assert not errors(findings) and diff_traces(trace, run(ONE)[0]).same
    assert seen == {"a": int(df.apply_num_rejected.fillna(0).sum())} and seen["a"] > 0


def test_account_rejections_without_the_c_correction_is_flagged_at_the_next_schedule():
    class NoComputedCorrection(AsyncScheduler):
        """Corrects P for rejected drafts but leaves C where the schedule put it."""

        def account_rejections(self, req, slots, generated, stale):
            computed = req.num_computed_tokens
            rejected = super().account_rejections(req, slots, generated, stale)
            req.num_computed_tokens = computed
            return rejected

    _, good_findings, good = run(ONE)
    assert not errors(good_findings)
    # The first rejections come back with the apply after step 3's schedule; step 4's schedule
    # is the first to read the uncorrected C.
    first_rejection = good[good.apply_num_rejected > 0].apply_step.min()
    assert first_rejection == 3
    _, findings, _ = run(ONE, NoComputedCorrection)
    first = errors(findings)[0]
    assert (first.step, first.request_id) == (4, "a")
    assert {f.code for f in errors(findings) if f.step == 4} & {
        "S3-scheduler-computed-tokens",
        "S4-decode-identity",
        "X2-worker-position-mismatch",
    }


# ---------------------------------------------------------------------- account_placeholders
def test_account_placeholders_without_its_assert_lets_the_old_life_output_land():
    class NoPlaceholderAssert(AsyncScheduler):
        def account_placeholders(self, req, tokens, stale):
            if not stale:
                req.num_output_placeholders -= len(tokens)

    upstream, _, _ = run("resubmit")
    assert upstream.outcome.status == "crashed" and upstream.outcome.step == 12  # vLLM's assert
    trace, findings, _ = run("resubmit", NoPlaceholderAssert)
    assert trace.outcome.status == "completed"
    # Step 11's output, scheduled for life 0, lands on life 1 and drives P below 0 there.
    at11 = {(f.code, f.request_id) for f in errors(findings) if f.step == 11}
    assert {("L1-output-life", "0"), ("S1-placeholders-nonnegative", "0")} <= at11
    assert min(f.step for f in errors(findings)) == 11
