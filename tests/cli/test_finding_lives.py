"""Findings say which life of a request they concern: text names the life where the id has more
than one (a resubmission), JSON always carries it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specreplay.cli.gate_reports import gate_json, junit_xml, markdown_summary
from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workflows.gate import GateResult
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces.io import write_trace
from tests.replay.check.test_checker import mutate


@pytest.fixture(scope="module")
def resubmitted():
    """The resubmit scenario (request 1: life 0 finishes at step 4, life 1 arrives at step 10;
    request 2 has one life) with three placeholder counts broken: request 1's life 0 at step 3
    and life 1 at step 12 (S1, S2), request 2 at step 5 (S1)."""
    trace = run_workload(build_scenario("resubmit"), resolve("upstream", allow_import=False))
    trace = mutate(trace, "sched_num_output_placeholders", 3, "1", -1)
    trace = mutate(trace, "sched_num_output_placeholders", 12, "1", 9)
    return mutate(trace, "sched_num_output_placeholders", 5, "2", -1)


def _where(findings):
    return {(f.code, f.step, f.request_id): f for f in findings}


def test_each_finding_knows_its_life_and_how_many_the_id_has(resubmitted):
    found = _where(check_trace(resubmitted))
    old, new, single = (
        found[("S1-placeholders-nonnegative", 3, "1")],
        found[("S2-placeholder-count", 12, "1")],
        found[("S1-placeholders-nonnegative", 5, "2")],
    )
    assert (old.life, old.lives, old.request_label) == (0, 2, "1 (life 0)")
    assert (new.life, new.lives, new.request_label) == (1, 2, "1 (life 1)")
    assert (single.life, single.lives, single.request_label) == (0, 1, "2")


def test_diff_text_names_the_life_only_for_an_id_with_several(resubmitted, tmp_path):
    path = tmp_path / "resubmit.parquet"
    write_trace(resubmitted, path)
    out = CliRunner().invoke(main, ["diff", str(path), "--no-story"]).output
    assert "step 3  request 1 (life 0)  num_output_placeholders" in out
    assert "step 12  request 1 (life 1)  num_output_placeholders" in out
    assert "step 5  request 2  num_output_placeholders" in out
    assert "request 2 (life" not in out
    assert "first divergence: step 3, request '1' (life 0), " in out


def test_diff_json_always_carries_the_life(resubmitted, tmp_path):
    path = tmp_path / "resubmit.parquet"
    write_trace(resubmitted, path)
    doc = json.loads(CliRunner().invoke(main, ["diff", str(path), "--format", "json"]).output)
    lives = {(f["step"], f["request_id"]): f["life"] for f in doc["findings"]}
    assert lives[(3, "1")] == 0 and lives[(12, "1")] == 1 and lives[(5, "2")] == 0


def test_gate_reports_name_the_life(resubmitted):
    findings = check_trace(resubmitted)
    result = GateResult("resubmit.parquet", "fail", findings=findings, message="S1 at step 3")
    xml = junit_xml([result])
    assert "step 3 request 1 (life 0):" in xml and "step 12 request 1 (life 1):" in xml
    assert "step 5 request 2:" in xml
    assert "| fail | step 3 req 1 (life 0) `" in markdown_summary([result])
    docs = json.loads(gate_json([result]))["results"][0]["findings"]
    assert {(d["step"], d["request_id"], d["life"]) for d in docs} >= {(3, "1", 0), (12, "1", 1), (5, "2", 0)}


def test_a_trace_without_resubmissions_names_no_life(reentry_traces, tmp_path):
    path = tmp_path / "pr30796.parquet"
    write_trace(reentry_traces["pr30796"], path)
    out = CliRunner().invoke(main, ["diff", str(path), "--no-story"]).output
    assert "request 10  " in out and "(life" not in out
