"""X12 (padding verified as drafts): draft slots the drafter left unfilled after the step before,
verified as if they were drafts, are flagged at the step that verifies them; on vLLM's own
behaviour (the drafter skipped for the whole batch near max_model_len) and on a drafter variant
that proposes fewer than k; not where the drafter filled every slot, and unchecked where the trace
does not say what the drafter proposed."""

from __future__ import annotations

import dataclasses

from specreplay.replay.api import GPUModelRunner
from specreplay.replay.check.checker import check_trace, unchecked_codes
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.scenarios import build_scenario

X12 = "X12-padding-verified"
#: a reaches max_model_len (40 + 8 = 48) while b decodes: once a's sequence plus k no longer fits,
#: vLLM's drafter is skipped for the whole batch and b's next k slots hold zeros.
NEAR_THE_END = "a:p40,t8 b:p4,t20 | k3 {mode} len 48"


class ProposesOne(GPUModelRunner):
    """A drafter that proposes one draft per request and pads the rest of its k with zeros."""

    def propose_drafts(self, inputs, emitted, discarded):
        super().propose_drafts(inputs, emitted, discarded)
        if self._draft_token_ids is not None:
            self._draft_token_ids[:, 1:] = 0
        self.drafts_proposed = {rid: min(n, 1) for rid, n in self.drafts_proposed.items()}


def x12(trace):
    return [f for f in check_trace(trace) if f.code == X12]


def upstream():
    return resolve("upstream", allow_import=False)


def test_the_drafter_skipped_near_max_model_len_wastes_the_next_steps_slots():
    for mode in ("sync", "async"):
        trace = run_workload(workload_from_notation(NEAR_THE_END.format(mode=mode)), upstream())
        found = check_trace(trace)
        # a's last step (step 3) leaves no room for k more; the drafter is skipped for a and b, and
        # b's step 4 verifies its 3 slots against zeros (all rejected: 1 token from the step).
        got = [(f.code, f.step, f.request_id, f.actual, f.severity) for f in found]
        assert got == [(X12, 4, "b", 3, "warning")], mode
        rows = trace.table.to_pandas()
        b4 = rows[(rows.step == 4) & (rows.request_id == "b")].iloc[0]
        assert list(b4.worker_draft_ids) == [0, 0, 0] and b4.worker_num_accepted == 0


def test_a_drafter_that_proposes_fewer_than_k_is_flagged_at_the_first_step_that_verifies_padding():
    impl = Implementation("proposes-one", ProposesOne.__doc__, runner=ProposesOne)
    trace = run_workload(workload_from_notation("a:p6,t12 b:p6,t12,@2 | k3 async"), impl)
    found = x12(trace)
    # Step 1 prefills a, step 2 is a's first step with drafts (two of its 3 slots padding); b's
    # first drafted step is step 3.
    assert [(f.step, f.request_id, f.actual) for f in found] == [(2, "a", 2), (3, "b", 2)]
    assert not x12(run_workload(workload_from_notation("a:p6,t12 b:p6,t12,@2 | k3 async"), upstream()))


def test_slots_the_drafter_filled_are_not_padding():
    for name in ("reentry", "pause-clear", "streaming-append"):
        assert not x12(run_workload(build_scenario(name), upstream())), name


def test_unchecked_where_the_trace_does_not_say_what_the_drafter_proposed():
    trace = run_workload(workload_from_notation(NEAR_THE_END.format(mode="sync")), upstream())
    table = trace.table
    at = table.schema.get_field_index("truth_unfilled_draft_slots")
    import pyarrow as pa

    blind = dataclasses.replace(
        trace, table=table.set_column(at, table.schema.field(at), pa.nulls(table.num_rows, pa.int16()))
    )
    assert X12 not in {f.code for f in check_trace(blind)}
    assert X12 in unchecked_codes(blind) and X12 not in unchecked_codes(trace)
