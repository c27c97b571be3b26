"""A run's outcome is built in one place (engines/outcome.py) for every way a run ends; compared as
the trace stores it (`Outcome.to_dict`, the metadata written)."""

from __future__ import annotations

from specreplay.replay.engines.outcome import run_outcome
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario


def test_each_ending_has_its_outcome():
    assert run_outcome(12).to_dict() == {"status": "completed"}
    assert run_outcome(12, unfinished=["b", "a"]).to_dict() == {
        "status": "completed",
        "step": 12,
        "unfinished": ["b", "a"],
    }
    assert run_outcome(12, cut=True, unfinished=["a"]).to_dict() == {"status": "step_limit", "step": 12}
    crash = {"kind": "scheduler-assert", "message": "AssertionError: x"}
    assert run_outcome(3, crash=crash, cut=True).to_dict() == {"status": "crashed", "step": 3, **crash}
    assert run_outcome(9, partial="x" * 600).to_dict() == {"status": "partial", "step": 9, "message": "x" * 500}


def test_a_run_cut_by_its_step_limit_says_so_and_a_whole_one_completes():
    from dataclasses import replace

    upstream = resolve("upstream", allow_import=False)
    whole = run_workload(build_scenario("reentry"), upstream)
    assert whole.outcome.to_dict() == {"status": "completed"}
    cut = run_workload(replace(build_scenario("reentry"), max_steps=5), upstream)
    assert cut.outcome.to_dict() == {"status": "step_limit", "step": 5}
