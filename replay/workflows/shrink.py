"""Shrink: cut a failing workload down to a minimal reproduction that still fires the same code.

Where it sits: traces -> replay -> **diff**, then back to record: the workload in a failing
trace's metadata is reduced step by step (drop a request, halve or decrement prompts and
max_tokens, move arrivals earlier, drop aborts, stops and per-request acceptance, drop, move and
shrink control events, simplify the acceptance, lower the draft width, the budget and the batch size, relax KV pressure and the
long-prefill threshold), each candidate replayed through the same implementation and engine and
kept only if the finding code still fires. Greedy and deterministic: the same trace and code give
the same minimal workload. `emit_pytest` turns the result into a self-contained regression test.
"""

from __future__ import annotations

import dataclasses
import pprint
from dataclasses import dataclass, field
from typing import Callable, Iterator

from specreplay.replay.workloads.workload import RequestSpec, Workload
from specreplay.traces.errors import InputError
from specreplay.traces.trace import Trace


@dataclass
class Shrunk:
    workload: Workload
    trace: Trace
    code: str
    runs: int = 0  # replays tried
    steps: list[str] = field(default_factory=list)  # the reductions kept, in order


def size(workload: Workload, trace: Trace) -> tuple[int, ...]:
    """What smaller means: fewer requests, then fewer steps, then fewer tokens, then fewer
    optional complications (aborts, stop tokens, per-request or random acceptance, control events,
    streaming sessions, a threshold),
    then a smaller engine (draft width, batch size, budget)."""
    tokens = sum(r.prompt_len + r.max_tokens for r in workload.requests)
    extras = sum((r.abort_step is not None) + (r.stop_at is not None) + (r.acceptance is not None) + r.streaming
                 for r in workload.requests) + len(workload.events)
    extras += (workload.acceptance not in ("all", "none")) + bool(workload.config.long_prefill_token_threshold)
    cfg = workload.config
    return (len(workload.requests), trace.num_steps, tokens, extras, cfg.num_spec_tokens, cfg.max_num_seqs,
            cfg.max_num_batched_tokens)


def shrink(workload: Workload, impl, code: str, engine: str = "reference", max_runs: int = 3000,
           progress: Callable[[Shrunk], None] | None = None) -> Shrunk:
    """The smallest workload (greedy) whose run through `impl` still fires `code`."""
    from specreplay.replay.engines.loop import run_workload

    def fires(w: Workload) -> Trace | None:
        from specreplay.replay.check.checker import check_trace

        try:
            w = Workload.from_dict(w.to_dict())  # a reduction must still be a valid workload
            trace = run_workload(w, impl, engine=engine)
        except InputError:
            return None
        if not any(f.code == code for f in check_trace(trace)):
            return None
        if code == "E1-engine-crash" and signature is not None and crash_signature(trace) != signature:
            return None  # the engine dies, but of something else (say, a duplicate request id)
        return trace

    signature = None
    first = fires(workload)
    signature = crash_signature(first) if first is not None else None
    if first is None:
        raise InputError(f"{code} does not fire when this workload is replayed through {impl.name}; "
                         "nothing to shrink (pick a --code the trace's findings show)")
    best = Shrunk(workload, first, code, runs=1)
    improved = True
    while improved and best.runs < max_runs:
        improved = False
        for label, candidate in reductions(best.workload):
            if best.runs >= max_runs:
                break
            best.runs += 1
            trace = fires(candidate)
            if trace is not None and size(candidate, trace) < size(best.workload, best.trace):
                best.workload, best.trace = candidate, trace
                best.steps.append(label)
                improved = True
                if progress is not None:
                    progress(best)
                break  # start over from the biggest reductions
    return best


def crash_signature(trace: Trace) -> str | None:
    """What a crash says, less its numbers and names: shrinking an E1 keeps the same assert."""
    import re

    if trace.outcome.get("status") != "crashed":
        return None
    message = re.sub(r"'[^']*'", "'…'", str(trace.outcome.get("message", "")))
    return f"{trace.outcome.get('kind')}: {re.sub(r'-?[0-9]+', 'N', message)}"


def reductions(w: Workload) -> Iterator[tuple[str, Workload]]:
    """Candidate reductions, biggest first."""
    reqs = list(w.requests)
    cfg = w.config

    def with_requests(new: list[RequestSpec]) -> Workload:
        ids = {r.request_id for r in new}  # a dropped request's events go with it
        return dataclasses.replace(w, requests=tuple(new),
                                   events=tuple(e for e in w.events if e.request is None or e.request in ids))

    def with_events(new: list) -> Workload:
        return dataclasses.replace(w, events=tuple(new))

    def with_config(**changes) -> Workload:
        return dataclasses.replace(w, config=dataclasses.replace(cfg, **changes))

    def with_request(i: int, **changes) -> Workload:
        return with_requests(reqs[:i] + [dataclasses.replace(reqs[i], **changes)] + reqs[i + 1:])

    if len(reqs) > 1:
        half = len(reqs) // 2
        if half > 1:
            yield f"drop requests {reqs[half].request_id}..", with_requests(reqs[:half])
            yield f"drop requests ..{reqs[half - 1].request_id}", with_requests(reqs[half:])
        for i, r in enumerate(reqs):
            yield f"drop request {r.request_id}", with_requests(reqs[:i] + reqs[i + 1:])
    first_arrival = min(r.arrival_step for r in reqs)
    if first_arrival > 1:
        shift = first_arrival - 1  # aborts move with the arrivals they follow
        earlier = with_requests([dataclasses.replace(
            r, arrival_step=r.arrival_step - shift, abort_step=None if r.abort_step is None else max(1, r.abort_step - shift))
            for r in reqs])
        yield "arrive earlier", dataclasses.replace(earlier, events=tuple(
            dataclasses.replace(e, step=max(1, e.step - shift)) for e in earlier.events))
    events = list(w.events)
    for i, e in enumerate(events):
        name = f"event {e.kind}@{e.step}" + (f" ({e.request})" if e.request else "")
        yield f"drop {name}", with_events(events[:i] + events[i + 1:])
        for step in sorted({1, e.step // 2, e.step - 1} - {0, e.step}):
            yield f"{name} at step {step}", with_events(events[:i] + [dataclasses.replace(e, step=step)] + events[i + 1:])
        if e.kind == "stream_append":
            if e.tokens > 1:
                yield f"{name} tokens {e.tokens // 2}", with_events(
                    events[:i] + [dataclasses.replace(e, tokens=e.tokens // 2)] + events[i + 1:])
            if (e.max_tokens or 2) > 1:
                yield f"{name} max_tokens 1", with_events(events[:i] + [dataclasses.replace(e, max_tokens=1)] + events[i + 1:])
    for i, r in enumerate(reqs):
        if r.max_tokens > 1:
            yield f"request {r.request_id} max_tokens {r.max_tokens // 2}", with_request(i, max_tokens=max(1, r.max_tokens // 2))
            yield f"request {r.request_id} max_tokens {r.max_tokens - 1}", with_request(i, max_tokens=r.max_tokens - 1)
        if r.prompt_len > 1:
            yield f"request {r.request_id} prompt_len {r.prompt_len // 2}", with_request(i, prompt_len=max(1, r.prompt_len // 2))
            yield f"request {r.request_id} prompt_len {r.prompt_len - 1}", with_request(i, prompt_len=r.prompt_len - 1)
        if r.arrival_step > 1:
            for arrival in sorted({1, r.arrival_step // 2, r.arrival_step - 1} - {r.arrival_step}):
                moved = None if r.abort_step is None else max(1, r.abort_step - (r.arrival_step - arrival))
                yield f"request {r.request_id} arrives at {arrival}", with_request(i, arrival_step=arrival, abort_step=moved)
        if r.abort_step is not None:
            yield f"request {r.request_id} not aborted", with_request(i, abort_step=None)
        if r.stop_at is not None:
            yield f"request {r.request_id} no stop token", with_request(i, stop_at=None)
        if r.acceptance is not None:
            yield f"request {r.request_id} default acceptance", with_request(i, acceptance=None)
        if r.streaming:
            plain = with_request(i, streaming=False)
            yield f"request {r.request_id} not streaming", dataclasses.replace(plain, events=tuple(
                e for e in plain.events if not (e.kind == "stream_append" and e.request == r.request_id)))
    for simpler in ("all", "none"):
        if w.acceptance != simpler:
            yield f"acceptance {simpler}", dataclasses.replace(w, acceptance=simpler)
    if cfg.num_spec_tokens > 1:
        yield f"num_spec_tokens {cfg.num_spec_tokens - 1}", with_config(num_spec_tokens=cfg.num_spec_tokens - 1)
    if cfg.long_prefill_token_threshold:
        yield "no long-prefill threshold", with_config(long_prefill_token_threshold=0)
    if cfg.max_num_seqs > 1:
        yield f"max_num_seqs {cfg.max_num_seqs - 1}", with_config(max_num_seqs=cfg.max_num_seqs - 1)
    if cfg.max_num_batched_tokens > cfg.max_num_seqs:
        yield f"budget {cfg.max_num_batched_tokens - 1}", with_config(max_num_batched_tokens=cfg.max_num_batched_tokens - 1)


def emit_pytest(shrunk: Shrunk, source: str, impl_name: str, engine: str) -> str:
    """A self-contained pytest module: the minimal workload inline, run through the implementation
    under test (SPECREPLAY_IMPL, default `impl_name`), failing while `code` fires."""
    first = next(f for f in _findings(shrunk.trace) if f.code == shrunk.code)
    slug = "".join(ch if ch.isalnum() else "_" for ch in shrunk.code.lower())
    workload = pprint.pformat(shrunk.workload.to_dict(), width=100, sort_dicts=True)  # Python literals
    n, steps = size(shrunk.workload, shrunk.trace)[:2]
    return f'''"""Regression test written by `specreplay shrink` from {source}.

{shrunk.code} fired on {impl_name} at step {first.step}, request {first.request_id!r}:
{first.message}

The workload is the shrunk reproduction ({n} requests, {steps} steps). The test replays it through
the implementation under test and fails while {shrunk.code} fires. Choose the implementation with
SPECREPLAY_IMPL (a registry name or module:attr; default {impl_name!r}).
"""

import os

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.loop import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.workload import Workload

CODE = {shrunk.code!r}
ENGINE = {engine!r}
WORKLOAD = {workload}


def test_{slug}_does_not_fire():
    impl = resolve(os.environ.get("SPECREPLAY_IMPL", {impl_name!r}), allow_import=True)
    trace = run_workload(Workload.from_dict(WORKLOAD), impl, engine=ENGINE)
    hits = [f for f in check_trace(trace) if f.code == CODE]
    assert not hits, f"{{CODE}} at step {{hits[0].step}}, request {{hits[0].request_id!r}}: {{hits[0].message}}"
'''


def _findings(trace: Trace):
    from specreplay.replay.check.checker import check_trace

    return check_trace(trace)
