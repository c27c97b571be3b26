"""--device cuda gives the same trace as --device cpu (needs a GPU; skipped without CUDA)."""

from __future__ import annotations

import pytest

from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario


@pytest.mark.gpu
@pytest.mark.parametrize("scenario, seed", [("reentry", 0), ("random", 1), ("random", 4)])
def test_cuda_trace_equals_cpu_trace(scenario, seed):
    workload = build_scenario(scenario, seed)
    for name in ("upstream", "pr30796", "sched-clear"):
        cpu = run_workload(workload, resolve(name, allow_import=False), device="cpu")
        gpu = run_workload(workload, resolve(name, allow_import=False), device="cuda")
        assert cpu.content_equals(gpu), name


@pytest.mark.gpu
@pytest.mark.parametrize("scenario, seed", [("reentry", 0), ("reentry-sync", 0), ("random", 1), ("random", 4)])
def test_reference_mrv2_on_cuda_equals_cpu(scenario, seed):
    """The reference Model Runner V2 (runner v2) on CUDA: byte-equal to its CPU trace."""
    workload = build_scenario(scenario, seed)
    for name in ("upstream", "sched-clear"):
        cpu = run_workload(workload, resolve(name, allow_import=False), device="cpu", runner="v2")
        gpu = run_workload(workload, resolve(name, allow_import=False), device="cuda", runner="v2")
        assert cpu.content_equals(gpu), name


@pytest.mark.gpu
def test_an_mrv2_recording_replays_on_cuda_as_on_cpu(tmp_path):
    from pathlib import Path

    from specreplay.replay.workflows.record import replay_to

    recording = Path(__file__).parents[1] / "workflows" / "data" / "preempt-mrv2.parquet"
    cpu = replay_to(tmp_path / "cpu.parquet", recording, device="cpu").trace
    gpu = replay_to(tmp_path / "gpu.parquet", recording, device="cuda").trace
    assert cpu.content_equals(gpu)
