"""The SGLang observer: watches SGLang 0.5.23's scheduler and its worker from outside and writes the rows.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. `attach` wraps, on the instances, the methods SGLang's own event loop
calls (before and after the original, which runs unchanged; nothing here writes to SGLang's
objects), and writes the trace rows through the `Recorder`:

| wrapped (instance)                       | called from (0.5.23)                         | gives              |
| ---------------------------------------- | -------------------------------------------- | ------------------ |
| Scheduler._add_request_to_queue          | handle_generate_request; update_running_batch | arrivals, retractions |
| Scheduler.process_input_requests         | ingest_requests, every iteration             | aborts (AbortReq)  |
| Scheduler.get_next_batch_to_run          | both loops, once per iteration               | the scheduler's rows |
| Scheduler._reqs_finishing_inflight       | update_running_batch                         | why one is skipped |
| model_worker.forward_batch_generation    | run_batch, after the FutureMap's resolution  | worker, KV truth   |
| Scheduler.process_batch_result           | both loops; under overlap an iteration late  | the apply columns  |
| tree_cache.claim_kv_row / on_release     | release_kv_cache (mem_cache/common.py)       | a finish's release |

One row per request per loop iteration (the trace's step, 1-based: the iteration's
`recv_requests` call), from the iteration it arrives in to the one whose processing finished and
released it (an abort that takes it out of the waiting queue: that iteration). The scheduler's
columns are its view after `get_next_batch_to_run` (the sched_kv_* lengths, its seq_lens entry in
the batch it built; sched_num_computed_tokens is Req.kv.kv_committed_len before the iteration's
scheduling); the worker's, what the worker was handed and did (the seq_lens after the FutureMap's
resolution, the positions and drafts, what it emitted and published); the apply columns, what
`process_batch_result` did with the batch's result for it, in the iteration that popped it. The
vLLM columns with no SGLang meaning hold 0 / False (schema.py says which).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specreplay.replay.families.sglang.truth import SglangTruth
from specreplay.replay.families.sglang.worker import VERIFY, RowResult
from specreplay.replay.observers.guard import GUARD
from specreplay.replay.observers.recorder import Recorder

#: SGLang's finish reason classes (schedule_batch.py) -> the trace's apply_finish_reason.
FINISH_REASONS = {
    "FINISH_LENGTH": "length",
    "FINISH_MATCHED_TOKEN": "stop",
    "FINISH_MATCHED_STR": "stop",
    "FINISH_ABORT": "aborted",
}
WHO = "SGLang observer"


@dataclass
class Tracked:
    """A request the observer follows: SGLang's Req object and its place in the row order."""

    req: Any
    order: int
    last_step: int | None = None  # the iteration of its last row (released, or aborted while waiting)
    scheduled_before: bool = False  # launched at least once (else its first batch is `new`)
    retracted: bool = False  # retracted and not re-prefilled yet (its next batch is `resumed`)


@dataclass(frozen=True)
class Launch:
    """A batch handed to the worker, waiting for process_batch_result: its iteration and rows."""

    step: int
    rids: tuple[str, ...]
    reqs: tuple[int, ...]  # the rows' Req objects, by id() (a streaming session's turns share an id)
    scheduled: tuple[int, ...]  # tokens per row, as the rows' sched_num_scheduled_tokens
    draft_slots: int  # k on a verify batch, else 0


def finish_reason(req: Any) -> str:
    reason = req.finished_reason
    return "" if reason is None else FINISH_REASONS.get(type(reason).__name__, "stop")


class SglangObserver:
    """Writes the rows of every iteration (module docstring). `order`: the row order of the
    workload's request ids; `k`: the EAGLE draft steps (0: no spec)."""

    def __init__(
        self,
        scheduler: Any,
        recorder: Recorder,
        oracle: Any,
        truth: SglangTruth,
        *,
        k: int,
        order: dict[str, int],
        steps_for: Callable[[int], int] | None = None,
    ) -> None:
        """`k`: the EAGLE steps the run was configured with (0: no speculation); `steps_for(bs)`:
        the steps the worker runs a decode batch of `bs` requests with (adaptive speculation
        changes them as it runs; None: always k)."""
        self.s = scheduler
        self.rec = recorder
        self.oracle = oracle
        self.truth = truth
        self.k = k
        self.steps_for = steps_for or (lambda batch_size: k)
        self.order = dict(order)
        self.iteration = 0
        self.tracked: dict[str, Tracked] = {}  # every request seen, by id
        self.active: list[Tracked] = []  # those with a row this iteration or later, in row order
        self.events: dict[str, str] = {}  # this iteration's control events per request
        self.retracted_now: set[str] = set()
        self.finishing_inflight: set[str] = set()
        self.committed_before: dict[str, int] = {}
        self.prev_scheduled: set[str] = set()
        self.launched: deque[Launch] = deque()
        self.releases: dict[str, dict[str, Any]] = {}  # rid -> what its finish release recorded
        # Req (by id()) -> its kv lengths and streaming session id (None: none) as a release began
        self._releasing: dict[int, tuple[int, int, int, str | None]] = {}
        # Reqs (by id()) released unfinished in this scheduling, until what follows settles it: re-enqueued,
        # a retraction; not, by the scheduling's end, a request the scheduler dropped (`settle_releases`).
        # Each with what its release recorded (None: its streaming session kept its KV record).
        self.unsettled: dict[int, tuple[Any, dict[str, Any] | None]] = {}
        self._pre_apply: list[tuple[int, int, bool, bool]] = []
        self._worker_in: tuple[list[int], list[int]] = ([], [])
        self._carried: list[list[int]] = []

    # ------------------------------------------------------------------ the clock
    def set_iteration(self, iteration: int) -> None:
        """The loop's receiver starts iteration `iteration` (its recv_requests call)."""
        self.iteration = iteration
        self.active = [t for t in self.active if t.last_step is None or t.last_step >= iteration]
        self.events = {}
        self.retracted_now = set()
        self.finishing_inflight = set()

    def live(self) -> list[Tracked]:
        """The requests with a row this iteration, in row order."""
        return self.active

    @property
    def requests(self) -> dict[str, Any]:
        """The requests the scheduler holds now, by id (SGLang keeps them in its queues and
        batches, not one table): what a crash's message may name (engines/crash.py)."""
        return {t.req.rid: t.req for t in self.active}

    # ------------------------------------------------------------------ arrivals, aborts, retractions
    def on_enqueue(self, req: Any, is_retracted: bool = False) -> None:
        rid = req.rid
        if is_retracted:
            t = self.tracked[rid]
            t.retracted = True
            self.retracted_now.add(rid)
            _, release = self.unsettled.pop(id(req), (None, {}))
            if release is None:  # a streaming session kept its KV record: it resumes from it
                self.truth.reread(rid)
            else:
                self.truth.retracted(rid)
        elif rid not in self.tracked:
            t = self.tracked[rid] = Tracked(req, self.order.setdefault(rid, len(self.order)))
            self.active.append(t)
            self.active.sort(key=lambda t: t.order)  # arrivals are few: a sort each
        elif self.tracked[rid].req is not req:
            # A streaming session's next turn: a new Req under the id, on the session's KV record
            # (families/sglang/sessions.py). Its rows go on the id's; the first says the turn began.
            t = self.tracked[rid]
            t.req, t.last_step, t.scheduled_before, t.retracted = req, None, False, False
            self.events[rid] = "stream_turn"
            self.truth.reread(rid)
            if t not in self.active:
                self.active.append(t)
                self.active.sort(key=lambda t: t.order)

    def before_inputs(self) -> tuple[set[int], set[int]]:
        """Before the iteration's inputs are processed: who waits, who is known (Reqs, by id():
        a streaming session's next turn is a new Req under a known id)."""
        return {id(r) for r in self.s.waiting_queue}, {id(t.req) for t in self.tracked.values()}

    def after_inputs(self, recv_reqs: list[Any], before: tuple[set[int], set[int]]) -> None:
        """The requests each AbortReq reached (SGLang matches ids by prefix: `refuse_workload`
        keeps the workload's aborted ids prefixes of no other). One that was waiting, or arrived
        in the same inputs, and is no longer in the waiting queue was taken out of it and
        answered with an abort: this iteration is its last row. (abort_request itself is bound
        into SGLang's request dispatcher at construction: an instance wrap would not be called.)"""
        waiting_before, known_before = before
        waiting_now = {id(r) for r in self.s.waiting_queue}
        for recv_req in recv_reqs:
            if type(recv_req).__name__ != "AbortReq":
                continue
            for t in self.active:
                rid = t.req.rid
                if not rid.startswith(recv_req.rid) or t.last_step is not None:
                    continue
                self.events[rid] = "abort"
                was_waiting = id(t.req) in waiting_before or id(t.req) not in known_before
                if was_waiting and id(t.req) not in waiting_now:
                    t.last_step = self.iteration

    def on_finishing_inflight(self, reqs: list[Any]) -> None:
        self.finishing_inflight = {r.rid for r in reqs}

    # ------------------------------------------------------------------ the scheduler's view
    def before_schedule(self) -> None:
        self.committed_before = {t.req.rid: t.req.kv.kv_committed_len for t in self.active}

    def settle_releases(self, plan: Any) -> None:
        """After the scheduling: a request released unfinished that no queue or batch holds now
        was dropped. retract_decode aborts the last request of a decode batch that does not fit
        even alone (its client gets an AbortReq); it was retracted first, and its life ends here."""
        if not self.unsettled:
            return
        held = {id(r) for r in self.s.waiting_queue}
        for batch in (plan.running_batch, plan.batch_to_run):
            held.update(id(r) for r in (batch.reqs if batch is not None else ()))
        held.add(id(self.s.chunked_req))
        for key, (req, release) in self.unsettled.items():
            if key in held:
                continue  # still the scheduler's: a release that ended nothing
            self._finished(req)
            self.retracted_now.add(req.rid)  # the result in flight is skipped as a retracted request's
            if release is not None:
                self.truth.released(req.rid)
                self.releases[req.rid] = release
        self.unsettled = {}

    def after_schedule(self, plan: Any) -> None:
        self.settle_releases(plan)
        batch = plan.batch_to_run
        s = self.s
        in_batch: dict[int, int] = {}
        scheduled: list[int] = []
        seq_lens: list[int] = []
        mode = None
        steps = 0  # the draft slots of each row of a verify batch
        if batch is not None:
            mode = self.mode_of(batch)
            in_batch = {id(r): i for i, r in enumerate(batch.reqs)}
            scheduled = self.tokens_per_row(batch, mode)
            seq_lens = batch.seq_lens.tolist()
            steps = scheduled[0] - 1 if mode == VERIFY and scheduled else 0
        running = {id(r) for r in plan.running_batch.reqs} if plan.running_batch is not None else set()
        if s.chunked_req is not None:
            running.add(id(s.chunked_req))
        waiting = {id(r) for r in s.waiting_queue}
        in_flight = self.in_flight()
        rows: list[tuple] = []
        sgl = _columns("sched_kv_committed_len sched_kv_allocated_len sched_seq_len sched_req_pool_idx")
        for t in self.live():
            r, rid = t.req, t.req.rid
            at = in_batch.get(id(r))
            n = scheduled[at] if at is not None else 0
            finished = r.finished() or t.last_step is not None
            if at is not None:
                kind = "resumed" if t.retracted else "cached" if rid in self.prev_scheduled else "reentering"
                kind = "new" if not t.scheduled_before else kind
                skip = ""
                t.scheduled_before, t.retracted = True, False
                status = "running"
            else:
                kind = "unscheduled"
                if finished:
                    status, skip = "finished", "finished"
                elif rid in self.retracted_now:
                    status, skip = "preempted", "preempted"
                elif id(r) in waiting:
                    status, skip = ("preempted" if t.retracted else "waiting"), "waiting"
                elif rid in self.finishing_inflight:
                    # Left out of the decode batch: the result in flight finishes it by length.
                    status, skip = "running", "max_tokens"
                elif id(r) in running:
                    status = "running"
                    skip = "prefill" if mode is not None and mode not in ("decode", VERIFY) else "no_tokens"
                else:
                    raise AssertionError(f"request {rid} is in no queue of the scheduler")  # our bug, not SGLang's
            output = len(r.output_ids)
            prompt = len(r.origin_input_ids)
            rows.append(
                (
                    rid,
                    0,  # sched_life: one life per id (resubmission is not driven)
                    self.events.get(rid, ""),
                    status,
                    kind,
                    skip,
                    n,
                    steps if n and mode == VERIFY else 0,
                    self.committed_before.get(rid, 0),  # sched_num_computed_tokens: committed before
                    None,  # sched_num_cached_tokens: vLLM's prefix cache (SGLang's radix cache is its own)
                    None,  # sched_cache_hit_blocks
                    0,  # sched_num_output_placeholders
                    prompt + output,
                    output,
                    prompt,
                    0,  # sched_spec_len
                    False,  # sched_spec_placeholders
                    bool(n) and mode == "extend" and r.extend_end < prompt + output,
                    t.last_step is not None,  # sched_finished_announced: an abort answered at once
                    rid in self.retracted_now,
                    in_flight.get(id(r), 0),
                    0,  # sched_num_stale_output_tokens
                    None,  # sched_preempt_blocks_alone: vLLM's block pool
                    None,  # sched_preempt_blocks_returned
                )
            )
            sgl["sched_kv_committed_len"].append(r.kv.kv_committed_len)
            sgl["sched_kv_allocated_len"].append(r.kv.kv_allocated_len)
            sgl["sched_seq_len"].append(seq_lens[at] if at is not None else None)
            sgl["sched_req_pool_idx"].append(r.kv.req_pool_idx)
        index = self.rec.append_step(self.iteration, sum(scheduled), "", rows)
        at_rows = list(index.values())
        if at_rows:
            self.rec.fill_columns(at_rows, {**sgl, "step_forward_mode": [mode] * len(at_rows)})
        for rid, release in self.releases.items():  # released by the scheduling: an aborted chunked prefill
            if rid in index:
                self.rec.fill(index[rid], release)
        self.releases = {}
        for step in [step for step in self.rec.rows_of_step if step < self.iteration - 1]:
            if all(launch.step != step for launch in self.launched):
                del self.rec.rows_of_step[step]  # nothing will write to that step's rows again
        self.prev_scheduled = {r.rid for r in batch.reqs} if batch is not None else set()
        if batch is None:
            self.rec.step_done(self.iteration)  # nothing runs: both views of the iteration are in

    def mode_of(self, batch: Any) -> str:
        """The forward mode the batch runs as: the scheduler's, a spec decode batch as the verify it is."""
        name = batch.forward_mode.name.lower()
        return VERIFY if name == "decode" and self.k else name

    def tokens_per_row(self, batch: Any, mode: str) -> list[int]:
        if mode == "extend" or mode == "mixed":
            return list(batch.extend_lens)
        width = self.steps_for(len(batch.reqs)) + 1 if mode == VERIFY else 1
        return [width] * len(batch.reqs)

    def in_flight(self) -> dict[int, int]:
        """Tokens of launched batches whose results are not processed yet, per Req (by id())."""
        out: dict[int, int] = {}
        for launch in self.launched:
            for req, n in zip(launch.reqs, launch.scheduled):
                out[req] = out.get(req, 0) + n
        return out

    # ------------------------------------------------------------------ the worker's view
    def before_forward(self, batch: Any) -> None:
        self._worker_in = (batch.seq_lens.tolist(), batch.req_pool_indices.tolist())

    def after_forward(self, result: Any, batch: Any, worker_rows: list[RowResult]) -> None:
        step = self.iteration
        index = self.rec.rows_of_step.get(step, {})
        mode = self.mode_of(batch)
        scheduled = self.tokens_per_row(batch, mode)
        rids = tuple(r.rid for r in batch.reqs)
        reqs = tuple(id(r) for r in batch.reqs)
        self.launched.append(Launch(step, rids, reqs, tuple(scheduled), scheduled[0] - 1 if mode == VERIFY else 0))
        seq_lens, pool_rows = self._worker_in
        published = result.new_seq_lens.tolist() if getattr(result, "new_seq_lens", None) is not None else None
        edited = [a != b for a, b in zip(batch.seq_lens.tolist(), seq_lens)]
        edited = [e or a != b for e, a, b in zip(edited, batch.req_pool_indices.tolist(), pool_rows)]
        at, cols = (
            [],
            _columns(
                "worker_row worker_num_scheduled_tokens worker_num_draft_slots worker_first_position worker_draft_ids "
                "worker_negative_inputs worker_num_accepted worker_num_emitted worker_edited_output worker_sampled_ids "
                "worker_seq_len worker_new_seq_len"
            ),
        )
        for i, (rid, row) in enumerate(zip(rids, worker_rows)):
            if rid not in index:
                continue
            at.append(index[rid])
            cols["worker_row"].append(i)
            cols["worker_num_scheduled_tokens"].append(len(row.written))
            cols["worker_num_draft_slots"].append(len(row.drafts))
            cols["worker_first_position"].append(row.first_position)
            cols["worker_draft_ids"].append(row.drafts)
            cols["worker_negative_inputs"].append(row.negative_inputs)
            cols["worker_num_accepted"].append(row.accepted)
            cols["worker_num_emitted"].append(len(row.emitted) if row.samples else 0)
            cols["worker_edited_output"].append(edited[i])
            cols["worker_sampled_ids"].append(row.emitted if row.samples else [])
            cols["worker_seq_len"].append(seq_lens[i])
            cols["worker_new_seq_len"].append(published[i] if published is not None else None)
        self.rec.fill_columns(at, cols)
        live = [t.req for t in self.live()]
        truth = self.truth.forward(list(zip(batch.reqs, worker_rows)), live)
        truth_at = [index[rid] for rid in truth if rid in index]
        if truth_at:
            names = list(next(iter(truth.values())))
            self.rec.fill_columns(
                truth_at, {name: [truth[rid][name] for rid in truth if rid in index] for name in names}
            )
        self.rec.step_done(step)  # both views in: a journal flush after an exception keeps the step

    # ------------------------------------------------------------------ what the result did
    def before_apply(self, batch: Any, result: Any) -> None:
        self._pre_apply = [(len(r.output_ids), r.kv.kv_committed_len, r.finished(), r.is_retracted) for r in batch.reqs]
        self._carried = self.carried(batch, result)
        self.releases = {}

    def carried(self, batch: Any, result: Any) -> list[list[int]]:
        """The token ids the result carries for each row, as process_batch_result reads them:
        one per row, or under spec v2 the first accept_len of each row's k + 1."""
        ids = result.next_token_ids.tolist()
        if result.accept_lens is None:
            return [[t] for t in ids]
        width = len(ids) // max(1, len(batch.reqs))
        return [ids[i * width : i * width + a] for i, a in enumerate(result.accept_lens.tolist())]

    def after_apply(self, batch: Any) -> None:
        launch = self.launched.popleft()
        rids = tuple(r.rid for r in batch.reqs)
        assert launch.rids == rids, f"processed batch {rids} is not the launched one {launch.rids}"  # our bug
        index = self.rec.rows_of_step.get(launch.step, {})
        applied = _columns(
            "apply_step apply_outcome apply_life apply_num_scheduled_tokens apply_num_draft_slots apply_num_rejected "
            "apply_num_tokens apply_sampled_token_ids apply_token_mismatches apply_num_computed_tokens "
            "apply_num_output_placeholders apply_finish_reason apply_kv_committed_len apply_kv_allocated_len "
            "apply_skip_reason"
        )
        ignored = _columns("apply_step apply_outcome apply_kv_committed_len apply_kv_allocated_len apply_skip_reason")
        applied_at, ignored_at = [], []
        for i, r in enumerate(batch.reqs):
            at = index.get(r.rid)
            if at is None:
                continue
            n_out, committed, was_finished, was_retracted = self._pre_apply[i]
            appended = list(r.output_ids[n_out:])
            kv = r.kv
            if (was_finished or was_retracted) and not appended and kv.kv_committed_len == committed:
                ignored_at.append(at)
                ignored["apply_step"].append(self.iteration)
                ignored["apply_outcome"].append("ignored")
                ignored["apply_kv_committed_len"].append(kv.kv_committed_len)
                ignored["apply_kv_allocated_len"].append(kv.kv_allocated_len)
                ignored["apply_skip_reason"].append("finished" if was_finished else "retracted")
                continue
            applied_at.append(at)
            carried = self._carried[i]
            applied["apply_step"].append(self.iteration)
            applied["apply_outcome"].append("applied")
            applied["apply_life"].append(0)
            applied["apply_num_scheduled_tokens"].append(launch.scheduled[i])
            applied["apply_num_draft_slots"].append(launch.draft_slots)
            applied["apply_num_rejected"].append(launch.draft_slots + 1 - len(carried) if launch.draft_slots else 0)
            applied["apply_num_tokens"].append(len(appended))
            applied["apply_sampled_token_ids"].append(carried)
            applied["apply_token_mismatches"].append(
                self.oracle.mismatches(r.rid, n_out, appended, len(r.origin_input_ids))
            )
            applied["apply_num_computed_tokens"].append(kv.kv_committed_len)
            applied["apply_num_output_placeholders"].append(0)
            applied["apply_finish_reason"].append("" if was_finished else finish_reason(r))
            applied["apply_kv_committed_len"].append(kv.kv_committed_len)
            applied["apply_kv_allocated_len"].append(kv.kv_allocated_len)
            applied["apply_skip_reason"].append("")
        self.rec.fill_column_groups([(applied_at, applied), (ignored_at, ignored)])
        for rid, release in self.releases.items():
            # On the row whose result finished it, else (released in this iteration's processing
            # all the same) on its row of this iteration.
            row = index.get(rid) if rid in rids else None
            row = row if row is not None else self.rec.rows_of_step.get(self.iteration, {}).get(rid)
            if row is not None:
                self.rec.fill(row, release)
        self.releases = {}

    # ------------------------------------------------------------------ releases
    def before_release(self, req: Any) -> None:
        kv = req.kv
        session = req.session.session_id if req.session is not None else None  # a keep may detach it
        self._releasing[id(req)] = (kv.kv_committed_len, kv.kv_allocated_len, req.owned_kv_len(), session)

    def after_claim(self, kept: bool, req: Any) -> None:
        """`claim_kv_row` answered: True when a streaming session kept the request's KV record
        (families/sglang/sessions.py), so nothing is released: a turn that finished is over (its
        session holds the KV for the next turn), a retracted one resumes from it."""
        if not kept:
            return
        *_, session = self._releasing.pop(id(req))
        slot = self.s.tree_cache.session.slots.get(session)
        if slot is not None:
            self.truth.kept(req.rid, slot.kv.kv_committed_len)
        if req.finished():
            self._finished(req)
        else:
            self.unsettled[id(req)] = (req, None)

    def after_release(self, req: Any, checkpointed: bool) -> None:
        committed, allocated, owned, _ = self._releasing.pop(id(req))
        release = {
            "apply_released_committed_len": committed,
            "apply_released_allocated_len": allocated,
            "apply_owned_kv_len": owned,
            "apply_release_checkpointed": checkpointed,
        }
        if not req.finished():
            self.unsettled[id(req)] = (req, release)  # a retraction's, or a drop's (settle_releases)
            return
        self._finished(req)
        self.truth.released(req.rid)
        self.releases[req.rid] = release

    def _finished(self, req: Any) -> None:
        """The request's life (a streaming session's turn) ends in this iteration."""
        t = self.tracked.get(req.rid)
        if t is not None and t.req is req:
            t.last_step = self.iteration
            at = self.rec.rows_of_step.get(self.iteration, {}).get(req.rid)
            if at is not None:
                self.rec.fill(at, {"sched_finished_announced": True})


def _columns(names: str) -> dict[str, list]:
    return {name: [] for name in names.split()}


# ====================================================================== attaching
def wrap(obj: Any, name: str, before: Any = None, after: Any = None) -> None:
    """Replace `obj.name` by an instance attribute calling the original between `before(*args)`
    and `after(result, *args)`, each through the guard (an observer's failure is specreplay's)."""
    original = getattr(obj, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            GUARD.call(WHO, functools.partial(before, *args, **kwargs))
        result = original(*args, **kwargs)
        if after is not None:
            GUARD.call(WHO, functools.partial(after, result, *args, **kwargs))
        return result

    setattr(obj, name, wrapper)


def attach(observer: SglangObserver, worker_rows: Any) -> None:
    """Wrap the scheduler's methods (module docstring). `worker_rows()`: what the reference
    worker did in its last forward, row by row (families/sglang/worker.py `last_forward`)."""
    s = observer.s
    inputs: list[tuple[set[int], set[int]]] = []
    wrap(s, "_add_request_to_queue", after=lambda _, req, is_retracted=False: observer.on_enqueue(req, is_retracted))
    wrap(
        s,
        "process_input_requests",
        before=lambda recv_reqs: inputs.append(observer.before_inputs()),
        after=lambda _, recv_reqs: observer.after_inputs(recv_reqs, inputs.pop()),
    )
    wrap(s, "_reqs_finishing_inflight", after=lambda reqs, batch: observer.on_finishing_inflight(reqs))
    wrap(
        s,
        "get_next_batch_to_run",
        before=lambda *a, **kw: observer.before_schedule(),
        after=lambda plan, *a, **kw: observer.after_schedule(plan),
    )
    wrap(
        s.model_worker,
        "forward_batch_generation",
        before=lambda batch, *a, **kw: observer.before_forward(batch),
        after=lambda result, batch, *a, **kw: observer.after_forward(result, batch, worker_rows()),
    )
    wrap(
        s,
        "process_batch_result",
        before=lambda batch, result: observer.before_apply(batch, result),
        after=lambda _, batch, result: observer.after_apply(batch),
    )
    wrap(
        s.tree_cache,
        "claim_kv_row",
        before=lambda req: observer.before_release(req),
        after=lambda kept, req: observer.after_claim(kept, req),
    )
    wrap(s.tree_cache, "on_release", after=lambda _, req, checkpointed: observer.after_release(req, checkpointed))


__all__ = ["SglangObserver", "attach", "wrap"]
