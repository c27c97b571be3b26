"""Fidelity workloads: seeded workloads drawn across every engine setting, for the differential
of the reference scheduler against the installed vLLM's real scheduler.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli Its only consumer is the fidelity sweep (workflows/fidelity_sweep.py,
`specreplay fidelity`, the CI differential test). It is deliberately independent of the `random`
scenario and of explore's profiles: those aim at the bugs specreplay hunts, this one aims at the
corners of the configuration space where a model of the scheduler could part from the real one.

What one seed draws (docs/fidelity.md has the table):
- k (num_spec_tokens) 0 to 8; lookahead 0, k, or in between (vLLM's drafters ask 0 or k);
- block size 16, 32 or 64 (sometimes 8); KV blocks from one request's worth (+0 to 2 spare)
  to plenty;
- max_model_len from exactly the longest request (drafts trimmed, then skipped, at the end)
  to roomy;
- long-prefill threshold off, 1, 4, 8, 16 or 64;
- max_num_seqs 1 to 64; a token budget at m * (1 + k) give or take two, or anywhere from 1 + k
  up, never below max_num_seqs (vLLM's rule);
- 1 to 16 requests: 1-token prompts, short and long prompts, 1 to 40 output tokens, arrivals at
  step 1, spread out or in bursts, aborts, stop tokens, acceptance per request;
- control events for about 40% of seeds (pause/resume in each mode, cache resets, aborts before
  and after a schedule, resubmissions, streaming sessions); sync for about 30%;
- prefix caching on (vLLM's default) for about 85% of seeds; shared prompt prefixes and
  conversation turns (explore's draw, generators.draw_shared_prompts, from a generator of its own);
  with lookahead k, an EAGLE-style drafter's rule for a hit's last block for about a third.
"""

from __future__ import annotations

import dataclasses
import random

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.generators import draw_events, draw_shared_prompts
from specreplay.replay.workloads.prompts import Prompts
from specreplay.replay.workloads.workload import RequestSpec, Workload

ACCEPTANCES = ("all", "none", "alternate", "random:0.2", "random:0.5", "random:0.8")
BLOCK_SIZES = (16, 16, 32, 64, 8)
MAX_NUM_SEQS = (1, 2, 3, 4, 6, 8, 16, 32, 64)
THRESHOLDS = (0, 0, 0, 1, 4, 8, 16, 64)


def fidelity_workload(seed: int) -> Workload:
    """The seed's workload; the same seed always draws the same workload."""
    rng = random.Random(f"fidelity:{seed}")
    k = rng.choice((0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 8))
    lookahead = 0 if k == 0 else rng.choice((0, 0, k, k, rng.randint(1, k)))
    block_size = rng.choice(BLOCK_SIZES)
    requests = _requests(rng, k)
    max_num_seqs = rng.choice(MAX_NUM_SEQS)
    budget = _budget(rng, k, max_num_seqs, len(requests))
    requests, prefixes = draw_shared_prompts(random.Random(f"fidelity-prompts:{seed}"), requests, block_size, seed)
    longest = _longest(requests, prefixes, seed)
    # Tight: the last tokens of the longest request have no room for k drafts (vLLM trims them,
    # then schedules none); roomy: nothing reaches the end.
    max_model_len = rng.choice((longest, longest + rng.randint(1, max(1, k)), max(longest, 256), 512))
    per_request = -(-min(longest + k + lookahead, max_model_len) // block_size)
    spare = rng.choice((0, 1, 2, per_request, 4 * per_request, 64 * per_request))
    config = EngineConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=min(max_num_seqs, budget),
        num_spec_tokens=k,
        async_scheduling=rng.random() < 0.7,
        block_size=block_size,
        num_blocks=1 + per_request + spare,
        max_model_len=max_model_len,
        long_prefill_token_threshold=min(rng.choice(THRESHOLDS), max_model_len),
        num_lookahead_tokens=lookahead,
    )
    config = _cache_settings(random.Random(f"fidelity-cache:{seed}"), config)
    events: tuple = ()
    if rng.random() < 0.4:
        requests, events = draw_events(rng, requests, config, last_step=30)
    return Workload(
        tuple(requests),
        config,
        name=f"fidelity-{seed}",
        seed=seed,
        acceptance=rng.choice(ACCEPTANCES),
        max_steps=2000,
        events=events,
        prefixes=prefixes,
    )


def _longest(requests: list[RequestSpec], prefixes: tuple, seed: int) -> int:
    """The longest whole prompt (a shared prefix, a conversation's earlier turns) and output."""
    whole = Prompts(Workload(tuple(requests), seed=seed, prefixes=prefixes))
    return max(whole.length(r.request_id) + r.max_tokens for r in requests)


def _cache_settings(rng: random.Random, config: EngineConfig) -> EngineConfig:
    """Prefix caching off for about 15% of seeds; an EAGLE-style drafter's rule for a hit's last
    block for about a third of those whose lookahead is k (EAGLE reserves k slots)."""
    on = rng.random() >= 0.15
    eagle = on and config.num_spec_tokens > 0 and config.num_lookahead_tokens == config.num_spec_tokens
    return dataclasses.replace(config, enable_prefix_caching=on, eagle_block_drop=eagle and rng.random() < 1 / 3)


def runner_workload(seed: int) -> Workload:
    """The seed's workload for the runner differential (workflows/runner_differential.py): the
    reference runner against vLLM's real one, live, where a step costs 10-100 ms and an engine
    start a second (Model Runner V2's Triton kernels run in Triton's interpreter on a CPU), so
    small: 1 to 6 requests of prompts up to 96 tokens and up to 14 outputs, k 0 to 5. Across
    the settings where a runner's state can part from the reference's: async and sync, budgets
    that skip requests and cut drafts, KV caches tight enough to preempt, max_model_len at the
    longest request (drafts trimmed at the end), aborts, stops, control events (streaming
    sessions, resubmissions, pauses, cache resets). Every config is one a live vLLM builds: its
    KV cache holds a request of max_model_len (vLLM's startup check), and a pause waits in keep
    or abort mode (an in-process engine core refuses wait)."""
    rng = random.Random(f"runner:{seed}")
    k = rng.choice((0, 1, 1, 2, 2, 3, 3, 4, 5))
    lookahead = 0 if k == 0 else rng.choice((0, k))
    block_size = rng.choice(BLOCK_SIZES)
    requests = _requests(rng, k, small=True)
    max_num_seqs = rng.choice((1, 2, 3, 4, 8))
    budget = _budget(rng, k, max_num_seqs, len(requests))
    requests, prefixes = draw_shared_prompts(random.Random(f"runner-prompts:{seed}"), requests, block_size, seed)
    longest = _longest(requests, prefixes, seed)
    max_model_len = rng.choice((longest, longest, longest + rng.randint(1, max(1, k)), longest + 32, 128))
    max_model_len = max(max_model_len, longest)
    # One request of max_model_len, in blocks of a CPU's attention too (it rounds the block size
    # up to a multiple of 32 and keeps the tokens, families/vllm/live.py).
    unit = max(block_size, 32)
    one_request = -(-max_model_len // unit) * unit // block_size
    # Tight for about half the seeds: room for one request of max_model_len and a block or two,
    # so that requests together outgrow it and are preempted.
    num_blocks = 1 + one_request + rng.choice((0, 0, 0, 1, 2, one_request, 8 * one_request))
    config = EngineConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=min(max_num_seqs, budget),
        num_spec_tokens=k,
        async_scheduling=rng.random() < 0.6,
        block_size=block_size,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        long_prefill_token_threshold=min(rng.choice(THRESHOLDS), max_model_len),
        num_lookahead_tokens=lookahead,
    )
    # The live engine's drafter decides EAGLE's rule for itself: only caching on or off here.
    config = dataclasses.replace(config, enable_prefix_caching=random.Random(f"runner-cache:{seed}").random() >= 0.15)
    events: tuple = ()
    if rng.random() < 0.4:
        requests, events = draw_events(rng, requests, config, last_step=16)
        events = tuple(dataclasses.replace(e, mode="keep") if e.mode == "wait" else e for e in events)
    return Workload(
        tuple(requests),
        config,
        name=f"runner-{seed}",
        seed=seed,
        acceptance=rng.choice(ACCEPTANCES),
        max_steps=400,
        events=events,
        prefixes=prefixes,
    )


def _requests(rng: random.Random, k: int, small: bool = False) -> list[RequestSpec]:
    if small:
        count = rng.choice((1, 2, rng.randint(2, 4), rng.randint(3, 6), rng.randint(4, 6)))
    else:
        count = rng.choice((1, 2, rng.randint(3, 8), rng.randint(3, 8), rng.randint(8, 16)))
    arrivals = rng.choice(("together", "spread", "bursts"))
    requests, arrival = [], 1
    for i in range(count):
        if arrivals == "spread":
            arrival += rng.randint(0, 6)
        elif arrivals == "bursts":
            arrival += rng.choice((0, 0, 0, rng.randint(5, 20)))
        short, medium, long = rng.randint(2, 12), rng.randint(2, 12), rng.randint(13, 40)
        if small:
            prompt_len = rng.choice((1, 1, short, medium, long, rng.randint(40, 96)))
            max_tokens = rng.choice((1, rng.randint(1, k + 2), rng.randint(2, 14), rng.randint(2, 14)))
        else:
            prompt_len = rng.choice((1, 1, short, medium, long, rng.randint(40, 160)))
            max_tokens = rng.choice((1, rng.randint(1, k + 2), rng.randint(2, 40), rng.randint(2, 40)))
        requests.append(
            RequestSpec(
                str(i),
                arrival_step=arrival,
                prompt_len=prompt_len,
                max_tokens=max_tokens,
                abort_step=arrival + rng.randint(0, 20) if rng.random() < 0.12 else None,
                stop_at=rng.randint(1, max_tokens) if rng.random() < 0.15 else None,
                acceptance=rng.choice(ACCEPTANCES) if rng.random() < 0.4 else None,
            )
        )
    return requests


def _budget(rng: random.Random, k: int, max_num_seqs: int, num_requests: int) -> int:
    """At m decoding requests' worth (m * (1 + k)) give or take two, or anywhere from 1 + k up."""
    if rng.random() < 0.5:
        m = rng.randint(1, max(1, min(max_num_seqs, num_requests)))
        return max(1, m * (1 + k) + rng.randint(-2, 2))
    return rng.choice((1 + k, 2 + k, 8, 16, 32, 64, 128, 512))


__all__ = ["fidelity_workload", "runner_workload"]
