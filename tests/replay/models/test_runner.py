"""The runner's persistent-batch bookkeeping and its view of a re-entering request."""

from __future__ import annotations

from specreplay.replay.families.vllm.v1.input_batch import CachedRequestState, InputBatch


def state(rid: str) -> CachedRequestState:
    return CachedRequestState(rid, [1, 2, 3], [1], 0)


def test_add_takes_lowest_free_row_and_condense_moves_highest_rows_into_holes():
    batch = InputBatch()
    rows = [batch.add_request(state(r)) for r in "abcde"]
    assert rows == [0, 1, 2, 3, 4]
    batch.remove_request("b")
    batch.remove_request("d")
    assert batch.add_request(state("f")) == 1  # lowest hole
    batch.condense()
    assert batch.req_ids == ["a", "f", "c", "e"]  # e moved from row 4 into hole 3
    assert batch.req_id_to_index == {"a": 0, "f": 1, "c": 2, "e": 3}


def test_remove_drops_the_id_from_the_previous_step_map():
    batch = InputBatch()
    batch.add_request(state("a"))
    batch.prev_req_id_to_index = {"a": 0}
    batch.remove_request("a")
    assert batch.prev_req_id_to_index == {} and batch.num_reqs == 0


def test_reentering_request_is_removed_then_readded_without_correction(reentry_traces):
    df = reentry_traces["upstream"].table.to_pandas()
    r10 = df[df.request_id == "10"].set_index("step")
    assert r10.loc[2, "worker_row"] is None or r10.loc[2, "worker_row"] != r10.loc[2, "worker_row"]  # absent
    re = r10.loc[4]
    assert re.sched_kind == "reentering" and not re.worker_in_prev_map and re.worker_cached_drafts == 0
    assert re.worker_correction == 0 and re.worker_num_computed_tokens == re.truth_num_computed_tokens == 3
    assert list(re.worker_draft_ids) == [-1, -1, -1] and re.worker_num_accepted == 0 and re.worker_num_emitted == 1
    nxt = r10.loc[5]  # in the prev map now, with real drafts: the correction (3 - 0) applies
    assert nxt.worker_in_prev_map and nxt.worker_correction == 3 and nxt.worker_num_computed_tokens == 4
    assert nxt.worker_num_accepted == 3


def test_decode_rows_are_corrected_by_the_rejections_of_the_previous_step():
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.notation import workload_from_notation

    w = workload_from_notation("a:p5,t12 | k3 alternate")
    df = run_workload(w, resolve("upstream", allow_import=False)).table.to_pandas()
    dec = df[(df.sched_num_scheduled_tokens > 0) & df.worker_in_prev_map.fillna(False)]
    prev = df.set_index("step")
    for row in dec.itertuples():
        before = prev.loc[row.step - 1]
        assert row.worker_correction == before.worker_num_draft_slots - before.worker_num_accepted
        assert row.worker_num_computed_tokens == row.truth_num_computed_tokens
    assert (df.apply_token_mismatches.fillna(0) == 0).all()


def test_drafter_is_skipped_for_the_whole_batch_near_max_model_len():
    """vLLM caches zero drafts for every row once the longest optimistic sequence plus k no
    longer fits the drafter (max_model_len here)."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.notation import workload_from_notation

    w = workload_from_notation("0:p40,t24 1:p3,t40 | len 64 k3")
    df = run_workload(w, resolve("upstream", allow_import=False)).table.to_pandas()
    one = df[(df.request_id == "1") & (df.sched_num_draft_slots > 0)].set_index("step")
    longest = (
        df[df.worker_row.notna()]
        .groupby("step")
        .apply(lambda g: (g.sched_num_computed_tokens + g.sched_num_scheduled_tokens).max())
    )
    skipped = [m for m in one.index if longest.get(m - 1, 0) + 3 > 64]
    assert skipped, "the workload must reach the drafter limit"
    for m in skipped:
        assert one.loc[m].worker_num_accepted == 0 and list(one.loc[m].worker_draft_ids) == [0, 0, 0]
    assert (one.drop(index=skipped).worker_num_accepted == 3).all()
