"""`specreplay gate` on the shipped corpus: verdicts per implementation, exit codes, CI outputs."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.workflows.gate import corpus_dir
from tests.replay.check.truthless import FORCED_NOT_CHECKED, NEED_KV_TRUTH, NEED_TRUTH, NOT_CHECKED


def gate(*args, env=None):
    return CliRunner().invoke(main, ["gate", *[str(a) for a in args]], env=env)


def results(result) -> dict[str, str]:
    return {r["path"].rsplit("/", 1)[-1]: r["result"] for r in json.loads(result.output)["results"]}


def test_corpus_passes_for_upstream():
    result = gate("--format", "json")
    assert result.exit_code == 0, result.output
    assert set(results(result).values()) == {"pass"} and len(results(result)) >= 8


def test_sched_clear_only_changes():
    result = gate("--impl", "sched-clear", "--format", "json")
    assert result.exit_code == 1
    verdicts = results(result)
    assert "fail" not in verdicts.values() and verdicts["reentry.parquet"] == "changed"
    assert gate("--impl", "sched-clear", "--allow-changed").exit_code == 0


def test_pr30796_fails_with_the_findings_named(tmp_path):
    junit = tmp_path / "gate.xml"
    result = gate("--impl", "pr30796", "--junit", junit, "--format", "json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    reentry = next(r for r in doc["results"] if r["path"].endswith("/reentry.parquet"))
    assert reentry["result"] == "fail" and "X10-scheduler-output-mutated" in reentry["message"]
    assert {f["code"] for f in reentry["findings"]} >= {"X10-scheduler-output-mutated", "S3-scheduler-computed-tokens"}
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases)
    assert int(suite.get("failures")) == len([c for c in cases if c.find("failure") is not None])
    names = {(c.get("classname"), c.get("name")) for c in cases}
    assert ("specreplay.gate", "reentry.parquet") in names
    assert ("specreplay.gate.reentry.parquet", "X10-scheduler-output-mutated") in names
    assert doc["counts"]["fail"] == len(
        [
            c
            for c in cases
            if c.get("classname") == "specreplay.gate"
            and c.find("failure") is not None
            and c.find("failure").get("type") == "fail"
        ]
    )


def test_github_annotations_and_summary(tmp_path):
    summary = tmp_path / "summary.md"
    result = gate("--impl", "sched-clear", "--github", env={"GITHUB_STEP_SUMMARY": str(summary)})
    lines = [line for line in result.output.splitlines() if line.startswith("::")]
    # sched-clear is an AsyncScheduler variant: the synchronous goldens are n/a (a notice), never a pass
    na = [line for line in lines if "title=specreplay gate%3A n/a::" in line]
    assert len(na) == 3 and all(line.startswith("::notice file=") for line in na)
    assert lines and all(line.startswith("::warning file=") for line in lines if line not in na)
    text = summary.read_text()
    assert text.startswith("## specreplay gate") and "| reentry.parquet | changed |" in text
    assert "| reentry-sync.parquet | n/a | ClearStalePlaceholdersScheduler is an AsyncScheduler" in text
    assert len(text.encode()) < 1 << 20


def test_annotations_are_capped_per_kind(tmp_path):
    for i in range(13):
        shutil.copy(corpus_dir() / "reentry.parquet", tmp_path / f"r{i:02}.parquet")
    lines = [
        line for line in gate(tmp_path, "--impl", "pr30796", "--github").output.splitlines() if line.startswith("::")
    ]
    assert sum(line.startswith("::error") for line in lines) == 10
    assert lines[-1] == "::notice title=specreplay gate::3 more error annotations not shown"


def test_jobs_do_not_change_the_report():
    one = gate("--impl", "sched-clear", "--format", "json", "--jobs", "1")
    two = gate("--impl", "sched-clear", "--format", "json", "--jobs", "2")
    assert one.output == two.output and one.exit_code == two.exit_code


def test_errors_exit_2(tmp_path):
    (tmp_path / "junk.parquet").write_text("junk")
    result = gate(tmp_path, "--format", "json")
    assert result.exit_code == 2 and results(result) == {"junk.parquet": "error"}
    assert gate("--impl", "nope").exit_code == 2
    missing = gate(tmp_path / "missing")
    assert missing.exit_code == 2 and "no such trace file or folder" in missing.output


def test_update_round_trips(tmp_path):
    shutil.copy(corpus_dir() / "reentry.parquet", tmp_path / "reentry.parquet")
    same = CliRunner().invoke(main, ["gate", "--update", str(tmp_path)])
    assert same.exit_code == 0 and same.output.startswith("same")
    updated = CliRunner().invoke(main, ["gate", "--update", str(tmp_path), "--impl", "sched-clear"])
    assert updated.exit_code == 0 and "updated" in updated.output and "sched_spec_len" in updated.output
    assert gate(tmp_path, "--impl", "sched-clear").exit_code == 0
    assert gate(tmp_path).exit_code == 0  # the golden's own implementation is now sched-clear


def test_corpus_covers_the_situations():
    from specreplay.traces.io import read_trace

    seen = set()
    for path in sorted(corpus_dir().glob("*.parquet")):
        trace = read_trace(path)
        df = trace.table.to_pandas()
        seen.add("async" if trace.config.async_scheduling else "sync")
        if df.sched_preempted.any():
            seen.add("preemption")
        if df.sched_is_prefill_chunk.any():
            seen.add("chunked prefill")
        if any("abort_step" in r for r in trace.workload.requests) or (df.sched_event == "abort").any():
            seen.add("abort")
        if df.step_event.str.contains("pause").any():
            seen.add("pause")
        if (df.sched_event == "reset_preempt").any():
            seen.add("cache reset")
        if (df.apply_outcome == "dropped").any():
            seen.add("dropped output")
        if (df.apply_outcome == "ignored").any():
            seen.add("ignored output")
        if (df.sched_life > 0).any():
            seen.add("resubmission")
        if (df.sched_kind == "reentering").any() and df.sched_num_draft_slots[df.sched_kind == "reentering"].gt(
            0
        ).any():
            seen.add("stale re-entry")
    assert seen == {
        "async",
        "sync",
        "preemption",
        "chunked prefill",
        "abort",
        "stale re-entry",
        "pause",
        "cache reset",
        "dropped output",
        "ignored output",
        "resubmission",
    }


@pytest.mark.parametrize("impl, should_pass", [("upstream", True), ("pr30796", False)])
def test_pytest_plugin_fixture(specreplay_gate, impl, should_pass):
    if should_pass:
        assert len(specreplay_gate(impl=impl)) >= 8
    else:
        with pytest.raises(AssertionError, match="X10-scheduler-output-mutated"):
            specreplay_gate(impl=impl)


def assert_outputs_name_the_unchecked(
    result, junit, summary, name: str, not_checked: str = NOT_CHECKED, need_truth: list[str] = NEED_TRUTH
) -> None:
    """The table, the GitHub annotations, the step summary and the JUnit XML of a gate over one
    trace without ground truth (or, forced live, without KV ground truth: `not_checked`,
    `need_truth`) all say which codes were not checked."""
    assert f"[{not_checked}]" in result.output  # the table (wide: one line per row)
    assert any(
        line.startswith("::notice file=") and name in line and line.endswith(f"::{not_checked}")
        for line in result.output.splitlines()
    )
    assert not_checked in summary.read_text()
    suite = ET.parse(junit).getroot()
    skipped = {
        c.get("name")
        for c in suite.findall("testcase")
        if c.get("classname") == f"specreplay.gate.{name}" and c.find("skipped") is not None
    }
    assert set(need_truth) <= skipped
    for case in suite.findall("testcase"):
        if case.get("name") in need_truth:
            assert "no ground truth" in case.find("skipped").get("message")
    assert int(suite.get("skipped")) == len(list(suite.iter("skipped")))


def test_a_gate_with_ground_truth_says_everything_was_checked(tmp_path):
    junit, summary = tmp_path / "gate.xml", tmp_path / "summary.md"
    result = gate("--format", "json", "--junit", junit, "--github", env={"GITHUB_STEP_SUMMARY": str(summary)})
    doc = json.loads(result.output[result.output.index("{") :])
    assert all(r["unchecked"] == [] for r in doc["results"])
    assert "not checked" not in result.output and "no ground truth" not in summary.read_text()
    assert "no ground truth" not in junit.read_text()


def test_a_gate_without_ground_truth_says_which_checks_did_not_run(tmp_path, monkeypatch):
    from specreplay.replay.engines import run as engines_run
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import build_scenario
    from specreplay.traces.io import write_trace
    from tests.replay.check.truthless import without_ground_truth

    # The golden and each replay of it without ground truth, as on a live engine.
    record = engines_run.run_workload
    golden = without_ground_truth(record(build_scenario("reentry"), resolve("upstream", allow_import=False)))
    write_trace(golden, tmp_path / "reentry.parquet")
    monkeypatch.setattr(engines_run, "run_workload", lambda *a, **kw: without_ground_truth(record(*a, **kw)))
    doc = json.loads(gate(tmp_path / "reentry.parquet", "--format", "json").output)
    assert [(r["result"], r["unchecked"]) for r in doc["results"]] == [("pass", NEED_TRUTH)]
    junit, summary = tmp_path / "gate.xml", tmp_path / "summary.md"
    result = gate(
        tmp_path / "reentry.parquet",
        "--junit",
        junit,
        "--github",
        env={"GITHUB_STEP_SUMMARY": str(summary), "COLUMNS": "400"},
    )
    assert result.exit_code == 0, result.output
    assert_outputs_name_the_unchecked(result, junit, summary, "reentry.parquet")


@pytest.mark.vllm
def test_a_gate_on_the_live_engine_says_which_checks_did_not_run(live_reentry_trace, tmp_path):
    from specreplay.traces.io import write_trace

    golden = write_trace(live_reentry_trace, tmp_path / "live.parquet")
    junit, summary = tmp_path / "gate.xml", tmp_path / "summary.md"
    # --engine vllm reruns the golden's workload live (a recording golden otherwise reruns on its
    # recorded outcomes on the reference, with ground truth): the new trace, forced, has the
    # oracle's token ground truth and none for the KV cache.
    result = gate(
        golden,
        "--engine",
        "vllm",
        "--junit",
        junit,
        "--github",
        env={"GITHUB_STEP_SUMMARY": str(summary), "COLUMNS": "400"},
    )
    assert result.exit_code in (0, 1), result.output  # pass, or changed if the live engine's timing moved
    assert_outputs_name_the_unchecked(result, junit, summary, "live.parquet", FORCED_NOT_CHECKED, NEED_KV_TRUTH)
