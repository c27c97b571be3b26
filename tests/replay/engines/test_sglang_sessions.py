"""SGLang's streaming sessions through `--engine sglang-scheduler` (families/sglang/sessions.py).

Marked `sglang`: they run in SGLang's environment (`scripts/sglang.sh test`) and skip elsewhere.
A workload's streaming request (`stream`, fed by `append(ID)@STEP` chunks) is an SGLang streaming
session: opened, one turn at a time (each a new Req under the id, on the session's KV record),
closed after the last. What the tests assert is what SGLang 0.5.23's scheduler and its
`StreamingSession` decided.
"""

from __future__ import annotations

import functools

import pyarrow.compute as pc
import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.notation import workload_from_notation
from tests.replay.check.test_checker_equivalence import same_findings
from tests.replay.check.truthless import without_ground_truth

sglang = pytest.mark.sglang
FIX = "sglang-session-commits-computed"


@functools.cache
def run(text: str, impl: str = "upstream"):
    return run_workload(workload_from_notation(text), resolve(impl, allow_import=False), engine="sglang-scheduler")


def rows(trace, rid: str) -> list[dict]:
    return trace.table.filter(pc.equal(trace.table["request_id"], rid)).to_pylist()


def codes(trace) -> set[tuple[str, str, int]]:
    return {(f.code, f.request_id, f.step) for f in check_trace(trace)}


#: Session s: a 6-token prompt (max_tokens 6), a chunk of 4 at step 3 while its first turn runs,
#: a chunk of 3 (max_tokens 4) at step 20, when it is idle; q beside it.
SESSION = "s:p6,t6,stream q:p5,t8 | blocks 16 block 16 apc | append(s)@3:p4 append(s)@20:p3,t4"


@sglang
@pytest.mark.parametrize("mode, k, impl", [("async", 0, "upstream"), ("sync", 0, "upstream"), ("async", 3, FIX)])
def test_a_session_runs_turn_by_turn_on_its_kv_and_the_client_gets_every_turn(mode, k, impl):
    """Each turn's prompt is the turn before's prompt and all its outputs (SGLang keeps the last
    sampled token: 6 + 6 + 4, then 16 + 6 + 3), it starts on the session's KV (its prefill covers
    the chunk, and the turn before's last output where no forward wrote it), the chunk that came
    mid-turn waits for the turn's end, and the client receives 6 + 6 + 4 tokens, each the one the
    worker sampled. The KV truth holds throughout, and the checker finds nothing."""
    trace = run(SESSION.replace("| blocks", f"| k{k} {mode} blocks"), impl)
    assert trace.outcome.status == "completed"
    mine = rows(trace, "s")
    turns = [r for r in mine if r["sched_event"] == "stream_turn"]
    assert [r["sched_num_prompt_tokens"] for r in turns] == [16, 25]
    finished = [r["step"] for r in mine if r["apply_finish_reason"] == "length"]
    assert turns[0]["step"] > 3 and all(t["step"] > f for t, f in zip(turns, finished))  # one turn at a time
    for turn in turns:
        first = next(r for r in mine if r["step"] >= turn["step"] and r["worker_first_position"] is not None)
        kept = turn["sched_num_prompt_tokens"] - (4 if turn is turns[0] else 3)  # prompt + outputs before
        assert kept - 1 <= first["worker_first_position"] <= kept
    assert trace.outcome.engine_output_tokens == {"s": 16, "q": 8}
    assert all(r["truth_kv_ok"] for r in trace.table.to_pylist() if r["truth_kv_ok"] is not None)
    assert check_trace(trace) == []
    same_findings(trace)


OVERCLAIM = "s:p4,t8,stream,none | k1 async apc | append(s)@20:p4"


@sglang
def test_a_turn_that_ended_on_a_correction_token_hands_on_kv_nobody_wrote():
    """Every draft rejected, so each verify round's last output is its correction token, whose KV
    only a next round would write. 0.5.23 skips the round that would (the result in flight finishes
    the request by length) and hands the session the finished length, 12, as committed: turn 2
    prefills from 12 over position 11, which holds a rejected draft's KV. G10 says so from the
    worker's inputs alone (the KV truth nulled: an attached recording), K1 from the KV. Keeping
    what the forwards computed, the fix prefills from 11."""
    trace = run(OVERCLAIM)
    assert codes(trace) == {("G10-turn-past-computed", "s", 20), ("K1-kv-content", "s", 20)}
    g10 = next(f for f in check_trace(trace) if f.code == "G10-turn-past-computed")
    assert (g10.expected, g10.actual) == (11, 12)
    # Without the KV truth G10 is the only code that sees it: with the rule off, nothing would.
    assert {f.code for f in check_trace(without_ground_truth(trace))} == {"G10-turn-past-computed"}
    fixed = run(OVERCLAIM, FIX)
    assert check_trace(fixed) == []
    turn = next(r for r in rows(fixed, "s") if r["sched_event"] == "stream_turn")
    assert (turn["worker_first_position"], turn["sched_num_scheduled_tokens"]) == (11, 5)
    same_findings(trace)


@sglang
def test_idle_sessions_holding_every_request_row_starve_their_own_next_turn():
    """#37583's class: with one request row, the idle session holds it between turns; admission
    counts free rows only, so the session's next turn, which would borrow the row it holds, never
    runs: E2 at the step limit. With two rows the same session runs both turns."""
    text = "s:p4,t4,stream | seqs {} async apc steps 40 | append(s)@8:p3"
    assert codes(run(text.format(1))) == {("E2-run-incomplete", "s", 40)}
    two = run(text.format(2))
    assert two.outcome.status == "completed" and two.outcome.engine_output_tokens == {"s": 8}


@sglang
def test_an_aborted_turn_ends_its_session():
    """An abort of the session's request aborts the turn that runs; the client stops streaming:
    the chunk still to come is not sent, and the session is closed."""
    trace = run("s:p6,t12,stream | async apc | abort(s)@4 append(s)@10:p3")
    assert trace.outcome.status == "completed"
    mine = rows(trace, "s")
    assert not [r for r in mine if r["sched_event"] == "stream_turn"]
    assert (mine[-1]["step"], mine[-1]["sched_event"]) == (4, "abort")
    assert [r["apply_finish_reason"] for r in mine if r["apply_finish_reason"]] == ["aborted"]
    assert trace.table.num_rows == len(mine) == 4  # nothing after: no turn 2, the session closed
    assert check_trace(trace) == []


@sglang
def test_an_abort_that_meets_a_turn_as_it_arrives_takes_it_out_of_the_queue():
    """A chunk and an abort of its session in the same inputs: the turn arrives and is aborted
    while it waits (the observer tells the new turn's Req from the finished one under the same id)."""
    trace = run("a:p3,t2,stream b:p9,t10 | k1 async apc steps 400 | append(a)@12:p2,t6 append(a)@23:p8 abort(a)@23")
    assert trace.outcome.status == "completed"
    last = rows(trace, "a")[-1]
    assert (last["step"], last["sched_event"], last["sched_status"]) == (23, "abort", "finished")


@sglang
def test_a_request_the_scheduler_aborts_at_a_retraction_ends_there():
    """Sessions pin most of a 64-slot pool; retract_decode finds the last request of the decode
    batch does not fit even alone, and aborts it (its client gets an AbortReq). The observer ends
    that request at the iteration (retracted, then finished), and the result in flight is skipped
    as a retracted request's: no G3. What is left cannot run on the pinned pool (E2)."""
    text = (
        "a:p9,t11,stream@4 b:p1,t9,stream@4 c:p2,t4,stream@1 d:p7,t3,stop2@2 e:p1,t12,stop5,random:0.5@1 "
        "| budget 16 seqs 8 k3 async blocks 4 apc steps 60 "
        "| append(a)@7:p5,t7 append(b)@11:p3,t9 append(b)@23:p1,t9 append(c)@5:p7,t7 append(c)@12:p3,t6"
    )
    trace = run(text)
    cut = rows(trace, "a")[-1]
    assert (cut["step"], cut["sched_status"], cut["sched_preempted"]) == (14, "finished", True)
    assert {code for code, *_ in codes(trace)} == {"E2-run-incomplete"}
