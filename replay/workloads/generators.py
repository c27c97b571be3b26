"""Seeded random generators: whole workloads and the control events drawn for them.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. `--scenario random --seed N` and `explore` draw their workloads here;
each seed gives the same workload on every machine.

`explore_workload` draws across every engine setting the reference models honour: k
(num_spec_tokens) 0 to 8, lookahead slots (0, k, k + 1 or in between), block sizes 4 to 64,
max_model_len from exactly the longest request (the drafter skipped and the drafts cut at the
end) to roomy, KV from one request's worth to plenty; its profiles (explore's) bend the draw
toward one kind of situation. Some of its workloads share prompts (`draw_shared_prompts`): a
prefix of whole blocks and a part, or a conversation's next turn, for vLLM's prefix caching.
"""

from __future__ import annotations

import dataclasses
import random

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.prompts import Prompts
from specreplay.replay.workloads.workload import Event, Prefix, RequestSpec, Workload


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


#: explore's draws. k and block size weigh the common settings (k 3-4, 16-token blocks) double.
EXPLORE_SPEC_TOKENS = (0, 1, 2, 3, 3, 4, 4, 5, 6, 7, 8)
EXPLORE_BLOCK_SIZES = (4, 8, 16, 16, 32, 64)
EXPLORE_ACCEPTANCES = ("all", "none", "alternate", "random:0.3", "random:0.7")


def explore_workload(seed: int, profiles: tuple[str, ...], attempt: int = 0) -> Workload:
    """A small workload (2-8 requests, short prompts and outputs) from a seed and a mix of explore's
    profiles (burst, budget-edge, long-prompts, kv-pressure, aborts, acceptance, idle-gaps, sync,
    events, model-len-edge), drawn across every engine setting. `attempt` > 0 draws another
    workload for the same seed (explore's redraw when the implementation does not apply)."""
    rng = random.Random(f"workload:{seed}" if not attempt else f"workload:{seed}:{attempt}")
    on = set(profiles)
    k = rng.choice(EXPLORE_SPEC_TOKENS)
    # vLLM's drafters ask 0 (ngram) or k (EAGLE, draft model) lookahead slots, DFlash k + 1.
    lookahead = 0 if k == 0 else rng.choice((0, 0, 0, k, k + 1, rng.randint(1, k)))
    num_requests = rng.randint(2, 8)
    budget = rng.choice((8, 12, 16, 24, 32, 48, 64))
    max_num_seqs = rng.choice((2, 4, 8))
    if "budget-edge" in on:
        # m decoding requests' worth of 1 + k tokens, give or take one, with more than m running:
        # the running loop stops before the last ones, which re-enter a step later.
        max_num_seqs = max(max_num_seqs, 3)
        m = rng.randint(1, max(1, min(num_requests, max_num_seqs) - 1))
        budget = max(2, m * (1 + k) + rng.choice((-1, 0, 0, 1)))
    threshold = rng.choice((0, 8, 16)) if "long-prompts" in on else 0
    block_size = rng.choice(EXPLORE_BLOCK_SIZES)
    edge = "model-len-edge" in on
    requests, arrival = [], 1
    for i in range(num_requests):
        long = "long-prompts" in on and rng.random() < 0.5
        prompt_len = rng.randint(20, 80) if long else rng.randint(2, 12)
        # At the model-length edge some requests decode long, so others run beside their end.
        max_tokens = rng.randint(10, 40) if edge and rng.random() < 0.5 else rng.randint(1, 20)
        if "burst" in on or "budget-edge" in on:
            arrival = rng.choice((1, 1, 1, rng.randint(2, 12)))
        elif "idle-gaps" in on:
            arrival = arrival + (rng.randint(8, 30) if rng.random() < 0.4 else 0)
        else:
            arrival = rng.choice((1, rng.randint(1, 8)))
        abort = arrival + rng.randint(1, 8) if "aborts" in on and rng.random() < 0.4 else None
        per_request = rng.choice(EXPLORE_ACCEPTANCES) if "acceptance" in on and rng.random() < 0.7 else None
        stop_at = rng.randint(1, max_tokens) if rng.random() < 0.1 else None
        requests.append(
            RequestSpec(
                str(i),
                arrival_step=arrival,
                prompt_len=prompt_len,
                max_tokens=max_tokens,
                abort_step=abort,
                stop_at=stop_at,
                acceptance=per_request,
            )
        )
    requests, prefixes = draw_shared_prompts(random.Random(f"prompts:{seed}:{attempt}"), requests, block_size, seed)
    whole = Prompts(Workload(tuple(requests), seed=seed, prefixes=prefixes))
    longest = max(whole.length(r.request_id) + r.max_tokens for r in requests)
    # Tight: the longest request's last steps have no room for k drafts (the scheduler cuts them,
    # the runner skips the drafter for the whole batch); roomy: nothing reaches the end.
    tight = edge or rng.random() < 0.2
    max_model_len = longest + rng.randint(0, k + 1) if tight else 256
    per_request_blocks = -(-min(longest + k + lookahead, max_model_len) // block_size)
    spare = rng.randint(0, 3) if "kv-pressure" in on else 4 * num_requests * per_request_blocks
    config = EngineConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=min(budget, max_num_seqs),
        num_spec_tokens=k,
        async_scheduling="sync" not in on or rng.random() < 0.3,
        block_size=block_size,
        num_blocks=1 + per_request_blocks + spare,
        max_model_len=max_model_len,
        long_prefill_token_threshold=min(threshold, max_model_len),
        num_lookahead_tokens=lookahead,
    )
    name = f"explore-{seed}-{'+'.join(profiles) or 'plain'}"
    acceptance = rng.choice(EXPLORE_ACCEPTANCES)
    if "sync" not in on and rng.random() < 0.1:  # sync outside its profile too (drawn last: the rest stays)
        config = dataclasses.replace(config, async_scheduling=False)
    events: tuple = ()
    if "events" in on:
        requests, events = draw_events(random.Random(f"events:{seed}:{attempt}"), requests, config, last_step=15)
    return Workload(
        tuple(requests),
        config,
        name=name,
        seed=seed,
        acceptance=acceptance,
        max_steps=400,
        events=events,
        prefixes=prefixes,
    )


#: The longest whole prompt and output a shared prompt may make (explore's roomy max_model_len is 256).
SHARED_PROMPT_ROOM = 220


def draw_shared_prompts(
    rng: random.Random, requests: list[RequestSpec], block_size: int, seed: int
) -> tuple[list[RequestSpec], tuple[Prefix, ...]]:
    """Prompts that share tokens, for about a third of explore's workloads, from their own
    generator (the rest of a seed's draw is the same with or without them): in a quarter, two
    to four requests start with one prefix of one to three blocks, and half the time part of
    another (vLLM caches full blocks only); in a fifth, a request becomes the next turn of an
    earlier one (its prompt that one's prompt and answer, then its own text), sent one to four
    steps after that one finished, or now and then at its own step. Requests that are aborted
    take no part (a followed request's answer must be whole)."""
    prefixes: tuple[Prefix, ...] = ()
    out = list(requests)
    if rng.random() < 0.25 and len(out) >= 2:
        members = rng.sample(range(len(out)), rng.randint(2, min(4, len(out))))
        blocks = rng.randint(1, max(1, min(3, 96 // block_size)))
        length = blocks * block_size + rng.choice((0, rng.randint(1, block_size - 1) if block_size > 1 else 0))
        prefixes = (Prefix("shared", length),)
        for i in members:
            if length + out[i].prompt_len + out[i].max_tokens <= SHARED_PROMPT_ROOM:
                out[i] = dataclasses.replace(out[i], prefix="shared")
    if rng.random() < 0.2 and len(out) >= 2:
        j = rng.randrange(1, len(out))
        i = rng.randrange(j)
        before, spec = out[i], out[j]
        after = rng.choice((1, 1, 2, 4, None))  # None: at its own arrival step
        turn = dataclasses.replace(spec, prefix=None, follows=before.request_id, after_finish=after)
        if before.abort_step is None and spec.abort_step is None:
            lengths = Prompts(Workload(tuple(out[:j] + [turn]), seed=seed, prefixes=prefixes))
            if lengths.length(turn.request_id) + turn.max_tokens <= SHARED_PROMPT_ROOM:
                out[j] = turn
    return out, prefixes


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
            if _in_conversation(spec, requests) or spec.prefix is not None or spec.follows is not None:
                continue  # (its whole prompt, which the room below would need, is longer than its own text)
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
            if spec.streaming or _in_conversation(spec, requests):
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


def _in_conversation(spec: RequestSpec, requests: list[RequestSpec]) -> bool:
    """A followed request (its answer must be whole) or a turn that arrives after_finish (its step
    is known only in the run): no abort, resubmission or stream for it."""
    return spec.after_finish is not None or any(r.follows == spec.request_id for r in requests)
