"""One entry point for every engine: run a workload through an implementation, get its trace.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. `run_workload` asks the engine's entry (engines/registry.py), once,
whether the implementation runs there (it applies to the workload, `Implementation.why_not`, and has
the forms the engine runs: nothing runs in its place), picks the driver (the loop for the engines
that drive a scheduler and a reference runner; a live vLLM drives itself and the input driver feeds
it), ends the run as a crash when the implementation raises (engines/crash.py), keeps the journal,
and builds the trace with one header, which names the scheduler and runner classes that ran, and its
outcome (engines/outcome.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import platform
import time
from collections.abc import Callable, Iterator
from typing import Any

from specreplay.replay.engines.crash import crash_outcome
from specreplay.replay.engines.loop import EngineLoop
from specreplay.replay.engines.outcome import run_outcome
from specreplay.replay.engines.registry import DEFAULT_RUNNER, LoopEngine, refuse_outcomes_on
from specreplay.replay.engines.registry import engine as engine_entry
from specreplay.replay.engines.run_request import ProgressFn, RunRequest
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.observers.recorder import FLUSH_EVERY
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import Workload
from specreplay.traces import schema
from specreplay.traces.errors import InputError
from specreplay.traces.header import Config, ImplHeader, Outcome, OutcomesNote, Volatile, WorkloadHeader
from specreplay.traces.journal import JournalWriter
from specreplay.traces.trace import Trace


def run_workload(
    workload: Workload,
    impl: Implementation,
    device: str = "cpu",
    progress: ProgressFn | None = None,
    engine: str = "reference",
    model: str | None = None,
    journal: str | os.PathLike[str] | None = None,
    flush_every: int = FLUSH_EVERY,
    oracle: Oracle | None = None,
    runner: str | None = None,
    drafter: str | None = None,
) -> Trace:
    """Run `workload` through `impl` and return the recorded trace. An exception the
    implementation raises while the engine runs ends the run as it ends vLLM's engine: outcome
    `crashed` at that step (engines/crash.py); one that a `module:attr` implementation raises
    while it is built (no step ran) becomes one InputError line naming it and its source line.

    `journal`: a path where settled rows are appended every `flush_every` steps and everything
    recorded on any exception (traces.journal); the caller deletes it once the trace is written.
    `oracle`: the outcomes the run produces (default: the workload's synthetic ones; a replay of
    a recording passes its recorded ones, which only its own engine family runs); a live engine
    makes its own.

    `engine`, `runner`: entries of engines/registry.py (a runner family: what a loop engine's
    reference runner models, default v1; the runner a live vLLM builds, default what vLLM picks).
    `drafter`: what a live vLLM drafts with (families/vllm/drafters.py; default ngram_gpu async, ngram sync).

    An implementation that does not apply to the workload (an AsyncScheduler variant on a
    synchronous workload, ...: `Implementation.why_not`) raises `NotApplicable`, before anything
    is built; one without the real forms the engine runs, one InputError line."""
    entry = engine_entry(engine)
    entry.refuse(impl, workload.config, f"workload {workload.name!r}")  # once per run, before anything is built
    entry.refuse_inputs(workload)
    entry.runner_for(runner)  # a family whose workers serve this engine's scheduler
    runner = entry.runner_on(runner, workload.config)  # ... and one its vLLM release has
    if oracle is not None and oracle.recorded:  # a recording's outcomes drive only its own engine line's engines
        refuse_outcomes_on(engine, oracle.line)
    request = RunRequest(workload, impl, device, progress, model, runner, drafter, oracle, journal, flush_every)
    trace = entry.run(request)  # the loop drives a LoopEngine; a SelfDrivenEngine runs itself
    return on_outcomes(trace, oracle) if oracle is not None and oracle.recorded else trace


def run_loop(entry: LoopEngine, request: RunRequest) -> Trace:
    """Drive `request` through specreplay's loop on `entry` (the reference or the real scheduler,
    a reference runner): one header, the journal, the crash outcome."""
    r = request
    if r.model is not None:
        raise InputError("--model is for --engine vllm (a live engine); the other engines run the reference model")
    if r.drafter is not None:
        raise InputError(
            f"--drafter is for --engine vllm (a live engine); --engine {entry.name} drafts with the oracle"
        )
    loop = _built(r.impl, EngineLoop, r.workload, r.impl, r.device, entry.name, r.oracle, r.runner or DEFAULT_RUNNER)
    ran = entry.describe(r.impl, loop.parts.observed, loop.parts.runner, r.workload.config)
    header = trace_header(r.workload, ran, r.device, loop.outcome)
    writer = JournalWriter(r.journal, header) if r.journal is not None else None
    with fewer_full_collections():
        return _run(loop, header, r.progress, writer, r.flush_every)


def on_outcomes(trace: Trace, oracle: Oracle) -> Trace:
    """A run on a recording's outcomes, noted so that it replays as a recording too: the drafter
    they came from (the checker's X11 asks it), what they gave and what their rules filled, where
    the recording stopped (`info` shows it), and the recording's inputs."""
    note = OutcomesNote(
        source=oracle.context.source,
        drafter=oracle.drafter,
        drains_at_end=oracle.drains_at_end,
        recorded=oracle.summary(),
        filled=oracle.unobserved(trace.table),
    )
    inputs = trace.inputs if trace.inputs is not None else oracle.context.trace_inputs
    # A pseudonymised recording's replay holds the same permuted ids: it says so too.
    tokens = oracle.context.tokens or trace.impl.tokens
    impl = dataclasses.replace(trace.impl, drafter=oracle.drafter, outcomes=note, tokens=tokens)
    return dataclasses.replace(trace, impl=impl, inputs=inputs)


def _built(impl: Implementation, fn: Callable, *args):
    """Build the engine; an exception from a `module:attr` implementation's constructor becomes
    one InputError line naming it (no step ran: there is no run to report). A built-in's, or
    specreplay's own, propagates: a specreplay bug."""
    try:
        return fn(*args)
    except InputError:
        raise
    except Exception as exc:
        crash = crash_outcome(exc, impl, (), None) if impl.user_code else None
        if crash is None:
            raise
        raise InputError(f"implementation {impl.name} failed to start: {crash.message}") from None


#: Allocations between young-generation collections while an engine runs (CPython's default: 700).
GC_YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_full_collections() -> Iterator[None]:
    """Run with the collector's young threshold raised. A run keeps a recorder's worth of small
    objects alive and makes few cycles (the objects that die go by reference counting), so at
    CPython's default the collector walks the growing heap over and over: about a quarter of a
    256-request run (3.3 s -> 2.4 s measured, benchmarks/run.py's decode workload). Cycles are
    still collected, less often; the thresholds are restored after, exception or not."""
    before = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, before[1], before[2])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _run(
    loop: Any, header: Trace, progress: ProgressFn | None, writer: JournalWriter | None, flush_every: int
) -> Trace:
    rec = loop.parts.recorder
    if writer is not None:
        rec.journal = writer
        rec.flush_every = flush_every
    try:
        while loop.step():
            rec.maybe_flush(loop.step_no)
            if progress is not None and loop.step_no:
                progress(loop.step_no, loop.workload.max_steps)
    except BaseException as exc:
        # The implementation under test died (an assert in the scheduler, the worker unable to
        # run a step, any exception its code raised): the run's outcome, as vLLM's engine dies.
        crash = crash_outcome(exc, loop.impl, (loop.sched, loop.parts.observed), loop.runner)
        if crash is None:
            # Anything else (specreplay's bug, an observer's failure, bad input, Ctrl-C): what
            # was recorded goes to the journal before it propagates.
            rec.flush(everything=True)
            if writer is not None:
                writer.close()
            raise
        loop.outcome = run_outcome(loop.crash_step(), crash=crash)
    if loop.outcome.status == "completed":
        # Idle for good with requests it holds: requests lost by the scheduler.
        loop.outcome = run_outcome(loop.step_no, unfinished=loop.unfinished())
    rec.flush(everything=True)
    if writer is not None:
        writer.close()
    return dataclasses.replace(header, table=rec.table(), outcome=loop.outcome)


def trace_header(workload: Workload, impl_doc: ImplHeader, device: str, outcome: Outcome, config: Any = None) -> Trace:
    """A trace's metadata, no rows (the journal's header, and every engine's trace). `config`:
    the engine config that ran, where it differs from the workload's (a live engine on a CPU)."""
    return Trace(
        table=schema.empty_table(),
        workload=WorkloadHeader.from_dict(workload.to_dict()),
        config=Config.from_dict((config or workload.config).to_dict()),
        impl=impl_doc,
        outcome=outcome,
        seed=workload.seed,
        device=device,
        volatile=Volatile(
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            host=platform.node(),
            python=platform.python_version(),
        ),
    )
