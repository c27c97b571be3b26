"""specreplay's public API for implementation authors: what a variant subclasses and receives.

Where it sits: workloads -> models -> **impls** -> observers -> engines -> traces -> check ->
workflows -> views -> cli; the public face of the first three, for code outside specreplay (and the
built-in variants, written as a user's would be). docs/implementations.md documents every name here
and its hook tables name these paths; tests/replay/impls/test_public_api.py imports every name those
tables mention and holds each hook's signature. Anything a variant reaches by another path, or by a
name starting with `_` that is not listed below, is internal and may change.

    from specreplay.replay.api import AsyncScheduler, SchedulerOutput

The hook tables are version API_VERSION ("0.3"). An implementation is checked when it is
loaded, before anything runs (impls/hook_api.py): a hook written in a previous form still runs,
through an adapter, with one HookDeprecationWarning naming the new form and the version that
removes the old one; any other mismatch is one line and exit 2. CHANGELOG.md lists every change.

What a variant subclasses:
    Scheduler, AsyncScheduler       the reference schedulers (vLLM's sync and async scheduler)
    GPUModelRunner                  the reference runner (vLLM's V1 GPUModelRunner)
    SglangReferenceWorker           the reference SGLang worker (--engine sglang-scheduler)
    Implementation                  a scheduler + runner + executor pairing, with real-vLLM forms
    LifeGuardScheduler, ClearStalePlaceholdersScheduler, DropReentryDraftsRunner, NoClampRunner
                                    the built-in variants (life-guard, sched-clear, pr30796, noclamp)
What its hooks receive and return:
    SchedulerOutput, NewRequestData, CachedRequestData, ModelRunnerOutput    the messages
    Request, Status, StreamingUpdate, StepPlan, BlockPool, Release      scheduler side
    CachedRequestState, InputBatch, PreparedInputs                           runner side
    EngineConfig, Oracle            the run's configuration and the tokens a correct engine emits
    EngineCrash, NegativeInputIdError, MalformedSchedulerOutput              what a hook raises
                                    for something the real engine would die on
    PAUSE_STATES                    the values `set_pause_state` takes
    API_VERSION, HookDeprecationWarning    the hook tables' version; the warning an old form gets
The hooks and the state, by name (the docs' tables list the same; a test holds them equal):
    SCHEDULER_HOOKS, RUNNER_HOOKS, IMPLEMENTATION_HOOKS, SGLANG_WORKER_HOOKS, SCHEDULER_STATE,
    RUNNER_STATE

Names resolve when first used (PEP 562), so importing this module loads neither torch nor the
models: the built-in variants in impls/ import it without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers and the package map (tests/test_architecture.py)
    from specreplay.replay.families.sglang.worker import SglangReferenceWorker
    from specreplay.replay.families.vllm.v1.input_batch import CachedRequestState, InputBatch
    from specreplay.replay.families.vllm.v1.runner import (
        GPUModelRunner,
        MalformedSchedulerOutput,
        NegativeInputIdError,
        PreparedInputs,
    )
    from specreplay.replay.families.vllm.variants import (
        ClearStalePlaceholdersScheduler,
        DropReentryDraftsRunner,
        LifeGuardScheduler,
        NoClampRunner,
    )
    from specreplay.replay.impls.hook_api import API_VERSION, HookDeprecationWarning
    from specreplay.replay.impls.registry import Implementation
    from specreplay.replay.models.kv import BlockPool
    from specreplay.replay.models.messages import (
        CachedRequestData,
        EngineCrash,
        ModelRunnerOutput,
        NewRequestData,
        SchedulerOutput,
    )
    from specreplay.replay.models.releases import Release
    from specreplay.replay.models.request import Request, Status
    from specreplay.replay.models.scheduler import PAUSE_STATES, AsyncScheduler, Scheduler, StepPlan, StreamingUpdate
    from specreplay.replay.workloads.config import EngineConfig
    from specreplay.replay.workloads.oracle import Oracle

#: public name -> the module that defines it.
_HOME = {
    "Scheduler": "specreplay.replay.models.scheduler",
    "AsyncScheduler": "specreplay.replay.models.scheduler",
    "StepPlan": "specreplay.replay.models.scheduler",
    "StreamingUpdate": "specreplay.replay.models.scheduler",
    "PAUSE_STATES": "specreplay.replay.models.scheduler",
    "GPUModelRunner": "specreplay.replay.families.vllm.v1.runner",
    "PreparedInputs": "specreplay.replay.families.vllm.v1.runner",
    "NegativeInputIdError": "specreplay.replay.families.vllm.v1.runner",
    "MalformedSchedulerOutput": "specreplay.replay.families.vllm.v1.runner",
    "CachedRequestState": "specreplay.replay.families.vllm.v1.input_batch",
    "InputBatch": "specreplay.replay.families.vllm.v1.input_batch",
    "SchedulerOutput": "specreplay.replay.models.messages",
    "NewRequestData": "specreplay.replay.models.messages",
    "CachedRequestData": "specreplay.replay.models.messages",
    "ModelRunnerOutput": "specreplay.replay.models.messages",
    "EngineCrash": "specreplay.replay.models.messages",
    "Request": "specreplay.replay.models.request",
    "Status": "specreplay.replay.models.request",
    "BlockPool": "specreplay.replay.models.kv",
    "Release": "specreplay.replay.models.releases",
    "Implementation": "specreplay.replay.impls.registry",
    "API_VERSION": "specreplay.replay.impls.hook_api",
    "HookDeprecationWarning": "specreplay.replay.impls.hook_api",
    "LifeGuardScheduler": "specreplay.replay.families.vllm.variants",
    "ClearStalePlaceholdersScheduler": "specreplay.replay.families.vllm.variants",
    "DropReentryDraftsRunner": "specreplay.replay.families.vllm.variants",
    "NoClampRunner": "specreplay.replay.families.vllm.variants",
    "EngineConfig": "specreplay.replay.workloads.config",
    "Oracle": "specreplay.replay.workloads.oracle",
    "SglangReferenceWorker": "specreplay.replay.families.sglang.worker",
}

#: Scheduler hooks, in the order a step uses them, then the control events (engine-facing, vLLM's
#: names). `account_placeholders` is AsyncScheduler's; every other one is on Scheduler.
SCHEDULER_HOOKS = (
    "schedule_running",
    "running_demand",
    "allocate_or_preempt",
    "preempt_request",
    "free_blocks",
    "charge_budget",
    "assign_draft_slots",
    "admit_waiting",
    "update_after_schedule",
    "update_from_output",
    "request_for_output",
    "take_output",
    "discard_output",
    "account_rejections",
    "append_output",
    "account_placeholders",
    "cache_applied",
    "update_draft_token_ids",
    "add_request",
    "finish_requests",
    "set_pause_state",
    "reset_prefix_cache",
    "handle_stopped_request",
    "update_request_as_session",
)
#: Runner hooks, in the order a step uses them (`_prepare_inputs` keeps vLLM's name).
RUNNER_HOOKS = (
    "remove_finished",
    "remove_unscheduled",
    "add_new_request",
    "update_streaming_request",
    "update_cached_request",
    "readd_request",
    "on_reentry",
    "trim_outputs",
    "write_spec_ids",
    "write_readded_spec_ids",
    "load_kv",
    "apply_deferred_corrections",
    "_prepare_inputs",
    "discarded_rows",
    "scatter_prev_sampled",
    "write_kv",
    "commit_kv",
    "rejection_sample",
    "propose_drafts",
    "bookkeeping",
)
#: The engine hook and the applicability question on `Implementation`.
IMPLEMENTATION_HOOKS = ("deliver", "why_not")
#: The reference SGLang worker's hooks (`--engine sglang-scheduler`): one per forward kind SGLang's
#: scheduler runs, then the draft model's proposal.
SGLANG_WORKER_HOOKS = ("extend", "decode", "verify", "propose")
#: The scheduler's state a hook may read and change (vLLM's names where vLLM has them).
SCHEDULER_STATE = (
    "config",
    "release",
    "k",
    "requests",
    "running",
    "waiting",
    "kv_holding",
    "kv",
    "step",
    "pause_state",
    "finished_req_ids",
    "preempted_req_ids",
)
#: The runner's state a hook may read and change (vLLM's names: `input_batch`, not `batch`).
RUNNER_STATE = (
    "config",
    "oracle",
    "k",
    "use_async_scheduling",
    "clamps_negative_ids",
    "requests",
    "input_batch",
    "prev_sampled_token_ids",
    "_draft_token_ids",
    "valid_sampled_token_count_cpu",
)

#: Every public name (the lazily resolved ones are `_HOME`'s keys; a test holds the two equal).
__all__ = [
    "API_VERSION",
    "AsyncScheduler",
    "ClearStalePlaceholdersScheduler",
    "DropReentryDraftsRunner",
    "HookDeprecationWarning",
    "LifeGuardScheduler",
    "NoClampRunner",
    "BlockPool",
    "CachedRequestData",
    "CachedRequestState",
    "EngineConfig",
    "EngineCrash",
    "GPUModelRunner",
    "IMPLEMENTATION_HOOKS",
    "Implementation",
    "InputBatch",
    "MalformedSchedulerOutput",
    "ModelRunnerOutput",
    "NegativeInputIdError",
    "NewRequestData",
    "Oracle",
    "PAUSE_STATES",
    "PreparedInputs",
    "RUNNER_HOOKS",
    "RUNNER_STATE",
    "SGLANG_WORKER_HOOKS",
    "SglangReferenceWorker",
    "Request",
    "SCHEDULER_HOOKS",
    "SCHEDULER_STATE",
    "Scheduler",
    "SchedulerOutput",
    "Status",
    "StepPlan",
    "StreamingUpdate",
    "Release",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
