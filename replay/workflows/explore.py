"""Explore: search seeded workloads for findings, one generation at a time, guided by coverage.

Where it sits: record -> traces -> replay -> **diff**, automated. Each candidate is a small
seeded workload drawn from a mix of perturbation profiles (arrival bursts, budgets at the edge of
1 + k per request, long prompts that chunk, KV pressure that preempts, aborts at awkward steps,
acceptance patterns per request, idle gaps that leave empty steps, sync scheduling, control
events: pauses, cache resets, aborts, resubmissions, streaming sessions). It runs
through the implementation under test and the checker; what matters comes back small (finding
codes and the scheduler situations the run reached), never the trace.

Coverage guidance: a profile whose candidates reach a situation no earlier candidate reached
(re-entry, preemption with output in flight, a finish in flight, ...) is drawn more often in the
next generation. The candidates of a generation depend only on the explore seed and the results
of earlier generations, and results are gathered in candidate order, so the findings are the same
whether the candidates run inline, in `--jobs N` processes or on a Ray cluster (backends.py).
`explore_to` runs the search and writes what `specreplay explore` leaves in its folder.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import RequestSpec, Workload
from specreplay.traces.errors import InputError

if TYPE_CHECKING:
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
)
GENERATION = 16  # candidates per generation
ACCEPTANCES = ("all", "none", "alternate", "random:0.3", "random:0.7")


@dataclass(frozen=True)
class Candidate:
    index: int  # position in the search: results are gathered in this order
    seed: int
    profiles: tuple[str, ...]

    def workload(self) -> Workload:
        return candidate_workload(self.seed, self.profiles)


@dataclass
class CaseResult:
    index: int
    seed: int
    profiles: tuple[str, ...]
    findings: dict[str, dict[str, Any]]  # code -> first finding (severity, step, request, message)
    features: frozenset[str]
    steps: int
    requests: int = 0
    error: str = ""  # the workload could not run (bad input): reported, the search goes on


def candidate_workload(seed: int, profiles: tuple[str, ...]) -> Workload:
    """A small workload (2-8 requests, short prompts and outputs) from a seed and a profile mix."""
    rng = random.Random(f"workload:{seed}")
    on = set(profiles)
    k = rng.choice((1, 2, 3, 3, 4))
    num_requests = rng.randint(2, 8)
    budget = rng.choice((8, 12, 16, 24, 32, 48))
    max_num_seqs = rng.choice((2, 4, 8))
    if "budget-edge" in on:
        # m decoding requests' worth of 1 + k tokens, give or take one, with more than m running:
        # the running loop stops before the last ones, which re-enter a step later.
        max_num_seqs = max(max_num_seqs, 3)
        m = rng.randint(1, max(1, min(num_requests, max_num_seqs) - 1))
        budget = max(2, m * (1 + k) + rng.choice((-1, 0, 0, 1)))
    threshold = rng.choice((0, 8, 16)) if "long-prompts" in on else 0
    block_size = rng.choice((4, 8, 16))
    requests, longest, arrival = [], 0, 1
    for i in range(num_requests):
        long = "long-prompts" in on and rng.random() < 0.5
        prompt_len = rng.randint(20, 80) if long else rng.randint(2, 12)
        max_tokens = rng.randint(1, 20)
        if "burst" in on or "budget-edge" in on:
            arrival = rng.choice((1, 1, 1, rng.randint(2, 12)))
        elif "idle-gaps" in on:
            arrival = arrival + (rng.randint(8, 30) if rng.random() < 0.4 else 0)
        else:
            arrival = rng.choice((1, rng.randint(1, 8)))
        abort = arrival + rng.randint(1, 8) if "aborts" in on and rng.random() < 0.4 else None
        per_request = rng.choice(ACCEPTANCES) if "acceptance" in on and rng.random() < 0.7 else None
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
        longest = max(longest, prompt_len + max_tokens + k)
    per_request_blocks = -(-longest // block_size)
    spare = rng.randint(0, 3) if "kv-pressure" in on else 4 * num_requests * per_request_blocks
    config = EngineConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=min(budget, max_num_seqs),
        num_spec_tokens=k,
        async_scheduling="sync" not in on or rng.random() < 0.3,
        block_size=block_size,
        num_blocks=1 + per_request_blocks + spare,
        max_model_len=256,
        long_prefill_token_threshold=threshold,
    )
    name = f"explore-{seed}-{'+'.join(profiles) or 'plain'}"
    acceptance = rng.choice(ACCEPTANCES)
    events: tuple = ()
    if "events" in on:
        from specreplay.replay.workloads.generators import draw_events

        requests, events = draw_events(random.Random(f"events:{seed}"), requests, config, last_step=15)
    return Workload(tuple(requests), config, name=name, seed=seed, acceptance=acceptance, max_steps=400, events=events)


# ---------------------------------------------------------------------- one candidate
def run_candidate(impl_name: str, engine: str, candidate: Candidate) -> CaseResult:
    """Run one candidate and keep what the search needs (module level: process pools and Ray
    workers import it)."""
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    try:
        impl = resolve(impl_name, allow_import=True)
        trace = run_workload(candidate.workload(), impl, engine=engine)
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
        len(trace.workload["requests"]),
    )


def situations(trace) -> frozenset[str]:
    """The scheduler situations a run reached: the coverage explore steers by."""
    import pyarrow.compute as pc

    t = trace.table
    if t.num_rows == 0:
        return frozenset()

    def any_of(mask) -> bool:
        return bool(pc.any(pc.fill_null(mask, False)).as_py())

    kind, skip, finish, event, outcome = (
        pc.cast(t[c], "string")
        for c in ("sched_kind", "sched_skip", "apply_finish_reason", "sched_event", "apply_outcome")
    )
    scheduled = pc.greater(t["sched_num_scheduled_tokens"], 0)
    checks = {
        "reentry": pc.equal(kind, "reentering"),
        "resume": pc.equal(kind, "resumed"),
        "preempt-in-flight": pc.and_(t["sched_preempted"], pc.greater(t["sched_num_output_placeholders"], 0)),
        "output-never-applied": pc.and_(scheduled, pc.or_kleene(pc.is_null(outcome), pc.equal(outcome, "ignored"))),
        "output-dropped": pc.equal(outcome, "dropped"),
        "stale-delivered": pc.equal(outcome, "stale_delivered"),
        "pause": pc.match_substring(pc.cast(t["step_event"], "string"), "pause"),
        "cache-reset": pc.equal(event, "reset_preempt"),
        "resubmission": pc.greater(t["sched_life"], 0),
        "streaming-turn": pc.equal(event, "stream_turn"),
        "chunked-prefill": t["sched_is_prefill_chunk"],
        "abort": pc.equal(finish, "aborted"),
        "stop": pc.equal(finish, "stop"),
        "empty-step": pc.equal(t["step_total_scheduled_tokens"], 0),
        "budget-skip": pc.equal(skip, "budget"),
        "max-tokens-skip": pc.equal(skip, "max_tokens"),
        "padded-admission": pc.and_(pc.equal(kind, "new"), pc.greater(t["sched_num_draft_slots"], 0)),
        "drafts-with-nothing-behind": pc.and_(pc.greater(t["sched_num_draft_slots"], 0), pc.equal(kind, "reentering")),
    }
    found = {name for name, mask in checks.items() if any_of(mask)}
    if trace.outcome.get("status") != "completed":
        found.add(f"outcome-{trace.outcome.get('status')}")
    elif trace.outcome.get("unfinished"):
        found.add("outcome-requests-lost")
    return frozenset(found)


# ---------------------------------------------------------------------- the search
@dataclass
class Exploration:
    impl: str
    engine: str
    seed: int
    results: list[CaseResult] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)  # situation -> candidates reaching it
    seconds: float = 0.0

    def by_code(self) -> dict[str, list[CaseResult]]:
        """Every finding code and the candidates that hit it, the smallest reproduction first
        (fewest requests, then steps, then the earliest found): the best start for shrink."""
        out: dict[str, list[CaseResult]] = {}
        for r in self.results:
            for code in r.findings:
                out.setdefault(code, []).append(r)
        return {code: sorted(hits, key=lambda r: (r.requests, r.steps, r.index)) for code, hits in sorted(out.items())}


def candidates_for(seed: int, generation: int, weights: dict[str, float], start: int, count: int) -> list[Candidate]:
    rng = random.Random(f"explore:{seed}:{generation}")
    names = list(PROFILES)
    out = []
    for i in range(count):
        picked: list[str] = []
        pool = dict(weights)
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
        out.append(Candidate(start + i, rng.randrange(1 << 30), tuple(sorted(picked))))  # a valid workload seed
    return out


def explore(
    impl: str,
    engine: str = "reference",
    seed: int = 0,
    budget: int | None = 200,
    seconds: float | None = None,
    backend: Backend | None = None,
    progress: Callable[[int, Exploration], None] | None = None,
) -> Exploration:
    """Run generations of candidates until `budget` candidates ran or `seconds` passed, on
    `backend` (default: inline; the caller closes it)."""
    from specreplay.replay.workflows.backends import InlineBackend

    backend = backend or InlineBackend()
    result = Exploration(impl, engine, seed)
    weights = {p: 1.0 for p in PROFILES}
    started = time.monotonic()
    generation = 0
    while True:
        left = GENERATION if budget is None else min(GENERATION, budget - len(result.results))
        if left <= 0 or (seconds is not None and time.monotonic() - started >= seconds):
            break
        batch = candidates_for(seed, generation, weights, len(result.results), left)
        for case in backend.run(impl, engine, batch):
            new = [s for s in case.features if s not in result.coverage]
            for s in case.features:
                result.coverage[s] = result.coverage.get(s, 0) + 1
            for p in case.profiles:  # steer toward the profiles that find new situations
                weights[p] += 2.0 * len(new)
            result.results.append(case)
            if progress is not None:
                progress(len(result.results), result)
        generation += 1
    result.seconds = time.monotonic() - started
    return result


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
        "seed": result.seed,
        "workloads": len(result.results),
        "seconds": round(result.seconds, 1),
        "coverage": dict(sorted(result.coverage.items())),
        "findings": {},
        "implementation_errors": len(errors),
        "first_errors": [{"seed": r.seed, "profiles": list(r.profiles), "error": r.error} for r in errors[:10]],
    }


def _write_findings(output_dir: Path, result: Exploration, impl) -> dict[str, dict[str, Any]]:
    """Per finding code, the smallest workload that hit it, run again here and written as
    CODE.parquet (deterministic: the trace its worker saw), and what explore.json says of it."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.traces.io import write_trace

    findings = {}
    for code, hits in result.by_code().items():
        first = hits[0]
        finding = first.findings[code]
        trace = run_workload(Candidate(first.index, first.seed, first.profiles).workload(), impl, engine=result.engine)
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
