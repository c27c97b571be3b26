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
whether the candidates run inline, in `--jobs N` processes or on a Ray cluster.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.workload import RequestSpec, Workload

PROFILES = ("burst", "budget-edge", "long-prompts", "kv-pressure", "aborts", "acceptance", "idle-gaps", "sync",
            "events")
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
    error: str = ""  # the implementation raised (user code): reported, the search goes on


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
        requests.append(RequestSpec(str(i), arrival_step=arrival, prompt_len=prompt_len, max_tokens=max_tokens,
                                    abort_step=abort, stop_at=stop_at, acceptance=per_request))
        longest = max(longest, prompt_len + max_tokens + k)
    per_request_blocks = -(-longest // block_size)
    spare = rng.randint(0, 3) if "kv-pressure" in on else 4 * num_requests * per_request_blocks
    config = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=min(budget, max_num_seqs),
                          num_spec_tokens=k, async_scheduling="sync" not in on or rng.random() < 0.3,
                          block_size=block_size, num_blocks=1 + per_request_blocks + spare, max_model_len=256,
                          long_prefill_token_threshold=threshold)
    name = f"explore-{seed}-{'+'.join(profiles) or 'plain'}"
    acceptance = rng.choice(ACCEPTANCES)
    events: tuple = ()
    if "events" in on:
        from specreplay.replay.workloads.generators import draw_events

        requests, events = draw_events(random.Random(f"events:{seed}"), requests, config, last_step=15)
    return Workload(tuple(requests), config, name=name, seed=seed, acceptance=acceptance, max_steps=400,
                    events=events)


# ---------------------------------------------------------------------- one candidate
def run_candidate(impl_name: str, engine: str, candidate: Candidate) -> CaseResult:
    """Run one candidate and keep what the search needs (module level: process pools and Ray
    workers import it)."""
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.engines.loop import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.traces.errors import InputError

    try:
        impl = resolve(impl_name, allow_import=True)
        trace = run_workload(candidate.workload(), impl, engine=engine)
    except InputError as exc:
        return CaseResult(candidate.index, candidate.seed, candidate.profiles, {}, frozenset(), 0, 0, str(exc))
    findings: dict[str, dict[str, Any]] = {}
    for f in check_trace(trace):
        findings.setdefault(f.code, {"severity": f.severity, "step": f.step, "request_id": f.request_id,
                                     "message": f.message})
    return CaseResult(candidate.index, candidate.seed, candidate.profiles, findings, situations(trace),
                      trace.num_steps, len(trace.workload["requests"]))


def situations(trace) -> frozenset[str]:
    """The scheduler situations a run reached: the coverage explore steers by."""
    import pyarrow.compute as pc

    t = trace.table
    if t.num_rows == 0:
        return frozenset()

    def any_of(mask) -> bool:
        return bool(pc.any(pc.fill_null(mask, False)).as_py())

    kind, skip, finish, event, outcome = (pc.cast(t[c], "string") for c in (
        "sched_kind", "sched_skip", "apply_finish_reason", "sched_event", "apply_outcome"))
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
        "drafts-with-nothing-behind": pc.and_(pc.greater(t["sched_num_draft_slots"], 0),
                                              pc.equal(kind, "reentering")),
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


def explore(impl: str, engine: str = "reference", seed: int = 0, budget: int | None = 200,
            seconds: float | None = None, runner: "Runner | None" = None,
            progress: Callable[[int, Exploration], None] | None = None) -> Exploration:
    """Run generations of candidates until `budget` candidates ran or `seconds` passed."""
    runner = runner or InlineRunner()
    result = Exploration(impl, engine, seed)
    weights = {p: 1.0 for p in PROFILES}
    started = time.monotonic()
    generation = 0
    while True:
        left = GENERATION if budget is None else min(GENERATION, budget - len(result.results))
        if left <= 0 or (seconds is not None and time.monotonic() - started >= seconds):
            break
        batch = candidates_for(seed, generation, weights, len(result.results), left)
        for case in runner.run(impl, engine, batch):
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


# ---------------------------------------------------------------------- where candidates run
class InlineRunner:
    def run(self, impl: str, engine: str, batch: list[Candidate]) -> list[CaseResult]:
        return [run_candidate(impl, engine, c) for c in batch]

    def close(self) -> None:
        pass


class ProcessRunner:
    """`--jobs N`: a pool of local processes, kept across generations."""

    def __init__(self, jobs: int) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(max_workers=jobs)

    def run(self, impl: str, engine: str, batch: list[Candidate]) -> list[CaseResult]:
        return list(self.pool.map(run_candidate, [impl] * len(batch), [engine] * len(batch), batch))

    def close(self) -> None:
        self.pool.shutdown()


class RayRunner:
    """`--ray ADDRESS`: candidates as Ray tasks ('local' starts a one-machine cluster)."""

    def __init__(self, address: str) -> None:
        from specreplay.traces.errors import InputError

        try:
            import ray
        except ImportError:
            raise InputError("--ray needs Ray: pip install 'specreplay[ray]'") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        self.task = ray.remote(run_candidate)

    def run(self, impl: str, engine: str, batch: list[Candidate]) -> list[CaseResult]:
        return self.ray.get([self.task.remote(impl, engine, c) for c in batch])  # in submission order

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


Runner = InlineRunner | ProcessRunner | RayRunner


def make_runner(jobs: int = 1, ray_address: str | None = None) -> Runner:
    if ray_address:
        return RayRunner(ray_address)
    return ProcessRunner(jobs) if jobs > 1 else InlineRunner()
