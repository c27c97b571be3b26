"""The worker's token rows hold what vLLM's `token_ids_cpu` holds past a row's known tokens (what
earlier writes left at that batch index, 0 where nothing was written), so a runner that neither
writes a re-added row's draft slots nor clamps its inputs dies as vLLM's runners up to 0.13 did.

The variant is vLLM 0.11-0.13's re-add (design A0: no spec ids written for a re-added row) on
vLLM <= 0.22's input path (no clamp): one override of the re-add hook plus the clamp switch.
"""

from __future__ import annotations

from specreplay.replay.api import GPUModelRunner
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.v1.input_batch import CachedRequestState, InputBatch
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.workloads.scenarios import build_scenario


class StaleDraftSlotsNoClamp(GPUModelRunner):
    """A re-added row gets no draft ids written (vLLM A0) and no clamp guards the embedding."""

    clamps_negative_ids = False

    def write_readded_spec_ids(self, st, row, out):
        pass  # the row's draft slots keep what earlier writes left there


def test_a_row_keeps_what_earlier_writes_left_past_its_known_tokens():
    batch = InputBatch()
    first = CachedRequestState("a", [1, 2, 3], [0], 0)
    row = batch.add_request(first)
    batch.write_spec_ids(row, [-1, -1])
    batch.append_tokens(row, [-1])  # async bookkeeping: one placeholder over the first slot
    assert batch.token_ids[row] == [1, 2, 3, -1, -1]
    batch.remove_request("a")
    batch.condense()
    # Another request takes the emptied row: only its own tokens are overwritten.
    row = batch.add_request(CachedRequestState("b", [7, 8], [1], 0))
    assert batch.token_ids[row] == [7, 8, 3, -1, -1]
    batch.write_spec_ids(row, [-1])
    assert batch.token_ids[row][:3] == [7, 8, -1]


def test_condense_moves_only_the_known_tokens_and_draft_slots():
    batch = InputBatch()
    for rid, prompt in (("a", [1, 1, 1, 1, 1]), ("b", [2, 2])):
        batch.add_request(CachedRequestState(rid, prompt, [0], 0))
    batch.write_spec_ids(1, [-1])
    batch.remove_request("a")
    batch.condense()
    # b moves into row 0 over a's tokens: its 2 + 1 active tokens, then what a left there.
    assert batch.req_id_to_index == {"b": 0}
    assert batch.token_ids[0] == [2, 2, -1, 1, 1]


def test_a_readded_row_without_draft_ids_or_clamp_dies_at_the_reentry_step():
    # reentry: request 10 is left out by the budget at steps 2-3 and re-enters at step 4 with 3
    # draft slots. Its row's slots hold the -1 placeholders the async bookkeeping and the draft
    # writes of earlier steps left there; with nothing written over them and no clamp, -1 reaches
    # the embedding (vLLM #36906's device-side assert).
    impl = Implementation("stale-slots", "A0 re-add, no clamp", runner=StaleDraftSlotsNoClamp)
    trace = run_workload(build_scenario("reentry"), impl)
    assert (trace.outcome.status, trace.outcome.step, trace.outcome.kind) == ("crashed", 4, "negative-input-id")
    crash = [f for f in check_trace(trace) if f.code in ("E1-engine-crash", "X5-negative-input-id")]
    assert [(f.code, f.step, f.request_id) for f in crash] == [("X5-negative-input-id", 4, "10")]


def test_upstream_reads_no_stale_slot():
    # vLLM >= 0.25 writes the re-added row's slots and clamps: the same workload completes, and the
    # stale row contents reach no input (every draft slot is written or scattered over).
    trace = run_workload(build_scenario("reentry"), resolve("upstream", allow_import=False))
    assert trace.outcome.status == "completed"
    assert not [f for f in check_trace(trace) if f.severity == "error"]
