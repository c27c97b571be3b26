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
