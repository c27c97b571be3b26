"""What ran is what was asked (issue 21), at the registry's level: `Implementation.why_not`, no
silent stand-in on any engine's class picking, and the header naming the classes that ran.
(The gate's `n/a` built on it: tests/replay/workflows/test_gate_not_applicable.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specreplay.replay.engines.registry import engine
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.v1.runner import GPUModelRunner
from specreplay.replay.impls.registry import Implementation, NotApplicable, resolve
from specreplay.replay.models.scheduler import AsyncScheduler
from specreplay.replay.workflows.gate import GateOptions, corpus_dir, gate_one
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.scenarios import build_scenario

SYNC = EngineConfig(async_scheduling=False)
ASYNC = EngineConfig(async_scheduling=True)
NO_DRAFTS = EngineConfig(num_spec_tokens=0)


def builtin(name: str) -> Implementation:
    return resolve(name, allow_import=False)


@pytest.mark.parametrize("name", ["sched-clear", "life-guard"])
def test_async_scheduler_variants_do_not_apply_to_sync_workloads(name):
    reason = builtin(name).why_not(SYNC)
    assert "is an AsyncScheduler and the workload is synchronous; pass an async workload" in reason
    assert "subclass" not in reason  # a built-in: nothing for the user to subclass
    assert builtin(name).why_not(ASYNC) is None
    # Decided once per run, by the engine's entry, before anything is built: never the plain
    # Scheduler in its place, nor vLLM's.
    for entry in ("reference", "vllm-scheduler"):
        with pytest.raises(NotApplicable, match=f"{name} does not apply to the workload"):
            engine(entry).refuse(builtin(name), SYNC)
    with pytest.raises(NotApplicable, match=f"{name} does not apply to workload 'reentry-sync'"):
        run_workload(build_scenario("reentry-sync"), builtin(name))


@pytest.mark.parametrize("name", ["pr30796", "pr30796-copy", "noclamp"])
def test_draft_slot_runner_variants_need_draft_slots(name):
    reason = builtin(name).why_not(NO_DRAFTS)
    assert "the workload books no draft slots (num_spec_tokens = 0); pass a workload with num_spec_tokens > 0" in reason
    assert builtin(name).why_not(SYNC) is None and builtin(name).why_not(ASYNC) is None
    workload = build_scenario("reentry", 0)
    workload = replace(workload, config=replace(workload.config, num_spec_tokens=0))
    with pytest.raises(NotApplicable, match="workload 'reentry'"):
        run_workload(workload, builtin(name))


def test_upstream_applies_everywhere():
    for config in (SYNC, ASYNC, NO_DRAFTS, replace(NO_DRAFTS, async_scheduling=False)):
        assert builtin("upstream").why_not(config) is None


class OnlyBigBatches(GPUModelRunner):
    """A user runner that declares where it applies."""

    @classmethod
    def why_not(cls, config):
        if config.max_num_batched_tokens < 100:
            return "OnlyBigBatches needs a budget of 100 tokens or more; pass a workload with one"
        return None


def test_a_user_class_declares_its_own_applicability():
    impl = Implementation("mine", "user runner", runner=OnlyBigBatches, user_code=True)
    assert impl.why_not(replace(ASYNC, max_num_batched_tokens=40)).startswith("OnlyBigBatches needs")
    assert impl.why_not(replace(ASYNC, max_num_batched_tokens=400)) is None
    with pytest.raises(NotApplicable, match="OnlyBigBatches needs a budget"):
        run_workload(build_scenario("reentry", 0), impl)  # budget 40


def test_the_header_names_the_classes_that_ran():
    workload = build_scenario("reentry-sync", 0)
    trace = run_workload(workload, builtin("pr30796-copy"))
    assert trace.impl.scheduler == "specreplay.replay.models.scheduler.Scheduler"
    assert trace.impl.runner == "specreplay.replay.families.vllm.variants.DropReentryDraftsRunner"
    assert trace.impl.executor == "multiproc"
    assert trace.impl.models == f"specreplay reference of vllm {workload.config.vllm_version}"
    assert builtin("pr30796-copy").expected(workload.config) == {
        key: getattr(trace.impl, key) for key in ("scheduler", "runner", "executor")
    }


def test_an_async_user_scheduler_on_async_goldens_is_what_ran():
    impl = Implementation("mine", "user", scheduler=type("Mine", (AsyncScheduler,), {}), user_code=True)
    result = gate_one(str(corpus_dir() / "reentry.parquet"), GateOptions(impl="upstream"))
    assert result.result == "pass"
    assert impl.why_not(ASYNC) is None and "Mine is an AsyncScheduler" in impl.why_not(SYNC)
    assert "subclass Scheduler for synchronous workloads" in impl.why_not(SYNC)
