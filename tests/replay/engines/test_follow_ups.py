"""A conversation's next turn, sent once the turn before it finished (`follows` with
`after_finish`: engines/inputs.py `notice_ends`), and acceptance listed per verification round, on
every engine that drives a workload: the reference loop, vLLM's real scheduler and a live vLLM
(those two marked `vllm`). Arrival steps are read from the trace (a request's rows start at its
arrival), so what is asserted holds whatever the machine's speed."""

from __future__ import annotations

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.inputs import InputDriver
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.oracle import Oracle
from specreplay.traces.errors import InputError

#: "long" keeps the engine busy, so every iteration schedules a step; q0 stops at its third output
#: (or earlier, at its stop token), q1 follows it 2 steps after its finish, q2 follows q1 the step
#: after, q3 shares q0's prefix; q2's rounds accept 2, 0, 3 drafts, then all.
CONVERSATION = (
    "long:p6,t30 q0:prefix=sys,p5,t6,stop3 q1:follows=q0,p4,t5@+2 q2:follows=q1,prompt=1.2.3,t8,accept=2.0.3 "
    "q3:prefix=sys,p7,t4@4 | k3 prefix sys=p40 block 32 blocks 64 len 256 budget 64 steps 200"
)


def upstream():
    return resolve("upstream", allow_import=False)


def arrivals(trace) -> dict[str, int]:
    """Each request's arrival step: its first row."""
    return trace.table.to_pandas().groupby("request_id").step.min().to_dict()


def prompt_lengths(trace) -> dict[str, int]:
    return trace.table.to_pandas().groupby("request_id").sched_num_prompt_tokens.first().to_dict()


def finished_at(trace, rid: str) -> int:
    """The step whose output finished `rid` (its apply_finish_reason row)."""
    df = trace.table.to_pandas()
    rows = df[(df.request_id == rid) & df.apply_finish_reason.fillna("").astype(bool)]
    assert len(rows) == 1, rows
    return int(rows.step.iloc[0])


def accepted_per_round(trace, rid: str) -> list[int]:
    df = trace.table.to_pandas()
    rows = df[(df.request_id == rid) & (df.worker_num_draft_slots.fillna(0) > 0)].sort_values("step")
    return [int(a) for a in rows.worker_num_accepted]


def errors(trace) -> list[str]:
    return sorted({f.code for f in check_trace(trace) if f.severity == "error"})


# ---------------------------------------------------------------------- the driver
def test_the_driver_sends_a_turn_after_the_one_before_ended_once():
    workload = workload_from_notation("a:p4,t3 b:follows=a,p2@+3 c:follows=b,p2 d:p2@2")
    driver = InputDriver(workload, Oracle(workload))
    assert [s.request_id for s in driver.pop_arrivals(1)] == ["a"]
    driver.notice_ends(1, lambda rid: True)  # "a" was never sent: nothing follows yet
    assert {step: [s.request_id for s in specs] for step, specs in driver.arrivals.items() if specs} == {2: ["d"]}
    driver.submit(workload.requests[0])
    driver.notice_ends(4, lambda rid: rid != "a")  # sent, not ended
    assert not any(s.request_id == "b" for specs in driver.arrivals.values() for s in specs)
    driver.notice_ends(5, lambda rid: True)
    driver.notice_ends(6, lambda rid: True)  # noticed once: the first step it was seen ended counts
    assert [s.request_id for s in driver.arrivals[8]] == ["b"]
    assert "c" in [s.request_id for s in driver.after["b"]]  # c waits for b, which was not sent


def test_a_refused_request_counts_as_ended():
    workload = workload_from_notation("a:p4 b:follows=a,p2")
    driver = InputDriver(workload, Oracle(workload))
    driver.refused(workload.requests[0])
    driver.notice_ends(3, lambda rid: True)
    assert [s.request_id for s in driver.arrivals[4]] == ["b"]


# ---------------------------------------------------------------------- the reference loop
@pytest.mark.parametrize("mode, after", [("async", 1), ("async", 3), ("sync", 1), ("sync", 2)])
def test_a_turn_arrives_after_finish_steps_after_the_iteration_that_finished_the_one_before(mode, after):
    workload = workload_from_notation(f"long:p6,t40 a:p4,t5 b:follows=a,p3,t4@+{after} | {mode} budget 64 k2")
    trace = run_workload(workload, upstream())
    # Async: step m's output is applied in the next iteration (m + 1), sync: in its own.
    applied_in = finished_at(trace, "a") + (1 if mode == "async" else 0)
    assert arrivals(trace)["b"] == applied_in + after
    assert not errors(trace)


def test_a_turn_s_prompt_is_what_the_engine_gets_and_its_tokens_check():
    workload = workload_from_notation(CONVERSATION)
    trace = run_workload(workload, upstream())
    assert prompt_lengths(trace) == {r.request_id: workload.prompt_len_of(r.request_id) for r in workload.requests}
    assert not errors(trace)  # T1: every token the expected one, the turns' included
    assert accepted_per_round(trace, "q2")[:3] == [2, 0, 3]
    assert set(accepted_per_round(trace, "q2")[3:]) <= {3}  # then the workload's rule: all (k = 3)


def test_a_turn_follows_an_aborted_request_and_never_one_that_does_not_end():
    aborted = run_workload(
        workload_from_notation("a:p4,t30 b:follows=a,p3,t2 | k2 | pause@4:abort resume@5"), upstream()
    )
    assert "b" in arrivals(aborted) and not errors(aborted)
    cut = run_workload(workload_from_notation("a:p4,t300 b:follows=a,p3,t2 | k2 steps 20"), upstream())
    assert cut.outcome.status == "step_limit" and "b" not in arrivals(cut)


def test_a_turn_after_a_request_refused_while_paused_on_vllm_0_33_is_sent():
    """vLLM 0.33 refuses new requests while paused (engine_paused): the client has its answer,
    and sends the next turn, here once the engine resumed (sent while paused, it is refused too)."""
    trace = run_workload(
        workload_from_notation("x:p4,t20 a:p4,t3@3 b:follows=a,p2,t2@+4 | k2 vllm 0.33.0 | pause@2:wait resume@6"),
        upstream(),
    )
    assert "a" not in arrivals(trace) and "b" in arrivals(trace)


def test_sglang_s_scheduler_refuses_after_finish_in_one_line():
    from specreplay.replay.families.sglang.setup import refuse_workload

    with pytest.raises(InputError, match="request 'b' arrives after_finish.*give it an arrival_step"):
        refuse_workload(workload_from_notation("a:p4 b:follows=a,p2"))
    refuse_workload(workload_from_notation("a:p4 b:follows=a,p2@5"))  # a fixed step: taken


# ---------------------------------------------------------------------- vLLM
@pytest.mark.vllm
def test_the_real_scheduler_sends_the_turns_at_the_reference_s_steps():
    workload = workload_from_notation(CONVERSATION)
    reference = run_workload(workload, upstream())
    real = run_workload(workload, upstream(), engine="vllm-scheduler")
    assert arrivals(real) == arrivals(reference)
    assert accepted_per_round(real, "q2")[:3] == [2, 0, 3]
    assert not errors(real)


@pytest.mark.vllm
def test_a_live_engine_sends_the_turns_at_the_reference_s_steps(tmp_path):
    """In process, forced: the live driver learns of a finish from its front end, the loop from
    its scheduler; the steps agree, every token checks (T1), the forced drafter accepts the
    listed rounds, and the recording replays to itself on its recorded outcomes."""
    from specreplay.replay.families.vllm.setup import installed_vllm_version
    from specreplay.replay.workflows.record import replay_to
    from specreplay.replay.workflows.replaying import trace_workload
    from specreplay.replay.workloads.oracle import live_driven
    from specreplay.traces.io import read_trace, write_trace

    workload = workload_from_notation(CONVERSATION).at_version(installed_vllm_version())
    live = run_workload(workload, upstream(), engine="vllm", runner="v1")
    ran = trace_workload(live, "conversation")
    reference = run_workload(ran, upstream(), runner="v1", oracle=live_driven(ran))
    assert live.outcome.status == "completed"
    assert arrivals(live) == arrivals(reference)
    assert arrivals(live)["q1"] > arrivals(live)["q0"]
    assert accepted_per_round(live, "q2")[:3] == [2, 0, 3]
    assert not errors(live)
    write_trace(live, tmp_path / "live.parquet")
    replay_to(tmp_path / "again.parquet", tmp_path / "live.parquet", "upstream")
    again = read_trace(tmp_path / "again.parquet")
    assert arrivals(again) == arrivals(live)
    assert (
        prompt_lengths(again)
        == prompt_lengths(live)
        == {r.request_id: workload.prompt_len_of(r.request_id) for r in workload.requests}
    )
