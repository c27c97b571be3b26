"""Reference scheduler: vLLM 0.32.0's `Scheduler` and `AsyncScheduler`, state and arithmetic only.

Where it sits: replay, scheduler side. The engine loop calls `schedule()`, hands the
`SchedulerOutput` to a runner, and later calls `update_from_output()`. Variants subclass these
classes and override the hooks below (documented in the README, "Writing an implementation").

Hooks, in the order a step uses them:
  schedule_running(plan)                                the running-queue visit
  running_demand(req, budget, threshold) -> (n, skip)   tokens to give a running request
  allocate_or_preempt(req, n, plan) -> bool             KV blocks, preempting from the tail
  preempt_request(req)                                  what preemption resets
  assign_draft_slots(req, n) -> list[int]               the draft slots booked inside n
  admit_waiting(plan)                                   the waiting queue (new and resumed)
  update_after_schedule(out)                            C += n; (async) placeholders
  update_from_output(out, model_output) -> reports      rejections, placeholders, stops
  update_draft_token_ids(req_ids, drafts)               sync mode: real drafts from the worker

Control events (between steps, from the engine loop): add_request, finish_requests,
set_pause_state(PAUSE_STATES[i]), reset_prefix_cache(reset_running_requests).

Worked example of the async counters for one decoding request, k = 3, all drafts accepted
(values after each event; T = prompt + applied outputs):
  schedule(m):   C 7 -> 11, P 4 -> 8   (n = T + len(spec) + P - C = 4 + 3 + 4 - 7 = 4)
  apply(m-1):    rej = 3 - 3 = 0; 4 tokens appended: T 4 -> 8, P 8 -> 4
  schedule(m+1): demand = 8 + 3 + 4 - 11 = 4 again: the identity T + P - C = 1 holds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from specreplay.replay.config import EngineConfig
from specreplay.replay.kv import BlockPool
from specreplay.replay.messages import (CachedRequestData, EngineCrash, ModelRunnerOutput, NewRequestData,
                                        SchedulerOutput)
from specreplay.replay.request import Request, Status

#: vLLM's PauseState: UNPAUSED, PAUSED_NEW (running requests go on, nothing is admitted),
#: PAUSED_ALL (nothing is scheduled).
PAUSE_STATES = ("unpaused", "paused_new", "paused_all")


@dataclass
class StepPlan:
    """What one `schedule()` call has decided so far."""

    budget: int
    threshold: int = 0  # long_prefill_token_threshold in force this step
    prefill_scheduled: bool = False  # a running request scheduled this step is mid-prefill
    num_scheduled: dict[str, int] = field(default_factory=dict)
    spec: dict[str, list[int]] = field(default_factory=dict)
    new_blocks: dict[str, list[int]] = field(default_factory=dict)
    running: list[Request] = field(default_factory=list)
    new: list[Request] = field(default_factory=list)
    resumed: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)


@dataclass(frozen=True)
class ApplyReport:
    """What `update_from_output` did to one request (the recorder's `apply_*` columns)."""

    num_scheduled_tokens: int  # as read back from the SchedulerOutput
    num_draft_slots: int
    num_rejected: int
    tokens: tuple[int, ...]
    finish_reason: str  # "" | "length" | "stop"
    num_computed_tokens: int
    num_output_placeholders: int
    outcome: str = "applied"  # applied | stale_delivered | dropped (schema.APPLY_OUTCOMES)
    life: int = 0  # the life of the request object the output was given to


class Scheduler:
    """vLLM 0.32.0 `Scheduler` (one batch in flight): FCFS, chunked prefill, no prefix caching."""

    is_async = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.k = config.num_spec_tokens
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.finished_req_ids: set[str] = set()
        self.preempted_req_ids: set[str] = set()
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.kv = BlockPool(config.num_blocks, config.block_size, config.max_model_len)
        self.step = 0
        self.pause_state = "unpaused"
        #: Why each live request got no tokens in the last schedule() (recorder only).
        self.skip_reasons: dict[str, str] = {}

    # ---------------------------------------------------------------- requests in and out
    def add_request(self, request: Request) -> Request:
        """Queue a new request; returns the object the scheduler tracks (the recorder reads it).
        An id that is still live is vLLM's `assert ... "duplicate request id"`; a finished one's
        id is free again (a new life: nothing ties the old life's in-flight outputs to it)."""
        if request.request_id in self.requests:
            raise EngineCrash(f"scheduler assert: duplicate request id {request.request_id!r} (it is still live)",
                              kind="scheduler-assert")
        self.requests[request.request_id] = request
        self.waiting.append(request)
        return request

    def has_requests(self) -> bool:
        """vLLM's get_num_unfinished_requests() > 0, which a pause narrows: under PAUSED_ALL
        nothing counts, under PAUSED_NEW only running requests (queued ones stay queued)."""
        if self.pause_state == "paused_all":
            return False
        if self.pause_state == "paused_new":
            return bool(self.running)
        return bool(self.running or self.waiting)

    def set_pause_state(self, state: str) -> None:
        """vLLM's set_pause_state: only the state changes; schedule() and has_requests() read it."""
        self.pause_state = state

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM 0.32's Scheduler.reset_prefix_cache: with `reset_running_requests`, preempt every
        running request (from the tail, so they come back in order) in drop mode: their in-flight
        outputs are ignored when they return, and they may resume in the very next schedule().
        The cache itself resets only if no request holds KV blocks; returns whether it did."""
        if reset_running_requests:
            while self.running:
                self.preempt_request(self.running.pop(), drop_stale_output=True)
            # As if nothing was scheduled last step: the resumed requests get their full
            # token lists, and the worker drops them from its batch first.
            self.prev_step_scheduled_req_ids.clear()
        return self.kv.num_used_blocks() == 0

    def finish_requests(self, request_ids: list[str], status: Status = Status.FINISHED_ABORTED) -> list[str]:
        """Abort (or otherwise finish) requests from outside update_from_output; returns the ids
        that were live and are now finished."""
        done = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.status.finished:
                continue
            if req.status == Status.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self._free(req, status)
            done.append(rid)
        return done

    def _free(self, req: Request, status: Status) -> None:
        req.status = status
        self.kv.release(req.request_id)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]

    # ---------------------------------------------------------------- schedule()
    def schedule(self) -> SchedulerOutput:
        self.step += 1
        self.skip_reasons = {}
        budget = 0 if self.pause_state == "paused_all" else self.config.max_num_batched_tokens
        plan = StepPlan(budget=budget, threshold=self.long_prefill_threshold())
        self.schedule_running(plan)
        if not plan.preempted and self.pause_state == "unpaused":
            # PAUSED_NEW admits only waiting requests that hold KV blocks: none here (a
            # preempted request has freed its blocks).
            self.admit_waiting(plan)
        out = self.make_output(plan)
        self.update_after_schedule(out)
        return out

    def long_prefill_threshold(self) -> int:
        # vLLM applies the threshold only when more than one request is eligible.
        eligible = len(self.running) + len(self.waiting)
        return self.config.long_prefill_token_threshold if eligible > 1 else 0

    def schedule_running(self, plan: StepPlan) -> None:
        i = 0
        # The loop stops as soon as the budget is 0: later requests are not even visited.
        while i < len(self.running) and plan.budget > 0:
            req = self.running[i]
            n, skip = self.running_demand(req, plan.budget, plan.threshold)
            if n <= 0:
                self.skip_reasons[req.request_id] = skip
                i += 1
                continue
            if not self.allocate_or_preempt(req, n, plan):
                break
            plan.running.append(req)
            plan.prefill_scheduled |= req.is_prefill_chunk
            plan.num_scheduled[req.request_id] = n
            plan.budget -= n
            i += 1
            slots = self.assign_draft_slots(req, n)
            if slots:
                plan.spec[req.request_id] = slots

    def running_demand(self, req: Request, budget: int, threshold: int) -> tuple[int, str]:
        """Tokens to schedule for a running request, or (0, why not)."""
        # Max-tokens rule: the in-flight step emits at least one token; if that reaches
        # max_tokens, this request never needs another step.
        if (req.num_output_placeholders > 0 and req.num_computed_tokens + 2 - req.num_output_placeholders
                >= req.num_prompt_tokens + req.max_tokens):
            return 0, "max_tokens"
        n = req.num_tokens_with_spec + req.num_output_placeholders - req.num_computed_tokens
        if 0 < threshold < n:
            n = threshold
        n = min(n, budget, self.config.max_model_len - req.num_computed_tokens - 1)
        return n, "no_tokens"

    def allocate_or_preempt(self, req: Request, n: int, plan: StepPlan) -> bool:
        """Allocate KV slots for `req`, preempting from the tail of `running` (FCFS) until they
        fit. False if `req` itself had to be preempted."""
        while True:
            new = self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n,
                                         self.config.num_lookahead_tokens)
            if new is not None:
                plan.new_blocks[req.request_id] = new
                return True
            victim = self.running.pop()
            self.preempt_request(victim)
            plan.preempted.append(victim)
            self.skip_reasons[victim.request_id] = "preempted"
            if victim is req:
                return False

    def preempt_request(self, req: Request, drop_stale_output: bool = False) -> None:
        """vLLM 0.32: C and P reset; the in-flight output is marked stale: still delivered but no
        longer moving the counters (deliver mode, a preemption for KV blocks), or ignored
        altogether (drop mode, a cache reset). An undrained drop-mode share stays in drop mode."""
        self.kv.release(req.request_id)
        req.status = Status.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.drop_stale_output = drop_stale_output or (req.drop_stale_output and req.num_stale_output_tokens > 0)
        # Assigned, not added: the in-flight count already holds any undrained stale share.
        req.num_stale_output_tokens = req.num_in_flight_tokens
        req.num_output_placeholders = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        self.preempted_req_ids.add(req.request_id)

    def assign_draft_slots(self, req: Request, n: int) -> list[int]:
        """The draft slots inside `n`; the request's spec list is cleared once scheduled."""
        if not req.spec_token_ids:
            return []
        num_spec = n + req.num_computed_tokens - req.num_tokens - req.num_output_placeholders
        slots = req.spec_token_ids[:num_spec] if num_spec > 0 else []
        req.spec_token_ids = []
        return list(slots)

    def admit_waiting(self, plan: StepPlan) -> None:
        skipped: list[Request] = []
        while plan.budget > 0 and self.waiting:
            if len(self.running) >= self.config.max_num_seqs:
                break
            req = self.waiting[0]
            if req.num_stale_output_tokens and not req.drop_stale_output:
                # Stale output of the preempted life is still in flight: resuming now
                # would deliver it out of order. Try again next step.
                skipped.append(self.waiting.popleft())
                continue
            need = req.num_tokens - req.num_computed_tokens
            padded = self.pad_to_draft_width(req, need, plan)
            if padded is None:
                break  # the padded step does not fit the budget: vLLM prefers not to schedule
            n = padded
            if 0 < plan.threshold < n:
                n = plan.threshold
            n = min(n, plan.budget)
            # vLLM 0.32 admits a waiting request only if its whole sequence fits in the free
            # blocks (scheduler_reserve_full_isl, on by default), not just this chunk.
            if not self.kv.fits(req.request_id, req.num_tokens):
                break
            new = self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n,
                                         self.config.num_lookahead_tokens)
            if new is None:
                break
            if padded != need and n != padded:  # vLLM asserts this only once the blocks are allocated
                raise EngineCrash(f"scheduler assert: request {req.request_id!r} padded to {padded} tokens "
                                  f"for spec decode but cut to {n} (long_prefill_token_threshold)",
                                  kind="scheduler-assert")
            self.waiting.popleft()
            self.running.append(req)
            (plan.new if req.status == Status.WAITING else plan.resumed).append(req)
            plan.new_blocks[req.request_id] = self.kv.block_ids(req.request_id)
            plan.num_scheduled[req.request_id] = n
            plan.budget -= n
            req.status = Status.RUNNING
            if padded != need:
                plan.spec[req.request_id] = [-1] * self.k  # the padding's placeholder drafts
        self.waiting.extendleft(reversed(skipped))

    def pad_to_draft_width(self, req: Request, n: int, plan: StepPlan) -> int | None:
        """vLLM 0.32 pads an admission that needs exactly 1 token to 1 + k tokens (k placeholder
        drafts) so the step keeps a uniform spec-decode shape, when no running request scheduled
        in this step is mid-prefill. None: the padded step does not fit the budget."""
        if not (self.k and n == 1 and not plan.prefill_scheduled and (plan.running or req.num_computed_tokens > 0)):
            return n
        if req.num_computed_tokens + 1 + self.k + 1 > self.config.max_model_len:
            return n
        return 1 + self.k if 1 + self.k <= plan.budget else None

    def make_output(self, plan: StepPlan) -> SchedulerOutput:
        cached = CachedRequestData()
        for req in plan.running + plan.resumed:
            rid = req.request_id
            cached.req_ids.append(rid)
            cached.new_block_ids.append(plan.new_blocks.get(rid, []))
            cached.num_computed_tokens.append(req.num_computed_tokens)
            cached.num_output_tokens.append(req.num_output_tokens + req.num_output_placeholders)
            if rid not in self.prev_step_scheduled_req_ids:
                cached.all_token_ids[rid] = list(req.all_token_ids)
        cached.resumed_req_ids = {req.request_id for req in plan.resumed}
        new = [NewRequestData(req.request_id, list(req.prompt_token_ids),
                              self.kv.block_ids(req.request_id), req.num_computed_tokens)
               for req in plan.new]
        out = SchedulerOutput(
            step=self.step,
            scheduled_new_reqs=new,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=plan.num_scheduled,
            total_num_scheduled_tokens=sum(plan.num_scheduled.values()),
            scheduled_spec_decode_tokens=plan.spec,
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids=self.preempted_req_ids,
            num_spec_tokens_to_schedule=self.k,
        )
        self.prev_step_scheduled_req_ids = set(plan.num_scheduled)
        return out

    def update_after_schedule(self, out: SchedulerOutput) -> None:
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests[rid]
            req.num_computed_tokens += n
            req.num_in_flight_tokens += n
            req.is_prefill_chunk = req.num_computed_tokens < req.num_tokens + req.num_output_placeholders
        # New sets: the old ones live on inside `out`.
        self.finished_req_ids = set()
        self.preempted_req_ids = set()

    # ---------------------------------------------------------------- update_from_output()
    def update_from_output(self, out: SchedulerOutput, model_output: ModelRunnerOutput) -> dict[str, ApplyReport]:
        reports: dict[str, ApplyReport] = {}
        stopped: list[Request] = []
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            stale = False
            if req is not None:
                req.num_in_flight_tokens -= n
                if req.num_stale_output_tokens > 0:
                    stale = True
                    req.num_stale_output_tokens -= n
            if req is None or req.status.finished:
                continue  # finished or aborted while this step was in flight: output ignored
            slots = out.scheduled_spec_decode_tokens.get(rid)
            if stale and req.drop_stale_output:
                # Drop mode: nothing of this output is used (its positions are resampled).
                reports[rid] = ApplyReport(n, len(slots or ()), 0, (), "", req.num_computed_tokens,
                                           req.num_output_placeholders, "dropped", req.life)
                continue
            index = model_output.req_id_to_index.get(rid)
            generated = list(model_output.sampled_token_ids[index]) if index is not None else []
            rejected = 0
            if slots and generated:
                rejected = len(slots) - (len(generated) - 1)
                # A stale rejection count predates the preemption's reset and must not apply.
                if not stale:
                    if req.num_computed_tokens > 0:
                        req.num_computed_tokens -= rejected
                    if req.num_output_placeholders > 0:
                        req.num_output_placeholders -= rejected
            finish = ""
            if generated:
                generated, finish = self.append_output(req, generated, stale)
                if finish:
                    stopped.append(req)
            reports[rid] = ApplyReport(n, len(slots or ()), rejected, tuple(generated), finish,
                                       req.num_computed_tokens, req.num_output_placeholders,
                                       "stale_delivered" if stale else "applied", req.life)
        for req in stopped:
            if req.status == Status.RUNNING:
                self.running.remove(req)
            elif req in self.waiting:
                self.waiting.remove(req)
            status = Status.FINISHED_STOPPED if reports[req.request_id].finish_reason == "stop" else Status.FINISHED_LENGTH
            self._free(req, status)
        return reports

    def append_output(self, req: Request, tokens: list[int], stale: bool) -> tuple[list[int], str]:
        """Append tokens one by one with the stop check after each; truncate after a stop."""
        finish = ""
        for count, token in enumerate(tokens, 1):
            req.all_token_ids.append(token)
            if req.stop_token_id is not None and token == req.stop_token_id:
                finish = "stop"
            elif req.num_tokens >= self.config.max_model_len or req.num_output_tokens >= req.max_tokens:
                finish = "length"
            if finish:
                del tokens[count:]
                break
        return tokens, finish

    def update_draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        """Sync mode only: the worker's real drafts become the requests' spec lists."""
        for rid, draft in zip(req_ids, drafts):
            req = self.requests.get(rid)
            if req is None or req.status.finished:
                continue
            if req.is_prefill_chunk:
                req.spec_token_ids = []
                continue
            req.spec_token_ids = list(draft)


class AsyncScheduler(Scheduler):
    """vLLM 0.32.0 `AsyncScheduler`: two batches in flight, -1 placeholders for drafts."""

    is_async = True

    def update_after_schedule(self, out: SchedulerOutput) -> None:
        super().update_after_schedule(out)
        # One shared read-only placeholder list of this step's draft width, as vLLM does.
        placeholders = [-1] * out.num_spec_tokens_to_schedule
        for rid in out.num_scheduled_tokens:
            req = self.requests[rid]
            if req.is_prefill_chunk:
                continue
            req.num_output_placeholders += 1 + len(out.scheduled_spec_decode_tokens.get(rid, ()))
            req.spec_token_ids = placeholders

    def append_output(self, req: Request, tokens: list[int], stale: bool) -> tuple[list[int], str]:
        tokens, finish = super().append_output(req, tokens, stale)
        # Placeholders were zeroed at preemption; a stale delivery must not decrement them.
        if not stale:
            req.num_output_placeholders -= len(tokens)
            if req.num_output_placeholders < 0:  # vLLM asserts here and EngineCore dies
                raise EngineCrash(f"scheduler assert: request {req.request_id!r} num_output_placeholders "
                                  f"{req.num_output_placeholders} < 0", kind="scheduler-assert")
        return tokens, finish
