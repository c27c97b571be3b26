"""Prefix caching through both views: the scheduler's hit in the trace, the worker starting where
the hit ends, the KV truth reading the hit back, and K6 when a cached block does not hold the KV
its hash names."""

from __future__ import annotations

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.notation import workload_from_notation
from tests.replay.check import rowwise_checker

VARIANTS = "tests.replay.models.kv_variants"
#: Request a (9 tokens: its first two blocks of 4 cached) finishes; b then needs the whole free
#: queue, so a's free cached blocks are handed out again; a comes back under the same id and
#: looks its prompt up.
REUSED = "a:p9,t2 b:p16,t2@5 | k0 block 4 blocks 7 budget 32 async | resubmit(a)@12"


def findings(trace) -> list:
    found = check_trace(trace)
    assert found == rowwise_checker.check_trace(trace)  # the row-by-row statement agrees
    return found


def row(trace, step: int, rid: str):
    df = trace.table.to_pandas()
    return df[(df.step == step) & (df.request_id == rid)].iloc[0]


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_hit_starts_both_views_where_it_ends_and_the_truth_reads_it_back(runner):
    """Upstream: the resubmitted life hits the one block b did not take (its second block was
    evicted: its hash went with it), starts from it on both views, and nothing is flagged."""
    trace = run_workload(workload_from_notation(REUSED), resolve("upstream", allow_import=False), runner=runner)
    assert not [f for f in findings(trace) if f.severity == "error"]
    admitted = row(trace, 12, "a")
    assert (admitted.sched_kind, admitted.sched_life) == ("new", 1)
    assert admitted.sched_num_cached_tokens == 4 and list(admitted.sched_cache_hit_blocks) == [1]
    assert admitted.sched_num_computed_tokens == 4 and admitted.sched_num_scheduled_tokens == 5
    assert admitted.worker_first_position == 4
    assert admitted.truth_cache_hit_valid == 4 and admitted.truth_num_computed_tokens == 4
    assert row(trace, 6, "b").step_cache_evictions == 1  # b took a's cached second block


def test_a_block_handed_out_again_with_its_hash_is_served_stale_k6_names_its_writer():
    """KeepsHashOnReuse keeps the evicted block's hash: the resubmitted life hits both of a's old
    blocks, the second holding b's tokens. K6 at its admission, naming b, ranked before what
    follows from it (the scheduler's count above the truth's, K1)."""
    trace = run_workload(workload_from_notation(REUSED), resolve(f"{VARIANTS}:KeepsHashOnReuse", allow_import=True))
    admitted = row(trace, 12, "a")
    assert admitted.sched_num_cached_tokens == 8 and admitted.truth_cache_hit_valid == 4
    assert admitted.truth_cache_hit_writer == "b"
    at_admission = [f for f in findings(trace) if (f.step, f.request_id) == (12, "a")]
    assert at_admission[0].code == "K6-cache-hit-content"
    assert at_admission[0].facts()["other_request"] == "b" and "request 'b'" in at_admission[0].message
    assert {f.code for f in at_admission} >= {"K6-cache-hit-content", "K1-kv-content"}


#: A conversation: a's answer (10 tokens, every draft rejected) ends its 16 tokens at a block's
#: end; b, the next turn, sends a's prompt and answer and 4 more tokens a step after a finished.
CONVERSATION = "a:p6,t10,none b:p4,t4,follows=a@+1 | k3 block 4 async"


def test_a_next_turn_hits_only_the_blocks_whose_kv_was_computed():
    """Upstream: a's last token was never computed (no step ran after it), so its block is never
    cached (vLLM caches up to C - P at the apply, one token short): b hits a's first 3 blocks,
    computes the rest, and nothing is flagged."""
    trace = run_workload(workload_from_notation(CONVERSATION), resolve("upstream", allow_import=False))
    assert not [f for f in findings(trace) if f.severity == "error"]
    admitted = row(trace, 12, "b")
    assert admitted.sched_num_cached_tokens == 12 and admitted.truth_cache_hit_valid == 12


def test_a_block_cached_with_a_rejected_drafts_kv_is_served_k6_at_the_next_turn():
    """CachesAtFinish caches a's full blocks when it finishes: the last one's last position holds
    the draft the rejection sampler rejected there (a's last token, the one sampled in its place,
    was never computed), and b's hit serves it. K6 at b's admission, naming a."""
    trace = run_workload(workload_from_notation(CONVERSATION), resolve(f"{VARIANTS}:CachesAtFinish", allow_import=True))
    admitted = row(trace, 12, "b")
    assert admitted.sched_num_cached_tokens == 16 and admitted.truth_cache_hit_valid == 15
    first = [f for f in findings(trace) if (f.step, f.request_id) == (12, "b")][0]
    assert first.code == "K6-cache-hit-content" and first.facts()["other_request"] == "a"
