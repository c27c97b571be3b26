"""What ran is what was asked (issue 21), run as a user runs it: a scheduler of one's own in a
module of the working directory, through the installed `specreplay` console script.

An implementation that does not apply to a workload (an AsyncScheduler subclass on a synchronous
workload, a Scheduler subclass on an asynchronous one) is never replaced by the plain reference
scheduler: record, replay and compare refuse it in one line (exit 2), the gate reports the golden
`n/a` with the reason. Every trace names the classes that ran, and `info` shows them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specreplay.replay.workflows.gate import corpus_dir

SCRIPT = Path(sys.executable).parent / "specreplay"
pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="the specreplay console script is not installed")

MINE = '''
from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler


class Loud(AsyncScheduler):
    """An async scheduler that raises: if it ran, the run crashed."""

    def schedule(self):
        raise RuntimeError("Loud ran")


class Quiet(Scheduler):
    """A synchronous scheduler that changes nothing."""
'''

SYNC_GOLDENS = {"reentry-sync.parquet", "random-24.parquet", "random-72.parquet"}


def specreplay(cwd: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=600, env=_env()
    )


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}


@pytest.fixture
def here(tmp_path) -> Path:
    (tmp_path / "mine.py").write_text(MINE)
    return tmp_path


def corpus() -> set[str]:
    return {p.name for p in corpus_dir().glob("*.parquet")}


def test_record_refuses_an_async_scheduler_on_a_sync_workload_in_one_line(here):
    done = specreplay(here, "record", "--scenario", "reentry-sync", "--impl", "mine:Loud", "-o", "t.parquet")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    line = done.stderr
    assert "mine:Loud does not apply to workload 'reentry-sync'" in line
    assert "Loud is an AsyncScheduler and the workload is synchronous" in line
    assert "subclass Scheduler for synchronous workloads, or pass an async workload" in line
    assert "check: ok" not in line and not (here / "t.parquet").exists() and not (here / "t.parquet.partial").exists()


def test_record_refuses_a_sync_scheduler_on_an_async_workload(here):
    done = specreplay(here, "record", "--scenario", "reentry", "--impl", "mine:Quiet", "-o", "t.parquet")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "Quiet is a synchronous Scheduler and the workload uses async scheduling" in done.stderr
    assert "subclass AsyncScheduler for async workloads, or pass a synchronous workload" in done.stderr


def test_replay_and_compare_refuse_too(here):
    replay = specreplay(here, "replay", corpus_dir() / "reentry-sync.parquet", "--impl", "mine:Loud", "-o", "r.parquet")
    assert replay.returncode == 2 and "does not apply" in replay.stderr, replay.stderr
    assert not (here / "r.parquet").exists()
    # The default list holds sched-clear, an AsyncScheduler variant: refused before anything is recorded.
    compare = specreplay(here, "compare", "--scenario", "reentry-sync", "-o", "out")
    assert compare.returncode == 2 and len(compare.stderr.splitlines()) == 1, compare.stderr
    assert "sched-clear does not apply to workload 'reentry-sync'" in compare.stderr
    assert "--impls upstream,pr30796,pr30796-copy apply" in compare.stderr
    assert not (here / "out").exists() or not list((here / "out").iterdir())


def test_a_scheduler_that_applies_is_the_one_that_ran_and_info_shows_it(here):
    done = specreplay(here, "record", "--scenario", "reentry-sync", "--impl", "mine:Quiet", "-o", "q.parquet")
    assert done.returncode == 0, done.stderr
    info = json.loads(specreplay(here, "info", "q.parquet", "--format", "json").stdout)
    assert info["impl"]["scheduler"] == "mine.Quiet"
    assert info["impl"]["runner"] == "specreplay.replay.families.vllm.v1.runner.GPUModelRunner"
    assert info["impl"]["executor"] == "inproc"
    assert info["impl"]["models"] == "specreplay reference of vllm 0.32.0"
    text = specreplay(here, "info", "q.parquet").stdout
    assert (
        "ran: scheduler mine.Quiet, runner specreplay.replay.families.vllm.v1.runner.GPUModelRunner, executor inproc"
        in text
    )


def test_a_builtin_runner_variant_is_named_by_its_class(here):
    done = specreplay(here, "record", "--scenario", "reentry", "--impl", "pr30796-copy", "-o", "p.parquet")
    assert done.returncode in (0, 1), done.stderr
    impl = json.loads(specreplay(here, "info", "p.parquet", "--format", "json").stdout)["impl"]
    assert impl["runner"] == "specreplay.replay.families.vllm.variants.DropReentryDraftsRunner"
    assert impl["scheduler"] == "specreplay.replay.models.scheduler.AsyncScheduler"
    assert impl["executor"] == "multiproc"


def test_gate_reports_the_sync_goldens_na_and_runs_the_async_ones(here):
    done = specreplay(here, "gate", "--impl", "mine:Loud", "--format", "json", "--junit", "gate.xml", "--jobs", "2")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    by_name = {Path(r["path"]).name: r for r in doc["results"]}
    assert {n for n, r in by_name.items() if r["result"] == "n/a"} == SYNC_GOLDENS
    for name in SYNC_GOLDENS:
        assert by_name[name]["message"].startswith("Loud is an AsyncScheduler and the workload is synchronous")
        assert not by_name[name]["findings"]
    for name in corpus() - SYNC_GOLDENS:  # Loud ran there: the engine died in its schedule()
        assert by_name[name]["result"] == "fail" and "Loud ran" in by_name[name]["message"], by_name[name]
    assert doc["counts"]["n/a"] == 3 and doc["counts"]["pass"] == 0
    cases = {c.get("name"): c for c in ET.parse(here / "gate.xml").getroot().findall("testcase")}
    for name in SYNC_GOLDENS:
        skipped = cases[name].find("skipped")
        assert skipped is not None and "AsyncScheduler" in skipped.get("message")
        assert cases[name].find("failure") is None


def test_gate_table_counts_na_apart_and_github_says_notice(here):
    done = specreplay(here, "gate", "--impl", "mine:Loud", "--github")
    assert done.returncode == 1
    assert "11 traces, 0 pass, 8 fail, 0 changed, 0 error, 3 n/a" in done.stdout
    notices = [line for line in done.stdout.splitlines() if "title=specreplay gate%3A n/a" in line]
    assert len(notices) == 3 and all(line.startswith("::notice ") for line in notices)


def test_a_sync_only_scheduler_gets_the_async_goldens_na(here):
    done = specreplay(here, "gate", "--impl", "mine:Quiet", "--format", "json", "--jobs", "2")
    doc = json.loads(done.stdout)
    by_name = {Path(r["path"]).name: r["result"] for r in doc["results"]}
    assert {n for n, r in by_name.items() if r != "n/a"} == SYNC_GOLDENS
    assert all(by_name[n] == "pass" for n in SYNC_GOLDENS)
    assert done.returncode == 0, done.stderr  # what applied passed; the rest ran nothing and fail nothing


def test_gate_exits_1_when_nothing_applies(here):
    goldens = here / "goldens"
    goldens.mkdir()
    for name in ("reentry-sync.parquet", "random-24.parquet"):
        shutil.copy(corpus_dir() / name, goldens / name)
    done = specreplay(here, "gate", "goldens", "--impl", "mine:Loud")
    assert done.returncode == 1
    assert "2 traces, 0 pass, 0 fail, 0 changed, 0 error, 2 n/a" in done.stdout
    assert done.stderr.strip() == "error: no golden applies to mine:Loud: nothing ran (see the n/a reasons)"


@pytest.mark.vllm
def test_a_live_trace_names_the_classes_vllms_processes_ran(live_reentry_trace):
    """The plugin writes the classes it found (a variant's subclass in place) into the run's
    parts; the header names them, not a generic "GPUModelRunner (live)"."""
    impl = live_reentry_trace.impl
    assert impl.scheduler == "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
    # CPUModelRunner on these machines, GPUModelRunner on a GPU: vLLM's own, by module and name.
    assert impl.runner.startswith("vllm.v1.worker.") and impl.runner.endswith("ModelRunner"), impl.runner
