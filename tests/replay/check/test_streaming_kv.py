"""The KV ground truth across a streaming turn: the positions a session's next turn keeps are
read back against that turn's expected tokens, so a worker that keeps the old turn's token where
the new chunk begins is K1 at the turn's first step (before, the truth kept them unread and the
corrupt position counted as valid until a later turn)."""

from __future__ import annotations

import dataclasses

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.workloads.scenarios import build_scenario
from tests.replay.check.broken_turns import KeepsEndedTurnToken
from tests.replay.check.test_checker_equivalence import same_findings


def _workload():
    """streaming-append with an 8-token second chunk and a 12-token budget: session "s" (prompt
    6, max_tokens 6) ends its first turn at step 5's apply with step 5 in flight (it wrote
    positions 11 and 12 with the old turn's tokens); turn 2 keeps 11 positions and prefills the
    chunk from position 11, 4 tokens at step 6 (b0 and b1 decode beside it)."""
    w = build_scenario("streaming-append")
    first, second = w.events
    return dataclasses.replace(
        w,
        config=dataclasses.replace(w.config, max_num_batched_tokens=12),
        events=(dataclasses.replace(first, tokens=8), second),
    )


def _rows(trace, rid, step):
    return [r for r in trace.table.to_pylist() if r["request_id"] == rid and r["step"] == step]


def test_a_kept_position_holding_the_old_turns_token_is_wrong_kv_at_the_turns_first_step():
    trace = run_workload(_workload(), Implementation("keeps-ended-turn-token", "", runner=KeepsEndedTurnToken))
    (row,) = _rows(trace, "s", 6)
    assert row["sched_event"] == "stream_turn" and row["sched_num_computed_tokens"] == 11
    assert row["worker_num_computed_tokens"] == 12  # the worker keeps position 11 (the old turn's token)
    # Read back against turn 2's tokens, position 11 (the chunk's first) is wrong: 11 valid, not 12.
    assert (row["truth_num_computed_tokens"], row["truth_kv_ok"]) == (11, False)
    k1 = [f for f in check_trace(trace) if f.code == "K1-kv-content"]
    assert [(f.step, f.request_id, f.severity) for f in k1] == [(6, "s", "error")]
    same_findings(trace)


def test_upstream_keeps_only_what_both_turns_agree_on():
    trace = run_workload(_workload(), resolve("upstream", allow_import=False))
    (row,) = _rows(trace, "s", 6)
    assert (row["truth_num_computed_tokens"], row["truth_kv_ok"]) == (11, True)
    assert check_trace(trace) == []
