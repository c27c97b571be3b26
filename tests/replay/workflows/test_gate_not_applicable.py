"""What ran is what was asked (issue 21), at the gate's level: the gate's `n/a`, its reports,
`--update`, the pytest plugin, and the gate's check of the classes a rerun's header says ran.
(`Implementation.why_not` and the classes a run picks: tests/replay/impls/test_applicability.py.)"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from specreplay.cli.gate_reports import github_annotations, junit_xml, markdown_summary, summary_line
from specreplay.cli.main import main
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.models.scheduler import Scheduler
from specreplay.replay.workflows.gate import (
    GateOptions,
    GateResult,
    RanOtherThanAsked,
    corpus_dir,
    gate_one,
    run_gate,
    update_goldens,
)
from specreplay.replay.workflows.pytest_plugin import GoldenNotApplicable, gate_or_fail
from specreplay.replay.workloads.scenarios import build_scenario


def sync_goldens(tmp_path):
    for name in ("reentry-sync.parquet", "random-24.parquet"):
        shutil.copy(corpus_dir() / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("name", ["sched-clear", "life-guard"])
def test_gate_marks_the_builtin_async_variants_na_on_sync_goldens(name):
    results = {r.path.rsplit("/", 1)[-1]: r for r in run_gate([corpus_dir()], GateOptions(impl=name), jobs=2)}
    na = {n for n, r in results.items() if r.result == "n/a"}
    assert na == {"reentry-sync.parquet", "random-24.parquet", "random-72.parquet"}
    for n in na:
        assert results[n].impl == name and "is an AsyncScheduler and the workload is synchronous" in results[n].message
        assert not results[n].failed() and not results[n].failed(allow_changed=True)
    assert all(r.result in ("pass", "changed") for n, r in results.items() if n not in na)


def test_reports_skip_na_as_a_notice():
    results = [
        GateResult("a/x.parquet", "n/a", impl="sched-clear", message="it does not apply; pass another"),
        GateResult("a/y.parquet", "pass", impl="sched-clear"),
    ]
    assert summary_line(results) == "2 traces, 1 pass, 0 fail, 0 changed, 0 error, 1 n/a (did not apply: nothing ran)"
    assert summary_line(results[1:]) == "1 traces, 1 pass, 0 fail, 0 changed, 0 error"
    suite = ET.fromstring(junit_xml(results).split("\n", 1)[1])
    case = next(c for c in suite.findall("testcase") if c.get("name") == "x.parquet")
    assert case.find("skipped").get("message") == "n/a: it does not apply; pass another"
    assert suite.get("skipped") == "1" and suite.get("failures") == "0" and suite.get("errors") == "0"
    assert github_annotations(results) == [
        "::notice file=a/x.parquet,title=specreplay gate%3A n/a::it does not apply; pass another"
    ]
    assert "| x.parquet | n/a | it does not apply; pass another |" in markdown_summary(results)


def test_update_leaves_a_golden_it_does_not_apply_to(tmp_path):
    goldens = sync_goldens(tmp_path)
    before = {p.name: p.read_bytes() for p in goldens.iterdir()}
    updates = update_goldens([goldens], GateOptions(impl="sched-clear"))
    assert {u.status for u in updates} == {"n/a"}
    assert {p.name: p.read_bytes() for p in goldens.iterdir()} == before
    result = CliRunner().invoke(main, ["gate", str(goldens), "--impl", "sched-clear", "--update"])
    assert result.exit_code == 0 and result.output.count("n/a     ") == 2, result.output


def test_pytest_plugin_skips_when_nothing_applies(tmp_path):
    with pytest.raises(pytest.skip.Exception, match="no golden applies to sched-clear"):
        gate_or_fail(impl="sched-clear", paths=[sync_goldens(tmp_path)])


def test_pytest_plugin_warns_of_the_na_goldens_beside_passing_ones(tmp_path):
    from specreplay.replay.engines.run import run_workload
    from specreplay.traces.io import write_trace

    goldens = sync_goldens(tmp_path)
    # An async golden sched-clear passes: its own recording (the shipped async goldens are
    # upstream's, whose announce rows keep a finished request's stale placeholders: sched-clear's clear them).
    own = run_workload(build_scenario("random", 23), resolve("sched-clear", allow_import=False))
    write_trace(own, goldens / "random-23.parquet")
    with pytest.warns(GoldenNotApplicable, match="reentry-sync.parquet: n/a"):
        results = gate_or_fail(impl="sched-clear", paths=[goldens])
    assert sorted(r.result for r in results) == ["n/a", "n/a", "pass"]


class Swapped(Implementation):
    """A stand-in in the wiring: asks for Quietly, builds the plain Scheduler (what the old silent
    swap did). The gate must not report it as a pass of Quietly."""

    def __init__(self, name="swapped", description="", **kwargs):
        super().__init__(name, description, **{"scheduler": Quietly, **kwargs})

    def make_scheduler(self, config):
        return Scheduler(config)


class Quietly(Scheduler):
    """A sync scheduler that changes nothing."""


def test_gate_stops_when_a_rerun_ran_other_classes_than_asked(tmp_path):
    golden = str(sync_goldens(tmp_path) / "reentry-sync.parquet")
    spec = f"{__name__}:Swapped"
    with pytest.raises(RanOtherThanAsked, match="asked tests.replay.workflows.test_gate_not_applicable.Quietly"):
        gate_one(golden, GateOptions(impl=spec))
    result = CliRunner().invoke(main, ["gate", golden, "--impl", spec])
    assert result.exit_code == 3 and "RanOtherThanAsked" in result.output and "a specreplay bug" in result.output


@pytest.mark.vllm
def test_a_real_scheduler_rerun_is_held_to_the_variants_real_form():
    """On --engine vllm-scheduler the header names the variant's subclass of vLLM's class, as asked."""
    from specreplay.replay.families.vllm.setup import real_scheduler_class

    result = gate_one(str(corpus_dir() / "reentry.parquet"), GateOptions(impl="sched-clear", engine="vllm-scheduler"))
    assert result.result == "changed", result.message  # ran, and cleared the stale placeholders
    asked = resolve("sched-clear", allow_import=False).expected(
        build_scenario("reentry").config, real_scheduler_class(True)
    )
    assert asked["scheduler"].endswith("ClearStalePlaceholders(AsyncScheduler)")
    sync = gate_one(
        str(corpus_dir() / "reentry-sync.parquet"), GateOptions(impl="sched-clear", engine="vllm-scheduler")
    )
    assert sync.result == "n/a"
