"""The library functions the commands call, without the command line: recording to a file and its
journal, recovering, replaying, exploring to a folder, the explore backends."""

from __future__ import annotations

import json

import pytest

from specreplay.replay.workflows.backends import InlineBackend, ProcessBackend, make_backend
from specreplay.replay.workflows.record import pick_workload, record_to, recover_to, recovered_path, replay_to
from specreplay.traces.errors import InputError
from specreplay.traces.io import read_trace
from specreplay.traces.journal import journal_path

#: Stops with an input error inside step 6 (shared with tests/traces/test_journal.py).
REFUSING = "tests.replay.engines.raising_impls:RefusingRunner"


def test_record_to_writes_the_trace_and_removes_the_journal(tmp_path):
    out = tmp_path / "r.parquet"
    recorded = record_to(out, pick_workload("reentry"), "pr30796")
    assert recorded.path == out and out.exists() and not journal_path(out).exists()
    assert read_trace(out).content_equals(recorded.trace)
    assert "X10-scheduler-output-mutated" in {f.code for f in recorded.findings}


def test_record_to_drops_an_empty_journal_and_refuses_one_that_holds_steps(tmp_path):
    out = tmp_path / "r.parquet"
    journal_path(out).write_bytes(b"")  # died before its first flush: nothing to keep
    record_to(out, pick_workload("reentry"), "upstream")
    assert not journal_path(out).exists()

    # A run stopped by an input error at step 6 (an exception of the implementation's own would be
    # the engine's death: a crashed trace, tests/replay/engines/test_impl_raises.py).
    cut = tmp_path / "cut.parquet"
    with pytest.raises(InputError, match="specreplay recover"):
        record_to(cut, pick_workload("reentry"), REFUSING, flush_every=1)
    assert journal_path(cut).exists() and not cut.exists()
    with pytest.raises(InputError, match="recover it first"):
        record_to(cut, pick_workload("reentry"), "upstream")

    recovered = recover_to(journal_path(cut))
    assert recovered.path == recovered_path(journal_path(cut)) == tmp_path / "cut.recovered.parquet"
    assert recovered.trace.outcome.status == "partial" and recovered.trace.outcome.step == 5
    with pytest.raises(InputError, match="exists"):
        recover_to(journal_path(cut))


def test_replay_to_runs_the_trace_s_workload_through_another_implementation(tmp_path):
    source = record_to(tmp_path / "up.parquet", pick_workload("reentry"), "upstream").path
    again = replay_to(tmp_path / "fixed.parquet", source, "sched-clear")
    assert again.trace.impl_name == "sched-clear" and not again.findings
    assert again.trace.workload == read_trace(source).workload


def test_pick_workload_takes_exactly_one_source_and_overrides(tmp_path):
    with pytest.raises(InputError, match="exactly one of"):
        pick_workload()
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps({"requests": [{"id": "a", "prompt_len": 4, "max_tokens": 4}], "seed": 1}))
    with pytest.raises(InputError, match="exactly one of"):
        pick_workload("reentry", spec)
    w = pick_workload(workload_file=spec, seed=9, max_steps=7)
    assert (w.seed, w.max_steps) == (9, 7)
    assert pick_workload("random", seed=3).seed == 3


def test_make_backend():
    assert isinstance(make_backend(), InlineBackend)
    backend = make_backend(jobs=2)
    try:
        assert isinstance(backend, ProcessBackend)
    finally:
        backend.close()
    with pytest.raises(InputError, match="not both"):
        make_backend(jobs=2, ray_address="local")


def test_explore_to_writes_a_trace_per_code_and_the_summary(tmp_path):
    from specreplay.replay.workflows.explore import explore_to

    report = explore_to(tmp_path, "pr30796", budget=32)
    on_disk = json.loads((tmp_path / "explore.json").read_text())
    assert on_disk == report.summary and report.summary["workloads"] == 32
    assert {p.stem for p in tmp_path.glob("*.parquet")} == set(report.summary["findings"])
    assert report.fails("never") is False and report.implementation_error() is None
    if report.summary["findings"]:
        assert report.most_hit() in report.summary["findings"]
