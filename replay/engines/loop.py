"""The engine loop: schedule, execute, apply, record both views, with one or two batches in flight.

Where it sits: **record** -> traces -> replay -> diff. `run_workload` drives an implementation
through a workload exactly in the order of vLLM's `step_with_batch_queue` (reference section 2):
schedule(m), execute + sample(m) on the worker, then pop the oldest batch, apply aborts, and
`update_from_output` it. With async scheduling the queue holds two batches, so schedule(m)
sees the outputs of steps <= m-2 only; in sync mode it holds one and drafts flow back through
`update_draft_token_ids`.

Control events (workload `[[events]]`) land where vLLM's EngineCoreProc takes them: with the
input queue before schedule(m), after that step's arrivals, or (aborts only) just before the
oldest batch is applied. While paused the loop does what vLLM's does: no schedule() while the
scheduler has nothing it may schedule, the batches in flight still drain, and a pause with
clear_cache resets the cache once nothing is in flight.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections import defaultdict, deque
from typing import Callable

from specreplay.replay.impls.registry import Implementation
from specreplay.replay.models.messages import EngineCrash
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.record.recorder import FLUSH_EVERY, Recorder
from specreplay.replay.models.request import Request
from specreplay.replay.workloads.workload import Workload
from specreplay.traces import schema
from specreplay.traces.errors import InputError
from specreplay.traces.journal import JournalWriter
from specreplay.traces.trace import Trace

ProgressFn = Callable[[int, int], None]  # (steps done, max steps)


def run_workload(workload: Workload, impl: Implementation, device: str = "cpu",
                 progress: ProgressFn | None = None, engine: str = "reference", model: str | None = None,
                 journal: str | os.PathLike[str] | None = None, flush_every: int = FLUSH_EVERY) -> Trace:
    """Run `workload` through `impl` and return the recorded trace. An exception raised inside
    outside code (a `module:attr` implementation) becomes one InputError line naming it.

    `journal`: a path where settled rows are appended every `flush_every` steps and everything
    recorded on any exception (traces.journal); the caller deletes it once the trace is written."""
    if engine == "vllm":
        from specreplay.replay.engines.live import run_live

        return run_live(workload, impl, device, model)  # its taps write part files as they go
    if model is not None:
        raise InputError("--model is for --engine vllm (a live engine); the other engines run the reference model")
    loop = _guarded(impl, EngineLoop, workload, impl, device, engine)
    # Outside the guard: a journal path that cannot be written is the user's file error, not
    # something the implementation raised.
    writer = JournalWriter(journal, loop.header()) if journal is not None else None
    return _guarded(impl, _run, loop, progress, writer, flush_every)


def _guarded(impl: Implementation, fn: Callable, *args):
    """Call into the engine; an exception from a `module:attr` implementation's code becomes one
    InputError line naming it (a built-in implementation's is a specreplay bug: it propagates)."""
    if not impl.user_code:
        return fn(*args)
    try:
        return fn(*args)
    except InputError:
        raise
    except Exception as exc:  # the user's scheduler or runner failed: say where, no traceback
        raise InputError(f"implementation {impl.name} raised {type(exc).__name__}: {exc}") from None


def _run(loop: "EngineLoop", progress: ProgressFn | None, writer: JournalWriter | None, flush_every: int) -> Trace:
    if writer is not None:
        loop.rec.journal = writer
        loop.rec.flush_every = flush_every
    try:
        while loop.step():
            loop.rec.maybe_flush(loop.step_no)
            if progress is not None and loop.step_no:
                progress(loop.step_no, loop.workload.max_steps)
    except EngineCrash as exc:  # an assert in the scheduler, or the worker unable to run a step
        loop.outcome = {"status": "crashed", "step": loop.step_no, "kind": exc.kind, "message": str(exc)}
    except BaseException:
        # Anything else (a bug, Ctrl-C): what was recorded goes to the journal before it propagates.
        loop.rec.flush(everything=True)
        if writer is not None:
            writer.close()
        raise
    if loop.outcome["status"] == "completed":
        held = sorted(rid for rid, req in loop.sched.requests.items() if not req.status.finished)
        if held:  # idle for good with requests it holds: a request lost by the scheduler
            loop.outcome = {"status": "completed", "step": loop.step_no, "unfinished": held}
    loop.rec.flush(everything=True)
    if writer is not None:
        writer.close()
    return loop.trace()


class EngineLoop:
    """One run: the scheduler, the runner, the batch queue and the recorder."""

    def __init__(self, workload: Workload, impl: Implementation, device: str, engine: str) -> None:
        self.workload = workload
        self.config = workload.config
        self.impl = impl
        self.engine = engine
        self.device = device
        self.oracle = Oracle(workload)
        self.sched = impl.make_scheduler(self.config, engine)
        self.runner = impl.make_runner(self.config, self.oracle, device)
        self.rec = Recorder(self.oracle)
        self.arrivals: dict[int, list] = defaultdict(list)
        for order, spec in enumerate(workload.requests):
            self.arrivals[spec.arrival_step].append((order, spec))
        self.aborts = sorted([(s.abort_step, s.request_id) for s in workload.requests if s.abort_step]
                             + [(e.step, e.request) for e in workload.events if e.when == "after"])
        self.events: dict[int, list] = defaultdict(list)  # step -> events before its schedule()
        for event in workload.events:
            if event.when == "before":
                self.events[event.step].append(event)
        self.lives: dict[str, int] = {}  # request id -> submissions so far
        self.turns_sent: dict[str, int] = {}  # streaming request -> input chunks sent after its prompt
        self.appends_left = {rid: len(inputs) - 1 for rid, inputs in self.oracle.inputs.items()}
        self.order_of = {spec.request_id: order for order, spec in enumerate(workload.requests)}
        self.clear_after_drain = False  # a pause with clear_cache waits for the batches in flight
        self.queue: deque = deque()  # (SchedulerOutput, ModelRunnerOutput), newest first
        self.outcome: dict = {"status": "completed"}
        self.step_no = 0

    def step(self) -> bool:
        """One engine iteration, as vLLM's step_with_batch_queue orders it. False when done."""
        # vLLM's _process_input_queue: idle callbacks (a pause's cache clear) while the engine
        # has nothing to do, then the input queue: aborts that arrived after an earlier
        # schedule() and were not applied yet (no batch was popped since), arrivals, events.
        self.finish_pause_if_idle()
        self.apply_aborts()
        self.admit_arrivals()
        self.apply_events()
        if not self.sched.has_requests() and not self.queue:
            # Idle: nothing to do until the next arrival or event (taken before the schedule()
            # of its step), or the next abort (due after its step's schedule()).
            pending = [step - 1 for step in (*self.arrivals, *self.events) if step > self.step_no + 1]
            pending += [step for step, _ in self.aborts if step > self.step_no]
            if not pending:
                return False
            self.step_no = min(pending)
            return True
        if self.sched.has_requests():
            out = self.schedule_and_execute()
            # Keep a batch in flight: async returns here until the queue holds two batches.
            if out.total_num_scheduled_tokens > 0 and len(self.queue) < self.config.depth:
                return True
        self.apply_aborts()
        done, result = self.queue.pop()
        self.rec.record_apply(done.step, self.sched.update_from_output(done, result), self.step_no)
        if not self.sched.is_async and self.config.num_spec_tokens:
            self.sched.update_draft_token_ids(*self.runner.take_draft_token_ids())
        if self.step_no >= self.workload.max_steps:
            self.outcome = {"status": "step_limit", "step": self.step_no}
            return False
        return True

    def admit_arrivals(self) -> None:
        for order, spec in self.arrivals.pop(self.step_no + 1, ()):
            self.submit(spec, order)

    def submit(self, spec, order: int) -> None:
        life = self.lives.get(spec.request_id, -1) + 1
        self.lives[spec.request_id] = life
        req = Request(spec.request_id, self.oracle.prompt(spec.request_id), spec.max_tokens,
                      self.oracle.stop_token(spec.request_id), order, life, resumable=spec.streaming)
        self.rec.add_request(self.sched.add_request(req))
        if spec.streaming and not self.appends_left.get(spec.request_id):
            self.end_stream(spec, order)

    def stream_append(self, spec, order: int) -> None:
        """The session's next input chunk, as AsyncLLM sends it: the same id, resumable; after
        the last chunk, the end of the stream follows at once."""
        rid = spec.request_id
        self.appends_left[rid] -= 1
        live = self.sched.requests.get(rid)
        if live is None or live.status.finished:
            return  # the session ended (aborted): its client stops streaming
        turn = self.turns_sent[rid] = self.turns_sent.get(rid, 0) + 1
        _, max_tokens = self.oracle.inputs[rid][turn]
        chunk = Request(rid, self.oracle.chunk(rid, turn), max_tokens, None, order, self.lives[rid], resumable=True)
        self.sched.add_request(chunk)
        self.rec.mark_request_event(rid, "stream_update")
        if not self.appends_left[rid]:
            self.end_stream(spec, order)

    def end_stream(self, spec, order: int) -> None:
        # AsyncLLM's final request: a non-resumable one-token prompt under the same id.
        self.sched.add_request(Request(spec.request_id, [0], 1, None, order, self.lives[spec.request_id]))

    def finish_pause_if_idle(self) -> None:
        """vLLM's _finish_pause: a pause with clear_cache resets the cache as soon as nothing is
        in flight or schedulable (at once when the pause finds the engine idle)."""
        if self.clear_after_drain and not self.sched.has_requests() and not self.queue:
            self.clear_after_drain = False
            self.reset_prefix_cache(True, "pause: clear_cache")

    def apply_events(self) -> None:
        """The control events of the coming step, in workload order (vLLM's input queue)."""
        for event in self.events.pop(self.step_no + 1, ()):
            self.finish_pause_if_idle()  # the engine is idle between two inputs: its callbacks run
            if event.kind == "abort":
                for rid in self.sched.finish_requests([event.request]):
                    self.rec.mark_request_event(rid, "abort")
            elif event.kind == "resubmit":
                order = self.order_of[event.request]
                self.submit(self.workload.requests[order], order)
                self.rec.mark_request_event(event.request, "resubmit")
            elif event.kind == "stream_append":
                order = self.order_of[event.request]
                if self.lives.get(event.request) is not None:
                    self.stream_append(self.workload.requests[order], order)
            elif event.kind == "pause":
                if event.mode == "abort":
                    for rid in self.sched.finish_requests(list(self.sched.requests)):
                        self.rec.mark_request_event(rid, "abort")
                self.sched.set_pause_state("paused_all" if event.mode == "keep" else "paused_new")
                self.rec.mark_step_event(event.label())
                self.clear_after_drain = event.clear_cache
                self.finish_pause_if_idle()  # pause_scheduler: _finish_pause at once if nothing is left
            elif event.kind == "resume":
                self.sched.set_pause_state("unpaused")
                # A clear still pending stays registered, as vLLM's idle callback does: it runs
                # the next time the engine has nothing to do.
                self.rec.mark_step_event("resume")
            elif event.kind == "reset_prefix_cache":
                self.reset_prefix_cache(event.reset_running, event.label())

    def reset_prefix_cache(self, reset_running: bool, label: str) -> None:
        running = [req.request_id for req in self.sched.running]
        done = self.sched.reset_prefix_cache(reset_running)
        if reset_running:
            for rid in running:
                self.rec.mark_request_event(rid, "reset_preempt")
        self.rec.mark_step_event(label if done else f"{label}: failed, blocks in use")

    def schedule_and_execute(self):
        self.step_no += 1
        self.sched.step = self.step_no - 1  # the engine numbers steps (idle gaps included)
        self.rec.snapshot(self.sched)
        out = self.sched.schedule()
        self.rec.record_schedule(out, self.sched)
        delivered = self.impl.deliver(out)
        result = self.runner.execute_model(delivered)
        if delivered is out and hasattr(self.sched, "share_edits"):
            self.sched.share_edits(out)  # the real scheduler reads back what the worker edited
        self.rec.record_worker(self.step_no, self.runner.view)
        self.queue.appendleft((out, result))
        return out

    def apply_aborts(self) -> None:
        """Aborts that arrived by this step land before the oldest batch is applied."""
        while self.aborts and self.aborts[0][0] <= self.step_no:
            for rid in self.sched.finish_requests([self.aborts.pop(0)[1]]):
                self.rec.record_abort(self.step_no, rid)

    def header(self) -> Trace:
        """The trace's metadata, no rows (the journal's header)."""
        return Trace(
            table=schema.SCHEMA.empty_table(),
            workload=self.workload.to_dict(),
            config=self.config.to_dict(),
            impl=self.impl.describe(self.sched, self.engine),
            outcome=self.outcome,
            seed=self.workload.seed,
            device=self.device,
            volatile={"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "host": platform.node(), "python": platform.python_version()},
        )

    def trace(self) -> Trace:
        return dataclasses.replace(self.header(), table=self.rec.table(), outcome=self.outcome)
