"""The regression gate: replay each golden trace through an implementation, check it, compare it.

Where it sits: traces -> replay -> **diff**, over a corpus. `run_gate` returns one `GateResult`
per golden (pass, fail, changed or error) and never prints; `GateResult.failed` says which fail
the gate; `cli/gate.py` renders the results (table, JSON, JUnit XML, GitHub annotations).
`update_goldens` rewrites goldens from the current implementation and says what changed.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specreplay.replay.check.findings import Finding, fails
from specreplay.traces import schema
from specreplay.traces.errors import InputError


def corpus_dir() -> Path:
    """The starter corpus shipped with the package."""
    return Path(__file__).resolve().parent.parent / "corpus"


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
    result: str  # pass | fail | changed | error
    impl: str = ""
    golden_impl: str = ""
    findings: list[Finding] = field(default_factory=list)  # invariant findings of the new trace
    changes: list[Finding] = field(default_factory=list)  # first difference per field, golden vs new
    changed_fields: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # fingerprint mismatches and the like
    # Codes the new trace gave no ground truth to check (a live engine's: no oracle): a pass
    # says nothing about them.
    unchecked: list[str] = field(default_factory=list)
    message: str = ""  # one line: why, for fail / changed / error

    def failed(self, allow_changed: bool = False) -> bool:
        """Whether this trace fails the gate: fail and error always, changed unless allowed."""
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
    engine: str | None = None  # None: each golden's own


def fingerprint(trace) -> dict[str, Any]:
    """What made a trace: engine, implementation, config, specreplay version."""
    return {
        "engine": trace.impl.get("engine", "reference"),
        "models": trace.impl.get("models", "?"),
        "impl": trace.impl_name,
        "executor": trace.impl.get("executor"),
        "config": trace.config,
        "specreplay": trace.version,
    }


def replay_golden(path: str | Path, options: GateOptions):
    """Read a golden and run its workload through the implementation under test (default: the
    golden's own, by registry name only) on its engine. Returns (golden, impl, new trace); the
    golden is opened, not loaded (`TraceFile`): its rows stream when it is compared."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.workload import Workload
    from specreplay.traces.io import open_trace

    golden = open_trace(path)
    workload = Workload.from_dict(golden.workload, f"{path}: workload metadata")
    impl = resolve(options.impl or golden.impl_name, allow_import=options.impl is not None, executor=options.executor)
    trace = run_workload(
        workload, impl, device=options.device, engine=options.engine or golden.impl.get("engine", "reference")
    )
    return golden, impl, trace


def gate_one(path: str, options: GateOptions) -> GateResult:
    """Replay one golden through the implementation under test. Never raises for bad input."""
    from specreplay.replay.check.checker import check_trace, unchecked_codes
    from specreplay.replay.check.tracediff import diff_batches
    from specreplay.traces.trace import package_version

    try:
        golden, impl, trace = replay_golden(path, options)
    except InputError as exc:
        return GateResult(path, "error", impl=options.impl or "", message=str(exc))
    result = GateResult(path, "pass", impl=impl.name, golden_impl=golden.impl_name)
    made_by = fingerprint(golden)
    if made_by["impl"] != impl.name:
        result.notes.append(f"golden made by {made_by['impl']}, gating {impl.name}")
    if made_by["engine"] != trace.impl.get("engine"):
        result.notes.append(f"golden made on the {made_by['engine']} engine, gating on {trace.impl.get('engine')}")
    if made_by["executor"] != trace.impl.get("executor"):
        result.notes.append(f"golden made with the {made_by['executor']} executor, gating {trace.impl.get('executor')}")
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
    from specreplay.replay.workflows.recording import check_device

    check_device(options.device)
    files = [str(p) for p in collect(paths)]
    if jobs <= 1 or len(files) == 1:
        return [gate_one(f, options) for f in files]
    with ProcessPoolExecutor(max_workers=min(jobs, len(files), os.cpu_count() or 1)) as pool:
        return list(pool.map(gate_one, files, [options] * len(files)))


@dataclass
class UpdateResult:
    path: str
    status: str  # unchanged | updated | error
    changed_fields: dict[str, int] = field(default_factory=dict)
    first: Finding | None = None
    message: str = ""


def update_goldens(paths: list[Path], options: GateOptions) -> list[UpdateResult]:
    """Re-record each golden from the implementation under test and write it in place."""
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.workflows.recording import check_device
    from specreplay.traces.io import write_trace

    check_device(options.device)
    out: list[UpdateResult] = []
    for path in collect(paths):
        try:
            golden, _, trace = replay_golden(path, options)
            golden = golden.read()
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
                _why_updated(golden, diff),
            )
        )
    return out


def _why_updated(golden, diff) -> str:
    """What changed when the rows agree: an older schema (upgraded, its new columns now filled)
    or only the metadata's stamps."""
    if not diff.same:
        return ""
    if golden.schema_version < schema.SCHEMA_VERSION:
        added = ", ".join(diff.left_out)
        return f"upgraded from schema v{golden.schema_version} to v{schema.SCHEMA_VERSION} ({added} now recorded)"
    return "metadata only (implementation, version or config stamp)"
