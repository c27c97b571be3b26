"""The regression gate: replay each golden trace through an implementation, check it, compare it.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli, over a corpus. `run_gate` returns one `GateResult` per golden (pass,
fail, changed, error or n/a) and never prints; `GateResult.failed` says which fail the gate;
`cli/gate.py` renders the results (table, JSON, JUnit XML, GitHub annotations). `update_goldens`
rewrites goldens from the current implementation and says what changed.

What ran is what was asked: a golden whose workload the implementation does not apply to
(`Implementation.why_not`: an AsyncScheduler variant on a synchronous golden, ...) is `n/a`
with the reason, never rerun through something else; and every rerun's header must name the
scheduler, runner and executor the implementation asked for (`Implementation.expected`), else
the gate stops on `RanOtherThanAsked`, a specreplay bug (exit 3), not a verdict on the code.

A golden that is a recording (a live or attached vLLM's trace with its outcomes; `plan_replay`
decides, as for `replay`) is rerun on its recorded outcomes through the implementation under
test on the reference (or real) scheduler, and compared as any golden: the ground truth the
recording lacks is left out of the comparison (`TraceDiff.no_truth`). `update_goldens` refuses
to overwrite such a golden with a rerun: it is the only record of what the engine did. An SGLang
golden is a recording of SGLang's scheduler, rerun on its recorded outcomes on that scheduler
(its corpus: `corpus_dir("sglang-scheduler")`); `--oracle synthetic` re-records one.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from specreplay.replay.check.findings import Finding, fails
from specreplay.replay.workloads.config import EARLIEST_VERSION
from specreplay.traces import schema
from specreplay.traces.errors import InputError, one_line


def corpus_dir(engine: str | None = None) -> Path:
    """The starter corpus shipped with the package; with `engine`, the corpus of goldens made on
    that engine (corpus/ENGINE/) where one ships. SGLang's goldens sit apart
    (corpus/sglang-scheduler/): they rerun on SGLang's scheduler, which only its own environment
    has, so the main environment's default gate, which globs the top folder alone, never meets them."""
    root = Path(__file__).resolve().parent.parent / "corpus"
    own = root / engine if engine else None
    return own if own is not None and own.is_dir() else root


def collect(paths: list[Path]) -> list[Path]:
    """Trace files named directly, and the *.parquet files of named folders (sorted)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(p for p in path.glob("*.parquet") if p.is_file()))
        elif path.exists():
            found.append(path)
        else:
            raise InputError(f"{path}: no such trace file or folder")
    if not found:
        raise InputError("no traces to gate: " + ", ".join(str(p) for p in paths) + " hold no *.parquet files")
    return found


@dataclass
class GateResult:
    path: str
    result: str  # pass | fail | changed | error | n/a (the implementation does not apply: message says why)
    impl: str = ""
    golden_impl: str = ""
    findings: list[Finding] = field(default_factory=list)  # invariant findings of the new trace
    changes: list[Finding] = field(default_factory=list)  # first difference per field, golden vs new
    changed_fields: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # fingerprint mismatches and the like
    # Codes the new trace gave no ground truth to check (a live engine's: no oracle): a pass
    # says nothing about them.
    unchecked: list[str] = field(default_factory=list)
    message: str = ""  # one line: why, for fail / changed / error / n/a

    def __post_init__(self) -> None:
        # The message may quote a hostile golden (a column name with a newline); reports keep it
        # one line.
        self.message = one_line(self.message)

    def failed(self, allow_changed: bool = False) -> bool:
        """Whether this trace fails the gate: fail and error always, changed unless allowed; n/a
        never (nothing ran: the gate fails only when no golden at all applied)."""
        return self.result in ("fail", "error") or (self.result == "changed" and not allow_changed)

    @property
    def first(self) -> Finding | None:
        pool = self.findings or self.changes
        return next((f for f in pool if f.severity == "error"), pool[0] if pool else None)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["findings"] = [f.to_dict() for f in self.findings]
        doc["changes"] = [f.to_dict() for f in self.changes]
        return doc


@dataclass(frozen=True)
class GateOptions:
    impl: str | None = None  # None: each golden's own implementation (registry names only)
    executor: str | None = None
    fail_on: str = "error"
    device: str = "cpu"
    engine: str | None = None  # None: each golden's own (a recording's: its plan's, reference)
    # recorded | synthetic | None: each golden's default (`replaying.default_oracle`); --engine
    # vllm alone means synthetic (a live engine makes its own outcomes).
    oracle: str | None = None
    vllm_version: str | None = None  # None: each golden as the vLLM release it was recorded as
    runner: str | None = None  # a live rerun's runner family; None: a live golden's own (else vLLM's default)


class RanOtherThanAsked(RuntimeError):
    """A rerun's header names other classes than the implementation asked for: specreplay ran
    something in place of the code under test. A bug of specreplay's, never a verdict on that code."""


def check_ran_as_asked(path: str, impl, trace, config, engine: str, runner: str | None = None) -> None:
    """Hold the classes a rerun's header says ran to those `impl` asks for on `engine` (a live
    engine replaces its classes inside vLLM's own processes; its header does not name them)."""
    from specreplay.replay.engines.registry import engine as engine_entry

    asked = engine_entry(engine).expected(impl, config, runner)
    if asked is None:
        return
    ran = {key: getattr(trace.impl, key) for key in asked}  # the header's fields that describe names
    if ran != asked:
        wrong = "; ".join(f"{key}: asked {asked[key]}, ran {ran[key]}" for key in asked if ran[key] != asked[key])
        raise RanOtherThanAsked(f"{path}: {impl.name} on {engine} did not run what it asked for ({wrong})")


def fingerprint(trace) -> dict[str, Any]:
    """What made a trace: engine, implementation, config, specreplay version."""
    return {
        "engine": trace.impl.engine_or_reference(),
        "models": trace.impl.models if trace.impl.models is not None else "?",
        "impl": trace.impl_name,
        "executor": trace.impl.executor,
        "config": trace.config.to_dict(),
        "specreplay": trace.version,
    }


def golden_plan(golden, where: str, options: GateOptions):
    """How the gate reruns `golden` (a `TraceFile`): a `ReplayPlan` whose oracle is None for a
    golden rerun on its workload's seeded model, as ever (the golden's rows are not read), or the
    recorded outcomes of a recording (its rows are read once, to build them). As the vLLM
    release the golden was recorded as, unless `options.vllm_version` says another."""
    plan = _golden_plan(golden, where, options)
    if options.vllm_version is None:
        return plan
    return replace(plan, workload=plan.workload.at_version(options.vllm_version))


def _golden_plan(golden, where: str, options: GateOptions):
    from specreplay.replay.engines.registry import engine
    from specreplay.replay.workflows.replaying import (
        ReplayPlan,
        default_oracle,
        live_runner_of,
        may_be_recording,
        plan_replay,
        recorded_workload,
        runner_of,
        runner_on,
    )

    # A live engine makes its own outcomes: on one, a golden reruns its workload.
    oracle = options.oracle or ("synthetic" if options.engine and engine(options.engine).makes_own_outcomes else None)
    recording = None
    if oracle is None:
        if not may_be_recording(golden.impl):
            oracle = "synthetic"  # default_oracle's answer for these, without reading the rows
        else:
            recording = golden.read()
            oracle = default_oracle(recording)
    if oracle == "synthetic":
        workload = recorded_workload(golden, where)
        engine_name = options.engine or golden.impl.engine_or_reference()
        own = live_runner_of(golden) if may_be_recording(golden.impl) else runner_of(golden)
        return ReplayPlan(
            workload, engine_name, golden.impl.executor, None, options.runner or runner_on(own, engine_name)
        )
    return plan_replay(recording or golden.read(), where, engine=options.engine, oracle=oracle, runner=options.runner)


def replay_golden(golden, plan, options: GateOptions):
    """Run an opened golden (`TraceFile`: its rows stream when it is compared) through the
    implementation under test (default: the golden's own, by registry name only) as `plan`
    (`golden_plan`) says: its workload on its engine, or a recording's outcomes. Returns
    (impl, new trace)."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    # A recording reruns with the executor that ran it; any other golden with the implementation's
    # own unless told (the gate notes a mismatch).
    executor = options.executor or (plan.executor if plan.oracle is not None else None)
    impl = resolve(options.impl or golden.impl_name, allow_import=options.impl is not None, executor=executor)
    trace = run_workload(
        plan.workload, impl, device=options.device, engine=plan.engine, oracle=plan.oracle, runner=plan.runner
    )
    return impl, trace


def gate_one(path: str, options: GateOptions) -> GateResult:
    """Replay one golden through the implementation under test. Never raises for bad input."""
    from specreplay.replay.check.checker import check_trace, unchecked_codes
    from specreplay.replay.check.findings import EMPTY_NOTE
    from specreplay.replay.check.tracediff import diff_batches
    from specreplay.replay.impls.registry import NotApplicable
    from specreplay.traces.io import open_trace
    from specreplay.traces.trace import package_version

    try:
        golden = open_trace(path)
        if not golden.num_steps:  # nothing recorded: nothing to gate, never a pass
            return GateResult(path, "error", golden_impl=golden.impl_name, message=f"{path}: {EMPTY_NOTE}")
        plan = golden_plan(golden, path, options)
        impl, trace = replay_golden(golden, plan, options)
    except NotApplicable as exc:  # nothing ran: neither a pass nor a failure of the code
        return GateResult(path, "n/a", impl=exc.impl, golden_impl=golden.impl_name, message=exc.reason)
    except InputError as exc:
        return GateResult(path, "error", impl=options.impl or "", message=str(exc))
    check_ran_as_asked(path, impl, trace, plan.workload.config, plan.engine, plan.runner)
    result = GateResult(path, "pass", impl=impl.name, golden_impl=golden.impl_name)
    made_by = fingerprint(golden)
    if made_by["impl"] != impl.name:
        result.notes.append(f"golden made by {made_by['impl']}, gating {impl.name}")
    if plan.oracle is not None:  # a recording's outcomes drive the rerun (a live vLLM's: on the reference)
        result.notes.append(
            f"golden recorded on the {made_by['engine']} engine, rerun on its recorded outcomes on {plan.engine}"
        )
    elif made_by["engine"] != trace.impl.engine:
        result.notes.append(f"golden made on the {made_by['engine']} engine, gating on {trace.impl.engine}")
    if made_by["executor"] != trace.impl.executor:
        result.notes.append(f"golden made with the {made_by['executor']} executor, gating {trace.impl.executor}")
    recorded_config = golden.workload.config
    recorded_as = recorded_config.vllm_version if recorded_config is not None else None
    recorded_as = recorded_as or EARLIEST_VERSION
    if recorded_as != plan.workload.config.vllm_version:
        result.notes.append(f"golden recorded as vLLM {recorded_as}, rerun as {plan.workload.config.vllm_version}")
    if made_by["specreplay"] != package_version():
        result.notes.append(f"golden made by specreplay {made_by['specreplay']}, this is {package_version()}")
    result.findings = check_trace(trace)
    result.unchecked = unchecked_codes(trace)
    try:
        diff = diff_batches(golden, trace, golden.batches(), trace.table.to_batches())
    except InputError as exc:  # the golden's rows are damaged (its metadata was fine)
        return GateResult(path, "error", impl=impl.name, golden_impl=golden.impl_name, message=str(exc))
    result.changes = diff.findings
    result.changed_fields = dict(diff.fields)
    if diff.no_truth.get("A"):  # a recording has no ground truth to compare its rerun's with
        result.notes.append("not compared: " + ", ".join(diff.no_truth["A"]) + " (no ground truth in the golden)")
    if fails(result.findings, options.fail_on):
        result.result = "fail"
        first = result.first
        result.message = f"{first.code} at step {first.step}, request {first.request_id}: {first.message}"
    elif not diff.same:
        result.result = "changed"
        f = diff.first
        result.message = (
            f"behaviour differs from the golden from step {f.step}, request {f.request_id}, "
            f"{f.field}: {f.scheduler!r} in the golden, {f.worker!r} now"
        )
    return result


def run_gate(paths: list[Path], options: GateOptions, jobs: int = 1) -> list[GateResult]:
    """Gate every trace under `paths`; results in path order whatever `jobs` is."""
    from specreplay.replay.workflows.record import check_device

    check_device(options.device)
    files = [str(p) for p in collect(paths)]
    if jobs <= 1 or len(files) == 1:
        return [gate_one(f, options) for f in files]
    with ProcessPoolExecutor(max_workers=min(jobs, len(files), os.cpu_count() or 1)) as pool:
        return list(pool.map(gate_one, files, [options] * len(files)))


@dataclass
class UpdateResult:
    path: str
    status: str  # unchanged | updated | refused (a recording) | error | n/a (the implementation does not apply)
    changed_fields: dict[str, int] = field(default_factory=dict)
    first: Finding | None = None
    message: str = ""

    def __post_init__(self) -> None:
        self.message = one_line(self.message)


def update_goldens(paths: list[Path], options: GateOptions) -> list[UpdateResult]:
    """Re-record each golden from the implementation under test and write it in place. A golden
    the gate reruns on recorded outcomes is refused, unwritten: a rerun would put the reference's
    rows where the engine's own were, and nothing could bring those back. Re-recording it on its
    own engine is asked for with `oracle="synthetic"` (a live golden: a fresh live run). A golden
    the implementation does not apply to is left as it is (n/a)."""
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.impls.registry import NotApplicable
    from specreplay.replay.workflows.record import check_device
    from specreplay.traces.io import open_trace, write_trace

    check_device(options.device)
    out: list[UpdateResult] = []
    for path in collect(paths):
        try:
            opened = open_trace(path)
            plan = golden_plan(opened, str(path), options)
            if plan.oracle is not None:
                out.append(UpdateResult(str(path), "refused", message=_recording_refused(opened)))
                continue
            _, trace = replay_golden(opened, plan, options)
            golden = opened.read()
        except NotApplicable as exc:
            out.append(UpdateResult(str(path), "n/a", message=exc.reason))
            continue
        except InputError as exc:
            out.append(UpdateResult(str(path), "error", message=str(exc)))
            continue
        diff = diff_traces(golden, trace)
        same_meta = golden.content_equals(trace)
        if diff.same and same_meta:
            out.append(UpdateResult(str(path), "unchanged"))
            continue
        write_trace(trace, path)
        out.append(
            UpdateResult(
                str(path),
                "updated",
                dict(diff.fields),
                diff.first,
                _why_updated(golden, diff, trace),
            )
        )
    return out


def _recording_refused(golden) -> str:
    engine = golden.impl.engine_or_reference()
    return (
        f"a recording of the {engine} engine, gated on its recorded outcomes; --update would replace it by a "
        f"rerun. Keep it, or re-record it on {engine} with --update --oracle synthetic"
    )


def _why_updated(golden, diff, trace) -> str:
    """What changed when the rows agree: an older schema (upgraded: the columns it added that the
    rerun fills, now recorded; another runner's columns stay null) or only the metadata's stamps."""
    if not diff.same:
        return ""
    if golden.schema_version < schema.SCHEMA_VERSION:
        filled = [name for name in diff.left_out if trace.table.column(name).null_count < trace.table.num_rows]
        what = f"{', '.join(filled)} now recorded" if filled else "its new columns hold nothing for this run"
        return f"upgraded from schema v{golden.schema_version} to v{schema.SCHEMA_VERSION} ({what})"
    return "metadata only (implementation, version or config stamp)"
