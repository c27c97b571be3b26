"""The scheduler observer: watches any vLLM-shaped scheduler from outside and writes its rows.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. `attach` wraps a scheduler instance's `add_request`, `schedule` and
`update_from_output`: the reference scheduler, the installed vLLM's real one (`--engine
vllm-scheduler`) and a live engine core's alike. The observer reads only what vLLM's own objects
have, by vLLM's names: the scheduler's `requests` and `running`; each request's counters and
`status`; the `SchedulerOutput` and the `ModelRunnerOutput`. So every rule that turns what a
scheduler did into trace columns is written here once, whichever scheduler ran.

What the scheduler does not say, the observer derives:
- why a running request got no tokens: it replays the running-queue visit (the loop stops once
  the budget is spent; a visited request was skipped by the max-tokens rule, or had none);
- what `update_from_output` did to each request: counters before and after, the tokens vLLM
  left in the output's list (it trims them to what it appended), the status it ended in;
- which life of an id an object is: a new object under a known id is the id's next life.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from specreplay.replay.models.decisions import reaches_max_tokens_in_flight
from specreplay.replay.observers.guard import GUARD
from specreplay.replay.observers.message_shapes import output_index, resumed_ids
from specreplay.replay.observers.recorder import Recorder

#: vLLM's RequestStatus names (the reference's Status uses the same) -> the trace's sched_status.
_TRACE_STATUS = {
    "WAITING": "waiting",
    "WAITING_FOR_STREAMING_REQ": "waiting",
    "RUNNING": "running",
    "PREEMPTED": "preempted",
}
_FINISH_REASON = {"FINISHED_LENGTH_CAPPED": "length", "FINISHED_STOPPED": "stop"}
#: Of two control events on one request before a schedule(), the row keeps the one that says more.
EVENT_RANK = {"": 0, "stream_update": 1, "stream_turn": 2, "reset_preempt": 2, "abort": 3, "resubmit": 4}
#: A row's (sched_preempt_blocks_alone, sched_preempt_blocks_returned) when this schedule() did not
#: preempt it.
_NOT_PREEMPTED = (None, None)
#: The observer takes these per live request per step: a tuple built by tuple.__new__ skips the
#: NamedTuple's Python-level __new__.
_new_tuple = tuple.__new__


@dataclass
class Tracked:
    """A request object the observer knows: its id in the trace, life and row order."""

    request: Any
    request_id: str
    life: int
    order: int


class Counters(NamedTuple):
    """A request's counters at one moment (before a schedule() or an update_from_output()); a
    tuple, as one is taken per live request per step."""

    num_computed_tokens: int
    num_output_placeholders: int
    num_tokens: int
    num_output_tokens: int
    num_in_flight_tokens: int
    num_stale_output_tokens: int
    num_prompt_tokens: int
    max_tokens: int

    @classmethod
    def of(cls, r: Any) -> Counters:
        return _new_tuple(cls, _read_counters(r))


#: The counters read in one C-level call (`operator.attrgetter`), in Counters' order.
_read_counters = operator.attrgetter(*Counters._fields)


class Delivery(NamedTuple):
    """One request's share of an output, read before update_from_output (a tuple: one per
    scheduled request per step)."""

    tracked: Tracked
    before: Counters
    sampled: tuple[int, ...]  # the tokens the worker emitted for it (before vLLM trims the list)
    outcome: str  # applied | stale_delivered | dropped: vLLM's stale test, read before it drains


class SchedulerObserver:
    """Writes the scheduler's rows of every step, and their apply columns once applied."""

    def __init__(
        self,
        scheduler: Any,
        recorder: Recorder,
        *,
        max_num_batched_tokens: int,
        max_model_len: int,
        external_id: Callable[[str], str] | None = None,
        order: dict[str, int] | None = None,
        mismatches: Callable | None = None,
    ) -> None:
        """`external_id`: the trace's id for a scheduler's request id (a live engine appends a
        suffix); `order`: the row order of known ids (the workload's), later ids after them;
        `mismatches(rid, first_output_index, tokens, prompt_len)`: the oracle's count of wrong
        tokens, or None (a live engine has no ground truth)."""
        self.scheduler = scheduler
        self.rec = recorder
        self.budget = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.ext = external_id or (lambda rid: rid)
        self._same_ids = external_id is None  # the trace's ids are the scheduler's: no renaming per row
        self._status_names: dict[int, tuple[Any, str]] = {}  # id(status) -> (status, status.name)
        self.order_hint = dict(order or {})
        self.mismatches = mismatches
        self.tracked: dict[str, Tracked] = {}  # trace id -> its live (or last) object
        self.prev_scheduled: set[str] = set()
        self._before_schedule: list[tuple[Tracked, Counters, int, bool]] = []
        self._running: list[Any] = []
        # Control events since the last schedule(), written on the next step's rows.
        self.request_events: dict[str, str] = {}
        self.step_events: list[str] = []
        # The prefix cache's evictions, counted by `attach` (None: the scheduler caches nothing),
        # and the count before the coming schedule().
        self.evictions: int | None = None
        self._evictions_before = 0
        self.block_size = getattr(scheduler, "block_size", 0)
        # Ids a cache reset preempted before the coming schedule(): the SchedulerOutput lists them
        # in preempted_req_ids, but not that schedule() preempted them. Kept apart from the row's
        # event, which a later one (an abort, a resubmission) may outrank.
        self.reset_preempted: set[str] = set()
        # What each preemption inside the running schedule() returned to the free pool, by the
        # scheduler's id: (blocks it held alone, free blocks the pool gained), read by
        # `watch_preemptions` (empty: nothing preempted, or the pool cannot be read).
        self.scheduling = False
        self.preemptions: dict[str, tuple[int, int]] = {}
        # A KV connector's bookings in the running schedule(), by the scheduler's id: the tokens it
        # supplied as computed with each admission (`watch_connector`; empty: no connector, or none).
        self.external: dict[str, int] = {}

    # ------------------------------------------------------------------ requests
    def request_added(self, internal_id: str) -> None:
        """After add_request: a new object under this id is a new request or the id's next life;
        the same object (a streaming session's next chunk) changes nothing."""
        obj = self.scheduler.requests.get(internal_id)
        rid = self.ext(internal_id)
        old = self.tracked.get(rid)
        if obj is None or (old is not None and old.request is obj):
            return
        life = old.life + 1 if old is not None else 0
        order = self.order_hint.setdefault(rid, len(self.order_hint))
        self.tracked.pop(rid, None)  # a new life goes to the end of the row order
        self.tracked[rid] = Tracked(obj, rid, life, order)

    def mark_request_event(self, rid: str, event: str) -> None:
        """A control event changed request `rid` (schema.EVENTS) before the coming schedule()."""
        if event == "reset_preempt":
            self.reset_preempted.add(rid)
        if EVENT_RANK[event] >= EVENT_RANK[self.request_events.get(rid, "")]:
            self.request_events[rid] = event

    def mark_step_event(self, label: str) -> None:
        """An engine-level control event (pause, resume, cache reset) before the coming schedule()."""
        self.step_events.append(label)

    def mark_refused(self, rid: str) -> None:
        """A new request the engine core refused while paused (vLLM 0.33.0 on: engine_paused), named
        by the trace's id; the scheduler never sees it."""
        self.mark_step_event(f"rejected {rid}: engine_paused")

    def abort_landed(self, step: int, rid: str) -> None:
        """An abort applied in step `step`'s iteration, with that step in flight: on its row."""
        at = self.rec.rows_of_step.get(step, {}).get(rid)
        if at is not None:
            self.rec.fill(at, {"apply_finish_reason": "aborted"})

    def live(self) -> list[Tracked]:
        return [t for t in self.tracked.values() if not t.request.is_finished()]

    # ------------------------------------------------------------------ E1(m)
    def before_schedule(self) -> None:
        """Every live request's counters, right before schedule()."""
        self._running = list(self.scheduler.running)
        of = Counters.of
        snap: list[Any] = []
        append = snap.append
        for t in self.tracked.values():  # self.live(), without the intermediate list
            r = t.request
            if r.is_finished():
                continue
            spec = r.spec_token_ids
            num_spec = len(spec)
            # All -1: the async placeholders (one C-level count instead of min and max).
            append((t, of(r), num_spec, num_spec > 0 and spec.count(-1) == num_spec))
        self._before_schedule = snap
        if self.evictions is not None:
            self._evictions_before = self.evictions
        self.preemptions = {}
        self.scheduling = True

    def admissions(self, so: Any) -> dict[str, tuple[int, list[int] | None]]:
        """The requests `so` admits (new ones, and V1's resumed ones), each with the count its
        step starts from as `so` carries it (its prefix-cache hit: vLLM's NewRequestData and
        CachedRequestData num_computed_tokens) and its blocks (the first hit ones are shared)."""
        x = self.ext
        found: dict[str, tuple[int, list[int] | None]] = {}
        for d in so.scheduled_new_reqs:
            found[x(d.req_id)] = (d.num_computed_tokens, _group0(d.block_ids))
        cached = so.scheduled_cached_reqs
        resumed = resumed_ids(cached)
        if resumed:
            for i, rid in enumerate(cached.req_ids):
                if rid in resumed:
                    found[x(rid)] = (cached.num_computed_tokens[i], _group0(cached.new_block_ids[i]))
        return found

    def after_schedule(self, so: Any, step: int) -> None:
        if self._same_ids:  # the common case: the trace's ids are the scheduler's, no renaming
            scheduled = so.num_scheduled_tokens
            slots = {rid: len(s) for rid, s in so.scheduled_spec_decode_tokens.items()}
            new_ids = {d.req_id for d in so.scheduled_new_reqs}
            resumed = set(resumed_ids(so.scheduled_cached_reqs))
            announced = set(so.finished_req_ids)
        else:
            x = self.ext
            scheduled = {x(rid): n for rid, n in so.num_scheduled_tokens.items()}
            slots = {x(rid): len(s) for rid, s in so.scheduled_spec_decode_tokens.items()}
            new_ids = {x(d.req_id) for d in so.scheduled_new_reqs}
            resumed = {x(rid) for rid in resumed_ids(so.scheduled_cached_reqs)}
            announced = {x(rid) for rid in so.finished_req_ids}
        skips = self.skip_reasons(so)
        admitted = self.admissions(so)
        external, self.external = self.external, {}
        if external and not self._same_ids:
            external = {self.ext(rid): n for rid, n in external.items()}
        bs = self.block_size
        events, self.request_events = self.request_events, {}
        rows = list(self._before_schedule)
        if announced:
            live = {t.request_id for t, *_ in rows}
            for rid in sorted(announced - live, key=lambda r: self.tracked[r].order if r in self.tracked else 0):
                t = self.tracked.get(rid)
                if t is not None:
                    rows.append((t, Counters.of(t.request), len(t.request.spec_token_ids), False))
        prev = self.prev_scheduled
        status_name = self._status_name
        freed = {self.ext(rid): v for rid, v in self.preemptions.items()} if self.preemptions else {}
        out: list[Any] = []
        append = out.append
        for t, was, spec_len, spec_placeholders in rows:
            rid, r = t.request_id, t.request
            n = scheduled.get(rid, 0)
            finished = r.is_finished()
            name = status_name(r.status)
            computed, cached, hit_blocks = was[0], None, None
            admission = admitted.get(rid) if n else None
            if admission is not None:
                # As S_m carries it: the prefix-cache hit the step starts from (the counter was
                # 0 before schedule(); a streaming session's next turn keeps its own, no hit),
                # less what a KV connector supplied with it.
                computed, blocks = admission
                cached = computed - was[0] - external.get(rid, 0)
                if cached > 0 and bs and blocks is not None:
                    hit_blocks = list(blocks[: cached // bs])
            if n:
                # How a scheduled request entered this step: new, resumed from preemption, cached
                # (it ran the step before) or re-entering (running, but skipped the step before).
                if rid in new_ids:
                    kind = "new"
                elif rid in resumed:
                    kind = "resumed"
                else:
                    kind = "cached" if rid in prev else "reentering"
                skip = ""
            else:
                # Why it got no tokens: finished, a reason the visit gave (skip_reasons), or never
                # visited (running: the budget ran out first; otherwise still waiting).
                kind = "unscheduled"
                if finished:
                    skip = "finished"
                elif rid in skips:
                    skip = skips[rid]
                else:
                    skip = "budget" if name == "RUNNING" else "waiting"
            append(
                (
                    rid,
                    t.life,
                    events.get(rid, ""),
                    "finished" if finished else _TRACE_STATUS.get(name, "waiting"),
                    kind,
                    skip,
                    n,
                    slots.get(rid, 0),
                    computed,  # num_computed_tokens
                    cached,
                    hit_blocks,
                    was[1],  # num_output_placeholders
                    was[2],  # num_tokens
                    was[3],  # num_output_tokens
                    r.num_prompt_tokens,
                    spec_len,
                    spec_placeholders,
                    bool(n) and bool(r.is_prefill_chunk),
                    rid in announced,
                    skips.get(rid) == "preempted",
                    was[4],  # num_in_flight_tokens
                    was[5],  # num_stale_output_tokens
                    *(freed.get(rid, _NOT_PREEMPTED) if freed else _NOT_PREEMPTED),
                )
            )
        evicted = None if self.evictions is None else self.evictions - self._evictions_before
        index = self.rec.append_step(step, so.total_num_scheduled_tokens, "; ".join(self.step_events), out, evicted)
        booked = [(index[rid], n) for rid, n in external.items() if rid in index and rid in admitted]
        if booked:
            self.rec.fill_columns([at for at, _ in booked], {"sched_kv_external_tokens": [n for _, n in booked]})
        self.step_events = []
        self.prev_scheduled = set(scheduled)

    def _status_name(self, status: Any) -> str:
        """`status.name`, remembered by the member's identity (Enum.name is a Python-level
        property, read for every row; members are singletons, kept alive here with their name)."""
        hit = self._status_names.get(id(status))
        if hit is None:
            hit = self._status_names[id(status)] = (status, status.name)
        return hit[1]

    def skip_reasons(self, so: Any) -> dict[str, str]:
        """Why running requests got no tokens in this schedule(). Preempted: listed in the output
        and not by a cache reset before it. Otherwise the visit is replayed: it stops once the
        budget is spent; a visited request was skipped by the max-tokens rule or had nothing to
        schedule; one never visited is left to the caller (budget)."""
        x = self.ext
        same = self._same_ids
        reset, self.reset_preempted = self.reset_preempted, set()
        skips = {x(rid): "preempted" for rid in (so.preempted_req_ids or ()) if x(rid) not in reset}
        before = None  # object id -> counters, built only when a visited request got nothing
        budget = self.budget
        num_scheduled = so.num_scheduled_tokens
        for r in self._running:
            internal = r.request_id
            rid = internal if same else x(internal)
            if rid in skips:
                continue
            n = num_scheduled.get(internal, 0)
            if n:
                budget -= n
            elif budget > 0:
                if before is None:
                    before = {id(t.request): was for t, was, *_ in self._before_schedule}
                was = before.get(id(r))
                rule = was is not None and reaches_max_tokens_in_flight(
                    was.num_computed_tokens, was.num_output_placeholders, r.num_prompt_tokens, r.max_tokens
                )
                skips[rid] = "max_tokens" if rule else "no_tokens"
        return skips

    # ------------------------------------------------------------------ E4(j)
    def before_update(self, so: Any, model_output: Any) -> dict[str, Delivery]:
        """Counters before update_from_output, which trims the output's token lists in place."""
        index = output_index(model_output)
        sampled = model_output.sampled_token_ids or []
        num_rows = len(sampled)
        tracked = self.tracked
        same, x = self._same_ids, self.ext
        of = Counters.of
        deliveries = {}
        for rid in so.num_scheduled_tokens:
            t = tracked.get(rid if same else x(rid))
            if t is None:
                continue
            r = t.request
            if r.is_finished():
                continue
            i = index.get(rid)
            if r.num_stale_output_tokens > 0:
                outcome = "dropped" if r.drop_stale_output else "stale_delivered"
            else:
                outcome = "applied"
            deliveries[rid] = _new_tuple(
                Delivery, (t, of(r), tuple(sampled[i]) if i is not None and i < num_rows else (), outcome)
            )
        return deliveries

    def after_update(
        self, so: Any, model_output: Any, deliveries: dict[str, Delivery], step: int, apply_step: int
    ) -> None:
        """Fill the apply columns of step `step`'s rows; outputs the scheduler gave to nobody
        (the request finished, was aborted, or a variant withheld it) are marked ignored. The
        rows are written column by column (Recorder.fill_column_groups), no dict per row."""
        rec = self.rec
        index = rec.rows_of_step.pop(step, {})
        out_index = output_index(model_output)
        out_sampled = model_output.sampled_token_ids
        spec = so.scheduled_spec_decode_tokens
        num_scheduled = so.num_scheduled_tokens
        mismatches = self.mismatches
        finish_reason = self.finish_reason
        given = set()
        rows: list[int] = []
        outcomes, lives, scheduled_col, slots_col, rejected_col, num_tokens_col = [], [], [], [], [], []
        sampled_col, mismatches_col, computed_col, placeholders_col, finish_col = [], [], [], [], []
        for rid, (tracked, was, sampled, outcome) in deliveries.items():
            r = tracked.request
            if r.num_in_flight_tokens == was[4]:  # num_in_flight_tokens
                continue  # untouched: the scheduler did not give this output to this object
            trace_id = tracked.request_id
            at = index.get(trace_id)
            if at is None:
                continue
            given.add(trace_id)
            slots = len(spec.get(rid, ()))
            dropped = outcome == "dropped"
            num_sampled = len(sampled)
            i = out_index.get(rid)
            tokens = () if dropped or i is None else tuple(out_sampled[i])
            finished = r.is_finished()
            # finish_reason says "" for a live request that cannot resume: no call for those.
            finish = finish_reason(r, was, tokens) if finished or r.resumable else ""
            if finish and not finished:
                self.mark_request_event(trace_id, "stream_turn")  # a streaming turn ended; the session goes on
            rows.append(at)
            outcomes.append(outcome)
            lives.append(tracked.life)
            scheduled_col.append(num_scheduled[rid])
            slots_col.append(slots)
            rejected_col.append(slots - (num_sampled - 1) if slots and num_sampled and not dropped else 0)
            # What the request grew by, where it is less than the output list: vLLM cuts the
            # list in place after a stop, so the list says what was appended, unless the code
            # under test appended fewer and left the list alone (a token lost where it happens,
            # S8). More growth than the list (a streaming turn's next chunk merged in the same
            # call) is the chunk's, not the output's.
            num_tokens_col.append(min(len(tokens), max(0, r.num_tokens - was.num_tokens)))
            # The tuple itself, not a list copy: a row of ints the garbage collector stops
            # tracking, where a list per row would keep every full collection growing.
            sampled_col.append(sampled)
            mismatches_col.append(
                None
                if mismatches is None
                else mismatches(trace_id, was.num_output_tokens, tokens, was.num_prompt_tokens)
            )
            computed_col.append(r.num_computed_tokens)
            placeholders_col.append(r.num_output_placeholders)
            finish_col.append(finish)
        scheduled = rec.scheduled_tokens
        ignored = [at for rid, at in index.items() if rid not in given and scheduled(at)]
        rec.fill_column_groups(
            [
                (
                    rows,
                    {
                        "apply_step": [apply_step] * len(rows),
                        "apply_outcome": outcomes,
                        "apply_life": lives,
                        "apply_num_scheduled_tokens": scheduled_col,
                        "apply_num_draft_slots": slots_col,
                        "apply_num_rejected": rejected_col,
                        "apply_num_tokens": num_tokens_col,
                        "apply_sampled_token_ids": sampled_col,
                        "apply_token_mismatches": mismatches_col,
                        "apply_num_computed_tokens": computed_col,
                        "apply_num_output_placeholders": placeholders_col,
                        "apply_finish_reason": finish_col,
                    },
                ),
                (ignored, {"apply_step": [apply_step] * len(ignored), "apply_outcome": ["ignored"] * len(ignored)}),
            ]
        )

    def finish_reason(self, r: Any, was: Counters, tokens: tuple) -> str:
        """ "length" or "stop" if this output ended the request (or a streaming session's turn:
        the session goes on waiting, so its status does not say; the counters do), else ""."""
        if r.is_finished():
            return _FINISH_REASON.get(self._status_name(r.status), "")
        if not tokens or not r.resumable or self._status_name(r.status) not in ("WAITING", "WAITING_FOR_STREAMING_REQ"):
            return ""
        reached = (
            was.num_output_tokens + len(tokens) >= was.max_tokens or was.num_tokens + len(tokens) >= self.max_model_len
        )
        return "length" if reached else "stop"


def attach(observer: SchedulerObserver, step_of: Callable[[Any], int], apply_step: Callable[[], int]) -> None:
    """Wrap the observed scheduler's add_request, schedule and update_from_output on the
    instance. `step_of(so)`: the engine step a new SchedulerOutput belongs to (stamped on it as
    `_specreplay_step`, which travels with it, pickled, to a worker process); `apply_step()`: the
    engine step in whose iteration an output is applied."""
    s = observer.scheduler
    add, schedule, update = s.add_request, s.schedule, s.update_from_output

    call = GUARD.call  # an observer's exception is specreplay's, never the scheduler's (observers/guard.py)

    @functools.wraps(add)
    def add_request(request, *a, **kw):
        result = add(request, *a, **kw)
        call("scheduler observer", observer.request_added, request.request_id)
        return result

    @functools.wraps(schedule)
    def schedule_(*a, **kw):
        call("scheduler observer", observer.before_schedule)
        try:
            so = schedule(*a, **kw)
        finally:
            observer.scheduling = False
        step = call("scheduler observer", step_of, so)
        if step is not None:
            so._specreplay_step = step
            call("scheduler observer", observer.after_schedule, so, step)
        return so

    @functools.wraps(update)
    def update_from_output(so, model_output, *a, **kw):
        deliveries = call("scheduler observer", observer.before_update, so, model_output)
        result = update(so, model_output, *a, **kw)
        step = getattr(so, "_specreplay_step", None)
        if step is not None and deliveries is not None:
            call("scheduler observer", observer.after_update, so, model_output, deliveries, step, apply_step())
        return result

    s.add_request, s.schedule, s.update_from_output = add_request, schedule_, update_from_output
    count_evictions(observer)
    watch_preemptions(observer)
    watch_connector(observer)


def watch_connector(observer: SchedulerObserver) -> None:
    """A KV connector's bookings (vLLM's scheduler-side connector, `scheduler.connector`): wrap
    its `update_state_after_alloc(request, blocks, num_external_tokens)` on the instance, which
    the scheduler calls once an admission's blocks are allocated, with the tokens the connector
    supplied as computed. Nothing where the scheduler has no connector."""
    connector = getattr(observer.scheduler, "connector", None)
    booked = getattr(connector, "update_state_after_alloc", None)
    if booked is None:
        return
    call = GUARD.call

    def note(request: Any, num_external_tokens: int) -> None:
        if num_external_tokens:
            observer.external[request.request_id] = int(num_external_tokens)

    @functools.wraps(booked)
    def update_state_after_alloc(request, blocks, num_external_tokens, *a, **kw):
        result = booked(request, blocks, num_external_tokens, *a, **kw)
        if observer.scheduling:
            call("scheduler observer", note, request, num_external_tokens)
        return result

    connector.update_state_after_alloc = update_state_after_alloc


def watch_preemptions(observer: SchedulerObserver) -> None:
    """Read what each preemption inside schedule() gives back: wrap the scheduler's preemption
    (vLLM's `_preempt_request`, the reference's `preempt_request`) on the instance, and around
    it count the victim's blocks that no other request holds and the free blocks the pool
    gains. Upstream returns every block held alone at once, where the allocation that preempted
    it can use it; a free deferred behind a step in flight returns none (vLLM #49674: the
    allocation fails again and the next victim goes). Only preemptions of a running schedule()
    are read (a cache reset's are not for blocks). One read per preemption, none per step."""
    s = observer.scheduler
    name = "_preempt_request" if hasattr(s, "_preempt_request") else "preempt_request"
    preempt = getattr(s, name, None)
    manager = getattr(s, "kv_cache_manager", None)
    pool = getattr(manager, "block_pool", None)
    if preempt is None or not callable(getattr(pool, "get_num_free_blocks", None)):
        return
    call = GUARD.call

    @functools.wraps(preempt)
    def preempt_(request, *a, **kw):
        if not observer.scheduling:
            return preempt(request, *a, **kw)
        before = call("scheduler observer", _pool_reading, manager, request.request_id)
        result = preempt(request, *a, **kw)
        if before is not None:
            alone, free = before
            after = call("scheduler observer", pool.get_num_free_blocks)
            if after is not None:
                observer.preemptions[request.request_id] = (alone, after - free)
        return result

    setattr(s, name, preempt_)


def _pool_reading(manager: Any, request_id: str) -> tuple[int, int]:
    """(the blocks `request_id` holds that no other request holds, the pool's free blocks now).
    vLLM's KVCacheManager hands out block objects with a reference count (every KV cache group's,
    the null block left out); the reference's BlockPool keeps block ids and a count per id."""
    pool = manager.block_pool
    counts = getattr(pool, "ref_cnt", None)
    if isinstance(counts, list):  # the reference (replay/models/kv.py)
        alone = sum(counts[b] == 1 for b in pool.blocks.get(request_id, ()))
    else:
        groups = manager.get_blocks(request_id).blocks
        alone = len({b.block_id for group in groups for b in group if not b.is_null and b.ref_cnt == 1})
    return alone, pool.get_num_free_blocks()


def count_evictions(observer: SchedulerObserver) -> None:
    """Count the prefix cache's evictions: wrap the block pool's `_maybe_evict_cached_block`
    (vLLM's, and the reference's of the same name: a free block handed out again loses its hash)
    on the instance. Nothing to count where the scheduler caches nothing."""
    pool = getattr(getattr(observer.scheduler, "kv_cache_manager", None), "block_pool", None)
    evict = getattr(pool, "_maybe_evict_cached_block", None)
    if evict is None or not getattr(pool, "enable_caching", False):
        return
    observer.evictions = 0

    @functools.wraps(evict)
    def maybe_evict(block, *a, **kw):
        evicted = evict(block, *a, **kw)
        if evicted:
            observer.evictions += 1
        return evicted

    pool._maybe_evict_cached_block = maybe_evict


def _group0(block_ids: Any) -> list[int] | None:
    """vLLM's block ids per KV cache group (a tuple of lists; None: no new blocks), or the
    reference's one list: the first group's."""
    if not block_ids:
        return None if block_ids is None else []
    first = block_ids[0]
    return list(first) if isinstance(first, (list, tuple)) else list(block_ids)
