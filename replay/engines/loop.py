"""The engine loop: schedule, execute, apply, with one or two batches in flight; the observers record.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli. `EngineLoop` drives a scheduler and a runner through a workload exactly
in the order of vLLM's `step_with_batch_queue` (docs/reference.md, the step timeline): schedule(m),
execute + sample(m) on the worker, then pop the oldest batch, apply aborts, and `update_from_output`
it. With async scheduling the queue holds two batches, so schedule(m) sees the outputs of steps <=
m-2 only; in sync mode it holds one and drafts flow back through `update_draft_token_ids`.

The loop records nothing itself: the scheduler observer and the worker observer, attached to the
scheduler and runner it was given, write every row (observers/). It only tells them what they
cannot see: control events, and aborts landing with a step in flight.

Control events (workload `[[events]]`, typed: engines/events.py) reach the loop through the one
driver every engine shares (`apply_control`, the loop being its target); they land where vLLM's
EngineCoreProc takes them: with the input queue before schedule(m), after that step's arrivals,
or (aborts only) just before the oldest batch is applied. While paused the loop does what vLLM's
does: no schedule() while the scheduler has nothing it may schedule, the batches in flight still
drain, and a pause with clear_cache resets the cache once nothing is in flight.
"""

from __future__ import annotations

from collections import deque

from specreplay.replay.engines.events import apply_control
from specreplay.replay.engines.inputs import InputDriver
from specreplay.replay.engines.outcome import run_outcome
from specreplay.replay.engines.ports import wire
from specreplay.replay.engines.registry import DEFAULT_RUNNER
from specreplay.replay.impls.registry import Implementation
from specreplay.replay.models.releases import release_of
from specreplay.replay.models.request import Request
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import RequestSpec, Workload
from specreplay.traces.header import Outcome


class EngineLoop:
    """One run: the scheduler, the runner, the batch queue and the input driver."""

    def __init__(
        self,
        workload: Workload,
        impl: Implementation,
        device: str = "cpu",
        engine: str = "reference",
        oracle: Oracle | None = None,
        runner: str = DEFAULT_RUNNER,
    ) -> None:
        self.workload = workload
        self.config = workload.config
        self.impl, self.device, self.engine = impl, device, engine
        self.step_no = 0
        self.parts = parts = wire(
            workload, impl, device, engine, step_now=lambda: self.step_no, oracle=oracle, runner=runner
        )
        self.sched = parts.scheduler
        self.runner = parts.runner
        self.observer = parts.scheduler_observer
        self.inputs = InputDriver(workload, parts.oracle)
        self.clear_after_drain = False  # a pause with clear_cache waits for the batches in flight
        self.release = release_of(self.config.vllm_version)
        self.rejecting_new = False  # vLLM 0.33: paused in wait or abort mode, new requests are refused
        self.queue: deque = deque()  # (SchedulerOutput, ModelRunnerOutput), newest first
        self.outcome: Outcome = run_outcome(0)  # until the run says otherwise (engines/run.py)
        # False for a replay of a live recording: stop, as the live engine did, once nothing is
        # left to feed or schedule, leaving the batches in flight unapplied.
        self.drains_at_end = parts.oracle.drains_at_end
        self.iteration = 0  # the engine iteration under way (1-based)
        # True where the run mirrors specreplay's live driver on a live engine core
        # (workloads/oracle.py `live_driven`): it numbers every iteration as a step (one that
        # only applies a batch included) and names a crash by its iteration.
        self.like_live = parts.oracle.like_live

    def step(self) -> bool:
        """One engine iteration, as vLLM's step_with_batch_queue orders it. False when done."""
        # vLLM's _process_input_queue: idle callbacks (a pause's cache clear) while the engine
        # has nothing to do, then the input queue: aborts that arrived after an earlier
        # schedule() and were not applied yet (no batch was popped since), arrivals, events.
        self.notice_ends(self.step_no)  # what ended in the iterations before (a turn may follow it)
        if not self.drains_at_end and self.live_driver_done():
            return False
        self.iteration = self.step_no + 1
        self.finish_pause_if_idle()
        self.land_leftover_aborts()
        for spec in self.inputs.pop_arrivals(self.step_no + 1):
            self.submit(spec)
        for event in self.inputs.pop_events(self.step_no + 1):
            self.finish_pause_if_idle()  # the engine is idle between two inputs: its callbacks run
            apply_control(event, self)
        # vLLM's has_requests() (scheduler.py:2823) also counts finished requests not yet
        # announced (has_finished_requests): the engine core schedules once more to announce
        # them, and that schedule pops the batch still in flight (core.py:724-768). The models'
        # has_requests() counts unfinished ones only: has_unannounced() adds the others, and a
        # replay of a recording also steps where the recorded engine announced
        # (InputDriver.steps_to_announce).
        unfinished = self.sched.has_requests() or self.inputs.steps_to_announce(self.step_no + 1)
        busy = unfinished or self.has_unannounced()
        if not busy and not self.queue:
            # Idle: nothing to do until the next input (a turn following a request aborted now too).
            self.notice_ends(self.iteration)
            idle_until = self.inputs.next_input_step(self.step_no)
            if idle_until is None:
                return False
            self.step_no = idle_until
            return True
        if busy:
            out = self.schedule_and_execute()
            # Keep a batch in flight: async returns here until the queue holds two batches.
            if out.total_num_scheduled_tokens > 0 and len(self.queue) < self.config.depth:
                return True
        self.apply_aborts()
        done, result = self.queue.pop()
        self.sched.update_from_output(done, result)
        if not self.sched.is_async and self.config.num_spec_tokens:
            self.sched.update_draft_token_ids(*self.runner.take_draft_token_ids())
        if not busy and self.like_live:
            # An iteration that only applied a batch (nothing to schedule, paused or finished)
            # is an engine step too where the run mirrors a live engine core: the live driver
            # steps it, and its observers number iterations (families/vllm/plugin.py).
            self.step_no += 1
        self.notice_ends(self.step_no)  # the client has the outputs of this iteration
        if self.step_no >= self.workload.max_steps:
            # A run whose last input and request end at its last step completed (a recording's
            # summary ends at its last step); one with work left was cut.
            if self.work_left():
                self.outcome = run_outcome(self.step_no, cut=True)
            return False
        return True

    def crash_step(self) -> int:
        """The step a crash ends the run at: the last one scheduled, or where the run mirrors the
        live driver, the iteration it died in (an input it could not take included)."""
        return self.iteration if self.like_live else self.step_no

    def live_driver_done(self) -> bool:
        """What specreplay's live driver asks after each iteration (families/vllm/live.py `done`):
        nothing left to feed (this step's inputs are still to come) and its front end waits for
        nothing. It then stops, leaving the batches in flight unapplied; an iteration in which
        inputs landed always runs."""
        return (
            not self.sched.has_requests()
            and not self.inputs.steps_to_announce(self.step_no + 1)
            and not self.clear_after_drain
            and self.inputs.next_input_step(self.step_no - 1) is None
        )

    def notice_ends(self, step: int) -> None:
        """Tell the input driver, which waits for some requests to end before it sends the turns
        that follow them, what has ended by step `step` (InputDriver.notice_ends)."""
        if self.inputs.after:
            self.inputs.notice_ends(step, self.has_ended)

    def has_ended(self, rid: str) -> bool:
        """Is the request's life over? (The scheduler drops a request once it finishes.)"""
        req = self.sched.requests.get(rid)
        return req is None or req.is_finished()

    def has_unannounced(self) -> bool:
        """Requests finished since the last schedule(), which vLLM's has_requests() counts: its
        engine core steps to announce them (an empty schedule, which pops the batch still in
        flight), and is not idle (a pause's cache clear waits) until it has."""
        return self.sched.has_finished_requests()

    def work_left(self) -> bool:
        """Requests to schedule, inputs to come, a cache clear pending or (when the run drains)
        batches in flight."""
        return (
            self.sched.has_requests()
            or self.inputs.next_input_step(self.step_no - 1) is not None  # those of the next step too
            or self.clear_after_drain
            or (self.drains_at_end and bool(self.queue))
        )

    def schedule_and_execute(self):
        self.step_no += 1
        self.sched.step = self.step_no - 1  # the engine numbers steps (idle gaps included)
        out = self.sched.schedule()
        result = self.runner.execute_model(self.impl.deliver(out))
        if result is None:  # the forward ran; sampling follows, as vLLM's async split
            result = self.runner.sample_tokens()
        self.queue.appendleft((out, result))
        return out

    # ------------------------------------------------------------------ inputs
    def submit(self, spec: RequestSpec) -> None:
        if self.rejecting_new and spec.request_id not in self.sched.requests:
            # vLLM 0.33's EngineCoreProc (_reject_add_while_paused): the client gets a retryable
            # engine_paused error and the scheduler never sees the request. A streaming session's
            # next chunk (an id the scheduler holds) is not new work and goes through.
            self.observer.mark_refused(spec.request_id)
            self.inputs.refused(spec)
            return
        prompt, max_tokens, stop = self.inputs.submit(spec)
        self.sched.add_request(Request(spec.request_id, prompt, max_tokens, stop, resumable=spec.streaming))
        if self.inputs.ends_at_once(spec):
            self.end_stream(spec.request_id)

    def end_stream(self, rid: str) -> None:
        # AsyncLLM's final request: a non-resumable one-token prompt under the same id.
        self.sched.add_request(Request(rid, [0], 1, None))

    def land_leftover_aborts(self) -> None:
        """Aborts due after the last schedule() that no batch was applied for (the queue was not
        full): EngineCoreProc takes them from its input queue before the next schedule(), as
        the client's abort (core.py: every abort goes to both its queues), marked on that step."""
        for rid in self.inputs.pop_aborts(self.step_no):
            self.abort([rid])

    def apply_aborts(self) -> None:
        """Aborts that arrived by this step land before the oldest batch is applied."""
        for rid in self.inputs.pop_aborts(self.step_no):
            for done in self.sched.finish_requests([rid]):
                self.observer.abort_landed(self.step_no, done)

    # ------------------------------------------------------------------ control events
    # The loop's ControlTarget (engines/events.py): apply_control calls these, one per kind.
    def abort(self, request_ids: list[str]) -> None:
        for rid in self.sched.finish_requests(request_ids):
            self.observer.mark_request_event(rid, "abort")

    def resubmit(self, request: str) -> None:
        self.submit(self.inputs.spec_of[request])
        self.observer.mark_request_event(request, "resubmit")

    def stream_append(self, request: str) -> None:
        """The session's next input chunk, as AsyncLLM sends it: the same id, resumable; after
        the last chunk, the end of the stream follows at once."""
        if self.inputs.lives.get(request) is None:
            return  # the session has not started
        live = self.sched.requests.get(request)
        if live is None or live.is_finished():
            self.inputs.drop_chunk(request)  # the session ended (aborted): its client stops streaming
            return
        tokens, max_tokens, last = self.inputs.next_chunk(request)
        self.sched.add_request(Request(request, tokens, max_tokens, None, resumable=True))
        self.observer.mark_request_event(request, "stream_update")
        if last:
            self.end_stream(request)

    def pause(self, mode: str, clear_cache: bool, label: str) -> None:
        if mode == "abort":
            self.abort(list(self.sched.requests))
        state = "paused_all" if mode == "keep" else "paused_new"
        changes = self.sched.pause_state != state  # a pause in the state it asks marks nothing, as live
        self.sched.set_pause_state(state)
        self.rejecting_new = self.release.paused_rejects_new and mode != "keep"
        if changes:
            self.observer.mark_step_event(label)
        self.clear_after_drain = clear_cache
        self.finish_pause_if_idle()  # pause_scheduler: _finish_pause at once if nothing is left

    def resume(self) -> None:
        changes = self.sched.pause_state != "unpaused"
        self.sched.set_pause_state("unpaused")
        self.rejecting_new = False
        # A clear still pending stays registered, as vLLM's idle callback does: it runs
        # the next time the engine has nothing to do.
        if changes:
            self.observer.mark_step_event("resume")

    def finish_pause_if_idle(self) -> None:
        """vLLM's _finish_pause: a pause with clear_cache resets the cache as soon as nothing is
        in flight or schedulable (at once when the pause finds the engine idle)."""
        if self.clear_after_drain and not self.sched.has_requests() and not self.has_unannounced() and not self.queue:
            self.clear_after_drain = False
            self.reset_prefix_cache(True, "pause: clear_cache")

    def reset_prefix_cache(self, reset_running: bool, label: str) -> None:
        running = [req.request_id for req in self.sched.running]
        done = self.sched.reset_prefix_cache(reset_running)
        if reset_running:
            for rid in running:
                self.observer.mark_request_event(rid, "reset_preempt")
        self.observer.mark_step_event(label if done else f"{label}: failed, blocks in use")

    def unfinished(self) -> list[str]:
        """Requests the scheduler still holds (at the end of a completed run: lost by it)."""
        return sorted(t.request_id for t in self.observer.live())
