"""The hooks that make each bug of its class one override of one hook (issue 30's list): the token
budget's charge, the blocks' return to the pool, take_output and discard_output seeing the
output, the worker's output-history trim, the "does this row sample" mask, KV written outside the
forward (a connector), the scatter told whose entry each is, and a re-added row's draft slots.
Each is overridden once, wrongly, and the checker names what it broke at the step it broke; the
defaults change nothing (the gate and the fidelity sweep hold upstream's traces)."""

from __future__ import annotations

from specreplay.replay.api import AsyncScheduler, GPUModelRunner
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.scenarios import build_scenario

#: Two decoding requests, drafts accepted every other step: rejections from their second step on.
TWO = workload_from_notation("a:p4,t12 b:p6,t12 | alternate name two")


def findings_of(workload, scheduler=AsyncScheduler, runner=GPUModelRunner):
    impl = Implementation("variant", "one override", scheduler=scheduler, runner=runner)
    trace = run_workload(build_scenario(workload) if isinstance(workload, str) else workload, impl)
    return trace, sorted(check_trace(trace), key=lambda f: (f.step, f.request_id or "", f.code))


def first_error(findings):
    return next((f.code, f.step, f.request_id) for f in findings if f.severity == "error")


def codes(findings) -> set[str]:
    return {f.code for f in findings}


# ---------------------------------------------------------------------- scheduler hooks
def test_charge_budget_that_undercharges_books_past_the_budget():
    class ChargesOneToken(AsyncScheduler):
        def charge_budget(self, plan, req, n):
            plan.budget -= 1

    _, found = findings_of(workload_from_notation("a:p30 b:p30 | budget 32 k3 async name budget"), ChargesOneToken)
    assert first_error(found) == ("S6-token-budget", 1, None)


def test_free_blocks_that_keeps_a_finished_requests_blocks_holds_the_next_one_for_good():
    class KeepsFinishedBlocks(AsyncScheduler):
        def free_blocks(self, req):
            if not req.status.finished:
                super().free_blocks(req)

    text = "a:p8,t8 b:p8,t8@12 | block 4 blocks 5 k0 async steps 60 name leak"
    trace, found = findings_of(workload_from_notation(text), KeepsFinishedBlocks)
    assert codes(findings_of(workload_from_notation(text))[1]) == set()  # upstream frees: both finish
    e2 = next(f for f in found if f.code == "E2-run-incomplete")
    assert e2.request_id == "b" and e2.severity == "error"


def test_take_output_that_reads_the_returned_tokens_miscounts_what_is_in_flight():
    class TakesWhatCameBack(AsyncScheduler):
        """Drains the in-flight count by the tokens returned, not by the tokens scheduled."""

        def take_output(self, req, n, generated):
            return super().take_output(req, len(generated) or n, generated)

    _, found = findings_of(TWO, TakesWhatCameBack)
    assert first_error(found) == ("L3-in-flight-tokens", 3, "a")


def test_discard_output_that_sees_the_output_loses_a_one_token_output_at_its_step():
    class DiscardsSingleTokens(AsyncScheduler):
        """Discards every output of one token (a rejected step's): the token is lost."""

        def discard_output(self, req, stale, generated):
            return super().discard_output(req, stale, generated) or len(generated) == 1

    _, found = findings_of(TWO, DiscardsSingleTokens)
    assert first_error(found) == ("S8-token-lost", 1, "a")


# ---------------------------------------------------------------------- runner hooks
def test_trim_outputs_that_keeps_the_optimistic_tail_is_flagged_where_the_lengths_part():
    class KeepsOptimisticOutputs(GPUModelRunner):
        def trim_outputs(self, st, row, num_output):
            pass  # the drafts' -1 extension of step m-1 stays in the output history

    _, found = findings_of(TWO, runner=KeepsOptimisticOutputs)
    assert first_error(found) == ("X3-output-length", 4, "a")


def test_discarded_rows_that_lets_a_partial_prefill_sample_crashes_at_its_step():
    class EveryRowSamples(GPUModelRunner):
        def discarded_rows(self, rows, seq_lens):
            return [False] * len(rows)

    trace, found = findings_of(
        workload_from_notation("a:p40,t4 | budget 16 k3 async name chunked"), runner=EveryRowSamples
    )
    # Step 1's prefill chunk (16 of 40 tokens) samples a token the scheduler booked no placeholder
    # for; applied when step 2 is scheduled, it takes P below 0: vLLM's assert.
    assert first_error(found) == ("E1-engine-crash", 2, "a")
    assert "num_output_placeholders -1 < 0" in trace.outcome.message


def test_load_kv_of_a_connector_that_writes_a_stale_token_is_kv_content():
    class StaleConnector(GPUModelRunner):
        """A KV connector that reloads request b's first position with a stale token each step."""

        def load_kv(self, out):
            if "b" in out.num_scheduled_tokens:
                self.issue_kv_writes("b", [0], [12345])

    _, found = findings_of(TWO, runner=StaleConnector)
    # Step 1's load lands under b's own prefill write (the later write wins); step 2's does not.
    assert first_error(found) == ("K1-kv-content", 2, "b")


def test_scatter_prev_sampled_is_told_whose_entry_each_is():
    class SkipsB(GPUModelRunner):
        """Leaves out request b's previous sampled token: b's input keeps the gather's value."""

        def scatter_prev_sampled(self, ids, token_at, token_rows, draft_at, draft_slots, rows, token_of, draft_of):
            keep = [j for j, x in enumerate(token_of) if rows[x] != "b"]
            super().scatter_prev_sampled(
                ids,
                [token_at[j] for j in keep],
                [token_rows[j] for j in keep],
                draft_at,
                draft_slots,
                rows,
                [token_of[j] for j in keep],
                draft_of,
            )

    _, found = findings_of(TWO, runner=SkipsB)
    assert first_error(found) == ("K1-kv-content", 2, "b")
    assert ("T1-wrong-token", 2, "b") in {(f.code, f.step, f.request_id) for f in found}


def test_the_default_hooks_change_nothing():
    # Every hook above at its default: upstream's findings on the same workloads are none.
    for workload in (TWO, "reentry", "pause-clear"):
        assert not [f for f in findings_of(workload)[1] if f.severity == "error"]
