"""Built-in scenarios: named workloads, each reaching one situation of the async + spec decode family.

Where it sits: the input side of record (replay). `specreplay record --scenario NAME` builds its
workload here; `specreplay scenarios` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.generators import random_workload
from specreplay.replay.workloads.request_spec import Prefix
from specreplay.replay.workloads.workload import Event, RequestSpec, Workload
from specreplay.traces.errors import InputError


def reentry(seed: int = 0) -> Workload:
    """Budget 40, k = 3, async, 11 decoding requests "0".."10" (3-token prompts). Requests 0-9
    take 4 tokens each at steps 2 and 3 and request 10 is not scheduled; request 0 (max_tokens 4,
    all drafts accepted) finishes when step 2 is applied, so at step 4 request 10 re-enters the
    batch with 3 draft slots and no drafts behind them."""
    config = EngineConfig(
        max_num_batched_tokens=40,
        max_num_seqs=16,
        num_spec_tokens=3,
        async_scheduling=True,
        block_size=16,
        num_blocks=1000,
        max_model_len=512,
    )
    requests = [RequestSpec("0", arrival_step=1, prompt_len=3, max_tokens=4)]
    requests += [RequestSpec(str(i), arrival_step=1, prompt_len=3, max_tokens=12) for i in range(1, 11)]
    return Workload(tuple(requests), config, name="reentry", seed=seed, acceptance="all", max_steps=200)


def reentry_sync(seed: int = 0) -> Workload:
    """The re-entry workload under the synchronous Scheduler: one batch in flight, real drafts."""
    base = reentry(seed)
    return Workload(
        base.requests,
        EngineConfig(**{**base.config.to_dict(), "async_scheduling": False}),
        name="reentry-sync",
        seed=seed,
        acceptance="all",
        max_steps=200,
    )


def _decoding(count: int, max_tokens: int = 16, prompt_len: int = 5) -> list[RequestSpec]:
    return [RequestSpec(str(i), arrival_step=1, prompt_len=prompt_len, max_tokens=max_tokens) for i in range(count)]


_ASYNC_K3 = EngineConfig(
    max_num_batched_tokens=64,
    max_num_seqs=16,
    num_spec_tokens=3,
    async_scheduling=True,
    block_size=16,
    num_blocks=1000,
    max_model_len=512,
)


def pause_clear(seed: int = 0) -> Workload:
    """The RLHF weight-update loop, under async scheduling with 3 draft slots: 6 decoding
    requests are paused at step 6 (keep mode, clear_cache: once step 5's output is back, every
    running request is preempted and the cache reset) and resumed at step 9; at step 14 a
    reset_prefix_cache(reset_running_requests=True) lands while step 13 is in flight, so the
    requests resume in the same step and step 13's outputs must be dropped, exactly those."""
    events = (
        Event(6, "pause", mode="keep", clear_cache=True),
        Event(9, "resume"),
        Event(14, "reset_prefix_cache", reset_running=True),
    )
    return Workload(
        tuple(_decoding(6, max_tokens=40)),
        _ASYNC_K3,
        name="pause-clear",
        seed=seed,
        acceptance="alternate",
        max_steps=400,
        events=events,
    )


def abort_inflight(seed: int = 0) -> Workload:
    """Aborts that land while the request's steps are in flight (async, k = 3): request 1 right
    after step 5's schedule (vLLM's early aborts queue, steps 4 and 5 in flight), request 2
    before step 7's schedule (step 6 in flight); request 6 arrives at step 8 and takes the freed
    blocks. The in-flight outputs of 1 and 2 must be ignored, nothing else."""
    requests = _decoding(6, max_tokens=30) + [RequestSpec("6", arrival_step=8, prompt_len=5, max_tokens=12)]
    events = (Event(5, "abort", request="1", when="after"), Event(7, "abort", request="2"))
    return Workload(
        tuple(requests),
        _ASYNC_K3,
        name="abort-inflight",
        seed=seed,
        acceptance="random:0.6",
        max_steps=400,
        events=events,
    )


def resubmit(seed: int = 0) -> Workload:
    """Same-id resubmission under async scheduling (k = 3). Request 1 finishes (max_tokens 4)
    and is resubmitted at step 10, nothing of its first life in flight: a clean second life.
    Request 0 is aborted and resubmitted before step 12's schedule while its step 11 is in flight:
    vLLM 0.32.0 looks the returning output up by id and gives the old life's tokens to the new
    life (no per-life guard), whose placeholder count goes negative: the engine asserts."""
    requests = [RequestSpec("0", 1, 5, 40), RequestSpec("1", 1, 5, 4), RequestSpec("2", 1, 5, 40)]
    events = (Event(10, "resubmit", request="1"), Event(12, "abort", request="0"), Event(12, "resubmit", request="0"))
    return Workload(
        tuple(requests), _ASYNC_K3, name="resubmit", seed=seed, acceptance="all", max_steps=400, events=events
    )


def streaming_append(seed: int = 0) -> Workload:
    """A streaming-input session "s" beside two decoding requests (async, k = 3). Its second
    chunk arrives at step 3, while turn 1 runs: it waits for the turn to end, and then the turn's
    last sampled token is discarded, its in-flight step dropped, and turn 2 prefills the chunk on
    the KV kept. The third chunk arrives at step 20, when the session sits idle between turns,
    and is taken at once; the stream ends after it."""
    requests = [RequestSpec("s", 1, 6, 6, streaming=True), RequestSpec("b0", 1, 5, 30), RequestSpec("b1", 2, 5, 30)]
    events = (
        Event(3, "stream_append", request="s", tokens=4, max_tokens=5),
        Event(20, "stream_append", request="s", tokens=3, max_tokens=4),
    )
    return Workload(
        tuple(requests),
        _ASYNC_K3,
        name="streaming-append",
        seed=seed,
        acceptance="alternate",
        max_steps=400,
        events=events,
    )


def streaming_preempt(seed: int = 32) -> Workload:
    """A vLLM 0.32.0 bug found by the random generator and shrunk (random seed 32): streaming
    session "6" is preempted for KV blocks (async, k = 1) while a step is in flight. That step's
    output, delivered as stale, completes its turn; _handle_stopped_request queues the session
    again, and the stopped-preempted cleanup right after removes every copy of it from the
    waiting queues. The session is in no queue: never scheduled again, never finished (its
    next turn also lost the prompt: num_tokens 2 < num_prompt_tokens 3)."""
    config = EngineConfig(
        max_num_batched_tokens=15,
        max_num_seqs=4,
        num_spec_tokens=1,
        async_scheduling=True,
        block_size=4,
        num_blocks=27,
        max_model_len=256,
    )
    requests = (
        RequestSpec("3", 1, 1, 14),
        RequestSpec("4", 1, 57, 7),
        RequestSpec("5", 1, 5, 7),
        RequestSpec("6", 1, 1, 6, streaming=True),
    )
    events = (Event(7, "stream_append", request="6", tokens=2, max_tokens=3),)
    return Workload(
        requests, config, name="streaming-preempt", seed=seed, acceptance="all", max_steps=200, events=events
    )


def shared_prefix(seed: int = 0) -> Workload:
    """vLLM's prefix caching under chat traffic (async, k = 3, blocks of 16): four conversations
    share a 48-token system prompt (three blocks), two of them send a second turn (the first
    turn's prompt and answer, then new text) a step or two after their answer, and a long
    unrelated prompt arrives at step 8. The later conversations start from the cached system
    prompt, a second turn from its whole first turn; a cache tight enough to evict cached blocks
    and to preempt a second turn, which comes back to its own blocks still cached; and a cache
    reset with the requests running at step 18 (every hash forgotten once they are preempted)."""
    config = EngineConfig(max_num_batched_tokens=40, num_spec_tokens=3, block_size=16, num_blocks=12, max_model_len=128)
    requests = (
        RequestSpec("c0", prompt_len=5, max_tokens=12, prefix="system"),
        RequestSpec("c1", prompt_len=7, max_tokens=14, prefix="system"),
        RequestSpec("c2", arrival_step=3, prompt_len=4, max_tokens=20, prefix="system"),
        RequestSpec("c3", arrival_step=6, prompt_len=9, max_tokens=10, prefix="system"),
        RequestSpec("c0b", prompt_len=6, max_tokens=10, follows="c0", after_finish=1),
        RequestSpec("c1b", prompt_len=3, max_tokens=12, follows="c1", after_finish=2),
        RequestSpec("x", arrival_step=8, prompt_len=70, max_tokens=8),
    )
    events = (Event(18, "reset_prefix_cache", reset_running=True),)
    return Workload(
        requests,
        config,
        name="shared-prefix",
        seed=seed,
        acceptance="random:0.6",
        max_steps=400,
        events=events,
        prefixes=(Prefix("system", 48),),
    )


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[int], Workload]
    summary: str


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "reentry",
            reentry,
            "11 requests, budget 40, k=3, async: request 10 is skipped by the budget, "
            "then re-enters the batch with 3 draft slots and no drafts behind them",
        ),
        Scenario("reentry-sync", reentry_sync, "the same workload under the synchronous Scheduler (real drafts)"),
        Scenario(
            "pause-clear",
            pause_clear,
            "async + k=3: pause (keep, clear_cache) at step 6, resume at 9, then "
            "reset_prefix_cache(reset_running_requests) with step 13 in flight: its outputs are dropped",
        ),
        Scenario(
            "abort-inflight",
            abort_inflight,
            "aborts landing with steps in flight (after a schedule, and before "
            "one); a late request takes the freed blocks",
        ),
        Scenario(
            "resubmit",
            resubmit,
            "same-id resubmission: a clean second life, then abort + resubmit with a step "
            "in flight, where vLLM 0.32.0 gives the old life's output to the new life and asserts",
        ),
        Scenario(
            "streaming-append",
            streaming_append,
            "a streaming-input session: a chunk queued behind a running "
            "turn, then one taken by the idle session; turn ends drop their in-flight steps",
        ),
        Scenario(
            "streaming-preempt",
            streaming_preempt,
            "vLLM 0.32.0 loses a streaming session preempted with a "
            "step in flight whose stale output ends its turn (E2: never scheduled again)",
        ),
        Scenario(
            "shared-prefix",
            shared_prefix,
            "prefix caching under chat traffic: four conversations share a system prompt, two send a second "
            "turn; hits, evictions, a second turn preempted and back to its cached blocks, a cache reset",
        ),
        Scenario(
            "random",
            random_workload,
            "seeded random workload (--seed N): preemption, chunked prefill, "
            "aborts, stop tokens, budget skips, mixed acceptance; control events for about a third of the seeds",
        ),
    )
}


def build_scenario(name: str, seed: int = 0) -> Workload:
    if name not in SCENARIOS:
        raise InputError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}; see `specreplay scenarios`")
    return SCENARIOS[name].build(seed)
