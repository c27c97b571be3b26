"""The whole vLLM 0.34.0 engine live on a CPU, in 0.34.0's own environment (scripts/vllm-0.34.sh
test): its CUDA wheel on the CPU torch, with specreplay's stand-ins for the CPU build's compiled
ops (families/vllm/mrv2/cpu_ops.py) and Triton's interpreter for Model Runner V2's kernels
(families/vllm/mrv2/cpu_triton.py), forced by the oracle. Held: the runner differential against
the reference MRV2 with 0.34.0's rules, row for row, on the scenario set and seeded workloads; its
recordings replay step for step; a user's pause refuses new requests as vLLM does; the trace
names what ran and the patches; nothing sets VLLM_USE_V2_MODEL_RUNNER (0.34.0 refuses 0).

The sweep is sized to what it must show (a live 0.34 workload takes about 6 s here): the seven
scenarios and 12 seeds, which reach every kind of step below; 0.32.0's MRV2 differential runs 100
seeds in the main environment (tests/replay/workflows/test_runner_differential_v2.py).
"""

from __future__ import annotations

import pytest

from specreplay.replay.families.vllm.setup import installed_vllm_version
from specreplay.replay.workflows.runner_differential import differential_scenarios, runner_differential
from specreplay.traces.io import read_trace
from tests.replay.workflows.test_replay_recorded import assert_live_replays

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(installed_vllm_version() != "0.34.0", reason="vLLM 0.34.0's environment: scripts/vllm-0.34.sh"),
]

SEEDS = 12
MUST_REACH = {
    "async",
    "sync",
    "preemption",
    "chunked prefill",
    "budget skip",
    "re-entry",
    "abort",
    "max_tokens finish",
    "prefix-cache hit",
    "stale output",
    *(f"event {kind}" for kind in ("abort", "pause", "resume", "resubmit", "reset_prefix_cache", "stream_append")),
}


@pytest.fixture(scope="module")
def differential(tmp_path_factory):
    folder = tmp_path_factory.mktemp("differential-0.34")
    return folder, runner_differential("v2", count=SEEDS, output_dir=folder)


def test_the_whole_0_34_engine_is_the_reference_mrv2_row_for_row(differential):
    folder, report = differential
    assert report.vllm_version == "0.34.0" and len(report.cases) == len(differential_scenarios()) + SEEDS
    assert not [c.tag for c in report.cases if c.refused]
    assert not report.differing, [(c.tag, c.first) for c in report.differing]
    coverage = report.coverage()
    assert coverage["runner v2"] == len(report.cases)
    assert not MUST_REACH - set(coverage), MUST_REACH - set(coverage)

    live = read_trace(folder / "reentry.vllm.parquet")
    assert live.impl.models == "vllm 0.34.0" and live.config.vllm_version == "0.34.0"
    assert live.impl.runner.endswith("cpu.model_runner.CPUModelRunner") and live.impl.runner_family == "v2"
    from specreplay.replay.families.vllm.mrv2 import cpu_ops, cpu_triton

    assert {*cpu_ops.PATCHES, *cpu_triton.PATCHES} <= set(live.impl.patches)
    # The seed's re-entry: request 10 keeps its slot while skipped and verifies its own drafts.
    ten = {row["step"]: row for row in live.table.to_pylist() if row["request_id"] == "10"}
    assert ten[4]["sched_num_scheduled_tokens"] == 4 and ten[4]["sched_spec_len"] == 3
    assert ten[2]["sched_skip"] == "budget" and ten[1]["worker_slot"] == ten[4]["worker_slot"]


def test_its_live_recordings_replay_step_for_step(differential, tmp_path):
    folder, report = differential
    assert_live_replays({tag: folder / f"{tag}.vllm.parquet" for tag in report.scenarios}, tmp_path, "reference")


def test_nothing_sets_the_runner_variable_on_0_34():
    from specreplay.replay.engines.registry import runner_family
    from specreplay.replay.families.vllm.live import live_environment
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import reentry

    config = reentry().at_version("0.34.0").config
    env = live_environment(resolve("upstream", allow_import=False), config, "/tmp/x", True, runner_family("v2"))
    assert "VLLM_USE_V2_MODEL_RUNNER" not in env and env["TRITON_INTERPRET"] == "1"


def test_a_new_request_during_a_users_pause_is_refused_as_vllm_refuses_it(tmp_path):
    """Seed 17 pauses in abort mode and sends request 0 while paused: from 0.33.0 on a user's
    pause refuses it (engine_paused); the live driver does as a user's engine does, and the trace
    says so on the step it lands in, as the reference's does."""
    from specreplay.replay.workflows.runner_differential import compare_live

    case = compare_live("runner-17", "v2", output_dir=str(tmp_path))
    assert case.same, case.first
    live = read_trace(tmp_path / "runner-17.vllm.parquet")
    assert "0" not in set(live.table.column("request_id").to_pylist())
    assert any("rejected 0: engine_paused" in e for e in live.table.column("step_event").to_pylist() if e)
