"""What a replay of a trace runs: its workload, engine config, executor, engine and oracle.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli. `plan_replay` reads a trace's metadata (and, for recorded outcomes,
its rows) and says how to run it again; `replay`, `shrink` and `gate` all replay through it, so a
recording means the same run to each.

The oracle: a trace recorded from a live or attached vLLM carries the only truth there is, its
outcomes (schema v3: the sampled tokens, the drafts verified), and a replay runs on them
(`families/vllm/outcomes.py`) through the reference or the real scheduler. A trace recorded on the
reference or the real scheduler came from its workload's seeded model, which its workload
regenerates whole: it replays on that (`synthetic`), unless told `recorded`.

An SGLang trace (`--engine sglang-scheduler`) replays on its recorded outcomes by default, on
SGLang's scheduler (`families/sglang/outcomes.py`): its worker view holds every token and draft
at known positions, so the replay is step-exact whatever the workload's seeded model gives (another
specreplay release's, a recording of a real SGLang server once one can be attached). Outcomes drive
only the engines of their own family: a vLLM recording's worker columns are vLLM's runner's, an
SGLang recording's are SGLang's worker's, and neither can stand for the other, so a replay across
families is refused in one line; `--oracle synthetic` runs the recording's workload on the other
engine instead (the what-if that means something: the same arrivals, lengths and acceptance).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specreplay.replay.engines.registry import (
    DEFAULT_ENGINE,
    RUNNERS,
    RunnerFamily,
    engine_of,
    outcome_engines,
    refuse_outcomes_on,
    replay_engines,
)
from specreplay.replay.engines.registry import engine as engine_entry
from specreplay.replay.workloads.oracle import ReplayContext
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError
from specreplay.traces.families import EngineLine, family_name, line_families
from specreplay.traces.header import ImplHeader
from specreplay.traces.trace import Trace

if TYPE_CHECKING:
    from specreplay.traces.io import TraceFile

ORACLES = ("recorded", "synthetic")
#: Engines a vLLM recording's outcomes can drive (a live engine makes its own): engines/registry.py.
REPLAY_ENGINES = replay_engines()


@dataclass
class ReplayPlan:
    workload: Workload
    engine: str
    executor: str | None  # the trace's own (how the SchedulerOutput reached the worker)
    oracle: Any  # a RecordedOracle, or None: the workload's synthetic one
    runner: str | None = None  # the runner family the rerun builds or drives: the trace's own (None: the default)


def runner_of(trace: Any) -> str | None:
    """The runner family `trace` ran (traces/families.py: V1's for one from before runners were
    named); None for a runner specreplay did not observe (the rerun takes the default)."""
    family = family_name(trace.impl)
    return family if family in RUNNERS else None


def line_of(impl: ImplHeader) -> EngineLine:
    """The engine line of a trace's engine: vLLM's (the reference, the real scheduler, a live or
    attached vLLM) or SGLang's. An engine this specreplay does not know counts as vLLM's, as ever."""
    entry = engine_of(impl)
    return entry.line if entry is not None else EngineLine.VLLM


def outcomes_family(trace: Any) -> RunnerFamily:
    """The runner family whose recorded oracle reads the trace's outcomes: its own, or for a
    runner specreplay did not observe, its engine line's first."""
    return RUNNERS.get(family_name(trace.impl)) or RUNNERS[line_families(line_of(trace.impl))[0]]


def runner_on(runner: str | None, engine: str) -> str | None:
    """`runner` (a trace's own family) when its workers serve `engine`'s scheduler, else None
    (the engine's default: a vLLM trace's workload run on SGLang takes SGLang's worker)."""
    if runner is None or runner not in RUNNERS:
        return runner
    return runner if RUNNERS[runner].line is engine_entry(engine).line else None


def live_runner_of(trace: Any) -> str | None:
    """The runner family a live rerun of `trace` builds: the one that ran, for a live or attached
    vLLM's trace (V1's for one from before runners were named); None (the default) for the others."""
    if not may_be_recording(trace.impl):
        return None
    return family_name(trace.impl)


def default_oracle(trace: Trace) -> str:
    """recorded for a trace of a live or attached vLLM with outcomes, for an SGLang trace with
    its worker's outcomes, and for a replay (or a shrink) of one, whose rows carry its outcomes
    (`impl.outcomes`); else synthetic."""
    return "recorded" if may_be_recording(trace.impl) and has_recorded_outcomes(trace) else "synthetic"


def has_recorded_outcomes(trace: Trace) -> bool:
    """Do the trace's rows carry outcomes its engine family's recorded oracle reads?"""
    return outcomes_family(trace).holds_outcomes(trace.table)


def may_be_recording(impl: ImplHeader) -> bool:
    """From the metadata alone (no rows read): a live or attached vLLM's trace, an SGLang trace
    (module docstring: why it replays on its outcomes), or a run on one's outcomes; only such a
    trace's default oracle can be its recorded outcomes."""
    return (impl.engine or DEFAULT_ENGINE) not in REPLAY_ENGINES or impl.outcomes is not None


def replayed(trace: Trace) -> bool:
    """Did this trace run on a recording's outcomes (a replay, a shrink)?"""
    return trace.impl.outcomes is not None


def trace_workload(trace: Trace, where: str) -> Workload:
    """The trace's workload on the engine config that ran it (a live engine on a CPU rounds the
    block size up: the config metadata holds what ran, the workload what was asked)."""
    from specreplay.replay.workloads.config import EngineConfig

    workload = recorded_workload(trace, where)
    config = trace.config.to_dict()
    if config:
        config = {**_legacy_config(trace), **config}
        workload = replace(workload, config=EngineConfig.from_dict(config, f"{where}: config metadata"))
    return workload


def recorded_workload(trace: Any, where: str) -> Workload:
    """The workload a trace (or an opened trace file) stores, as it ran: a trace written before
    prefix caching was modelled (schema < 8) ran without it, whatever the defaults say now."""
    doc = trace.workload.to_dict()
    doc["config"] = {**_legacy_config(trace), **doc.get("config", {})}
    return Workload.from_dict(doc, f"{where}: workload metadata")


def _legacy_config(trace: Any) -> dict[str, Any]:
    from specreplay.replay.workloads.config import BEFORE_PREFIX_CACHING
    from specreplay.traces.schema import PREFIX_CACHING_SCHEMA

    return dict(BEFORE_PREFIX_CACHING) if trace.schema_version < PREFIX_CACHING_SCHEMA else {}


def observed_workload(trace: Trace, workload: Workload) -> Workload:
    """A multiprocess live recording's workload with its inputs at the steps the engine core took
    them (its recorded inputs: over sockets they land when the core polls, not at the workload's
    step); the prompts, chunks and stops come from the same inputs (families/vllm/recorded_inputs.py).
    Any other trace ran its inputs at its workload's steps."""
    from specreplay.replay.workflows.merge import workload_of

    entry = engine_of(trace.impl)
    if trace.inputs is None or entry is None or entry.inputs_at_workload_steps(trace.impl.executor):
        return workload
    rows = trace.table.select(["step", "request_id", "sched_event"]).to_pylist()
    observed = workload_of(trace.inputs.to_dict(), workload.config, workload.name, workload.max_steps, rows)
    return replace(observed, name=workload.name, seed=workload.seed, acceptance=workload.acceptance)


def plan_replay(
    trace: Trace | TraceFile,
    where: str,
    engine: str | None = None,
    oracle: str | None = None,
    workload: Workload | None = None,
    runner: str | None = None,
) -> ReplayPlan:
    """How to run `trace` again (a `Trace`; a `TraceFile` will do where the plan is synthetic and
    the trace no recording: `may_be_recording`). `workload`: a part of the trace's (shrink),
    default the whole; the recorded outcomes of what remains drive it. `runner`: the runner
    family to rerun it on (default: its own; the other one is the cross-runner what-if)."""
    if not isinstance(trace, Trace):  # a TraceFile: its header, a Trace without rows
        trace = trace.header
    mode = oracle or default_oracle(trace)
    if mode not in ORACLES:
        raise InputError(f"--oracle {mode}: unknown; known: {', '.join(ORACLES)}")
    if workload is None:
        workload = trace_workload(trace, where)
        if not replayed(trace):  # a replay's workload is already the one that ran
            workload = observed_workload(trace, workload)
    recorded_engine = trace.impl.engine or DEFAULT_ENGINE
    executor = trace.impl.executor
    if mode == "synthetic":
        own = live_runner_of(trace) if may_be_recording(trace.impl) else runner_of(trace)
        engine = engine or recorded_engine
        return ReplayPlan(workload, engine, executor, None, runner or runner_on(own, engine))
    line = line_of(trace.impl)
    engines = outcome_engines(line)
    engine = engine or (recorded_engine if recorded_engine in engines else engines[0])
    refuse_outcomes_on(engine, line)
    own = runner_of(trace)
    # Where the recording stopped: a live engine's left its last batches unapplied; a replay of it
    # stopped as the recording did (its note says so).
    ran_on = trace.impl.outcomes
    drains = ran_on.drains_at_end if ran_on is not None else None
    recorded_entry = engine_of(trace.impl)
    if drains is None:
        drains = recorded_entry is not None and recorded_entry.recordings_drain
    # A live engine core in the recording's process (in process, attached to a program's LLM)
    # was stepped an iteration at a time, as specreplay's live driver steps it: the replay steps
    # as that driver does (workloads/oracle.py `LIVE_DRIVEN`). A multiprocess core numbers its
    # steps by schedule() calls, and its recording names the steps it announced on.
    context = ReplayContext(
        source=where,
        drains_at_end=drains,
        like_live=not drains and executor != "multiproc",
        trace_inputs=trace.inputs,
        tokens=trace.impl.tokens,
    )
    outcomes = outcomes_family(trace).recorded_oracle(workload, trace, context)
    return ReplayPlan(workload, engine, executor, outcomes, runner or own)
