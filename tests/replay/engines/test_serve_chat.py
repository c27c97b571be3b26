"""Chat traffic on a served vLLM with its default prefix caching: `specreplay record --attach --`
a real `vllm serve`, 16 chat clients sharing a 300-word system prompt, 4 of them with a second turn
(its prompt: the first turn's prompt and answer, then the new question), on both runners.

The server finds the shared system prompt (and a second turn's whole first turn) in its cache and
schedules only the rest; the worker computes from where the hit ends. The recording must say so
(the hit on each admission row, the cache on in `info`), give no error finding, and replay step
for step on the reference models and the real scheduler, whose prefix caches must hit the same
blocks. The clients, server and tokenizer (with its chat template) come from tests/live_serve.py.
"""

from __future__ import annotations

import signal

import pytest

from tests.live_serve import plan_chats, run_chats
from tests.replay.engines.test_attached import replay_differences
from tests.replay.engines.test_serve_recording import applied_tokens, attached_server, whole_on_record

pytestmark = pytest.mark.vllm

#: Per runner, how long the engine may take to go idle after the clients (MRV2 steps slower here).
IDLE = {"v1": 120, "v2": 300}


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_chats_sharing_a_system_prompt_record_with_their_cache_hits_and_replay_step_exact(tmp_path, runner):
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.workflows.cache_report import CacheCounts
    from specreplay.traces.io import read_trace

    output = tmp_path / "chat.parquet"
    plans = plan_chats(16, 4)
    with attached_server(tmp_path, output, runner) as server:
        server.wait_ready()
        server.warm_up()
        before = cache_counters(server)
        chats = run_chats(server, plans)
        assert server.wait_idle(IDLE[runner]), "the engine did not go idle after the clients"
        assert whole_on_record(output, IDLE[runner]), "the worker never returned the last scheduled step"
        after = cache_counters(server)
        stopped = server.stop(signal.SIGINT, timeout=180)
    log = server.log_text()
    assert stopped.returncode == 0 and "merged run" in log, log[-3000:]
    turns = [turn for chat in chats for turn in chat]
    assert len(turns) == 20 and not [t for t in turns if t.error], [t.error for t in turns if t.error]
    assert all(t.finish_reason == "length" and len(t.token_ids) == 16 for t in turns)
    # The server served the shared prefix from its cache, as its own /metrics count it.
    hits, queries = after[0] - before[0], after[1] - before[1]
    assert hits > 0 and queries > hits

    trace = read_trace(output)
    df = trace.table.to_pandas()
    assert trace.config.to_dict()["enable_prefix_caching"] is True
    by_client = {t.request_id: t for t in turns}  # the trace names a request by the client's id
    assert set(by_client) <= set(df.request_id), sorted(set(by_client) - set(df.request_id))
    # Per turn: the tokens the scheduler applied are the tokens the client received, and the
    # hit the server reported is the hit on its admission row.
    for rid, turn in by_client.items():
        assert applied_tokens(df, rid) == turn.token_ids, rid
        admitted = df[(df.request_id == rid) & df.sched_num_cached_tokens.notna()].iloc[0]
        assert int(admitted.sched_num_computed_tokens) == int(admitted.sched_num_cached_tokens)
    # Every admission's hit, summed, is what the server counted: the hits and the tokens looked up.
    admissions = df[df.sched_num_cached_tokens.notna() & df.request_id.isin(list(by_client))]
    assert (int(admissions.sched_num_cached_tokens.sum()), int(admissions.sched_num_tokens.sum())) == (hits, queries)
    assert (admissions.sched_num_cached_tokens > 0).sum() >= 8  # all but the first few conversations, every second turn
    second = [rid for rid, t in by_client.items() if t.request_id.endswith("-t2")]
    assert len(second) == 4
    for rid in second:  # a second turn finds at least its whole first prompt's full blocks
        first = df[df.request_id == rid[: -len("-t2")]].sched_num_prompt_tokens.iloc[0]
        bs = trace.config.to_dict()["block_size"]
        hit = df[(df.request_id == rid) & df.sched_num_cached_tokens.notna()].sched_num_cached_tokens.iloc[0]
        assert hit >= first // bs * bs, rid
    # Both views, no error: the worker computed each admitted request from its hit.
    scheduled = df[df.sched_num_scheduled_tokens > 0]
    assert scheduled.worker_num_scheduled_tokens.notna().all()
    assert not [f for f in check_trace(trace) if f.severity == "error"], [
        str(f) for f in check_trace(trace) if f.severity == "error"
    ][:3]
    counts = CacheCounts.of_config(trace.config.to_dict())
    for batch in trace.batches(columns=("request_id", *CacheCounts.COLUMNS)):
        counts.add(batch)
    assert counts.enabled and counts.hits >= 8 and counts.cached_tokens > 0
    # Replayed on its recorded prompts and outcomes, through the reference models (the runner it
    # recorded) and the real scheduler: every column as recorded, the hits included.
    why: dict = {}
    found = replay_differences(output, tmp_path, why)
    assert found == {"reference": ({}, {}), "vllm-scheduler": ({}, {})}, why


def cache_counters(server) -> tuple[int, int]:
    """The server's own prefix-cache counters (/metrics): tokens served from the cache, and tokens
    looked up, over every admission so far."""
    metrics = server.metrics()
    hits = sum(v for k, v in metrics.items() if k.startswith("vllm:prefix_cache_hits_total"))
    queries = sum(v for k, v in metrics.items() if k.startswith("vllm:prefix_cache_queries_total"))
    return int(hits), int(queries)
