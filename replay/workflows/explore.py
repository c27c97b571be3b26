"""Explore: search seeded workloads for findings, one generation at a time, guided by coverage.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
**workflows** -> views -> cli, automated. Each candidate is a small seeded workload
(workloads/generators.py, `explore_workload`) drawn across every engine setting the reference models
honour (k 0 to 8, lookahead slots, block sizes 4 to 64, max_model_len from exactly the longest
request to roomy, KV from one request's worth to plenty) and bent by a mix of perturbation profiles
(arrival bursts, budgets at the edge of 1 + k per request, long prompts that chunk, KV pressure that
preempts, aborts at awkward steps, acceptance patterns per request, idle gaps that leave empty
steps, sync scheduling, control events: pauses, cache resets, aborts, resubmissions, streaming
sessions; requests that decode up to max_model_len; and, in some draws of any profile, prompts
that share a prefix or continue a conversation). Only workloads the implementation applies to
are drawn (`Implementation.why_not`: an AsyncScheduler gets async ones). It runs through the
implementation under test and the checker; what matters comes back small (finding codes, the
situations the run reached, the settings it drew), never the trace. An engine that takes less than
vLLM's settings and events (SGLang's scheduler: arrivals and aborts) gets each draw as it takes it
(its registry entry's `shape`: families/sglang/shape.py), so none is spent on a refusal.

Coverage guidance: a profile whose candidates reach a situation no earlier candidate reached
(re-entry, preemption with output in flight, the drafter skipped near max_model_len, ...;
check/situations.py) is drawn more often in the next generation. The candidates of a generation
depend only on the explore seed, the implementation and the results of earlier generations, and
results are gathered in candidate order, so the findings are the same whether the candidates run
inline, in `--jobs N` processes or on a Ray cluster (backends.py).
`explore_to` runs the search and writes what `specreplay explore` leaves in its folder.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError

if TYPE_CHECKING:
    from specreplay.replay.impls.registry import Implementation
    from specreplay.replay.workflows.backends import Backend

PROFILES = (
    "burst",
    "budget-edge",
    "long-prompts",
    "kv-pressure",
    "aborts",
    "acceptance",
    "idle-gaps",
    "sync",
    "events",
    "model-len-edge",
)
GENERATION = 16  # candidates per generation
REDRAWS = 8  # draws of one candidate seed before it reports that the implementation applies to none
WhyNot = Callable[[EngineConfig], "str | None"]


@dataclass(frozen=True)
class Candidate:
    index: int  # position in the search: results are gathered in this order
    seed: int
    profiles: tuple[str, ...]
    vllm_version: str | None = None  # the release it runs as; None: the workload's default
    runner: str | None = None  # the runner family it runs on (engines/registry.py); None: v1

    def workload(self, impl: Implementation | None = None, engine: str | None = None) -> Workload:
        """Its workload; with `impl`, one that implementation applies to, as `engine` takes it
        (`candidate_workload`)."""
        why_not = impl.why_not if impl is not None else None
        workload = candidate_workload(self.seed, self.profiles, why_not, engine)
        return workload if self.vllm_version is None else workload.at_version(self.vllm_version)


@dataclass
class CaseResult:
    index: int
    seed: int
    profiles: tuple[str, ...]
    findings: dict[str, dict[str, Any]]  # code -> first finding (severity, step, request, message)
    features: frozenset[str]  # the situations its run reached (check/situations.py)
    steps: int
    requests: int = 0
    error: str = ""  # the workload could not run (bad input): reported, the search goes on
    settings: frozenset[str] = frozenset()  # the engine settings its workload drew


def candidate_workload(
    seed: int, profiles: tuple[str, ...], why_not: WhyNot | None = None, engine: str | None = None
) -> Workload:
    """The candidate's workload (generators.explore_workload) as `engine` takes it (its entry's
    `shape`; None: as drawn), one the implementation applies to: `why_not` is its
    `Implementation.why_not`. A draw it refuses runs in the other scheduling mode if that applies
    (a user's AsyncScheduler gets async workloads only, a sync Scheduler sync ones), else is drawn
    again (up to REDRAWS times); deterministic, so a seed still names one workload for one
    implementation on one engine."""
    from specreplay.replay.engines.registry import engine as engine_entry
    from specreplay.replay.workloads.generators import explore_workload

    shaped = engine_entry(engine).shaped if engine is not None else (lambda w: w)
    reason = ""
    for attempt in range(REDRAWS):
        workload = shaped(explore_workload(seed, profiles, attempt))
        if why_not is None:
            return workload
        other = replace(workload.config, async_scheduling=not workload.config.async_scheduling)
        for config in (workload.config, other):
            reason = why_not(config) or ""
            if not reason:
                return replace(workload, config=config)
    raise InputError(f"no workload drawn for seed {seed} applies to the implementation: {reason}")


# ---------------------------------------------------------------------- one candidate
def run_candidate(impl_name: str, engine: str, candidate: Candidate) -> CaseResult:
    """Run one candidate and keep what the search needs (module level: process pools and Ray
    workers import it)."""
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.check.situations import settings, situations
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    try:
        impl = resolve(impl_name, allow_import=True)
        workload = candidate.workload(impl, engine)
        trace = run_workload(workload, impl, engine=engine, runner=candidate.runner)
    except InputError as exc:
        return CaseResult(candidate.index, candidate.seed, candidate.profiles, {}, frozenset(), 0, 0, str(exc))
    findings: dict[str, dict[str, Any]] = {}
    for f in check_trace(trace):
        findings.setdefault(
            f.code, {"severity": f.severity, "step": f.step, "request_id": f.request_id, "message": f.message}
        )
    return CaseResult(
        candidate.index,
        candidate.seed,
        candidate.profiles,
        findings,
        situations(trace),
        trace.num_steps,
        len(trace.workload.requests),
        settings=settings(
            workload.config.to_dict(),
            max(workload.prompt_len_of(r.request_id) + r.max_tokens for r in workload.requests),
        ),
    )


def situations(trace) -> frozenset[str]:
    """The situations a run reached (check/situations.py): the coverage explore steers by."""
    from specreplay.replay.check.situations import situations as reached

    return reached(trace)


# ---------------------------------------------------------------------- the search
@dataclass
class Exploration:
    impl: str
    engine: str
    seed: int
    vllm_version: str | None = None
    runner: str | None = None
    results: list[CaseResult] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)  # situation -> candidates reaching it
    settings: dict[str, int] = field(default_factory=dict)  # engine setting -> candidates drawing it
    seconds: float = 0.0

    def by_code(self) -> dict[str, list[CaseResult]]:
        """Every finding code and the candidates that hit it, the smallest reproduction first
        (fewest requests, then steps, then the earliest found): the best start for shrink."""
        out: dict[str, list[CaseResult]] = {}
        for r in self.results:
            for code in r.findings:
                out.setdefault(code, []).append(r)
        return {code: sorted(hits, key=lambda r: (r.requests, r.steps, r.index)) for code, hits in sorted(out.items())}


def candidates_for(
    seed: int,
    generation: int,
    weights: dict[str, float],
    start: int,
    count: int,
    vllm_version: str | None = None,
    runner: str | None = None,
) -> list[Candidate]:
    rng = random.Random(f"explore:{seed}:{generation}")
    names = list(PROFILES)
    out = []
    for i in range(count):
        picked: list[str] = []
        pool = {n: w for n, w in weights.items() if w > 0}
        for _ in range(rng.choice((1, 1, 2, 2, 3))):
            total = sum(pool[n] for n in names if n in pool)
            x = rng.random() * total
            for n in names:
                if n not in pool:
                    continue
                x -= pool[n]
                if x <= 0:
                    picked.append(n)
                    del pool[n]
                    break
        seed_of_workload = rng.randrange(1 << 30)  # a valid workload seed
        out.append(Candidate(start + i, seed_of_workload, tuple(sorted(picked)), vllm_version, runner))
    return out


def explore(
    impl: str,
    engine: str = "reference",
    seed: int = 0,
    budget: int | None = 200,
    seconds: float | None = None,
    backend: Backend | None = None,
    progress: Callable[[int, Exploration], None] | None = None,
    vllm_version: str | None = None,
    runner: str | None = None,
) -> Exploration:
    """Run generations of candidates until `budget` candidates ran or `seconds` passed, on
    `backend` (default: inline; the caller closes it), as the vLLM release `vllm_version`, on
    runner family `runner` (default v1)."""
    from specreplay.replay.workflows.backends import InlineBackend

    backend = backend or InlineBackend()
    result = Exploration(impl, engine, seed, vllm_version, runner)
    weights = {p: 1.0 for p in PROFILES}
    if not _applies_to_sync(impl):
        weights["sync"] = 0.0  # an AsyncScheduler: its workloads are all async, the profile is moot
    started = time.monotonic()
    generation = 0
    while True:
        left = GENERATION if budget is None else min(GENERATION, budget - len(result.results))
        if left <= 0 or (seconds is not None and time.monotonic() - started >= seconds):
            break
        batch = candidates_for(seed, generation, weights, len(result.results), left, vllm_version, runner)
        for case in backend.run(impl, engine, batch):
            new = [s for s in case.features if s not in result.coverage]
            for s in case.features:
                result.coverage[s] = result.coverage.get(s, 0) + 1
            for s in case.settings:
                result.settings[s] = result.settings.get(s, 0) + 1
            for p in case.profiles:  # steer toward the profiles that find new situations
                weights[p] += 2.0 * len(new)
            result.results.append(case)
            if progress is not None:
                progress(len(result.results), result)
        generation += 1
    result.seconds = time.monotonic() - started
    return result


def _applies_to_sync(impl: str) -> bool:
    """Whether `impl` runs synchronous workloads (a user's AsyncScheduler does not). An unknown
    name: True, its candidates report the error."""
    from specreplay.replay.impls.registry import resolve

    try:
        implementation = resolve(impl, allow_import=True)
    except InputError:
        return True
    return implementation.why_not(EngineConfig(async_scheduling=False)) is None


# ---------------------------------------------------------------------- to a folder
DEFAULT_BUDGET = 200  # workloads, when neither a budget nor a time is given
SUMMARY = "explore.json"


@dataclass
class ExploreReport:
    """What `explore_to` wrote: the summary (as in explore.json) and where."""

    output_dir: Path
    summary: dict[str, Any]

    def fails(self, fail_on: str) -> bool:
        """A finding at or above `fail_on` (error, warning or never)."""
        severities = [f["severity"] for f in self.summary["findings"].values()]
        return fail_on != "never" and ("error" in severities or (fail_on == "warning" and bool(severities)))

    def most_hit(self) -> str | None:
        """The code most workloads hit, errors before warnings: the one to shrink first."""
        found = self.summary["findings"]
        return max(found, key=lambda c: (found[c]["severity"] == "error", found[c]["workloads"]), default=None)

    def implementation_error(self) -> str | None:
        """Why some workloads could not run through the implementation (bad input: a workload
        its config refuses, a constructor that raises), or None when every workload ran. An
        exception the implementation raises while stepping is no such error: that run is an
        engine crash, the finding E1-engine-crash."""
        s = self.summary
        if not s["implementation_errors"]:
            return None
        first = s["first_errors"][0]
        return (
            f"{s['implementation_errors']} of {s['workloads']} workloads failed to run through {s['impl']} "
            f"(first, seed {first['seed']}: {first['error']})"
        )


def explore_to(
    output_dir: Path,
    impl: str,
    *,
    engine: str = "reference",
    seed: int = 0,
    budget: int | None = None,
    seconds: float | None = None,
    jobs: int = 1,
    ray_address: str | None = None,
    progress: Callable[[int, Exploration], None] | None = None,
    vllm_version: str | None = None,
    runner: str | None = None,
) -> ExploreReport:
    """Search (`explore`; DEFAULT_BUDGET workloads unless `budget` or `seconds`), then write into
    `output_dir` one trace per distinct finding code, its smallest reproduction, and explore.json.
    Traces an earlier explore left there are removed first, so every trace is this run's."""
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workflows.backends import make_backend

    implementation = resolve(impl, allow_import=True)  # fail fast on an unknown name
    if output_dir.exists() and not output_dir.is_dir():
        raise InputError(f"{output_dir}: exists and is not a folder")
    backend = make_backend(jobs, ray_address)
    try:
        result = explore(
            impl,
            engine,
            seed,
            budget if budget or seconds else DEFAULT_BUDGET,
            seconds,
            backend=backend,
            progress=progress,
            vllm_version=vllm_version,
            runner=runner,
        )
    finally:
        backend.close()
    output_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_traces(output_dir)
    summary = _summary(result)
    summary["findings"] = _write_findings(output_dir, result, implementation)
    (output_dir / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return ExploreReport(output_dir, summary)


def _remove_stale_traces(output_dir: Path) -> None:
    """Traces an earlier explore left here would read as this run's."""
    from specreplay.replay.check.checker import all_codes

    for code, *_ in all_codes():
        (output_dir / f"{code}.parquet").unlink(missing_ok=True)


def _summary(result: Exploration) -> dict[str, Any]:
    errors = [r for r in result.results if r.error]
    return {
        "impl": result.impl,
        "engine": result.engine,
        **({"runner": result.runner} if result.runner else {}),
        "vllm_version": result.vllm_version,
        "seed": result.seed,
        "workloads": len(result.results),
        "seconds": round(result.seconds, 1),
        "coverage": dict(sorted(result.coverage.items())),
        "settings": dict(sorted(result.settings.items(), key=_setting_order)),
        "findings": {},
        "implementation_errors": len(errors),
        "first_errors": [{"seed": r.seed, "profiles": list(r.profiles), "error": r.error} for r in errors[:10]],
    }


def _setting_order(item: tuple[str, int]) -> tuple[str, int, int, str]:
    """Settings by name, numbers first and in numeric order (k=2 before k=10)."""
    name, _, value = item[0].partition("=")
    return (name, 0, int(value), "") if value.isdigit() else (name, 1, 0, value)


def _write_findings(output_dir: Path, result: Exploration, impl) -> dict[str, dict[str, Any]]:
    """Per finding code, the smallest workload that hit it, run again here and written as
    CODE.parquet (deterministic: the trace its worker saw), and what explore.json says of it."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.traces.io import write_trace

    findings = {}
    for code, hits in result.by_code().items():
        first = hits[0]
        finding = first.findings[code]
        workload = Candidate(first.index, first.seed, first.profiles).workload(impl, result.engine)
        trace = run_workload(workload, impl, engine=result.engine, runner=result.runner)
        path = output_dir / f"{code}.parquet"
        write_trace(trace, path)
        findings[code] = {
            "severity": finding["severity"],
            "workloads": len(hits),
            "seed": first.seed,
            "profiles": list(first.profiles),
            "step": finding["step"],
            "request_id": finding["request_id"],
            "message": finding["message"],
            "trace": path.name,
        }  # beside explore.json
    return findings
