"""Seeded random generators: whole workloads and the control events drawn for them.

Where it sits: workloads -> models -> engines -> record -> check. `--scenario random --seed N`
and `explore` draw their workloads here; each seed gives the same workload on every machine.
"""

from __future__ import annotations

import dataclasses
import random

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import Event, RequestSpec, Workload


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
        requests.append(
            RequestSpec(
                str(i),
                arrival_step=rng.choice((1, 1, rng.randint(1, 30))),
                prompt_len=prompt_len,
                max_tokens=max_tokens,
                abort_step=rng.randint(2, 40) if rng.random() < 0.12 else None,
                stop_at=rng.randint(1, max_tokens) if rng.random() < 0.15 else None,
                acceptance=rng.choice((None, None, "none", "all", "random:0.5")),
            )
        )
    per_request = -(-longest // block_size)
    # Between one long request's worth of blocks and plenty: the low end forces preemption.
    num_blocks = 1 + rng.choice((per_request + 2, 2 * per_request, 4 * per_request, 64 * per_request))
    config = EngineConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=min(budget, rng.choice((4, 8, 16, 32))),
        num_spec_tokens=k,
        async_scheduling=rng.random() < 0.8,
        block_size=block_size,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        long_prefill_token_threshold=rng.choice((0, 0, 0, 8, 16)),
    )
    acceptance = rng.choice(("all", "none", "alternate", "random:0.3", "random:0.7"))
    requests, events = random_events(seed, requests, config)
    return Workload(
        tuple(requests), config, name=f"random-{seed}", seed=seed, acceptance=acceptance, max_steps=2000, events=events
    )


def random_events(
    seed: int, requests: list[RequestSpec], config: EngineConfig
) -> tuple[list[RequestSpec], tuple[Event, ...]]:
    """Control events for about a third of the random workloads, from their own generator (the
    config and the other requests of a seed are the same with or without them): a pause and its
    resume, cache resets with and without running requests reset, aborts before and after a
    schedule, resubmissions of aborted ids (some while the aborted life still has a step in
    flight), and a streaming session fed one or two input chunks."""
    rng = random.Random(seed * 7919 + 1)
    if rng.random() >= 0.35:
        return requests, ()
    return draw_events(rng, requests, config, last_step=30)


def draw_events(
    rng: random.Random, requests: list[RequestSpec], config: EngineConfig, last_step: int
) -> tuple[list[RequestSpec], tuple[Event, ...]]:
    """One to three control events (a pause with its resume, a cache reset, an abort, an abort and
    a resubmission, a streaming session with its chunks) at steps 2..last_step; the requests come
    back with the streaming one marked."""
    events: list[Event] = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("pause", "reset", "abort", "abort", "resubmit", "stream"))
        if kind == "stream":
            i = rng.randrange(len(requests))
            spec = requests[i]
            if spec.streaming or spec.stop_at is not None or any(e.request == spec.request_id for e in events):
                continue
            chunks = [(rng.randint(1, 8), rng.randint(1, 10)) for _ in range(rng.randint(1, 2))]
            total = spec.prompt_len + spec.max_tokens + sum(t + m - 1 for t, m in chunks)
            room = (
                min(config.max_model_len, (config.num_blocks - 1) * config.block_size)
                - config.num_spec_tokens
                - config.num_lookahead_tokens
            )
            if total > room:
                continue
            requests = requests[:i] + [dataclasses.replace(spec, streaming=True)] + requests[i + 1 :]
            step = spec.arrival_step
            for tokens, max_tokens in chunks:
                step += rng.randint(0, 12)
                events.append(
                    Event(step, "stream_append", request=spec.request_id, tokens=tokens, max_tokens=max_tokens)
                )
            continue
        step = rng.randint(2, last_step)
        if kind == "pause":
            events.append(
                Event(step, "pause", mode=rng.choice(("keep", "keep", "wait", "abort")), clear_cache=rng.random() < 0.7)
            )
            events.append(Event(step + rng.randint(0, 6), "resume"))
        elif kind == "reset":
            events.append(Event(step, "reset_prefix_cache", reset_running=rng.random() < 0.8))
        else:
            spec = rng.choice(requests)
            if spec.streaming:
                continue
            step = max(step, spec.arrival_step)
            when = rng.choice(("before", "after"))
            events.append(Event(step, "abort", request=spec.request_id, when=when))
            if kind == "resubmit":
                # Aborted before step s: resubmitting at s is the same input-queue batch; after
                # step s's schedule, the earliest is s + 1.
                at = step + (when == "after") + rng.randint(0, 4)
                events.append(Event(max(at, spec.arrival_step + 1), "resubmit", request=spec.request_id))
    return requests, tuple(sorted(events, key=lambda e: e.step))
