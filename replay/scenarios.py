"""Built-in scenarios and the seeded random workload generator.

Where it sits: the input side of record (replay). `specreplay record --scenario NAME` builds its
workload here; `specreplay scenarios` lists them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from specreplay.replay.config import EngineConfig
from specreplay.replay.workload import RequestSpec, Workload
from specreplay.traces.errors import InputError


def reentry(seed: int = 0) -> Workload:
    """Budget 40, k = 3, async, 11 decoding requests "0".."10" (3-token prompts). Requests 0-9
    take 4 tokens each at steps 2 and 3 and request 10 is not scheduled; request 0 (max_tokens 4,
    all drafts accepted) finishes when step 2 is applied, so at step 4 request 10 re-enters the
    batch with 3 draft slots and no drafts behind them."""
    config = EngineConfig(max_num_batched_tokens=40, max_num_seqs=16, num_spec_tokens=3,
                          async_scheduling=True, block_size=16, num_blocks=1000, max_model_len=512)
    requests = [RequestSpec("0", arrival_step=1, prompt_len=3, max_tokens=4)]
    requests += [RequestSpec(str(i), arrival_step=1, prompt_len=3, max_tokens=12) for i in range(1, 11)]
    return Workload(tuple(requests), config, name="reentry", seed=seed, acceptance="all", max_steps=200)


def reentry_sync(seed: int = 0) -> Workload:
    """The re-entry workload under the synchronous Scheduler: one batch in flight, real drafts."""
    base = reentry(seed)
    return Workload(base.requests, EngineConfig(**{**base.config.to_dict(), "async_scheduling": False}),
                    name="reentry-sync", seed=seed, acceptance="all", max_steps=200)


def random_workload(seed: int = 0) -> Workload:
    """A seeded random workload that reaches preemption (few KV blocks), chunked prefill (long
    prompts, a long-prefill threshold), aborts, stop tokens, budget skips and mixed acceptance."""
    rng = random.Random(seed)
    block_size = rng.choice((4, 8, 16))
    k = rng.choice((0, 1, 2, 3, 3, 3, 4))
    budget = rng.choice((12, 16, 24, 32, 40, 64))
    max_model_len = 256
    num_requests = rng.randint(6, 24)
    requests = []
    longest = 0
    for i in range(num_requests):
        prompt_len = rng.choice((rng.randint(2, 12), rng.randint(2, 12), rng.randint(20, 90)))
        max_tokens = rng.randint(1, 40)
        longest = max(longest, prompt_len + max_tokens + k)
        requests.append(RequestSpec(
            str(i), arrival_step=rng.choice((1, 1, rng.randint(1, 30))), prompt_len=prompt_len,
            max_tokens=max_tokens,
            abort_step=rng.randint(2, 40) if rng.random() < 0.12 else None,
            stop_at=rng.randint(1, max_tokens) if rng.random() < 0.15 else None,
            acceptance=rng.choice((None, None, "none", "all", "random:0.5")),
        ))
    per_request = -(-longest // block_size)
    # Between one long request's worth of blocks and plenty: the low end forces preemption.
    num_blocks = 1 + rng.choice((per_request + 2, 2 * per_request, 4 * per_request, 64 * per_request))
    config = EngineConfig(
        max_num_batched_tokens=budget, max_num_seqs=min(budget, rng.choice((4, 8, 16, 32))), num_spec_tokens=k,
        async_scheduling=rng.random() < 0.8, block_size=block_size, num_blocks=num_blocks,
        max_model_len=max_model_len,
        long_prefill_token_threshold=rng.choice((0, 0, 0, 8, 16)),
    )
    acceptance = rng.choice(("all", "none", "alternate", "random:0.3", "random:0.7"))
    return Workload(tuple(requests), config, name=f"random-{seed}", seed=seed,
                    acceptance=acceptance, max_steps=2000)


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[int], Workload]
    summary: str


SCENARIOS = {s.name: s for s in (
    Scenario("reentry", reentry, "11 requests, budget 40, k=3, async: request 10 is skipped by the budget, "
             "then re-enters the batch with 3 draft slots and no drafts behind them"),
    Scenario("reentry-sync", reentry_sync, "the same workload under the synchronous Scheduler (real drafts)"),
    Scenario("random", random_workload, "seeded random workload (--seed N): preemption, chunked prefill, "
             "aborts, stop tokens, budget skips, mixed acceptance"),
)}


def build_scenario(name: str, seed: int = 0) -> Workload:
    if name not in SCENARIOS:
        raise InputError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}; see `specreplay scenarios`")
    return SCENARIOS[name].build(seed)
