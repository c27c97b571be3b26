"""The bug matrix: every vLLM failure specreplay knows, on every modelled vLLM release.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli. `specreplay scenarios --matrix` prints it; docs/vllm-releases.md
carries it and a test holds the two equal. Each known bug (workloads/known_bugs.py) runs through `upstream` once
per release:

- on the installed vLLM's real scheduler (`--engine vllm-scheduler`, with the reference runner)
  when that release is the installed one: measured on the real code;
- otherwise on the reference models of that release, and the cell says so.

A cell that does not reproduce is `fixed` when an earlier release in the matrix has the bug,
and `absent` when none does (a failure new in a later release). A bug the runner decides (the
scheduler's part is the same either way) is measured on the reference runner, which models
vLLM's V1 GPUModelRunner; `measured_on` says which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.engines.vllm_setup import installed_vllm_version, load_vllm
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.config import MODELLED_VERSIONS
from specreplay.replay.workloads.known_bugs import KNOWN_BUGS, KnownBug
from specreplay.traces.errors import InputError


@dataclass(frozen=True)
class Cell:
    bug: str
    version: str
    reproduces: bool
    evidence: str  # the finding and, for a crash, the engine's message; or what did not happen
    measured_on: str
    # reproduces; fixed (an earlier release in the matrix has it); absent (none earlier has it)
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


def measure(bug: KnownBug, version: str, real: bool) -> Cell:
    """Run `bug`'s workload as `version`, on its real scheduler when `real`."""
    engine = "vllm-scheduler" if real else "reference"
    trace = run_workload(bug.build().at_version(version), resolve("upstream", allow_import=False), engine=engine)
    message = trace.outcome.message or ""
    hits = [f for f in check_trace(trace) if f.code == bug.code and (bug.step is None or f.step == bug.step)]
    reproduces = bool(hits) and (not bug.asserts or any(a in message for a in bug.asserts))
    if reproduces:
        evidence = f"{bug.code} at step {hits[0].step}" + (f": {message}" if bug.asserts else "")
    else:
        evidence = f"no {bug.code}" + (f" at step {bug.step}" if bug.step is not None else "")
        evidence += f"; outcome {trace.outcome.status}"
    if real:
        measured_on = f"vllm {version} scheduler + reference runner"
    else:
        measured_on = f"reference models of vllm {version}"
    return Cell(bug.key, version, reproduces, evidence, measured_on)


def bug_matrix(versions: tuple[str, ...] = MODELLED_VERSIONS, use_real: bool = True) -> list[Cell]:
    """One cell per known bug and release, in KNOWN_BUGS order, releases oldest first.
    `use_real`: measure a release on its real scheduler when it is the installed one."""
    unknown = [v for v in versions if v not in MODELLED_VERSIONS]
    if unknown:
        raise InputError(f"vLLM {unknown[0]} is not modelled; modelled: {', '.join(MODELLED_VERSIONS)}")
    real = {v: use_real and real_scheduler_for(v) for v in sorted(versions, key=MODELLED_VERSIONS.index)}
    cells = []
    for bug in KNOWN_BUGS:
        seen_before = False
        for version, on_real in real.items():
            cell = measure(bug, version, on_real)
            verdict = "reproduces" if cell.reproduces else "fixed" if seen_before else "absent"
            cells.append(replace(cell, verdict=verdict))
            seen_before |= cell.reproduces
    return cells
