"""The input observer: what went into a vLLM scheduler from outside, step by step.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. When specreplay drives the engine, it knows the inputs (they are its
workload). When it is attached to someone else's vLLM (`SPECREPLAY_RECORD`, families/vllm/attached.py), it
does not: this observer wraps the scheduler's entry points from outside and writes one event per
input, by vLLM's names:

- `add_request`: a new request (or a new life of a finished id): its prompt token ids and the
  sampling parameters that decide when it ends (max_tokens, min_tokens, stop token ids,
  ignore_eos), whether it is a streaming session; or a streaming session's next input chunk;
- `finish_requests`: an abort (or a stop the front end detected), with the requests it finished;
- `set_pause_state` and `reset_prefix_cache`: pauses, resumes, cache resets.

Each event carries the engine step it lands before: the number of schedule() calls so far + 1
(`clock()`), so an arrival at step s was added before step s's schedule(); a live in-process
engine, which also counts its idle iterations, passes that count as `input_step`. It also tells
the scheduler observer, so the row of the next step carries the event as it does on the other
engines. An abort is told apart by where vLLM lands it: one that reached the scheduler just
before `update_from_output` came through the early-aborts queue with that batch in flight (its
row says `aborted`); any other also marks the next step's row with the `abort` event, as the
input queue's aborts are marked on the other engines. The events go to `write` (a sink's part
file); families/vllm/attached.py turns them into the trace's recorded inputs, and the live engine
(families/vllm/plugin.py) records its rows through the same observer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from specreplay.replay.observers.guard import GUARD
from specreplay.replay.observers.scheduler_observer import SchedulerObserver


class InputObserver:
    def __init__(
        self,
        scheduler: Any,
        observer: SchedulerObserver,
        write: Callable[[dict[str, Any]], None],
        clock: Callable[[], int],
        external_id: Callable[[str], str],
        input_step: Callable[[], int] | None = None,
    ) -> None:
        """`clock()`: the step of the last schedule(); `input_step()`: the step an input arriving
        now lands before (default: clock() + 1)."""
        self.scheduler = scheduler
        self.observer = observer
        self.write = write
        self.clock = clock
        self.input_step = input_step or (lambda: clock() + 1)
        self.ext = external_id
        self.lives: dict[str, int] = {}  # trace id -> its current life
        self.objects: dict[str, Any] = {}  # trace id -> the request object of that life
        # Aborts landed since the last schedule() or update_from_output(): which of the two comes
        # next says by which queue they came (see the module docstring).
        self.unplaced_aborts: list[tuple[str, int]] = []
        self.aborted_all = False  # finish_requests(None) just before a pause: pause_scheduler's abort mode

    # ------------------------------------------------------------------ events
    def request_seen(self, request: Any, step: int | None = None) -> None:
        """A request object the scheduler now holds: a new id, or a new life of a known one."""
        rid = self.ext(request.request_id)
        if self.objects.get(rid) is request:
            return
        life = self.lives[rid] + 1 if rid in self.lives else 0
        self.lives[rid], self.objects[rid] = life, request
        params = request.sampling_params
        self.write(
            {
                "e": "request",
                "id": rid,
                "life": life,
                "step": self.input_step() if step is None else step,
                "prompt": list(request.prompt_token_ids or ()),
                "max_tokens": request.max_tokens,
                "min_tokens": getattr(params, "min_tokens", 0) if params is not None else 0,
                "stop_token_ids": sorted(getattr(params, "stop_token_ids", None) or ()) if params else [],
                "ignore_eos": bool(getattr(params, "ignore_eos", False)) if params is not None else False,
                "streaming": bool(getattr(request, "resumable", False)),
            }
        )
        if life:
            self.observer.mark_request_event(rid, "resubmit")

    def chunk_seen(self, request: Any) -> None:
        """A streaming session's next input chunk (or, with no prompt, the end of its stream)."""
        rid = self.ext(request.request_id)
        self.write(
            {
                "e": "stream",
                "id": rid,
                "life": self.lives.get(rid, 0),
                "step": self.input_step(),
                "prompt": list(request.prompt_token_ids or ()),
                "max_tokens": request.max_tokens,
                "end": not request.resumable,
            }
        )
        if request.resumable:  # an input chunk; the end of the stream changes nothing on the row
            self.observer.mark_request_event(rid, "stream_update")

    def finished(self, ids: list[str], status: Any, by_input: bool = True) -> None:
        """`by_input`: an abort from outside (not vLLM ending a stream inside add_request)."""
        name = getattr(status, "name", str(status))
        step = self.clock()
        for internal in ids:
            rid = self.ext(internal)
            self.write({"e": "abort", "id": rid, "life": self.lives.get(rid, 0), "step": step, "status": name})
            if by_input:
                self.unplaced_aborts.append((rid, step))
            else:
                self.observer.abort_landed(step, rid)

    def place_aborts(self, before_schedule: bool) -> None:
        """The aborts since the last call: marked on the coming schedule's rows, or, when vLLM's
        early-aborts queue landed them right before the oldest batch's update_from_output, on
        the row of the step in flight (as the other engines place them: engines/loop.py)."""
        for rid, step in self.unplaced_aborts:
            if before_schedule:
                self.observer.mark_request_event(rid, "abort")
            else:
                self.observer.abort_landed(step, rid)
        self.unplaced_aborts = []

    def engine_event(self, kind: str, label: str, state: str) -> None:
        self.write({"e": "event", "kind": kind, "step": self.input_step(), "state": state})
        self.observer.mark_step_event(label)

    def cache_reset(self, preempted: list[str], label: str, reset_running: bool) -> None:
        for internal in preempted:
            self.observer.mark_request_event(self.ext(internal), "reset_preempt")
        step = self.input_step()
        self.write({"e": "event", "kind": "reset_prefix_cache", "step": step, "reset_running": reset_running})
        self.observer.mark_step_event(label)


def attach_inputs(inputs: InputObserver) -> None:
    """Wrap the scheduler's add_request, finish_requests, set_pause_state and reset_prefix_cache
    on the instance (after the scheduler observer's own wrappers: it sees the request first), and
    its schedule and update_from_output, to place the aborts in between."""
    s = inputs.scheduler
    call = GUARD.call  # an observer's exception is specreplay's, never the scheduler's
    add, finish = s.add_request, s.finish_requests
    set_pause, reset = s.set_pause_state, s.reset_prefix_cache
    schedule, update = s.schedule, s.update_from_output
    adding = {"now": False}  # inside add_request: vLLM itself ends a stream (finish_requests)

    @functools.wraps(add)
    def add_request(request, *a, **kw):
        existing = s.requests.get(request.request_id)
        live_session = existing is not None and not existing.is_finished()
        adding["now"] = True
        try:
            result = add(request, *a, **kw)
        finally:
            adding["now"] = False
        if live_session:
            call("input observer", inputs.chunk_seen, request)
        elif request.request_id in s.requests:
            call("input observer", inputs.request_seen, s.requests[request.request_id])
        return result

    @functools.wraps(finish)
    def finish_requests(request_ids, *a, **kw):
        if request_ids is None:
            ids = list(s.requests)
            inputs.aborted_all = True
        else:
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        live = [r for r in ids if r in s.requests and not s.requests[r].is_finished()]
        result = finish(request_ids, *a, **kw)
        status = a[0] if a else kw.get("finished_status")
        landed = [r for r in live if r not in s.requests or s.requests[r].is_finished()]
        if landed:
            call("input observer", inputs.finished, landed, status, not adding["now"])
        return result

    @functools.wraps(set_pause)
    def set_pause_state(state, *a, **kw):
        before = getattr(s, "pause_state", None)
        result = set_pause(state, *a, **kw)
        name = getattr(state, "name", str(state)).lower()
        if before is None or getattr(before, "name", None) != getattr(state, "name", None):
            # By vLLM's PauseMode: PAUSED_ALL is keep; PAUSED_NEW is abort right after an
            # abort of everything (pause_scheduler, core.py), else wait.
            mode = "keep" if name == "paused_all" else "abort" if inputs.aborted_all else "wait"
            label = "resume" if name == "unpaused" else f"pause({mode})"
            call("input observer", inputs.engine_event, "resume" if name == "unpaused" else "pause", label, name)
        inputs.aborted_all = False
        return result

    @functools.wraps(reset)
    def reset_prefix_cache(*a, **kw):
        running = bool(a[0] if a else kw.get("reset_running_requests", False))
        connector = bool(a[1] if len(a) > 1 else kw.get("reset_connector", False))
        # A pause's clear_cache: vLLM's _reset_caches, the only caller that resets the connector
        # too, with every request preempted, while paused.
        clearing = running and connector and getattr(getattr(s, "pause_state", None), "name", "UNPAUSED") != "UNPAUSED"
        preempted = [r.request_id for r in s.running] if running else []
        done = False
        try:
            done = reset(*a, **kw)
            return done
        finally:  # also when vLLM raises to its caller (a session holds blocks): the preemptions happened
            label = (
                "pause: clear_cache" if clearing else "reset_prefix_cache(running)" if running else "reset_prefix_cache"
            )
            if not done:
                label += ": failed, blocks in use"
            call("input observer", inputs.cache_reset, preempted, label, running)

    @functools.wraps(schedule)
    def schedule_(*a, **kw):
        call("input observer", inputs.place_aborts, True)
        inputs.aborted_all = False
        return schedule(*a, **kw)

    @functools.wraps(update)
    def update_from_output(*a, **kw):
        call("input observer", inputs.place_aborts, False)
        return update(*a, **kw)

    s.add_request, s.finish_requests = add_request, finish_requests
    s.set_pause_state, s.reset_prefix_cache = set_pause_state, reset_prefix_cache
    s.schedule, s.update_from_output = schedule_, update_from_output


__all__ = ["InputObserver", "attach_inputs"]
