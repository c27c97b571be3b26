"""replay/workflows/gate.py as a library: `run_gate` / `gate_one` over the shipped corpus, and what
they say about a failing implementation, a changed one, a tampered golden and a damaged file.
(tests/cli/test_gate.py holds the command: exit codes, JUnit, GitHub annotations.)"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pyarrow.compute as pc
import pytest

from specreplay.replay.workflows.gate import (
    GateOptions,
    GateResult,
    collect,
    corpus_dir,
    gate_one,
    run_gate,
    update_goldens,
)
from specreplay.traces.errors import InputError
from specreplay.traces.io import read_trace, write_trace

REENTRY = corpus_dir() / "reentry.parquet"


@pytest.fixture(scope="module")
def upstream_results() -> list[GateResult]:
    return run_gate([corpus_dir()], GateOptions())


def test_the_shipped_corpus_passes_against_its_own_implementation(upstream_results):
    files = sorted(corpus_dir().glob("*.parquet"))
    assert len(files) >= 11
    assert [r.path for r in upstream_results] == [str(p) for p in files]  # one result per golden, in path order
    for r in upstream_results:
        assert r.result == "pass", (r.path, r.message)
        assert r.impl == r.golden_impl == "upstream" and not r.notes, (r.path, r.notes)
        assert not r.changes and not r.changed_fields and not r.message
        assert not r.failed() and all(f.severity == "warning" for f in r.findings)
    # The warnings the README names for the re-entry golden: wasteful, not wrong.
    reentry = next(r for r in upstream_results if r.path == str(REENTRY))
    assert {f.code for f in reentry.findings} == {"S5-draft-provenance", "X5-placeholder-drafts"}
    json.dumps([r.to_dict() for r in upstream_results])  # what --format json prints


def test_pr30796_fails_the_reentry_golden_with_the_first_error_named():
    result = gate_one(str(REENTRY), GateOptions(impl="pr30796"))
    assert result.result == "fail" and result.failed(allow_changed=True)
    assert result.impl == "pr30796" and result.golden_impl == "upstream"
    assert "golden made by upstream, gating pr30796" in result.notes
    codes = {f.code for f in result.findings}
    assert {"X10-scheduler-output-mutated", "S3-scheduler-computed-tokens"} <= codes
    assert result.first.code == "X10-scheduler-output-mutated" and result.first.step == 4
    assert result.message.startswith("X10-scheduler-output-mutated at step 4, request 10: ")
    assert result.changes  # it also behaves differently from the golden


def test_fail_on_never_turns_the_failure_into_a_change():
    result = gate_one(str(REENTRY), GateOptions(impl="pr30796", fail_on="never"))
    assert result.result == "changed" and not result.failed(allow_changed=True) and result.failed()


def test_sched_clear_changes_behaviour_without_breaking_an_invariant():
    result = gate_one(str(REENTRY), GateOptions(impl="sched-clear"))
    assert result.result == "changed" and not [f for f in result.findings if f.severity == "error"]
    assert result.changed_fields and all(count > 0 for count in result.changed_fields.values())
    first = min(result.changes, key=lambda f: (f.step, f.request_id or ""))
    assert (first.step, first.request_id) == (3, "10")  # README: where upstream and sched-clear part
    assert result.message.startswith("behaviour differs from the golden from step 3, request 10, ")


def tampered(tmp_path, column: str, step: int, request: str, delta: int):
    """The reentry golden with one value changed (still a valid trace file)."""
    trace = read_trace(REENTRY)
    table = trace.table
    hit = pc.and_(pc.equal(table["step"], step), pc.equal(table["request_id"], request))
    values = pc.if_else(hit, pc.add(table[column], delta), table[column])
    table = table.set_column(
        table.schema.get_field_index(column), table.schema.field(column), values.cast(table.schema.field(column).type)
    )
    return write_trace(dataclasses.replace(trace, table=table), tmp_path / "tampered.parquet")


def test_a_tampered_golden_is_caught_at_the_step_and_field_changed(tmp_path):
    path = tampered(tmp_path, "sched_num_computed_tokens", 5, "10", 1)
    result = gate_one(str(path), GateOptions())
    assert result.result == "changed" and result.failed() and not result.failed(allow_changed=True)
    assert result.changed_fields == {"sched_num_computed_tokens": 1}
    [change] = result.changes
    assert (change.step, change.request_id, change.field) == (5, "10", "sched_num_computed_tokens")
    assert (change.scheduler, change.worker) == (8, 7)  # the golden's tampered value, the replay's
    assert "step 5, request 10, sched_num_computed_tokens: 8 in the golden, 7 now" in result.message


def test_a_golden_whose_workload_was_tampered_replays_something_else(tmp_path):
    trace = read_trace(REENTRY)
    workload = dataclasses.replace(
        trace.workload, requests=[dict(r, max_tokens=5) if r["id"] == "0" else r for r in trace.workload.requests]
    )
    path = write_trace(dataclasses.replace(trace, workload=workload), tmp_path / "other-workload.parquet")
    result = gate_one(str(path), GateOptions())
    assert result.result == "changed" and result.changes


def test_a_damaged_golden_is_an_error_in_one_line(tmp_path):
    broken = tmp_path / "broken.parquet"
    data = REENTRY.read_bytes()
    broken.write_bytes(data[: len(data) // 2])
    result = gate_one(str(broken), GateOptions())
    assert result.result == "error" and result.failed(allow_changed=True)
    assert result.message and "\n" not in result.message and str(broken) in result.message
    unknown = gate_one(str(REENTRY), GateOptions(impl="no-such-impl"))
    assert unknown.result == "error" and "unknown implementation 'no-such-impl'" in unknown.message


def test_run_gate_mixes_results_per_file_and_collect_refuses_empty_input(tmp_path):
    shutil.copy(REENTRY, tmp_path / "a-good.parquet")
    (tmp_path / "b-bad.parquet").write_bytes(b"not parquet")
    (tmp_path / "notes.txt").write_text("ignored: not a trace")
    results = run_gate([tmp_path], GateOptions())
    assert [(r.path.rsplit("/", 1)[-1], r.result) for r in results] == [
        ("a-good.parquet", "pass"),
        ("b-bad.parquet", "error"),
    ]
    assert collect([tmp_path / "a-good.parquet"]) == [tmp_path / "a-good.parquet"]
    with pytest.raises(InputError, match="no such trace file or folder"):
        collect([tmp_path / "missing.parquet"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no traces to gate"):
        run_gate([empty], GateOptions())


def test_update_goldens_rewrites_a_changed_golden_then_finds_it_unchanged(tmp_path):
    golden = tmp_path / "reentry.parquet"
    shutil.copy(REENTRY, golden)
    [first] = update_goldens([golden], GateOptions(impl="sched-clear"))
    assert first.status == "updated" and first.changed_fields and first.first.step == 3
    assert read_trace(golden).impl_name == "sched-clear"
    [again] = update_goldens([golden], GateOptions(impl="sched-clear"))
    assert again.status == "unchanged"
    assert gate_one(str(golden), GateOptions()).result == "pass"  # the golden's own impl is now sched-clear


def test_gate_results_are_plain_data():
    result = GateResult("x.parquet", "error", message="why")
    assert result.first is None and result.failed()
    assert json.loads(json.dumps(result.to_dict())) == {
        "path": "x.parquet",
        "result": "error",
        "impl": "",
        "golden_impl": "",
        "findings": [],
        "changes": [],
        "changed_fields": {},
        "notes": [],
        "unchecked": [],
        "message": "why",
    }
