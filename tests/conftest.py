"""Shared fixtures: recorded reentry traces per implementation (recorded once per session)."""

from __future__ import annotations

import pytest

from specreplay.replay.engine import run_workload
from specreplay.replay.impls import resolve
from specreplay.replay.scenarios import build_scenario


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def reentry_traces():
    workload = build_scenario("reentry")
    return {name: run_workload(workload, resolve(name, allow_import=False))
            for name in ("upstream", "pr30796", "pr30796-copy", "sched-clear", "noclamp")}
