"""replay/workflows/explore.py as a library: the seeded search returns structured results (one
per candidate, in candidate order, with its findings and the situations it reached), finds
pr30796's divergence within a tiny budget, and is deterministic; its parts (candidate workloads,
candidate draws, one candidate's run, the situations of a trace) hold their contracts.
(tests/cli/test_explore.py holds the command, --jobs and Ray.)"""

from __future__ import annotations

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls import resolve
from specreplay.replay.workflows.explore import (
    GENERATION,
    PROFILES,
    Candidate,
    candidate_workload,
    candidates_for,
    explore,
    run_candidate,
    situations,
)
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.replay.workloads.workload import Workload

X10 = "X10-scheduler-output-mutated"
BUDGET = 32  # two generations; about 2 s


def summary(exploration) -> list[tuple]:
    return [
        (r.index, r.seed, r.profiles, sorted(r.findings.items()), sorted(r.features), r.steps, r.requests, r.error)
        for r in exploration.results
    ]


@pytest.fixture(scope="module")
def pr30796():
    return explore("pr30796", budget=BUDGET, seed=0)


def test_a_tiny_budget_finds_the_pr30796_divergence(pr30796):
    assert (pr30796.impl, pr30796.engine, pr30796.seed) == ("pr30796", "reference", 0)
    hits = pr30796.by_code()
    assert X10 in hits and hits[X10][0].findings[X10]["severity"] == "error"
    first = hits[X10][0].findings[X10]
    assert set(first) == {"severity", "step", "request_id", "message"} and first["step"] >= 1
    # The smallest hit reproduces: its candidate workload, run again, fires the code.
    best = hits[X10][0]
    trace = run_workload(
        Candidate(best.index, best.seed, best.profiles).workload(), resolve("pr30796", allow_import=False)
    )
    assert X10 in {f.code for f in check_trace(trace)}
    assert (trace.num_steps, len(trace.workload.requests)) == (best.steps, best.requests)


def test_results_are_one_per_candidate_in_order_with_consistent_bookkeeping(pr30796):
    results = pr30796.results
    assert [r.index for r in results] == list(range(BUDGET))
    assert all(not r.error and r.steps > 0 and 2 <= r.requests <= 8 for r in results)
    assert all(r.profiles and set(r.profiles) <= set(PROFILES) for r in results)
    for situation, count in pr30796.coverage.items():
        assert count == sum(situation in r.features for r in results), situation
    assert set(pr30796.coverage) == set().union(*(r.features for r in results))
    for code, hits in pr30796.by_code().items():
        assert all(code in r.findings for r in hits)
        assert [(r.requests, r.steps, r.index) for r in hits] == sorted((r.requests, r.steps, r.index) for r in hits)
        assert len(hits) == sum(code in r.findings for r in results)
    assert pr30796.seconds > 0


def test_the_search_is_deterministic(pr30796):
    assert summary(explore("pr30796", budget=BUDGET, seed=0)) == summary(pr30796)
    other = explore("pr30796", budget=BUDGET, seed=1)
    assert [r.seed for r in other.results] != [r.seed for r in pr30796.results]


class RecordingBackend:
    """A backend that runs inline and remembers the batches it was given."""

    def __init__(self) -> None:
        self.batches: list[list[Candidate]] = []

    def run(self, impl, engine, batch):
        self.batches.append(list(batch))
        return [run_candidate(impl, engine, c) for c in batch]

    def close(self) -> None:
        pass


def test_generations_fill_the_budget_and_progress_counts_every_candidate():
    backend, progress = RecordingBackend(), []
    result = explore(
        "upstream",
        budget=GENERATION + 4,
        seed=3,
        backend=backend,
        progress=lambda done, exploration: progress.append((done, len(exploration.results))),
    )
    assert [len(b) for b in backend.batches] == [GENERATION, 4]
    assert [c.index for b in backend.batches for c in b] == list(range(GENERATION + 4))
    assert progress == [(i, i) for i in range(1, GENERATION + 5)]
    assert len(result.results) == GENERATION + 4
    assert explore("upstream", budget=None, seconds=0).results == []  # no time: nothing runs


def test_upstream_errors_come_only_from_control_events():
    """vLLM 0.32.0's own failures need control events (README); without them only warnings."""
    result = explore("upstream", budget=BUDGET, seed=0)
    for r in result.results:
        errors = [code for code, f in r.findings.items() if f["severity"] == "error"]
        assert not errors or "events" in r.profiles, (r.seed, r.profiles, errors)


def test_candidate_workloads_are_valid_small_and_deterministic():
    with_events = 0
    for seed in range(24):
        for profiles in ((), ("budget-edge",), ("kv-pressure", "long-prompts"), ("events",), ("sync", "aborts")):
            w = candidate_workload(seed, profiles)
            assert w == candidate_workload(seed, profiles)
            assert Workload.from_dict(w.to_dict()) == w  # a valid workload file
            assert 2 <= len(w.requests) <= 8 and w.seed == seed
            assert w.name == f"explore-{seed}-{'+'.join(profiles) or 'plain'}"
            if "events" not in profiles:
                assert not w.events
            with_events += bool(w.events)
            if "budget-edge" in profiles:  # m decodes' worth of 1 + k tokens, give or take one
                k, budget = w.config.num_spec_tokens, w.config.max_num_batched_tokens
                assert any(abs(budget - m * (1 + k)) <= 1 for m in range(1, 8)), (k, budget)
    assert with_events > 0


def test_candidates_are_drawn_from_the_seed_and_steered_by_the_weights():
    weights = {p: 1.0 for p in PROFILES}
    batch = candidates_for(0, 0, weights, start=5, count=10)
    assert batch == candidates_for(0, 0, weights, start=5, count=10)
    assert [c.index for c in batch] == list(range(5, 15))
    assert all(c.profiles == tuple(sorted(set(c.profiles))) and 1 <= len(c.profiles) <= 3 for c in batch)
    assert all(0 <= c.seed < 1 << 30 for c in batch)
    assert candidates_for(0, 1, weights, 5, 10) != batch  # another generation, other draws
    steered = candidates_for(0, 0, {p: (1e6 if p == "sync" else 1e-6) for p in PROFILES}, 0, 20)
    assert all("sync" in c.profiles for c in steered)


def test_a_candidate_that_cannot_run_is_a_result_with_its_error():
    case = run_candidate("no-such-impl", "reference", Candidate(7, 123, ("burst",)))
    assert (case.index, case.seed, case.profiles) == (7, 123, ("burst",))
    assert "unknown implementation 'no-such-impl'" in case.error
    assert case.findings == {} and case.features == frozenset() and case.steps == 0


@pytest.mark.parametrize(
    "scenario, impl, expected",
    [
        ("reentry", "upstream", {"reentry", "budget-skip", "drafts-with-nothing-behind"}),
        ("pause-clear", "upstream", {"pause", "cache-reset", "output-dropped"}),
        ("abort-inflight", "upstream", {"abort", "output-never-applied"}),
        ("streaming-append", "upstream", {"streaming-turn", "output-dropped"}),
        ("resubmit", "upstream", {"resubmission", "outcome-crashed"}),
        ("streaming-preempt", "upstream", {"outcome-requests-lost"}),
        ("resubmit", "life-guard", {"resubmission"}),
    ],
)
def test_situations_name_what_a_run_reached(scenario, impl, expected):
    found = situations(run_workload(build_scenario(scenario), resolve(impl, allow_import=False)))
    assert expected <= found, sorted(found)
    if impl == "life-guard":
        assert not any(s.startswith("outcome-") for s in found)  # the guard: it completes
