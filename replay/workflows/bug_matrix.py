"""The bug matrix: every failure specreplay knows, on every modelled vLLM release and runner, and on SGLang.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli. `specreplay scenarios --matrix` prints it; docs/vllm-releases.md
carries it and a test holds the two equal. Each known bug (workloads/known_bugs.py) runs through `upstream` once
per release and runner family (v1: vLLM's V1 GPUModelRunner; v2: Model Runner V2, what GPU
deployments run), on that family's reference runner:

- on the installed vLLM's real scheduler (`--engine vllm-scheduler`, with the reference runner)
  when that release is the installed one: measured on the real code;
- otherwise on the reference models of that release, and the cell says so.

A cell that does not reproduce is `fixed` when an earlier release in the matrix has the bug on
that runner, and `absent` when none does (a failure new in a later release, or one the runner
never has). A cell is `does not apply` when the finding that shows the failure compares state the
runner family does not have (the V1 runner's persistent batch and deferred correction on Model
Runner V2) and the bug names no form of it for that family (`KnownBug.runner_codes`): nothing runs.
A bug the runner decides is measured on the reference runner of its family (the reference MRV2
replays the real one's recordings row for row: tests/replay/workflows/test_replay_mrv2*.py);
`measured_on` says which.

The SGLang column (`sglang 0.5.23`, where sglang is installed: its own environment) runs each
workload on SGLang 0.5.23's real scheduler with the reference SGLang worker. An SGLang failure
reproduces there, or is `fixed` when the implementation that puts back the code before SGLang's
fix (`KnownBug.pre_fix`) reproduces it and upstream does not, or is `absent`. A vLLM failure's
workload runs there too when SGLang takes it (`absent`: no finding of any kind on SGLang; a
control event SGLang does not take: `does not apply`); an SGLang failure does not apply to vLLM's
columns (its code is about SGLang's scheduler state).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from specreplay.replay.check.catalogue import BY_CODE
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.registry import RUNNERS, runner_family
from specreplay.replay.engines.registry import engine as engine_entry
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.setup import installed_vllm_version, load_vllm
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.config import MODELLED_VERSIONS
from specreplay.replay.workloads.known_bugs import KNOWN_BUGS, KnownBug
from specreplay.traces.errors import InputError
from specreplay.traces.families import EngineLine


@dataclass(frozen=True)
class Cell:
    bug: str
    version: str
    runner: str  # the runner family (engines/registry.py RUNNERS)
    reproduces: bool
    evidence: str  # the finding and, for a crash, the engine's message; or what did not happen
    measured_on: str
    # reproduces; fixed (an earlier release in the matrix has it on this runner); absent (none
    # earlier has it); does not apply (the runner has no such state: nothing ran)
    verdict: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def real_scheduler_for(version: str) -> bool:
    """Whether `version`'s real scheduler runs here: it is the installed vLLM and imports."""
    if installed_vllm_version() != version:
        return False
    try:
        load_vllm("the bug matrix")
    except InputError:
        return False
    return True


#: The vLLM runner families a matrix measures: those with a reference runner.
MATRIX_RUNNERS = tuple(name for name, family in RUNNERS.items() if family.reference and family.line is EngineLine.VLLM)
NOT_APPLICABLE = "does not apply"
#: The SGLang column: SGLang's runner family, at the release specreplay drives.
SGLANG = "sglang"


def sglang_here() -> bool:
    """Whether SGLang's column can be measured here: sglang 0.5.23 imports (its own environment)."""
    from specreplay.replay.families.sglang.setup import require_sglang

    try:
        require_sglang()
    except InputError:
        return False
    return True


def measure(bug: KnownBug, version: str, real: bool, runner: str = "v1") -> Cell:
    """Run `bug`'s workload as `version` on runner family `runner`, on its real scheduler when `real`."""
    code = bug.code_on(runner)
    family = runner_family(runner)
    if engine_entry(bug.engine).line is not EngineLine.VLLM:
        evidence = f"{code} is about the state of --engine {bug.engine}"
        return Cell(bug.key, version, runner, False, evidence, f"{family.summary}: nothing to run", NOT_APPLICABLE)
    if not family.in_release(version):
        evidence = f"vLLM {version} has no {family.summary}"
        return Cell(bug.key, version, runner, False, evidence, f"{family.summary}: nothing to run", NOT_APPLICABLE)
    if runner not in BY_CODE[code].runners:
        evidence = f"{code} compares state {family.summary} does not have"
        return Cell(bug.key, version, runner, False, evidence, f"{family.summary}: nothing to run", NOT_APPLICABLE)
    engine = "vllm-scheduler" if real else "reference"
    workload = bug.build().at_version(version)
    trace = run_workload(workload, resolve("upstream", allow_import=False), engine=engine, runner=runner)
    message = trace.outcome.message or ""
    hits = [f for f in check_trace(trace) if f.code == code and (bug.step is None or f.step == bug.step)]
    reproduces = bool(hits) and (not bug.asserts or any(a in message for a in bug.asserts))
    if reproduces:
        evidence = f"{code} at step {hits[0].step}" + (f": {message}" if bug.asserts else "")
    else:
        evidence = f"no {code}" + (f" at step {bug.step}" if bug.step is not None else "")
        evidence += f"; outcome {trace.outcome.status}"
    models = f"reference {runner} runner"
    if real:
        measured_on = f"vllm {version} scheduler + {models}"
    else:
        measured_on = f"reference models of vllm {version}, {models}"
    return Cell(bug.key, version, runner, reproduces, evidence, measured_on)


def measure_on_sglang(bug: KnownBug) -> Cell:
    """Run `bug`'s workload on SGLang 0.5.23's real scheduler (module docstring: the verdicts)."""
    from specreplay.replay.families.sglang.setup import installed_sglang_version

    version = installed_sglang_version()
    measured_on = f"sglang {version} scheduler + reference SGLang worker"
    try:
        trace = run_workload(bug.build(), resolve("upstream", allow_import=False), engine="sglang-scheduler")
    except InputError as exc:  # a control event, a config SGLang does not take
        return Cell(bug.key, version, SGLANG, False, str(exc), f"{measured_on}: nothing ran", NOT_APPLICABLE)
    found = check_trace(trace)
    if engine_entry(bug.engine).line is EngineLine.VLLM:  # a vLLM failure's workload, run on SGLang too
        if not found:
            return Cell(bug.key, version, SGLANG, False, "no finding", measured_on, "absent")
        first = found[0]
        evidence = f"{first.code} at step {first.step} (not this failure's {bug.code})"
        return Cell(bug.key, version, SGLANG, False, evidence, measured_on, "absent")
    if _shows(bug, found, trace):
        return Cell(bug.key, version, SGLANG, True, _evidence(bug, found), measured_on, "reproduces")
    evidence = f"no {bug.code}; outcome {trace.outcome.status}"
    if bug.pre_fix is not None:
        before = run_workload(bug.build(), resolve(bug.pre_fix, allow_import=False), engine="sglang-scheduler")
        pre_found = check_trace(before)
        if _shows(bug, pre_found, before):
            evidence += f"; before the fix ({bug.pre_fix}): {_evidence(bug, pre_found)}"
            return Cell(bug.key, version, SGLANG, False, evidence, measured_on, "fixed")
    return Cell(bug.key, version, SGLANG, False, evidence, measured_on, "absent")


def _shows(bug: KnownBug, found: list, trace) -> bool:
    hits = [f for f in found if f.code == bug.code and (bug.step is None or f.step == bug.step)]
    return bool(hits) and (not bug.asserts or any(a in (trace.outcome.message or "") for a in bug.asserts))


def _evidence(bug: KnownBug, found: list) -> str:
    hit = next(f for f in found if f.code == bug.code)
    return f"{bug.code} at step {hit.step}, request {hit.request_id}"


def bug_matrix(
    versions: tuple[str, ...] = MODELLED_VERSIONS,
    use_real: bool = True,
    runners: tuple[str, ...] = MATRIX_RUNNERS,
    sglang: bool | None = None,
) -> list[Cell]:
    """One cell per known bug, runner family and release that has it, in KNOWN_BUGS order, runners
    in registry order, releases oldest first, then SGLang's cell. `use_real`: measure a release on
    its real scheduler when it is the installed one. `sglang`: measure SGLang's column (None:
    where sglang is installed)."""
    unknown = [v for v in versions if v not in MODELLED_VERSIONS]
    if unknown:
        raise InputError(f"vLLM {unknown[0]} is not modelled; modelled: {', '.join(MODELLED_VERSIONS)}")
    for runner in runners:
        runner_family(runner).reference_class()  # a family with no reference model: one line
    if sglang is None:
        sglang = sglang_here()
    real = {v: use_real and real_scheduler_for(v) for v in sorted(versions, key=MODELLED_VERSIONS.index)}
    cells = []
    for bug in KNOWN_BUGS:
        for runner in runners:
            seen_before = False
            for version, on_real in real.items():
                if not runner_family(runner).in_release(version):  # no column: 0.34.0 has no Model Runner V1
                    continue
                cell = measure(bug, version, on_real, runner)
                if cell.verdict != NOT_APPLICABLE:
                    verdict = "reproduces" if cell.reproduces else "fixed" if seen_before else "absent"
                    cell = replace(cell, verdict=verdict)
                cells.append(cell)
                seen_before |= cell.reproduces
        if sglang:
            cells.append(measure_on_sglang(bug))
    return cells
