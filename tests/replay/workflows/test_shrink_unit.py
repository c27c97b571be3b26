"""replay/workflows/shrink.py as a library: a known divergence (pr30796 on the re-entry scenario)
cut down while its code still fires, deterministically; a crash kept to the same assert; the
emitted regression test failing on the bug and passing on the fix. (tests/cli/test_explore.py
holds the `specreplay shrink` command.)

Shrinking the whole 11-request scenario takes about 2,500 replays, so the full shrink starts from
its first four requests with a budget for three decodes (the same re-entry of request 3), and the
whole scenario is shrunk under a bound on the replays."""

from __future__ import annotations

import dataclasses

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls import resolve
from specreplay.replay.workflows.shrink import crash_signature, emit_pytest, shrink, shrink_to, size
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.errors import InputError
from specreplay.traces.io import read_trace, write_trace

X10 = "X10-scheduler-output-mutated"


def small_reentry() -> Workload:
    """Requests 0-3 of `reentry`, budget 12: 1-3 fill it, request 3 is skipped, and re-enters with
    3 draft slots once request 0 finishes (X10 on pr30796 at step 4, request 3)."""
    w = build_scenario("reentry")
    return dataclasses.replace(
        w, requests=w.requests[:4], config=dataclasses.replace(w.config, max_num_batched_tokens=12, max_num_seqs=4)
    )


@pytest.fixture(scope="module")
def reentry_x10():
    workload = small_reentry()
    impl = resolve("pr30796", allow_import=False)
    return workload, impl, run_workload(workload, impl), shrink(workload, impl, X10)


def codes(trace) -> set[str]:
    return {f.code for f in check_trace(trace)}


def test_the_shrunk_workload_is_smaller_and_still_shows_the_code(reentry_x10):
    workload, impl, original, shrunk = reentry_x10
    assert shrunk.code == X10 and X10 in codes(original)
    assert size(shrunk.workload, shrunk.trace) < size(workload, original)
    assert shrunk.trace.num_steps <= original.num_steps
    # The trace it returns is the shrunk workload's own run, and the code fires on it.
    assert X10 in codes(shrunk.trace)
    again = run_workload(shrunk.workload, impl)
    assert again.content_equals(shrunk.trace) and X10 in codes(again)
    assert Workload.from_dict(shrunk.workload.to_dict()) == shrunk.workload  # a valid workload file
    # Bookkeeping: each kept reduction is labelled, and every replay counted.
    assert shrunk.reductions and all(isinstance(label, str) and label for label in shrunk.reductions)
    assert shrunk.runs > len(shrunk.reductions)


def test_the_result_is_minimal_for_the_re_entry_story(reentry_x10):
    """Re-entry needs a request skipped by the budget while others run: three 1-token prompts,
    a budget of 3 with one draft slot, two outputs each."""
    _, _, _, shrunk = reentry_x10
    cfg = shrunk.workload.config
    assert len(shrunk.workload.requests) == 3 and shrunk.trace.num_steps <= 6
    assert (cfg.num_spec_tokens, cfg.max_num_batched_tokens) == (1, 3)
    assert all(r.prompt_len == 1 and r.max_tokens == 2 for r in shrunk.workload.requests)
    first = next(f for f in check_trace(shrunk.trace) if f.code == X10)
    assert first.request_id in {r.request_id for r in shrunk.workload.requests}


def test_shrinking_is_deterministic(reentry_x10):
    workload, impl, _, shrunk = reentry_x10
    again = shrink(workload, impl, X10)
    assert again.workload == shrunk.workload and again.reductions == shrunk.reductions
    assert again.runs == shrunk.runs and again.trace.content_equals(shrunk.trace)


def test_the_whole_scenario_shrinks_under_a_bound_and_progress_sees_each_kept_reduction():
    workload, impl = build_scenario("reentry"), resolve("pr30796", allow_import=False)
    seen: list[int] = []
    shrunk = shrink(workload, impl, X10, max_runs=120, progress=lambda s: seen.append(len(s.reductions)))
    assert shrunk.runs <= 120 and X10 in codes(shrunk.trace)
    assert size(shrunk.workload, shrunk.trace) < size(workload, run_workload(workload, impl))
    assert seen == list(range(1, len(shrunk.reductions) + 1))


def test_a_code_that_does_not_fire_is_refused():
    with pytest.raises(InputError, match="does not fire"):
        shrink(build_scenario("reentry"), resolve("sched-clear", allow_import=False), X10)


def test_a_crash_shrinks_to_the_same_assert():
    """upstream on `resubmit` (request 0 aborted and resubmitted with a step in flight; request 1
    and its clean resubmission left out): the engine dies on negative placeholders. The shrunk
    run dies of the same assert, and (README) needs neither the abort nor the other request."""
    w = build_scenario("resubmit")
    workload = dataclasses.replace(
        w,
        requests=(w.requests[0], w.requests[2]),
        events=tuple(e for e in w.events if e.request == "0"),
        config=dataclasses.replace(w.config, max_num_batched_tokens=12, max_num_seqs=2),
    )
    impl = resolve("upstream", allow_import=False)
    original = run_workload(workload, impl)
    shrunk = shrink(workload, impl, "E1-engine-crash")
    assert crash_signature(shrunk.trace) == crash_signature(original) is not None
    assert "num_output_placeholders" in shrunk.trace.outcome.message
    assert len(shrunk.workload.requests) == 1 and [e.kind for e in shrunk.workload.events] == ["resubmit"]
    assert crash_signature(run_workload(shrunk.workload, resolve("life-guard", allow_import=False))) is None


def test_the_emitted_regression_test_fails_on_the_bug_and_passes_on_the_fix(reentry_x10, monkeypatch):
    _, impl, _, shrunk = reentry_x10
    source = emit_pytest(shrunk, "reentry.parquet", impl.name, "reference")
    namespace: dict = {}
    exec(compile(source, "test_min.py", "exec"), namespace)  # noqa: S102 (our own generated module)
    test = namespace["test_x10_scheduler_output_mutated_does_not_fire"]
    assert namespace["WORKLOAD"] == shrunk.workload.to_dict() and namespace["CODE"] == X10
    monkeypatch.delenv("SPECREPLAY_IMPL", raising=False)
    with pytest.raises(AssertionError, match=X10):
        test()  # default: the implementation it was shrunk on
    monkeypatch.setenv("SPECREPLAY_IMPL", "sched-clear")
    test()


def test_shrink_to_reads_a_trace_and_writes_the_minimal_one(tmp_path, reentry_x10):
    workload, _, original, shrunk = reentry_x10
    source = write_trace(original, tmp_path / "found.parquet")
    report = shrink_to(source, tmp_path / "min.parquet", pytest_file=tmp_path / "test_min.py")
    assert report.impl == "pr30796" and report.shrunk.code == X10  # the trace's first error
    assert report.before == size(workload, original) and report.after == size(shrunk.workload, shrunk.trace)
    assert read_trace(tmp_path / "min.parquet").content_equals(shrunk.trace)
    assert "def test_x10_scheduler_output_mutated_does_not_fire" in (tmp_path / "test_min.py").read_text()
    with pytest.raises(InputError, match="not a finding code"):
        shrink_to(source, tmp_path / "x.parquet", code="X99")


def test_shared_prompts_shrink_to_plain_ones_and_explicit_ids_to_fewer():
    """A prefix dropped, a turn standing alone, an explicit prompt cut: each reduction is a valid
    workload (the candidates a shrink tries), and the size counts whole prompts."""
    from specreplay.replay.workflows.shrink import candidate_reductions
    from specreplay.replay.workloads.notation import workload_from_notation

    workload = workload_from_notation("a:prefix=s,p4,t6 b:follows=a,prompt=5.6.7.8,t3@+3 | prefix s=p32")
    got = {}
    for label, candidate in candidate_reductions(workload):
        try:
            got[label] = Workload.from_dict(candidate.to_dict())
        except InputError:
            continue  # as shrink skips it: here, dropping "a", which "b" follows
    a, b = got["request a no prefix"].requests
    assert a.prefix is None and got["request a no prefix"].prompt_len_of("b") == 4 + 6 + 4
    alone = got["request b stands alone"].requests[1]
    assert (alone.follows, alone.after_finish, alone.prompt) == (None, None, (5, 6, 7, 8))
    assert got["request b prompt_len 2"].requests[1].prompt == (5, 6)
    assert got["request b sent the step after a finished"].requests[1].after_finish == 1
    assert "drop request a" not in got
    trace = run_workload(workload, resolve("upstream", allow_import=False))
    for smaller in ("request a no prefix", "request b stands alone"):
        assert size(got[smaller], trace) < size(workload, trace), smaller
