"""explore -> shrink -> regression test: found from random workloads with no hint, cut to a few
requests and steps, turned into a pytest that fails on the bug and passes on the fix; the same
findings inline, with --jobs 2 and on a local Ray cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.traces.io import read_trace

BUDGET = 400  # workloads; about 5 s on a 2-core machine


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def summary(folder) -> dict:
    doc = json.loads((folder / "explore.json").read_text())
    doc.pop("seconds")
    return doc


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    folder = tmp_path_factory.mktemp("found")
    result = run("explore", "--impl", "pr30796", "--budget", BUDGET, "-o", folder)
    assert result.exit_code == 1, result.output  # error-level findings
    return folder


def test_explore_finds_the_pr30796_divergence_from_random_workloads(found):
    errors = {code for code, f in summary(found)["findings"].items() if f["severity"] == "error"}
    assert "X10-scheduler-output-mutated" in errors
    trace = read_trace(found / "X10-scheduler-output-mutated.parquet")  # the saved trace reproduces it
    assert "X10-scheduler-output-mutated" in {f.code for f in check_trace(trace)}
    assert trace.workload.name.startswith(
        f"explore-{summary(found)['findings']['X10-scheduler-output-mutated']['seed']}-"
    )


def test_shrink_cuts_it_to_a_few_requests_and_steps_and_emits_a_regression_test(found, tmp_path):
    minimal, test_file = tmp_path / "min.parquet", tmp_path / "test_min.py"
    result = run(
        "shrink",
        found / "X10-scheduler-output-mutated.parquet",
        "--code",
        "X10-scheduler-output-mutated",
        "-o",
        minimal,
        "--emit-pytest",
        test_file,
    )
    assert result.exit_code == 0, result.output
    trace = read_trace(minimal)
    assert len(trace.workload.requests) <= 3 and trace.num_steps <= 10, result.output
    assert "X10-scheduler-output-mutated" in {f.code for f in check_trace(trace)}

    def pytest_on(impl: str) -> int:
        env = {**os.environ, "SPECREPLAY_IMPL": impl}
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        ).returncode

    assert pytest_on("pr30796") == 1  # the bug: the emitted test fails
    assert pytest_on("sched-clear") == 0  # the fix: it passes
    again = tmp_path / "again.parquet"
    assert (
        run(
            "shrink",
            found / "X10-scheduler-output-mutated.parquet",
            "--code",
            "X10-scheduler-output-mutated",
            "-o",
            again,
        ).exit_code
        == 0
    )
    assert read_trace(again).content_equals(trace)  # deterministic


def test_explore_on_upstream_finds_the_draft_provenance_warning_and_errors_only_under_control_events(tmp_path):
    result = run("explore", "--impl", "upstream", "--budget", BUDGET, "-o", tmp_path)
    findings = summary(tmp_path)["findings"]
    assert "S5-draft-provenance" in findings
    assert summary(tmp_path)["coverage"]["reentry"] > 0
    # vLLM 0.32.0's own failures under control events (README, "Control events"): a resubmitted
    # id given its previous life's output (the engine asserts), a lost streaming session, and
    # the runner's correction repeated after a pause that kept the batch; since the search draws
    # synchronous workloads outside the sync profile too, a streaming session's next turn in
    # sync mode whose KV and token go wrong (K1, T1; 1 request, 3 steps once shrunk): the KV truth
    # reads the kept positions back against the new turn's tokens, so the old turn's token left
    # where the chunk begins is not valid KV, and the scheduler and worker run on past it (S3,
    # X2-worker-kv-position, at the turn's first step). With prefix caching (vLLM's default) a
    # resubmitted id finds its aborted life's blocks cached and is admitted at once, so the old
    # life's output in flight lands on the new life without the assert: L1, then its counts (L3,
    # S2); the real 0.32.0 scheduler does the same, step for step. Nothing without events.
    errors = {code: f for code, f in findings.items() if f["severity"] == "error"}
    assert result.exit_code == (1 if errors else 0), result.output
    assert set(errors) <= {
        "E1-engine-crash",
        "E2-run-incomplete",
        "L1-output-life",
        "L3-in-flight-tokens",
        "S2-placeholder-count",
        "K1-kv-content",
        "S3-scheduler-computed-tokens",
        "T1-wrong-token",
        "X2-sched-worker-computed",
        "X2-worker-kv-position",
        "X2-worker-position-mismatch",
    }
    assert all("events" in f["profiles"] for f in errors.values())


def test_jobs_do_not_change_the_findings(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert run("explore", "--impl", "pr30796", "--budget", 128, "--jobs", 1, "-o", one).exit_code in (0, 1)
    assert run("explore", "--impl", "pr30796", "--budget", 128, "--jobs", 2, "-o", two).exit_code in (0, 1)
    assert summary(one) == summary(two) and summary(one)["findings"]
    for code in summary(one)["findings"]:
        assert read_trace(one / f"{code}.parquet").content_equals(read_trace(two / f"{code}.parquet"))


@pytest.mark.ray
def test_the_ray_local_backend_finds_the_same(tmp_path):
    one, ray = tmp_path / "one", tmp_path / "ray"
    assert run("explore", "--impl", "pr30796", "--budget", 128, "-o", one).exit_code in (0, 1)
    result = run("explore", "--impl", "pr30796", "--budget", 128, "--ray", "local", "-o", ray)
    assert result.exit_code in (0, 1), result.output
    assert summary(one) == summary(ray)


def test_bad_input_is_one_line(tmp_path, found):
    clean = tmp_path / "clean.parquet"
    assert run("record", "--scenario", "reentry", "--impl", "sched-clear", "-o", clean).exit_code == 0
    result = run("shrink", clean, "-o", tmp_path / "m.parquet")
    assert result.exit_code == 2 and "no finding to shrink" in result.output
    fired = {f.code for f in check_trace(read_trace(found / "X10-scheduler-output-mutated.parquet"))}
    quiet = next(c for c in ("E2-run-incomplete", "S9-step-past-max-tokens", "K4-kv-write-unowned") if c not in fired)
    result = run(
        "shrink",
        found / "X10-scheduler-output-mutated.parquet",
        "--code",
        quiet,
        "-o",
        tmp_path / "m.parquet",
    )
    assert result.exit_code == 2 and "does not fire" in result.output
    result = run(
        "shrink", found / "X10-scheduler-output-mutated.parquet", "--code", "X99", "-o", tmp_path / "m.parquet"
    )
    assert result.exit_code == 2 and "not a finding code" in result.output
    assert run("explore", "--impl", "nope", "-o", tmp_path / "x").exit_code == 2
    import sys as _sys

    (tmp_path / "brokenimpl.py").write_text(
        "from specreplay.replay.models.scheduler import AsyncScheduler\n"
        "class Broken(AsyncScheduler):\n"
        "    def schedule(self):\n"
        "        raise ValueError('broken')\n"
    )
    _sys.path.insert(0, str(tmp_path))
    try:
        result = run("explore", "--impl", "brokenimpl:Broken", "--budget", 8, "-o", tmp_path / "y")
    finally:
        _sys.path.remove(str(tmp_path))
    # Its exception kills the engine in every workload, as in vLLM: the finding is E1.
    assert result.exit_code == 1 and "E1-engine-crash" in result.output, result.output
    assert run("explore", "--jobs", 2, "--ray", "local", "-o", tmp_path / "x").exit_code == 2


def test_a_second_explore_into_the_same_folder_leaves_no_stale_traces(found, tmp_path):
    import shutil

    folder = tmp_path / "again"
    shutil.copytree(found, folder)
    assert run("explore", "--impl", "sched-clear", "--budget", 16, "-o", folder).exit_code == 0
    left = {p.stem for p in folder.glob("*.parquet")}
    assert left == set(summary(folder)["findings"])
