"""The G codes on SGLang 0.5.23's real scheduler: each broken by a variant, none on upstream.

Marked `sglang`: they run in SGLang's environment (`scripts/sglang.sh test`) and skip elsewhere.
Every trace here is recorded live, the variants loaded by `module:attr` as a user's are
(tests/replay/check/sglang_variants.py) or by their registry name. The committed traces the main
environment's tests read (sglang_traces.py) are recorded again and held equal to their files;
random workloads (overlap x spec, aborts, retraction, stops, chunked prefills) give upstream no
error and give the row-by-row statement the checker's findings.
"""

from __future__ import annotations

import random

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import NotApplicable, resolve
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.traces.io import read_trace
from tests.replay.check.sglang_traces import TRACES, path, record
from tests.replay.check.test_checker_equivalence import same_findings

sglang = pytest.mark.sglang
VARIANTS = "tests.replay.check.sglang_variants:"


def run(text: str, impl: str = "upstream"):
    return run_workload(workload_from_notation(text), resolve(impl, allow_import=True), engine="sglang-scheduler")


def codes(trace) -> set[str]:
    return {f.code for f in check_trace(trace)}


@sglang
@pytest.mark.parametrize("name", sorted(TRACES))
def test_each_committed_trace_is_what_the_engine_records_and_has_its_g_codes(name):
    fresh = record(name)
    assert fresh.table.equals(read_trace(path(name)).table), f"{name}: re-record it (sglang_traces.py)"
    impl = TRACES[name][1]
    if impl != "upstream":  # the variant ran, and the header says so
        assert fresh.impl.name == impl and fresh.impl.scheduler.endswith("(DrivenScheduler)")
    assert {c for c in codes(fresh) if c.startswith("G")} == TRACES[name][2]


@sglang
def test_g1_a_retraction_that_keeps_the_committed_count():
    text = "0-5:p4,t20 | blocks 4 block 16 k0 sync"
    assert "G1-committed-past-allocated" not in codes(run(text))
    found = [f for f in check_trace(run(text, VARIANTS + "RetractionKeepsCommitted")) if f.code.startswith("G1")]
    assert found and all(f.facts()["retracted"] and f.expected == 0 and f.actual > 0 for f in found)


@sglang
def test_g7_sglang_s_busy_time_pool_accounting_fails_on_a_leak():
    trace = run("a:p4,t6 b:p3,t8,stop2@2 | k0 async", VARIANTS + "LeakAtFinish")
    assert trace.outcome.status == "crashed"
    (f,) = [f for f in check_trace(trace) if f.code == "G7-sglang-own-check"]
    assert f.facts()["check_source"] == "managers/scheduler_components/invariant_checker.py:344"
    assert "Full Pool Mem Leak Detected" in f.message and "E1-engine-crash" not in codes(trace)


@sglang
def test_the_built_in_variants_say_where_they_do_not_apply():
    with pytest.raises(NotApplicable, match="sglang-finish-trim does not apply .* num_spec_tokens = 0"):
        run("a:p4,t6 | k3 async", "sglang-finish-trim")
    with pytest.raises(NotApplicable, match="sglang-stale-commit does not apply .* async scheduling"):
        run("a:p4,t6 | k3 sync", "sglang-stale-commit")


# ====================================================================== upstream, at random
def random_workload(rng: random.Random) -> str:
    """A workload SGLang takes: up to 8 requests (stops, aborts, random acceptance, arrivals), a
    pool tight enough to retract now and then, k in 0..3, overlap or not."""
    k, mode, blocks = rng.choice([0, 0, 1, 3]), rng.choice(["async", "sync"]), rng.choice([3, 4, 5, 8])
    room = (blocks - 1) * 16 - k - 2
    requests, events = [], []
    for rid in "abcdefgh"[: rng.randint(2, 8)]:
        p = rng.randint(1, 10)
        t = rng.randint(2, min(30, room - p))
        fields = [f"p{p}", f"t{t}"] + [f"stop{rng.randint(1, t)}"] * (rng.random() < 0.3)
        fields += [rng.choice(["none", "random:0.5"])] * (k > 0 and rng.random() < 0.4)
        requests.append(f"{rid}:{','.join(fields)}@{rng.choice([1, 1, 2, 4])}")
        if rng.random() < 0.15:
            events.append(f"abort({rid})@{rng.randint(5, 12)}")
    settings = f"budget {rng.choice([8, 16, 64])} seqs {rng.choice([4, 8])} k{k} {mode} blocks {blocks}"
    return f"{' '.join(requests)} | {settings} | {' '.join(events)}"


@sglang
def test_upstream_has_no_error_at_random_and_the_rowwise_statement_agrees():
    """The false-positive check the tests keep (docs/checker.md gives the long sweep's count):
    SGLang 0.5.23 breaks none of the G codes but G5, a warning, whose shape is #24590's: a stop or
    an abort without speculation under overlap. Both checkers agree on every trace."""
    rng = random.Random(31)
    seen = set()
    for _ in range(24):
        trace = run(random_workload(rng))
        assert trace.outcome.status == "completed"
        found = check_trace(trace)
        assert {f.code for f in found} <= {"G5-overcommit-at-finish"}, [f.message for f in found]
        for f in found:
            assert trace.config.async_scheduling and not trace.config.num_spec_tokens
            assert f.facts()["finish"] in ("stop", "aborted")
        cols = trace.table.select(["sched_preempted", "sched_event", "apply_outcome"]).to_pydict()
        seen |= {"retraction"} if any(cols["sched_preempted"]) else set()
        seen |= {"abort"} if "abort" in cols["sched_event"] else set()
        seen |= {"stale result"} if "ignored" in cols["apply_outcome"] else set()
        seen |= {f"k{trace.config.num_spec_tokens} {'async' if trace.config.async_scheduling else 'sync'}"}
        same_findings(trace)
    assert {"retraction", "abort", "stale result", "k0 async", "k0 sync", "k3 async", "k3 sync"} <= seen, seen
