"""`--engine sglang-scheduler`: SGLang 0.5.23's real scheduler in its own event loop, the reference
SGLang worker, both views in the trace (families/sglang/loop.py).

Marked `sglang`: they run in SGLang's environment (`scripts/sglang.sh test`) and skip elsewhere.
Every run goes through SGLang's own code (the overlap and normal loops, the schedule policy,
retraction, process_batch_result, release_kv_cache, its invariant checks after every iteration):
what the tests assert is what the real scheduler decided. The tests at the bottom (what SGLang
cannot take, the install hint) need no SGLang and run everywhere.
"""

from __future__ import annotations

import functools
import json

import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.sglang.worker import SglangReferenceWorker
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.traces.errors import InputError
from specreplay.traces.io import read_trace, write_trace
from specreplay.traces.schema import SCHEMA_VERSION

sglang = pytest.mark.sglang
UPSTREAM = resolve("upstream", allow_import=False)
#: overlap (async scheduling) x EAGLE v2 draft steps
MODES = [("async", 0), ("sync", 0), ("async", 3), ("sync", 3)]
MODE_IDS = [f"{m}-k{k}" for m, k in MODES]


def note(text: str, mode: str, k: int) -> str:
    """`text` (the notation, tests/README.md) with k and the scheduling mode among its settings."""
    parts = text.split("|") + [""] * (text.count("|") == 0)
    parts[1] = f"{parts[1]} k{k} {mode} "
    return "|".join(parts)


@functools.cache
def record(text: str, worker_class: type = SglangReferenceWorker):
    """The trace of a one-line workload (tests/README.md) on SGLang's scheduler, recorded once."""
    from specreplay.replay.families.sglang.loop import run_sglang

    return run_sglang(workload_from_notation(text), UPSTREAM, worker_class=worker_class)


def rows(trace, rid: str | None = None) -> list[dict]:
    table = trace.table if rid is None else trace.table.filter(pc.equal(trace.table["request_id"], rid))
    return table.to_pylist()


def applied(trace) -> list[dict]:
    return [r for r in rows(trace) if r["apply_outcome"] == "applied"]


# ====================================================================== the four modes
#: A length finish (with k = 3: two verify rounds of 4 after the prefill's token), a request
#: verifying at random, a stop token on its 3rd output arriving one step late, a 20-token prompt
#: arriving at step 3 that a budget of 16 prefills in two chunks.
FOUR = "a:p4,t9 b:p3,t5,random:0.5 c:p3,t8,stop3@2 d:p20,t4@3 | budget 16 seqs 8"


@sglang
@pytest.mark.parametrize("mode, k", MODES, ids=MODE_IDS)
def test_each_mode_records_a_valid_trace_of_what_the_client_received(tmp_path, mode, k):
    trace = record(note(FOUR, mode, k))
    assert trace.outcome.status == "completed", trace.outcome
    # What SGLang sent its client: max_tokens each, the stop request through its stop token.
    assert trace.outcome.engine_output_tokens == {"a": 9, "b": 5, "c": 3, "d": 4}
    assert trace.impl.engine == "sglang-scheduler" and trace.impl.runner_family == "sglang"
    again = read_trace(write_trace(trace, tmp_path / "t.parquet"))  # validated on write and on read
    assert again.table.equals(trace.table) and again.schema_version == SCHEMA_VERSION
    all_rows = rows(trace)
    assert {r["step_forward_mode"] for r in all_rows} - {None} == {"extend", "target_verify" if k else "decode"}
    # Every token the scheduler appended is the oracle's, and the KV cache holds what it should.
    assert all(r["apply_token_mismatches"] == 0 for r in applied(trace))
    assert all(r["truth_kv_ok"] for r in all_rows if r["truth_kv_ok"] is not None)
    for rid in "abcd":
        mine = rows(trace, rid)
        assert [r["sched_finished_announced"] for r in mine] == [False] * (len(mine) - 1) + [True]
        assert [r["step"] for r in mine] == list(range(mine[0]["step"], mine[-1]["step"] + 1))
    assert rows(trace, "d")[0]["step"] == 3 and rows(trace, "c")[0]["step"] == 2
    # d's first chunk samples nothing: the worker emits nothing the scheduler takes, it appends none.
    chunk = [r for r in rows(trace, "d") if r["sched_is_prefill_chunk"]]
    assert [(r["sched_num_scheduled_tokens"], r["worker_num_emitted"], r["apply_num_tokens"]) for r in chunk] == [
        (16, 0, 0)
    ]
    # Overlap: a batch's result is processed one iteration after its launch; without, in it.
    lag = 1 if mode == "async" else 0
    assert {r["apply_step"] - r["step"] for r in all_rows if r["apply_step"] is not None} == {lag}
    # Only under overlap can a result come back for a request that has finished meanwhile: with
    # EAGLE v2, finished requests run one more verify round, whose result is skipped.
    ignored = [r for r in all_rows if r["apply_outcome"] == "ignored"]
    if mode == "sync":
        assert ignored == []
    elif k:
        assert ignored and {(r["apply_skip_reason"], r["step_forward_mode"]) for r in ignored} == {
            ("finished", "target_verify")
        }


@sglang
@pytest.mark.parametrize("mode, k", MODES, ids=MODE_IDS)
def test_the_scheduler_commits_what_the_worker_wrote(mode, k):
    """SGLang's kv_committed_len against the reference worker's KV: non-spec commits the decoded
    token's slot when it schedules it, spec v2 commits the accepted run when it processes it."""
    trace = record(note(FOUR, mode, k))
    ran = [r for r in rows(trace) if r["worker_row"] is not None]
    for r in ran:
        if r["step_forward_mode"] == "extend" or not k:
            assert r["sched_kv_committed_len"] == r["truth_kv_after"], r
    for r in applied(trace):
        if r["step_forward_mode"] == "target_verify":
            assert r["apply_kv_committed_len"] == r["worker_new_seq_len"] == r["truth_kv_after"], r
            assert len(r["apply_sampled_token_ids"]) == r["worker_num_accepted"] + 1 == r["worker_num_emitted"]
            assert r["sched_num_draft_slots"] == r["worker_num_draft_slots"] == len(r["worker_draft_ids"]) == k
    # a, c and d draft right every time (the workload's acceptance: all): every round accepts
    # all k, the first draft included, which reached the round through the scheduler's relay.
    verified = [r for r in rows(trace) if r["request_id"] != "b" and r["step_forward_mode"] == "target_verify"]
    assert [r["worker_num_accepted"] for r in verified if r["worker_row"] is not None] == [k] * len(verified)


@sglang
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_future_map_hands_the_worker_the_lengths_it_published(mode):
    """Spec v2 under overlap: the scheduler builds a verify batch before the previous round's
    accept lengths are known, with stale seq_lens; the FutureMap resolves them to what the worker
    published. Without overlap the scheduler already holds them."""
    trace = record(note(FOUR, mode, 3))
    stale = 0
    for rid in "abcd":
        verify = [
            r for r in rows(trace, rid) if r["step_forward_mode"] == "target_verify" and r["worker_row"] is not None
        ]
        launched = [r for r in rows(trace, rid) if r["worker_row"] is not None]
        for r in verify:
            before = [x for x in launched if x["step"] < r["step"]][-1]
            assert r["worker_seq_len"] == before["worker_new_seq_len"], (rid, r["step"])
            stale += r["sched_seq_len"] != r["worker_seq_len"]
    assert stale > 0 if mode == "async" else stale == 0


@sglang
def test_the_same_workload_gives_the_same_trace():
    first = record(note(FOUR, "async", 3))
    again = run_workload(workload_from_notation(note(FOUR, "async", 3)), UPSTREAM, engine="sglang-scheduler")
    assert again.table.equals(first.table) and again.content_equals(first)


# ====================================================================== the H1 shape
@sglang
def test_a_stop_finish_under_overlap_decodes_once_more_and_commits_one_more():
    """D stops at its 3rd output. Under overlap the scheduler has already launched the next
    decode when the stop arrives: D's row there is scheduled, its result skipped ("finished"),
    and release_kv_cache releases committed = seqlen = 6 into the radix cache; without overlap 5."""
    released = {}
    for mode in ("async", "sync"):
        trace = record(note("d:p3,t8,stop3", mode, 0))
        assert trace.outcome.engine_output_tokens == {"d": 3}
        mine = rows(trace, "d")
        (release,) = [r for r in mine if r["apply_released_committed_len"] is not None]
        released[mode] = (release["apply_released_committed_len"], release["apply_owned_kv_len"])
        assert release["apply_finish_reason"] == "stop" and release["apply_release_checkpointed"]
        skipped = [r for r in mine if r["apply_outcome"] == "ignored"]
        if mode == "async":
            (extra,) = skipped
            assert extra["step"] == mine[-1]["step"] and extra["sched_num_scheduled_tokens"] == 1
            assert extra["apply_skip_reason"] == "finished"
        else:
            assert skipped == []
    assert released == {"async": (6, 6), "sync": (5, 5)}


# ====================================================================== lifecycle cuts
@sglang
@pytest.mark.parametrize("mode, k", MODES, ids=MODE_IDS)
def test_an_abort_mid_run_and_an_abort_in_the_queue(mode, k):
    """b is aborted at step 3 while it runs: SGLang sets to_finish, lets it run once more and
    finishes it when a result is processed; e arrives at step 3 and is aborted there, from the
    waiting queue: one row, finished, never scheduled."""
    trace = record(note("a:p4,t12 b:p3,t12 e:p2,t4@3 | | abort(b)@3 abort(e)@3", mode, k))
    assert trace.outcome.status == "completed"
    (e,) = rows(trace, "e")
    assert (e["step"], e["sched_event"], e["sched_status"], e["sched_finished_announced"]) == (
        3,
        "abort",
        "finished",
        True,
    )
    assert e["worker_row"] is None and e["apply_step"] is None
    b = rows(trace, "b")
    assert [r["step"] for r in b if r["sched_event"] == "abort"] == [3]
    (finish,) = [r for r in b if r["apply_finish_reason"]]
    assert finish["apply_finish_reason"] == "aborted" and b[-1]["sched_finished_announced"]
    assert trace.outcome.engine_output_tokens["a"] == 12 and "e" not in trace.outcome.engine_output_tokens
    assert all(r["truth_kv_ok"] for r in rows(trace) if r["truth_kv_ok"] is not None)


@sglang
def test_an_abort_in_the_round_that_crosses_max_tokens_delivers_past_them():
    """SGLang 0.5.23, EAGLE v2 without overlap: b has 9 of its 12 tokens when the abort lands; its
    next verify round accepts 4, and `update_finish_state` takes the abort before the length check,
    so nothing caps the output at max_new_tokens (finished_len stays unset): the client gets 13.
    A length finish alone is capped (the four-mode test: exactly max_tokens each)."""
    trace = record(note("b:p3,t12 | | abort(b)@4", "sync", 3))
    last = rows(trace, "b")[-1]
    assert (last["sched_event"], last["sched_num_output_tokens"], last["apply_num_tokens"]) == ("abort", 9, 4)
    assert last["apply_finish_reason"] == "aborted" and trace.outcome.engine_output_tokens == {"b": 13}


@sglang
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_an_abort_between_the_chunks_of_a_prefill(mode):
    """d's 40-token prompt is prefilled in chunks of 16; the abort at step 2 lands between two:
    SGLang's scheduling releases it (process_pending_chunked_abort), without a radix insert, and
    never schedules its next chunk; a runs to its end."""
    trace = record(note("d:p40,t4 a:p4,t6 | budget 16 | abort(d)@2", mode, 0))
    first, last = rows(trace, "d")
    assert first["sched_is_prefill_chunk"] and first["sched_num_scheduled_tokens"] == 16
    assert (last["step"], last["sched_status"], last["sched_event"]) == (2, "finished", "abort")
    assert last["apply_released_committed_len"] == 16 and last["apply_release_checkpointed"] is False
    assert trace.outcome.engine_output_tokens == {"a": 6}


@sglang
def test_a_run_past_its_max_steps_ends_at_the_step_limit(tmp_path):
    trace = record(note("a:p4,t40 | steps 6", "async", 0))
    assert (trace.outcome.status, trace.outcome.step, trace.num_steps) == ("step_limit", 6, 6)
    read_trace(write_trace(trace, tmp_path / "cut.parquet"))


@sglang
@pytest.mark.parametrize("mode, k", MODES, ids=MODE_IDS)
def test_a_tight_kv_pool_retracts_a_request_and_re_prefills_it(mode, k):
    """Six requests of 4 + 20 tokens in 64 KV slots (80 with spec): update_running_batch runs out
    of KV and retracts; the retracted request waits, then is prefilled again from its prompt and
    outputs, and finishes with the tokens it would have had."""
    blocks = 5 if k else 4
    trace = record(note(f"0-5:p4,t20 | blocks {blocks} block 16", mode, k))
    assert trace.outcome.status == "completed"
    assert trace.outcome.engine_output_tokens == {str(i): 20 for i in range(6)}
    retracted = [r for r in rows(trace) if r["sched_preempted"]]
    assert retracted
    for cut in retracted:
        mine = rows(trace, cut["request_id"])
        after = [r for r in mine if r["step"] > cut["step"]]
        resumed = next(r for r in after if r["sched_kind"] == "resumed")
        waiting = [r for r in after if r["step"] < resumed["step"]]
        assert cut["sched_status"] == "preempted" and cut["sched_kv_allocated_len"] == 0
        assert all(r["sched_status"] == "preempted" and r["sched_skip"] == "waiting" for r in waiting)
        # The re-prefill recomputes the prompt and every output it had: its KV truth restarts at 0.
        assert resumed["sched_num_scheduled_tokens"] == resumed["sched_num_tokens"]
        assert resumed["truth_num_computed_tokens"] == 0 and resumed["truth_kv_after"] == resumed["sched_num_tokens"]
    assert all(r["apply_token_mismatches"] == 0 for r in applied(trace))
    assert all(r["truth_kv_ok"] for r in rows(trace) if r["truth_kv_ok"] is not None)
    # Under overlap the retracted request's result still in flight is skipped: "retracted".
    skips = {r["apply_skip_reason"] for r in rows(trace) if r["apply_outcome"] == "ignored"}
    assert ("retracted" in skips) == (mode == "async")


@sglang
def test_a_request_aborted_while_running_and_retracted_in_the_same_scheduling_is_retracted():
    """Request 2's abort lands at step 20 (SGLang marks it to finish at its next result), and that
    step's scheduling retracts it before any result does: it is released unfinished, and put back
    in the waiting queue. The observer follows what happened after the release, not the mark:
    a retraction (its rows go on until SGLang ends it), never a life ended at step 20."""
    trace = record("0-5:p4,t20 | blocks 4 block 16 k0 async | abort(2)@20")
    assert trace.outcome.status == "completed"
    mine = rows(trace, "2")
    cut = next(r for r in mine if r["step"] == 20)
    assert (cut["sched_event"], cut["sched_status"], cut["sched_preempted"]) == ("abort", "preempted", True)
    assert mine[-1]["step"] > 30 and any(r["sched_kind"] == "resumed" for r in mine)


@sglang
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_retracted_input_embeds_request_generates_anew_and_its_client_gets_tokens_twice(mode):
    """Four requests whose prompts are sent as embeddings (SGLang runs them on placeholder ids; its
    radix cache off, as SGLang takes them) in 64 KV slots: request 2 is retracted with 13 outputs
    sent; SGLang discards them (an input_embeds request cannot re-prefill embeddings plus ids) and
    generates them anew, which G4 holds to (no finding: nothing kept, the next life re-prefills
    the prompt alone). 0.5.23's streamer
    then moves the send cursor back to the new, shorter output, so the client gets the new
    generation's first tokens a second time: G9 at output 13, G8 for the count. With the stream
    held until the new generation passes what was sent (sglang-stream-hold) the client gets the
    20 tokens the worker sampled, once each, and the checker finds nothing."""
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.families.sglang.loop import run_sglang

    text = note("0-3:p4,t20,embeds | blocks 4 block 16 noapc", mode, 3)
    trace = record(text)
    cut = next(r for r in rows(trace) if r["sched_preempted"])
    assert (cut["request_id"], cut["sched_num_output_tokens"]) == ("2", 0)  # discarded at the retraction
    resumed = next(r for r in rows(trace, "2") if r["sched_kind"] == "resumed")
    assert resumed["sched_num_scheduled_tokens"] == resumed["sched_num_prompt_tokens"] == 4
    held = run_sglang(workload_from_notation(text), resolve("sglang-stream-hold", allow_import=False))
    sampled = held.outcome.engine_output_ids["2"]  # the 20 tokens, once each (greedy: both generations)
    assert held.outcome.engine_output_tokens == {str(i): 20 for i in range(4)}
    again = 0 if mode == "async" else 1  # under overlap a result in flight moves the cursor to 0, else to 1
    assert trace.outcome.engine_output_ids["2"] == sampled[:13] + sampled[again:]
    assert {(f.code, f.request_id) for f in check_trace(trace)} == {
        ("G8-delivered-past-max-tokens", "2"),
        ("G9-client-tokens", "2"),
    }
    assert check_trace(held) == []


#: A long request alone, whose accepted drafts lead SGLang's adaptive policy to widen its steps,
#: then seven more: the batch size moves it to another slot of the policy and back.
UPSWITCH = "a:p4,t80,all 1-6:p4,t6,all@20 h:p4,t20,all@20 | k1 async seqs 8 budget 64 adaptive"


@sglang
def test_adaptive_speculation_widens_the_steps_and_0_5_23_reserves_for_the_widest():
    """SGLang's own adaptive policy (AdaptiveSpeculativeParams) drives the reference EAGLE worker:
    a's steps go 1 -> 3 -> 5 as its drafts are all accepted, the rows' draft slots and verify
    widths follow, and every decode batch reserves KV for the widest width the policy may pick
    (2 x 8 past the committed length: #36897). The code before #36897 reserves for the width in
    force at scheduling: when the batch's forward starts at another batch size the policy picks a
    wider one, whose verify writes into other requests' KV (K2, K1)."""
    from specreplay.replay.check.checker import check_trace

    trace = record(UPSWITCH)
    a = [r for r in rows(trace, "a") if r["sched_num_draft_slots"]]
    assert [r["sched_num_draft_slots"] for r in a][:1] == [1] and {1, 3, 5} <= {r["sched_num_draft_slots"] for r in a}
    assert all(r["worker_num_scheduled_tokens"] == r["sched_num_draft_slots"] + 1 for r in a)
    assert all(r["sched_kv_allocated_len"] >= r["sched_kv_committed_len"] + 16 for r in a[1:])
    assert trace.outcome.engine_output_tokens == {"a": 80, **{str(i): 6 for i in range(1, 7)}, "h": 20}
    assert check_trace(trace) == []

    before = run_workload(
        workload_from_notation(UPSWITCH),
        resolve("sglang-adaptive-reserve-current", allow_import=False),
        engine="sglang-scheduler",
    )
    found = {(f.code, f.request_id, f.step) for f in check_trace(before)}
    assert ("K2-kv-foreign-tokens", "a", 24) in found and {code for code, *_ in found} == {
        "K1-kv-content",
        "K2-kv-foreign-tokens",
    }


@sglang
@pytest.mark.parametrize("mode, k", MODES, ids=MODE_IDS)
def test_a_prefix_from_the_radix_cache_is_valid_kv_the_request_did_not_write(mode, k):
    """r0 and r317 have the same 6-token prompt (workloads/tokens.py); r317 arrives once r0 has
    finished, and SGLang's radix cache gives it r0's prefix: its first extend computes the rest
    only. The KV truth counts the prefix valid (r0 wrote it), also after the checkpoint of
    r317's prefill has swapped its own slot for the tree's copy of the same token."""
    from specreplay.replay.workloads.oracle import Oracle

    text = note("r0:p6,t2 r317:p6,t3@6", mode, k)
    oracle = Oracle(workload_from_notation(text))
    assert oracle.prompt("r0") == oracle.prompt("r317")
    trace = record(text)
    first, *later = [r for r in rows(trace, "r317") if r["truth_kv_ok"] is not None]
    assert first["sched_kind"] == "new" and 0 < first["worker_first_position"] < 6
    assert first["sched_num_scheduled_tokens"] == 6 - first["worker_first_position"]
    assert (first["truth_num_computed_tokens"], first["truth_kv_after"]) == (0, 6)
    assert all(r["truth_kv_ok"] and r["truth_kv_foreign_positions"] == 0 for r in [first, *later])
    assert later and later[-1]["truth_kv_after"] > 6
    assert trace.outcome.engine_output_tokens == {"r0": 2, "r317": 3}


# ====================================================================== the KV truth can fail
class WrongKvToken(SglangReferenceWorker):
    """Writes a wrong token into b's KV at position 5 (the tokens it emits stay right)."""

    def _done(self, results):
        for r in results:
            at = 5 - r.first_position
            if r.rid == "b" and 0 <= at < len(r.written):
                r.written[at] += 1
        return super()._done(results)


class WrongOutput(SglangReferenceWorker):
    """Emits a wrong token for b's 3rd output (its KV stays right)."""

    def _done(self, results):
        for r in results:
            if r.rid == "b" and r.first_position == 4 and r.samples:  # b's prompt is 3: output index 2
                r.emitted[0] += 1
        return super()._done(results)


@sglang
@pytest.mark.parametrize("mode, k", [("async", 0), ("async", 3)], ids=["async-k0", "async-k3"])
def test_the_kv_truth_catches_one_wrong_token_in_kv(mode, k):
    text = note("a:p4,t8 b:p3,t8", mode, k)
    good = record(text)
    assert all(r["truth_kv_ok"] for r in rows(good) if r["truth_kv_ok"] is not None)
    bad = record(text, WrongKvToken)
    b = [r for r in rows(bad, "b") if r["truth_kv_ok"] is not None]
    first = next(r for r in b if not r["truth_kv_ok"])
    # From the step that wrote position 5 on, b's valid KV ends there; a's stays whole.
    assert first["truth_kv_after"] == 5 and all(
        not r["truth_kv_ok"] and r["truth_kv_after"] <= 5 for r in b[b.index(first) :]
    )
    assert all(r["truth_kv_ok"] for r in rows(bad, "a") if r["truth_kv_ok"] is not None)
    # The scheduler's view and the tokens are the good run's: only the KV truth sees it.
    assert all(r["apply_token_mismatches"] == 0 for r in applied(bad))
    assert bad.outcome.engine_output_tokens == good.outcome.engine_output_tokens


@sglang
def test_a_wrong_token_emitted_is_a_mismatch_where_it_is_appended():
    bad = record(note("a:p4,t8 b:p3,t8", "async", 0), WrongOutput)
    wrong = [(r["step"], r["apply_token_mismatches"]) for r in applied(bad) if r["apply_token_mismatches"]]
    assert len(wrong) == 1 and wrong[0][1] == 1


class FailingWorker(SglangReferenceWorker):
    """Raises in the forward that would write b's position 6."""

    def _done(self, results):
        if any(r.rid == "b" and r.first_position <= 6 < r.first_position + len(r.written) for r in results):
            raise RuntimeError("the worker fell over at b's position 6")
        return super()._done(results)


@sglang
def test_a_worker_that_raises_ends_the_run_as_a_crash_at_that_step(tmp_path):
    trace = record(note("a:p4,t8 b:p3,t8", "async", 0), FailingWorker)
    assert trace.outcome.status == "crashed" and "fell over at b's position 6" in trace.outcome.message
    assert trace.outcome.step == trace.num_steps
    read_trace(write_trace(trace, tmp_path / "crash.parquet"))  # what was recorded is a valid trace
    after = record(note("a:p4,t8 b:p3,t8", "sync", 0))  # the crashed scheduler was closed: a new one builds
    assert after.outcome.status == "completed"


class ForgetfulWorker(SglangReferenceWorker):
    """Loses track of b at its position 6: a KeyError naming the request, as a dropped id gives."""

    def _done(self, results):
        if any(r.rid == "b" and r.first_position <= 6 < r.first_position + len(r.written) for r in results):
            raise KeyError("b")
        return super()._done(results)


@sglang
def test_a_crash_names_the_request_its_exception_names():
    # The crash's request is one the scheduler holds (SGLang keeps them in queues and batches: the
    # observer says which), so E1 / G7 name it as on vLLM.
    trace = record(note("a:p4,t8 b:p3,t8", "async", 0), ForgetfulWorker)
    assert (trace.outcome.status, trace.outcome.request) == ("crashed", "b")


# ====================================================================== the CLI
@sglang
@pytest.mark.parametrize("scenario", ["reentry", "reentry-sync"])
def test_record_info_and_show_a_scenario(tmp_path, scenario):
    out = tmp_path / f"{scenario}.parquet"
    runner = CliRunner()
    result = runner.invoke(main, ["record", "--engine", "sglang-scheduler", "--scenario", scenario, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}") and "outcome completed" in result.output
    trace = read_trace(out)
    assert trace.impl.runner_family == "sglang" and trace.config.num_spec_tokens == 3
    assert trace.config.async_scheduling == (scenario == "reentry")
    info = runner.invoke(main, ["info", str(out)])
    assert info.exit_code == 0 and "sglang-scheduler" in info.output, info.output
    show = runner.invoke(main, ["show", str(out), "--request", "10"])
    assert show.exit_code == 0 and "10 sched" in show.output, show.output


@sglang
def test_record_a_workload_file_without_spec(tmp_path):
    (tmp_path / "w.toml").write_text(
        'name = "plain"\n[config]\nnum_spec_tokens = 0\nasync_scheduling = true\n'
        '[[requests]]\nid = "x"\nprompt_len = 5\nmax_tokens = 6\n[[requests]]\nid = "y"\nprompt_len = 3\n'
        "max_tokens = 4\narrival_step = 2\nstop_at = 2\n"
    )
    out = tmp_path / "plain.parquet"
    result = CliRunner().invoke(
        main, ["record", "--engine", "sglang-scheduler", "--workload", str(tmp_path / "w.toml"), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    trace = read_trace(out)
    assert trace.outcome.engine_output_tokens == {"x": 6, "y": 2}
    assert {r["step_forward_mode"] for r in rows(trace)} - {None} == {"extend", "decode"}
    # A finding's request story (`diff`) on an SGLang trace: SGLang's lengths on both sides.
    from rich.console import Console

    from specreplay.cli.render import story_table
    from specreplay.traces.families import traits

    console = Console(record=True, width=200)
    console.print(story_table(trace.table, "y", trace.num_steps, family=traits("sglang")))
    text = console.export_text()
    assert "request 'y' on SGLang's scheduler" in text and "wL'" in text


# ====================================================================== what SGLang cannot take (no SGLang needed)
@pytest.mark.parametrize(
    "text, says",
    [
        ("a:p4,t8 | async | pause@3 resume@5", "streaming sessions' chunks only; the workload's pause at step 3"),
        ("a:p4,t8 | async | reset@3", "reset_prefix_cache at step 3 has no SGLang counterpart"),
        ("s:p4,t4,stream | async noapc | append(s)@3:p2", "request 's' is a streaming session, which SGLang runs"),
        (
            "s:p4,t250,stream | len 512 async | append(s)@3:p250,t2 append(s)@5:p1,t1",
            "its last turn (prompt_len 507, max_tokens 1)",
        ),
        ("a:p4,t8 | k3 lookahead 3 async", "num_lookahead_tokens 3 is vLLM's"),
        ("1:p4,t8 10:p4,t8 | async | abort(1)@3", "aborting '1' would abort '10' too"),
        ("a:p4,t507 | len 512 async", "does not fit SGLang's request limit"),
        ("e:p4,t8,embeds | async", "request 'e' sends input_embeds, which SGLang takes only with its radix cache"),
        ("a:p4,t8 | k2 async adaptive", "adaptive speculation starts from one of its candidate steps 1, 3, 5, 7"),
    ],
)
def test_what_sglang_cannot_take_is_one_line_exit_2_and_nothing_recorded(tmp_path, text, says):
    workload = workload_from_notation(text)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload.to_dict()))
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        main, ["record", "--engine", "sglang-scheduler", "--workload", str(path), "-o", str(out)]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: --engine sglang-scheduler") and says in line, line
    assert not out.exists() and not list(tmp_path.glob("out.parquet*"))


@sglang
def test_a_request_sglang_would_cap_is_refused_in_one_line(monkeypatch):
    """SGLang caps max_new_tokens where its pool, context or SGLANG_MAX_NEW_TOKENS_LIMIT says so,
    silently: such a request would not run as the workload asks."""
    monkeypatch.setenv("SGLANG_MAX_NEW_TOKENS_LIMIT", "5")
    with pytest.raises(InputError, match="^--engine sglang-scheduler: SGLang caps request 'a''s max_tokens 8 to 5"):
        run_workload(workload_from_notation("a:p4,t8 | async"), UPSTREAM, engine="sglang-scheduler")


def test_the_vllm_variants_have_no_sglang_form():
    from specreplay.replay.engines.registry import engine

    with pytest.raises(InputError, match="sched-clear changes vLLM's scheduler; it has no form for --engine sglang"):
        run_workload(
            workload_from_notation("a:p4,t4 | async"),
            resolve("sched-clear", allow_import=False),
            engine="sglang-scheduler",
        )
    with pytest.raises(InputError, match="--runner v1 .* does not run on --engine sglang-scheduler; it takes sglang"):
        run_workload(workload_from_notation("a:p4,t4 | async"), UPSTREAM, engine="sglang-scheduler", runner="v1")
    with pytest.raises(InputError, match="--runner sglang .* does not run on --engine reference; it takes v1, v2"):
        run_workload(workload_from_notation("a:p4,t4 | async"), UPSTREAM, runner="sglang")
    assert engine("sglang-scheduler").runner == "sglang"


def test_without_sglang_the_engine_says_how_to_install_it(monkeypatch):
    from specreplay.replay.families.sglang import setup as sglang_setup

    monkeypatch.setattr(sglang_setup, "installed_sglang_version", lambda: None)
    with pytest.raises(InputError) as missing:
        run_workload(workload_from_notation("a:p4,t4 | async"), UPSTREAM, engine="sglang-scheduler")
    assert str(missing.value) == (
        "--engine sglang-scheduler needs sglang 0.5.23 in its own environment: scripts/sglang.sh install, "
        "then run specreplay from .venv-sglang"
    )
    monkeypatch.setattr(sglang_setup, "installed_sglang_version", lambda: "0.5.9")
    with pytest.raises(InputError, match=r"from \.venv-sglang \(this environment has sglang 0\.5\.9\)$"):
        run_workload(workload_from_notation("a:p4,t4 | async"), UPSTREAM, engine="sglang-scheduler")


# ====================================================================== the journal, as the loop engines keep it
def _long_sglang_workload():
    """Long enough that a kill lands mid-run: 16 requests decoding 300 tokens each, overlap, EAGLE v2."""
    return workload_from_notation(" ".join(f"r{i}:p8,t300" for i in range(16)) + " | k3 async steps 2000 name long")


@sglang
def test_a_killed_sglang_recording_keeps_its_flushed_steps_and_recovers(tmp_path):
    """`record --engine sglang-scheduler` killed (SIGKILL) mid-run: its journal holds whole steps,
    and `recover` makes of them a partial trace whose rows are the full run's, step for step."""
    import signal
    import subprocess
    import sys
    import time

    from specreplay.traces.journal import holds_steps, journal_path, recover

    workload = _long_sglang_workload()
    spec = tmp_path / "long.json"
    spec.write_text(json.dumps(workload.to_dict()))
    out = tmp_path / "killed.parquet"
    command = [sys.executable, "-m", "specreplay.cli", "record", "--engine", "sglang-scheduler"]
    command += ["--workload", str(spec), "-o", str(out), "--flush-every", "4"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    journal = journal_path(out)
    deadline = time.monotonic() + 300
    while not (journal.exists() and holds_steps(journal)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # still running once steps were flushed
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    recovered = recover(journal)
    assert recovered.outcome.status == "partial" and recovered.num_rows > 0
    full = run_workload(workload, UPSTREAM, engine="sglang-scheduler")
    last = recovered.outcome.step
    assert last < full.num_steps
    whole = sum(1 for s in full.table["step"].to_pylist() if s <= last)
    prefix = full.table.slice(0, whole)
    for name in recovered.table.column_names:  # values, not encodings (a prefix has fewer enum values)
        assert recovered.table[name].to_pylist() == prefix[name].to_pylist(), name
    assert recovered.impl.scheduler == full.impl.scheduler and recovered.impl.runner_family == "sglang"


@sglang
def test_an_sglang_run_that_ends_by_specreplays_own_exception_leaves_its_journal(tmp_path, monkeypatch):
    """An exception that is no engine crash (here: the observer failing at iteration 40) propagates,
    and what was recorded before it is in the journal."""
    from specreplay.replay.families.sglang.loop import run_sglang
    from specreplay.replay.families.sglang.observer import SglangObserver
    from specreplay.traces.journal import recover

    original = SglangObserver.set_iteration

    def failing(self, iteration):
        if iteration == 40:
            raise KeyboardInterrupt  # Ctrl-C: never the engine's outcome
        original(self, iteration)

    monkeypatch.setattr(SglangObserver, "set_iteration", failing)
    journal = tmp_path / "run.parquet.partial"
    with pytest.raises(KeyboardInterrupt):
        run_sglang(_long_sglang_workload(), UPSTREAM, journal=journal, flush_every=4)
    recovered = recover(journal)
    assert recovered.outcome.status == "partial" and 30 <= recovered.outcome.step < 40
