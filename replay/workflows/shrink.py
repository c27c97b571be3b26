"""Shrink: cut a failing workload down to a minimal reproduction that still fires the same code.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli, then back to record: the workload in a failing trace's metadata is
reduced step by step (drop a request, halve or decrement prompts and max_tokens, move arrivals
earlier, drop aborts, stops and per-request acceptance, shared prefixes and conversation turns
(a turn then stands alone), drop, move and shrink control events,
simplify the acceptance, lower the draft width, the budget and the batch size, relax KV pressure and
the long-prefill threshold), each candidate replayed through the same implementation and engine and
kept only if the finding code still fires. Greedy and deterministic: the same trace and code give
the same minimal workload. `emit_pytest` turns the result into a self-contained regression test;
`shrink_to` does all of it from a trace file to the files `specreplay shrink` writes.

A recording (a live or attached vLLM's trace, an SGLang trace: `replaying.plan_replay` says so)
shrinks on its recorded outcomes: each candidate runs on a recorded oracle built over the
candidate's requests from the original rows, on the plan's engine and executor (an SGLang trace's:
SGLang's scheduler), and prompts keep their length (the recorded tokens follow them). The minimal
trace then carries the outcomes it ran on, so it is a recording too and replays to itself; its
emitted test reruns it on the same engine.
"""

from __future__ import annotations

import dataclasses
import os
import pprint
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreplay.replay.workloads.workload import RequestSpec, Workload
from specreplay.traces.errors import InputError
from specreplay.traces.families import EngineLine
from specreplay.traces.header import Inputs
from specreplay.traces.trace import Trace


@dataclass
class Shrunk:
    workload: Workload
    trace: Trace
    code: str
    runs: int = 0  # replays tried
    reductions: list[str] = field(default_factory=list)  # the reductions kept, in order (labels)
    oracle: Any = None  # the recorded outcomes the best run used (None: the workload's synthetic ones)


def size(workload: Workload, trace: Trace) -> tuple[int, ...]:
    """What smaller means: fewer requests, then fewer steps, then fewer tokens, then fewer
    optional complications (aborts, stop tokens, per-request or random acceptance, control events,
    streaming sessions, a threshold),
    then a smaller engine (draft width, batch size, budget)."""
    tokens = sum(workload.prompt_len_of(r.request_id) + r.max_tokens for r in workload.requests)
    extras = sum(
        (r.abort_step is not None)
        + (r.stop_at is not None)
        + (r.acceptance is not None)
        + r.streaming
        + (r.prefix is not None)
        + (r.follows is not None)
        for r in workload.requests
    ) + len(workload.events)
    extras += (workload.acceptance not in ("all", "none")) + bool(workload.config.long_prefill_token_threshold)
    cfg = workload.config
    return (
        len(workload.requests),
        trace.num_steps,
        tokens,
        extras,
        cfg.num_spec_tokens,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
    )


def shrink(
    workload: Workload,
    impl,
    code: str,
    engine: str = "reference",
    max_runs: int = 3000,
    progress: Callable[[Shrunk], None] | None = None,
    outcomes: Callable[[Workload], Any] | None = None,
    runner: str | None = None,
) -> Shrunk:
    """The smallest workload (greedy) whose run through `impl` still fires `code`. `outcomes`:
    the oracle a candidate runs on, given the candidate (a recording's outcomes over its
    requests); None: each candidate's own synthetic model. `runner`: the runner family every
    candidate runs on (engines/registry.py; default v1)."""
    from specreplay.replay.engines.run import run_workload

    def fires(w: Workload) -> tuple[Trace, Any] | None:
        from specreplay.replay.check.checker import check_trace

        try:
            w = Workload.from_dict(w.to_dict())  # a reduction must still be a valid workload
            oracle = outcomes(w) if outcomes is not None else None  # refuses rows the candidate contradicts
            trace = run_workload(w, impl, engine=engine, oracle=oracle, runner=runner)
        except InputError:
            return None
        if not any(f.code == code for f in check_trace(trace)):
            return None
        if code == "E1-engine-crash" and signature is not None and crash_signature(trace) != signature:
            return None  # the engine dies, but of something else (say, a duplicate request id)
        return trace, oracle

    signature = None
    first = fires(workload)
    signature = crash_signature(first[0]) if first is not None else None
    if first is None:
        on = " on its recorded outcomes" if outcomes is not None else ""
        raise InputError(
            f"{code} does not fire when this workload is replayed{on} through {impl.name}; "
            "nothing to shrink (pick a --code the trace's findings show)"
        )
    best = Shrunk(workload, first[0], code, runs=1, oracle=first[1])
    improved = True
    while improved and best.runs < max_runs:
        improved = False
        for label, candidate in candidate_reductions(best.workload, keep_prompts=outcomes is not None):
            if best.runs >= max_runs:
                break
            best.runs += 1
            ran = fires(candidate)
            if ran is not None and size(candidate, ran[0]) < size(best.workload, best.trace):
                best.workload, (best.trace, best.oracle) = candidate, ran
                best.reductions.append(label)
                improved = True
                if progress is not None:
                    progress(best)
                break  # start over from the biggest reductions
    return best


def crash_signature(trace: Trace) -> str | None:
    """What a crash says, less its numbers and names: shrinking an E1 keeps the same assert."""
    import re

    if not trace.outcome.crashed:
        return None
    message = re.sub(r"'[^']*'", "'…'", trace.outcome.message or "")
    return f"{trace.outcome.kind}: {re.sub(r'-?[0-9]+', 'N', message)}"


def candidate_reductions(w: Workload, keep_prompts: bool = False) -> Iterator[tuple[str, Workload]]:
    """Candidate reductions of `w` as (label, smaller workload), biggest first: fewer requests,
    simpler control events, smaller requests, a simpler acceptance and engine. `keep_prompts`:
    no prompt gets shorter (a recording's tokens are recorded at positions after its prompts)."""
    yield from _fewer_requests(w)
    yield from _simpler_events(w, keep_prompts)
    yield from _smaller_requests(w, keep_prompts)
    yield from _simpler_config(w)


def _with_requests(w: Workload, new: list[RequestSpec]) -> Workload:
    ids = {r.request_id for r in new}  # a dropped request's events go with it
    return dataclasses.replace(
        w, requests=tuple(new), events=tuple(e for e in w.events if e.request is None or e.request in ids)
    )


def _with_request(w: Workload, i: int, **changes) -> Workload:
    reqs = list(w.requests)
    return _with_requests(w, reqs[:i] + [dataclasses.replace(reqs[i], **changes)] + reqs[i + 1 :])


def _with_events(w: Workload, new: list) -> Workload:
    return dataclasses.replace(w, events=tuple(new))


def _with_event(w: Workload, i: int, **changes) -> Workload:
    events = list(w.events)
    return _with_events(w, events[:i] + [dataclasses.replace(events[i], **changes)] + events[i + 1 :])


def _with_config(w: Workload, **changes) -> Workload:
    return dataclasses.replace(w, config=dataclasses.replace(w.config, **changes))


def _fewer_requests(w: Workload) -> Iterator[tuple[str, Workload]]:
    """Drop half the requests, then each one; move every arrival earlier together."""
    reqs = list(w.requests)
    if len(reqs) > 1:
        half = len(reqs) // 2
        if half > 1:
            yield f"drop requests {reqs[half].request_id}..", _with_requests(w, reqs[:half])
            yield f"drop requests ..{reqs[half - 1].request_id}", _with_requests(w, reqs[half:])
        for i, r in enumerate(reqs):
            yield f"drop request {r.request_id}", _with_requests(w, reqs[:i] + reqs[i + 1 :])
    # A turn sent after the one before it finished has no arrival step of its own.
    first_arrival = min((r.arrival_step for r in reqs if r.after_finish is None), default=1)
    if first_arrival > 1:
        shift = first_arrival - 1  # aborts move with the arrivals they follow
        earlier = _with_requests(
            w,
            [
                dataclasses.replace(
                    r,
                    arrival_step=r.arrival_step - shift,
                    abort_step=None if r.abort_step is None else max(1, r.abort_step - shift),
                )
                for r in reqs
            ],
        )
        yield (
            "arrive earlier",
            dataclasses.replace(
                earlier, events=tuple(dataclasses.replace(e, step=max(1, e.step - shift)) for e in earlier.events)
            ),
        )


def _simpler_events(w: Workload, keep_prompts: bool = False) -> Iterator[tuple[str, Workload]]:
    """Drop each control event, move it earlier, shrink what a streaming append adds. With
    `keep_prompts` a streaming append stays whole: it is the next turn's prompt."""
    events = list(w.events)
    for i, e in enumerate(events):
        name = f"event {e.kind}@{e.step}" + (f" ({e.request})" if e.request else "")
        if not (keep_prompts and e.kind == "stream_append"):
            yield f"drop {name}", _with_events(w, events[:i] + events[i + 1 :])
        for step in sorted({1, e.step // 2, e.step - 1} - {0, e.step}):
            yield f"{name} at step {step}", _with_event(w, i, step=step)
        if e.kind == "stream_append":
            if e.tokens > 1 and not keep_prompts:
                yield f"{name} tokens {e.tokens // 2}", _with_event(w, i, tokens=e.tokens // 2)
            # A turn's outputs are part of the next turn's prompt: with `keep_prompts` only the last shrinks.
            later = any(x.kind == "stream_append" and x.request == e.request for x in events[i + 1 :])
            if (e.max_tokens or 2) > 1 and not (keep_prompts and later):
                yield f"{name} max_tokens 1", _with_event(w, i, max_tokens=1)


def _smaller_requests(w: Workload, keep_prompts: bool = False) -> Iterator[tuple[str, Workload]]:
    """Per request: shorter output and prompt, an earlier arrival, no abort, stop token,
    acceptance of its own or streaming. With `keep_prompts` no prompt changes: not its own, nor
    a streaming request's later turns (each holds the outputs before it)."""
    for i, r in enumerate(w.requests):
        rid = r.request_id
        turns_fixed = keep_prompts and r.streaming
        if r.max_tokens > 1 and not turns_fixed:
            yield (
                f"request {rid} max_tokens {r.max_tokens // 2}",
                _with_request(w, i, max_tokens=max(1, r.max_tokens // 2)),
            )
            yield f"request {rid} max_tokens {r.max_tokens - 1}", _with_request(w, i, max_tokens=r.max_tokens - 1)
        if r.prompt_len > 1 and not keep_prompts:
            for length in (max(1, r.prompt_len // 2), r.prompt_len - 1):
                own = {"prompt_len": length} if r.prompt is None else {"prompt": r.prompt[:length]}
                yield f"request {rid} prompt_len {length}", _with_request(w, i, **own)
        if r.prefix is not None and not keep_prompts:
            yield f"request {rid} no prefix", _with_request(w, i, prefix=None)
        if r.follows is not None and not keep_prompts:
            yield f"request {rid} stands alone", _with_request(w, i, follows=None, after_finish=None)
        if (r.after_finish or 1) > 1:
            yield f"request {rid} sent the step after {r.follows} finished", _with_request(w, i, after_finish=1)
        if r.arrival_step > 1 and r.after_finish is None:
            for arrival in sorted({1, r.arrival_step // 2, r.arrival_step - 1} - {r.arrival_step}):
                moved = None if r.abort_step is None else max(1, r.abort_step - (r.arrival_step - arrival))
                yield f"request {rid} arrives at {arrival}", _with_request(w, i, arrival_step=arrival, abort_step=moved)
        if r.abort_step is not None:
            yield f"request {rid} not aborted", _with_request(w, i, abort_step=None)
        if r.stop_at is not None:
            yield f"request {rid} no stop token", _with_request(w, i, stop_at=None)
        if r.acceptance is not None:
            yield f"request {rid} default acceptance", _with_request(w, i, acceptance=None)
        if r.streaming and not turns_fixed:
            plain = _with_request(w, i, streaming=False)
            yield (
                f"request {rid} not streaming",
                dataclasses.replace(
                    plain, events=tuple(e for e in plain.events if not (e.kind == "stream_append" and e.request == rid))
                ),
            )


def _simpler_config(w: Workload) -> Iterator[tuple[str, Workload]]:
    """All-or-nothing acceptance, then a narrower draft, no long-prefill threshold, a smaller
    batch and budget."""
    cfg = w.config
    for simpler in ("all", "none"):
        if w.acceptance != simpler:
            yield f"acceptance {simpler}", dataclasses.replace(w, acceptance=simpler)
    if cfg.num_spec_tokens > 1:
        yield f"num_spec_tokens {cfg.num_spec_tokens - 1}", _with_config(w, num_spec_tokens=cfg.num_spec_tokens - 1)
    if cfg.long_prefill_token_threshold:
        yield "no long-prefill threshold", _with_config(w, long_prefill_token_threshold=0)
    if cfg.max_num_seqs > 1:
        yield f"max_num_seqs {cfg.max_num_seqs - 1}", _with_config(w, max_num_seqs=cfg.max_num_seqs - 1)
    if cfg.max_num_batched_tokens > cfg.max_num_seqs:
        yield (
            f"budget {cfg.max_num_batched_tokens - 1}",
            _with_config(w, max_num_batched_tokens=cfg.max_num_batched_tokens - 1),
        )


def emit_pytest(
    shrunk: Shrunk, source: str, impl_name: str, engine: str, trace_path: str | None = None, runner: str | None = None
) -> str:
    """A self-contained pytest module: the minimal workload inline, run through the implementation
    under test (SPECREPLAY_IMPL, default `impl_name`), failing while `code` fires. A shrunk
    recording's outcomes are rows, not a seed: its test replays the minimal trace at `trace_path`
    (relative to the test file) on them instead."""
    first = next(f for f in _findings(shrunk.trace) if f.code == shrunk.code)
    slug = "".join(ch if ch.isalnum() else "_" for ch in shrunk.code.lower())
    n, steps = size(shrunk.workload, shrunk.trace)[:2]
    recorded = shrunk.oracle is not None and trace_path is not None
    doc = f"""Regression test written by `specreplay shrink` from {source}.

{shrunk.code} fired on {impl_name} at step {first.step}, request {first.request_id!r}:
{first.message}

The workload is the shrunk reproduction ({n} requests, {steps} steps). The test replays it through
the implementation under test on --engine {engine} and fails while {shrunk.code} fires. Choose the
implementation with SPECREPLAY_IMPL (a registry name or module:attr; default {impl_name!r}).{_environment(engine)}"""
    check = """    hits = [f for f in check_trace(trace) if f.code == CODE]
    assert not hits, f"{CODE} at step {hits[0].step}, request {hits[0].request_id!r}: {hits[0].message}"
"""
    if recorded:
        doc += f"\n\nIt runs on the recorded outcomes the minimal trace {trace_path} holds: keep it beside this file."
        return f'''"""{doc}
"""

import os
from pathlib import Path

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workflows.replaying import plan_replay
from specreplay.traces.io import read_trace

CODE = {shrunk.code!r}
ENGINE = {engine!r}
TRACE = Path(__file__).parent / {trace_path!r}


def test_{slug}_does_not_fire():
    plan = plan_replay(read_trace(TRACE), str(TRACE), engine=ENGINE, oracle="recorded")
    impl = resolve(os.environ.get("SPECREPLAY_IMPL", {impl_name!r}), allow_import=True, executor=plan.executor)
    trace = run_workload(plan.workload, impl, engine=plan.engine, oracle=plan.oracle, runner=plan.runner)
{check}'''
    workload = pprint.pformat(shrunk.workload.to_dict(), width=100, sort_dicts=True)  # Python literals
    return f'''"""{doc}
"""

import os

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.workload import Workload

CODE = {shrunk.code!r}
ENGINE = {engine!r}
RUNNER = {runner!r}
WORKLOAD = {workload}


def test_{slug}_does_not_fire():
    impl = resolve(os.environ.get("SPECREPLAY_IMPL", {impl_name!r}), allow_import=True)
    trace = run_workload(Workload.from_dict(WORKLOAD), impl, engine=ENGINE, runner=RUNNER)
{check}'''


def _environment(engine: str) -> str:
    """What an emitted test needs beyond specreplay: SGLang's scheduler runs in its own environment."""
    from specreplay.replay.engines.registry import engine as engine_entry

    if engine_entry(engine).line is EngineLine.VLLM:
        return ""
    return "\nRun it where SGLang is installed (scripts/sglang.sh install: docs/sglang.md)."


def _findings(trace: Trace):
    from specreplay.replay.check.checker import check_trace

    return check_trace(trace)


# ---------------------------------------------------------------------- from a file to files
@dataclass
class ShrinkReport:
    """What `shrink_to` did: sizes are `size()` tuples (requests, steps, tokens, ...)."""

    source: Path
    output: Path
    impl: str  # the implementation's name
    shrunk: Shrunk
    before: tuple[int, ...]
    after: tuple[int, ...]
    pytest_file: Path | None = None
    oracle: str = "synthetic"  # recorded: every candidate ran on the recording's outcomes
    engine: str = "reference"  # the engine the candidates ran on


def shrink_to(
    source: Path,
    output: Path,
    *,
    code: str | None = None,
    impl: str | None = None,
    engine: str | None = None,
    oracle: str | None = None,
    max_runs: int = 3000,
    pytest_file: Path | None = None,
    vllm_version: str | None = None,
    runner: str | None = None,
) -> ShrinkReport:
    """Shrink the workload of the trace at `source` while `code` (default: its first error, else
    its first finding) still fires through `impl` (default: the trace's own, by registry name
    only) on `engine` (default: the trace's own); write the minimal trace to `output` and, given
    `pytest_file`, a regression test there. `oracle` (default: `replaying.default_oracle`):
    recorded runs every candidate on the trace's recorded outcomes, on the engine and executor
    `plan_replay` picks; synthetic on each candidate's own seeded model. `vllm_version`: run as
    this vLLM release (default: the one the trace ran as). `runner`: the runner family the
    candidates run on (default: the trace's own)."""
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workflows.replaying import ORACLES, default_oracle, plan_replay, recorded_workload, runner_of
    from specreplay.traces.io import read_trace, write_trace

    trace = read_trace(source)
    mode = oracle or default_oracle(trace)
    if mode not in ORACLES:
        raise InputError(f"--oracle {mode}: unknown; known: {', '.join(ORACLES)}")
    outcomes = None
    if mode == "synthetic":  # the workload as written, on its seeded model: as before recordings
        workload = recorded_workload(trace, str(source))
        implementation = resolve(impl or trace.impl_name, allow_import=impl is not None)
        engine = engine or trace.impl.engine_or_reference()
        runner = runner or runner_of(trace)
    else:
        plan = plan_replay(trace, str(source), engine=engine, oracle="recorded", runner=runner)
        workload, engine, runner = plan.workload, plan.engine, plan.runner
        implementation = resolve(impl or trace.impl_name, allow_import=impl is not None, executor=plan.executor)

        def outcomes(candidate: Workload) -> Any:
            # The original rows, read for the candidate's requests: what remains keeps its outcomes.
            return plan_replay(
                trace, str(source), engine=engine, oracle="recorded", workload=candidate, runner=runner
            ).oracle

    code = _target_code(trace, source, code)
    if vllm_version is not None:
        workload = workload.at_version(vllm_version)
    result = shrink(workload, implementation, code, engine=engine, max_runs=max_runs, outcomes=outcomes, runner=runner)
    write_trace(result.trace if result.oracle is None else as_recording(result, trace), output)
    if pytest_file is not None:
        relative = os.path.relpath(output.resolve(), pytest_file.resolve().parent)
        pytest_file.write_text(emit_pytest(result, str(source), implementation.name, engine, relative, runner))
    return ShrinkReport(
        source,
        output,
        implementation.name,
        result,
        size(workload, trace),
        size(result.workload, result.trace),
        pytest_file,
        mode,
        engine,
    )


def as_recording(shrunk: Shrunk, recording: Trace) -> Trace:
    """The minimal trace of a recording, to replay as one: its outcomes note (which makes
    `default_oracle` pick them again, and says where the recording stopped) and drafter are
    there already; it keeps the recorded inputs of the requests it kept (an attached run's
    prompts, chunks and stops, which its workload only summarises)."""
    kept = {r.request_id for r in shrunk.workload.requests}
    inputs = _inputs_of(recording.inputs.to_dict() if recording.inputs is not None else {}, kept)
    return dataclasses.replace(shrunk.trace, inputs=Inputs.from_dict(inputs) if inputs else None)


def _inputs_of(inputs: dict[str, Any], kept: set[str]) -> dict[str, Any]:
    """A recording's `inputs` metadata less the requests dropped: their lives, aborts and chunks
    (engine events stay: they name no request)."""
    per_request = ("requests", "aborts", "chunks")
    return {
        key: [x for x in value if not isinstance(x, dict) or x.get("id") in kept]
        if key in per_request and isinstance(value, list)
        else value
        for key, value in (inputs or {}).items()
    }


def _target_code(trace: Trace, source: Path, code: str | None) -> str:
    """The code to keep firing: `code` when it is one, else the trace's first error, else its first finding."""
    from specreplay.replay.check.checker import all_codes

    if code is not None:
        if code not in {c[0] for c in all_codes()}:
            raise InputError(f"--code {code!r} is not a finding code; see `specreplay codes`")
        return code
    findings = _findings(trace)
    if not findings:
        raise InputError(f"{source}: no finding to shrink toward; this trace is clean")
    return next((f.code for f in findings if f.severity == "error"), findings[0].code)
