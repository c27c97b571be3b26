"""Reference scheduler: vLLM's `Scheduler` and `AsyncScheduler` (0.32.0 and 0.33.0), state and arithmetic only.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, scheduler side. The engine loop calls `schedule()`, hands the
`SchedulerOutput` to a runner, and later calls `update_from_output()`. Variants subclass these
classes and override the hooks below (docs/implementations.md; a variant imports what it uses from
`specreplay.replay.api`, and reads the state listed in `api.SCHEDULER_STATE`).

Hooks, in the order a step uses them:
  schedule_running(plan)                                the running-queue visit
  running_demand(req, budget, threshold) -> n           tokens to give a running request
  allocate_or_preempt(req, n, plan) -> bool             KV blocks, preempting from the tail
  preempt_request(req, drop_stale_output)               what preemption resets
    free_blocks(req)                                    blocks back to the pool (finish too)
  charge_budget(plan, req, n)                           n off the step's token budget
  assign_draft_slots(req, n) -> list[int]               the draft slots booked inside n
  admit_waiting(plan)                                   the waiting queue (new and resumed)
  update_after_schedule(out)                            C += n; (async) placeholders
  update_from_output(out, model_output)                 per scheduled request, the six below; stops
    request_for_output(out, rid) -> Request | None      whose output it is (None: ignored)
    take_output(req, n, generated) -> stale             in-flight count, stale share, its assert
    discard_output(req, stale, generated) -> bool       finished/aborted, or stale in drop mode
    account_rejections(req, slots, generated, stale)    C and P back by the rejected drafts
    append_output(req, tokens, stale) -> (tokens, fin)  appends, stop check, cut after a stop
      account_placeholders(req, tokens, stale)          (async) P -= appended tokens, its assert
    cache_applied(req, was_running, stale, had_placeholders)  prefix caching: the blocks it completed
  update_draft_token_ids(req_ids, drafts)               sync mode: real drafts from the worker

Serving Model Runner V2 (`use_v2_model_runner`, set by the runner family the run builds,
engines/registry.py; vLLM reads it from its config), a resumed request is sent as a new one with
all its tokens as prefill (`NewRequestData.prefill_token_ids`) and the MRV1-only re-entry list
(`all_token_ids`) is not kept: vLLM's scheduler.py ~1418 and ~1731. From 0.34.0 (no Model Runner
V1) it always serves MRV2, and sends the resumed requests in admission order among the new ones.

The release modelled is the config's `vllm_version`; where one release differs from the one before
is one field of `self.release` (models/releases.py) and one branch here.

Per-request state of your own goes in `req.plugin_state` (a dict, empty for each new Request:
each life of an id; kept across preemptions and a streaming session's turns).

Control events (between steps, from the engine loop): add_request (a new request, or the next
input chunk of a streaming session: vLLM's resumable requests), finish_requests,
set_pause_state(PAUSE_STATES[i]), reset_prefix_cache(reset_running_requests).

Worked example of the async counters for one decoding request, k = 3, all drafts accepted
(values after each event; T = prompt + applied outputs):
  schedule(m):   C 7 -> 11, P 4 -> 8   (n = T + len(spec) + P - C = 4 + 3 + 4 - 7 = 4)
  apply(m-1):    rej = 3 - 3 = 0; 4 tokens appended: T 4 -> 8, P 8 -> 4
  schedule(m+1): demand = 8 + 3 + 4 - 11 = 4 again: the identity T + P - C = 1 holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from specreplay.replay.models.decisions import reaches_max_tokens_in_flight
from specreplay.replay.models.kv import BlockPool
from specreplay.replay.models.messages import (
    CachedRequestData,
    EngineCrash,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from specreplay.replay.models.releases import release_of
from specreplay.replay.models.request import Request, Status
from specreplay.replay.workloads.config import EngineConfig

#: vLLM's PauseState: UNPAUSED, PAUSED_NEW (running requests go on, nothing is admitted),
#: PAUSED_ALL (nothing is scheduled).
PAUSE_STATES = ("unpaused", "paused_new", "paused_all")


class StreamingUpdate(NamedTuple):
    """vLLM's StreamingUpdate: a streaming session's next input chunk and that turn's max_tokens."""

    prompt_token_ids: list[int]
    max_tokens: int


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
    admitted: list[Request] = field(default_factory=list)  # new and resumed, in admission order
    drafts_needed: bool = False  # a scheduled request can use the drafts proposed after this step
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    """vLLM's `Scheduler` (one batch in flight): FCFS, chunked prefill, prefix caching."""

    is_async = False
    #: True when the runner is Model Runner V2 (resumed requests go out as new ones).
    use_v2_model_runner = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.release = release_of(config.vllm_version)
        if self.release.serves_mrv2_only:  # 0.34.0 on: no V1 mode
            self.use_v2_model_runner = True
        self.k = config.num_spec_tokens
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        # Waiting requests that hold KV blocks (here: streaming sessions between turns), drained
        # before `waiting` and the only ones admitted under PAUSED_NEW.
        self.kv_holding: deque[Request] = deque()
        self.num_waiting_for_streaming_input = 0
        self.finished_req_ids: set[str] = set()
        self.preempted_req_ids: set[str] = set()
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.kv = BlockPool(
            config.num_blocks,
            config.block_size,
            config.max_model_len,
            enable_caching=config.enable_prefix_caching,
            drop_last_hit_block=config.eagle_block_drop,
            hash_lookahead=1 if config.eagle_block_drop and self.release.eagle_hash_lookahead else 0,
        )
        self.block_size = config.block_size  # vLLM's name: what an observer reads
        self.step = 0
        self.pause_state = "unpaused"

    # ---------------------------------------------------------------- requests in and out
    def add_request(self, request: Request) -> Request:
        """Queue a new request; returns the object the scheduler tracks.

        An id that is still live is a streaming session's next input chunk (`request.resumable`)
        or the end of its stream (not resumable): taken at once by a session between turns,
        queued otherwise. For any other live id this is vLLM's `assert ... "duplicate request
        id"`. A finished id is free again: a new life (nothing ties the old life's in-flight
        outputs to it)."""
        existing = self.requests.get(request.request_id)
        if existing is not None:
            if existing.streaming_queue is None:
                raise EngineCrash(
                    f"scheduler assert: duplicate request id {request.request_id!r} (it is still live)",
                    kind="scheduler-assert",
                )
            update = StreamingUpdate(list(request.prompt_token_ids), request.max_tokens) if request.resumable else None
            if existing.status != Status.WAITING_FOR_STREAMING_REQ:
                existing.streaming_queue.append(update)
            elif update is not None:
                self.update_request_as_session(existing, update)
            else:
                self.finish_requests([request.request_id])
            return existing
        if request.resumable:
            request.streaming_queue = deque()
        self.requests[request.request_id] = request
        self._enqueue_waiting(request)
        return request

    def _enqueue_waiting(self, req: Request) -> None:
        (self.kv_holding if req.num_computed_tokens > 0 else self.waiting).append(req)

    def handle_stopped_request(self, req: Request) -> bool:
        """vLLM's _handle_stopped_request: True if the request is finished. A streaming
        session instead drops the ended turn's in-flight work (drop mode), keeps the KV of what
        its applied steps computed, and takes its next chunk or waits for one. 0.32.0 queues it
        here; 0.33.0 once the stopped requests have left the queues (update_from_output)."""
        if req.streaming_queue is None:
            return True
        req.num_computed_tokens -= req.num_output_placeholders  # the safe frontier
        req.spec_token_ids = []
        req.drop_stale_output = True
        req.num_stale_output_tokens = req.num_in_flight_tokens
        req.num_output_placeholders = 0
        if req.streaming_queue:
            update = req.streaming_queue.popleft()
            if update is None:
                return True
            self.update_request_as_session(req, update)
        else:
            req.status = Status.WAITING_FOR_STREAMING_REQ
            self.num_waiting_for_streaming_input += 1
        if not self.release.continuing_requeued_after_cleanup:
            self._enqueue_waiting(req)
        return False

    def update_request_as_session(self, req: Request, update: StreamingUpdate) -> None:
        """vLLM's _update_request_as_session: the next turn's prompt is the session's tokens so
        far (its last sampled token is discarded) plus the new chunk. 0.32.0 keeps the computed
        tokens only; 0.33.0 every token but the last, and asserts none of those is uncomputed."""
        if self.release.session_keeps_all_but_last:
            keep_end = req.num_tokens - 1
            if keep_end < req.num_computed_tokens:  # vLLM 0.33: assert keep_end >= num_computed_tokens
                raise EngineCrash(
                    f"scheduler assert: streaming request {req.request_id!r} keeps {keep_end} tokens "
                    f"for its next turn but has {req.num_computed_tokens} computed",
                    kind="scheduler-assert",
                )
        else:
            keep_end = req.num_computed_tokens
        kept = req.all_token_ids[req.num_prompt_tokens : keep_end]
        del req.all_token_ids[keep_end:]
        del req.block_hashes[keep_end // self.config.block_size :]  # the cut block's hash goes too
        req.prompt_token_ids = req.prompt_token_ids + kept + update.prompt_token_ids  # vLLM extends in place
        req.all_token_ids.extend(update.prompt_token_ids)
        req.num_prompt_tokens = len(req.prompt_token_ids)
        req.output_start = len(req.all_token_ids)
        req.max_tokens = update.max_tokens
        if req.status == Status.WAITING_FOR_STREAMING_REQ:
            self.num_waiting_for_streaming_input -= 1
        req.status = Status.WAITING

    @property
    def kv_cache_manager(self) -> BlockPool:
        """vLLM's name for the scheduler's KV cache (its `block_pool` is the same object here)."""
        return self.kv

    def has_finished_requests(self) -> bool:
        """vLLM's: requests finished since the last schedule(), which announces them."""
        return bool(self.finished_req_ids)

    def has_requests(self) -> bool:
        """vLLM's get_num_unfinished_requests() > 0, which a pause narrows: under PAUSED_ALL
        nothing counts, under PAUSED_NEW only running requests (queued ones stay queued)."""
        if self.pause_state == "paused_all":
            return False
        waiting = len(self.kv_holding) + (len(self.waiting) if self.pause_state == "unpaused" else 0)
        # Sessions between turns wait for input, not for the scheduler.
        return len(self.running) + waiting - self.num_waiting_for_streaming_input > 0

    def set_pause_state(self, state: str) -> None:
        """vLLM's set_pause_state: only the state changes; schedule() and has_requests() read it."""
        self.pause_state = state

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM 0.32's Scheduler.reset_prefix_cache: with `reset_running_requests`, preempt every
        running request (from the tail, so they come back in order) in drop mode: their in-flight
        outputs are ignored when they return, and they may resume in the very next schedule().
        The cache itself resets (every hash forgotten) only if no request holds KV blocks;
        returns whether it did."""
        if reset_running_requests:
            while self.running:
                self.preempt_request(self.running.pop(), drop_stale_output=True)
            # As if nothing was scheduled last step: the resumed requests get their full
            # token lists, and the worker drops them from its batch first.
            self.prev_step_scheduled_req_ids.clear()
        return self.kv.reset_prefix_cache()

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
                self._remove_from_waiting(req)
                if req.status == Status.WAITING_FOR_STREAMING_REQ:
                    self.num_waiting_for_streaming_input -= 1
            self._free(req, status)
            done.append(rid)
        return done

    def _remove_from_waiting(self, req: Request) -> None:
        """vLLM's remove_requests on both waiting queues: every copy, wherever it is, if anywhere
        (a streaming session vLLM lost after a preemption is in no queue at all)."""
        self.waiting = deque(r for r in self.waiting if r is not req)
        self.kv_holding = deque(r for r in self.kv_holding if r is not req)

    def _free(self, req: Request, status: Status) -> None:
        req.status = status
        self.free_blocks(req)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]

    # ---------------------------------------------------------------- schedule()
    def schedule(self) -> SchedulerOutput:
        self.step += 1
        budget = 0 if self.pause_state == "paused_all" else self.config.max_num_batched_tokens
        plan = StepPlan(budget=budget, threshold=self._long_prefill_threshold())
        self.schedule_running(plan)
        if not plan.preempted and self.pause_state != "paused_all":
            self.admit_waiting(plan)
        out = self._make_output(plan)
        self.update_after_schedule(out)
        return out

    def _long_prefill_threshold(self) -> int:
        # vLLM applies the threshold only when more than one request is eligible.
        eligible = len(self.running) + len(self.waiting) + len(self.kv_holding)
        return self.config.long_prefill_token_threshold if eligible > 1 else 0

    def schedule_running(self, plan: StepPlan) -> None:
        i = 0
        # The loop stops as soon as the budget is 0: later requests are not even visited.
        while i < len(self.running) and plan.budget > 0:
            req = self.running[i]
            n = self.running_demand(req, plan.budget, plan.threshold)
            if n <= 0:
                i += 1
                continue
            if not self.allocate_or_preempt(req, n, plan):
                break
            plan.running.append(req)
            plan.prefill_scheduled |= req.is_prefill_chunk
            plan.num_scheduled[req.request_id] = n
            self.charge_budget(plan, req, n)
            plan.drafts_needed |= not self._drafts_unused(req, req.num_computed_tokens, n)
            i += 1
            slots = self.assign_draft_slots(req, n)
            if slots:
                plan.spec[req.request_id] = slots

    def running_demand(self, req: Request, budget: int, threshold: int) -> int:
        """Tokens to schedule for a running request (0: none this step)."""
        if reaches_max_tokens_in_flight(
            req.num_computed_tokens, req.num_output_placeholders, req.num_prompt_tokens, req.max_tokens
        ):
            return 0
        computed = req.num_computed_tokens
        # req.num_tokens_with_spec, read without the property (this runs per running request per step).
        n = len(req.all_token_ids) + len(req.spec_token_ids) + req.num_output_placeholders - computed
        if 0 < threshold < n:
            n = threshold
        return min(n, budget, self.config.max_model_len - computed - 1)

    def allocate_or_preempt(self, req: Request, n: int, plan: StepPlan) -> bool:
        """Allocate KV slots for `req`, preempting from the tail of `running` (FCFS) until they
        fit. False if `req` itself had to be preempted."""
        while True:
            new = self.kv.allocate_slots(
                req.request_id, req.num_computed_tokens, n, self.config.num_lookahead_tokens, request=req
            )
            if new is not None:
                plan.new_blocks[req.request_id] = new
                return True
            victim = self.running.pop()
            self.preempt_request(victim)
            plan.preempted.append(victim)
            if victim is req:
                return False

    def charge_budget(self, plan: StepPlan, req: Request, n: int) -> None:
        """Charge the `n` tokens scheduled for `req` (running or admitted) to the step's token
        budget: all of them, draft slots included, as vLLM does."""
        plan.budget -= n

    def free_blocks(self, req: Request) -> None:
        """Return `req`'s KV blocks to the pool: at its finish, abort or preemption."""
        self.kv.release(req.request_id)

    def preempt_request(self, req: Request, drop_stale_output: bool = False) -> None:
        """vLLM 0.32: C and P reset; the in-flight output is marked stale: still delivered but no
        longer moving the counters (deliver mode, a preemption for KV blocks), or ignored
        altogether (drop mode, a cache reset). An undrained drop-mode share stays in drop mode."""
        self.free_blocks(req)
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
        num_spec = n + req.num_computed_tokens - len(req.all_token_ids) - req.num_output_placeholders
        slots = req.spec_token_ids[:num_spec] if num_spec > 0 else []  # a new list either way
        req.spec_token_ids = []
        return slots

    def admit_waiting(self, plan: StepPlan) -> None:
        """Waiting requests holding KV blocks first (streaming sessions with their next chunk),
        then, unless paused, the waiting queue (new and preempted requests)."""
        skipped: dict[int, list[Request]] = {id(self.kv_holding): [], id(self.waiting): []}
        while plan.budget > 0:
            queue = self.kv_holding if self.kv_holding else self.waiting if self.pause_state == "unpaused" else None
            if not queue:
                break
            # Sessions between turns are not running but keep their slot in the model runner.
            if len(self.running) + self.num_waiting_for_streaming_input >= self.config.max_num_seqs:
                break
            req = queue[0]
            if req.status == Status.WAITING_FOR_STREAMING_REQ or (
                req.num_stale_output_tokens and not req.drop_stale_output
            ):
                # Waiting for its next input chunk; or stale output of its preempted life is
                # still in flight, and resuming now would deliver it out of order. Next step.
                skipped[id(queue)].append(queue.popleft())
                continue
            # A request with nothing computed (new, or resumed) starts from the longest prefix
            # the cache holds of its tokens (none without prefix caching); a streaming session's
            # next turn keeps what it computed and looks nothing up.
            if req.num_computed_tokens == 0 and req.resumable and self.kv.hash_lookahead:
                req.block_hashes.clear()  # 0.33: a discarded streaming token may be in a lookahead hash
            hit, computed = self.kv.get_computed_blocks(req) if req.num_computed_tokens == 0 else ([], 0)
            computed = computed or req.num_computed_tokens
            need = req.num_tokens - computed
            padded = self._pad_to_draft_width(req, need, plan, computed)
            if padded is None:
                break  # the padded step does not fit the budget: vLLM prefers not to schedule
            n = padded
            if 0 < plan.threshold < n:
                n = plan.threshold
            n = min(n, plan.budget)
            if n <= 0:  # vLLM: assert num_new_tokens > 0
                raise EngineCrash(
                    f"scheduler assert: request {req.request_id!r} admitted with {n} tokens to "
                    f"schedule (num_computed_tokens {computed} >= num_tokens "
                    f"{req.num_tokens})",
                    kind="scheduler-assert",
                )
            # vLLM 0.32 admits a waiting request only if its whole sequence fits in the free
            # blocks (scheduler_reserve_full_isl, on by default), not just this chunk.
            if not self.kv.fits(req.request_id, req.num_tokens, hit):
                break
            new = self.kv.allocate_slots(
                req.request_id,
                req.num_computed_tokens,
                n,
                self.config.num_lookahead_tokens,
                new_computed_blocks=hit,
                request=req,
            )
            if new is None:
                break
            if padded != need and n != padded:  # vLLM asserts this only once the blocks are allocated
                raise EngineCrash(
                    f"scheduler assert: request {req.request_id!r} padded to {padded} tokens "
                    f"for spec decode but cut to {n} (long_prefill_token_threshold)",
                    kind="scheduler-assert",
                )
            queue.popleft()
            self.running.append(req)
            (plan.new if req.status == Status.WAITING else plan.resumed).append(req)
            plan.admitted.append(req)
            plan.new_blocks[req.request_id] = self.kv.block_ids(req.request_id)
            plan.num_scheduled[req.request_id] = n
            self.charge_budget(plan, req, n)
            plan.drafts_needed |= not self._drafts_unused(req, computed, n)
            req.status = Status.RUNNING
            req.num_computed_tokens = computed
            if padded != need:
                plan.spec[req.request_id] = [-1] * self.k  # the padding's placeholder drafts
        self.kv_holding.extendleft(reversed(skipped[id(self.kv_holding)]))
        self.waiting.extendleft(reversed(skipped[id(self.waiting)]))

    def _pad_to_draft_width(self, req: Request, n: int, plan: StepPlan, computed: int) -> int | None:
        """vLLM 0.32 pads an admission that needs exactly 1 token to 1 + k tokens (k placeholder
        drafts) so the step keeps a uniform spec-decode shape, when no running request scheduled
        in this step is mid-prefill (`computed`: what the admission starts from, its prefix-cache
        hit included). None: the padded step does not fit the budget."""
        if not (self.k and n == 1 and not plan.prefill_scheduled and (plan.running or computed > 0)):
            return n
        if computed + 1 + self.k + 1 > self.config.max_model_len:
            return n
        return 1 + self.k if 1 + self.k <= plan.budget else None

    def _make_output(self, plan: StepPlan) -> SchedulerOutput:
        cached = CachedRequestData()
        prev, new_blocks, all_token_ids = self.prev_step_scheduled_req_ids, plan.new_blocks, cached.all_token_ids
        v2 = self.use_v2_model_runner
        # MRV2: resumed requests are new ones to its runner (it freed their slots at preemption).
        cached_reqs = plan.running if v2 else plan.running + plan.resumed
        if not v2:
            for req in cached_reqs:
                if req.request_id not in prev:
                    all_token_ids[req.request_id] = list(req.all_token_ids)
        # Column by column (this runs per scheduled request per step); num_output_tokens read
        # without the property.
        cached.req_ids.extend([req.request_id for req in cached_reqs])
        cached.new_block_ids.extend([new_blocks.get(req.request_id, []) for req in cached_reqs])
        cached.num_computed_tokens.extend([req.num_computed_tokens for req in cached_reqs])
        cached.num_output_tokens.extend(
            [len(req.all_token_ids) - req.output_start + req.num_output_placeholders for req in cached_reqs]
        )
        cached.resumed_req_ids = set() if v2 else {req.request_id for req in plan.resumed}
        new = [
            NewRequestData(
                req.request_id,
                list(req.prompt_token_ids),
                self.kv.block_ids(req.request_id),
                req.num_computed_tokens,
                list(req.all_token_ids) if v2 else None,
            )
            for req in self._sent_as_new(plan)
        ]
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
            skip_drafts=self._skips_drafts(plan),
        )
        if not v2:  # MRV1 only (scheduler.py ~1450)
            self.prev_step_scheduled_req_ids = set(plan.num_scheduled)
        return out

    def _drafts_unused(self, req: Request, computed: int, n: int) -> bool:
        """vLLM's `_drafts_unused` (0.33.0 on): no step verifies the drafts proposed after this
        one for `req`, sure of it: a non-final prefill chunk (it samples nothing), or a step that
        samples its last token by max_tokens, every draft rejected and the step in flight counted."""
        if computed + n < req.num_tokens:
            return True
        least = req.num_output_tokens + 1 + (1 if req.num_output_placeholders > 0 else 0)
        return least >= req.max_tokens

    def _skips_drafts(self, plan: StepPlan) -> bool:
        """SchedulerOutput.skip_drafts: serving MRV2 a drafter that books lookahead slots (EAGLE,
        a draft model) proposes nothing after a step whose drafts no scheduled request can use."""
        can_skip = self.release.mrv2_skip_drafts and self.use_v2_model_runner and self.config.num_lookahead_tokens > 0
        return can_skip and not plan.drafts_needed

    def _sent_as_new(self, plan: StepPlan) -> list[Request]:
        """The requests `scheduled_new_reqs` carries, in its order: serving MRV2, the resumed ones
        too (after the new ones; from 0.34.0 in admission order: release.resumed_in_admission_order)."""
        if not self.use_v2_model_runner:
            return plan.new
        return plan.admitted if self.release.resumed_in_admission_order else plan.new + plan.resumed

    def update_after_schedule(self, out: SchedulerOutput) -> None:
        requests = self.requests
        for rid, n in out.num_scheduled_tokens.items():
            req = requests[rid]
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            req.num_in_flight_tokens += n
            req.is_prefill_chunk = computed < len(req.all_token_ids) + req.num_output_placeholders  # T = num_tokens
        # New sets: the old ones live on inside `out`.
        self.finished_req_ids = set()
        self.preempted_req_ids = set()

    # ---------------------------------------------------------------- update_from_output()
    def update_from_output(self, out: SchedulerOutput, model_output: ModelRunnerOutput) -> None:
        """Apply step `out`'s output, request by request, through the hooks below: whose output
        it is, the in-flight count, discard or use, rejections, appends (and, async, the
        placeholders), then the stops. As vLLM, the output's token lists are trimmed in place to
        what each request took (after a stop, nothing more)."""
        stopped: list[tuple[Request, bool, bool, str]] = []
        continuing: list[Request] = []
        out_index, out_sampled = model_output.req_id_to_index, model_output.sampled_token_ids
        spec = out.scheduled_spec_decode_tokens
        for rid, n in out.num_scheduled_tokens.items():
            req = self.request_for_output(out, rid)
            if req is None:
                continue  # no live request under this id: the output is ignored
            index = out_index.get(rid)
            generated = out_sampled[index] if index is not None else []
            stale = self.take_output(req, n, generated)
            if self.discard_output(req, stale, generated):
                continue
            self.account_rejections(req, spec.get(rid), generated, stale)
            if generated:
                running, had_placeholders = req.status == Status.RUNNING, req.num_output_placeholders > 0
                _, finish = self.append_output(req, generated, stale)
                self.cache_applied(req, running, stale, had_placeholders)
                if finish:
                    # As vLLM: the stop is handled at once (a streaming session may start its
                    # next turn here), the queues are tidied after the loop.
                    was_running = req.status == Status.RUNNING
                    finished = self.handle_stopped_request(req)
                    stopped.append((req, finished, was_running, finish))
                    if not finished:
                        continuing.append(req)
        for req, finished, was_running, finish in stopped:
            if was_running:
                self.running.remove(req)
            else:
                # A request stopped by output delivered after its preemption: vLLM removes every
                # copy from the waiting queues, even the one _handle_stopped_request just queued.
                self._remove_from_waiting(req)
            if finished:
                self._free(req, Status.FINISHED_STOPPED if finish == "stop" else Status.FINISHED_LENGTH_CAPPED)
        if self.release.continuing_requeued_after_cleanup:
            # 0.33.0: each continuing session ends up in exactly one queue, preempted or not.
            for req in continuing:
                self._enqueue_waiting(req)

    def request_for_output(self, out: SchedulerOutput, rid: str) -> Request | None:
        """The request that step `out`'s output for `rid` goes to; None: ignored. vLLM looks
        the id up, so a request resubmitted under the id of an aborted one takes the old life's
        output (the life-guard variant narrows this to the object the step was scheduled for)."""
        return self.requests.get(rid)

    def take_output(self, req: Request, n: int, generated: Sequence[int] = ()) -> bool:
        """The output of `n` scheduled tokens (`generated`, the worker's tokens for the request,
        [] if it returned none) has come back: it leaves the in-flight count, and
        drains the stale share if the request has one. Returns whether the output is stale
        (scheduled before the request's last preemption or cache reset). Example: preempted with
        4 + 4 tokens in flight (stale share 8), each of the two outputs takes 4 and is stale; the
        next output is fresh. A share that goes below 0 did not match what was in flight:
        vLLM's assert, an engine crash."""
        req.num_in_flight_tokens -= n
        if req.num_stale_output_tokens <= 0:
            return False
        req.num_stale_output_tokens -= n
        if req.num_stale_output_tokens < 0:  # vLLM asserts: the stale share did not match
            raise EngineCrash(
                f"scheduler assert: request {req.request_id!r} num_stale_output_tokens "
                f"{req.num_stale_output_tokens} < 0",
                kind="scheduler-assert",
            )
        return True

    def discard_output(self, req: Request, stale: bool, generated: Sequence[int] = ()) -> bool:
        """True: nothing of this output (`generated`) is used, neither its rejections nor its
        tokens (they come after this). A request finished or aborted while the step
        was in flight ignores it; a stale output in drop mode (a cache reset, a streaming
        turn's end) too: its positions are scheduled again and resampled."""
        return req.status.finished or (stale and req.drop_stale_output)

    def account_rejections(self, req: Request, slots: list[int] | None, generated: list[int], stale: bool) -> int:
        """The drafts the worker rejected out of the `slots` it was given (it returns accepted
        drafts + 1 tokens): C and P were advanced for every slot at schedule time and go back
        by the rejected ones. A stale rejection count predates the preemption's reset and
        corrects nothing. Returns the number rejected (0 without slots or output)."""
        if not (slots and generated):
            return 0
        rejected = len(slots) - (len(generated) - 1)
        if not stale:
            if req.num_computed_tokens > 0:
                req.num_computed_tokens -= rejected
            if req.num_output_placeholders > 0:
                req.num_output_placeholders -= rejected
        return rejected

    def append_output(self, req: Request, tokens: list[int], stale: bool) -> tuple[list[int], str]:
        """Append tokens one by one with the stop check after each; after a stop, the rest of
        `tokens` is cut, in place, as vLLM does (0.33.0 also takes the cut tokens back off C,
        unless the output is stale). Returns `tokens` and the finish reason ("" | "length" |
        "stop")."""
        finish = ""
        # num_tokens and num_output_tokens read without the properties: this runs per token.
        all_token_ids, stop_token_id = req.all_token_ids, req.stop_token_id
        max_model_len, max_num_tokens = self.config.max_model_len, req.output_start + req.max_tokens
        for count, token in enumerate(tokens, 1):
            all_token_ids.append(token)
            if stop_token_id is not None and token == stop_token_id:
                finish = "stop"
            elif len(all_token_ids) >= max_model_len or len(all_token_ids) >= max_num_tokens:
                finish = "length"
            if finish:
                if self.release.stop_rewinds_computed and not stale:
                    req.num_computed_tokens -= len(tokens) - count
                del tokens[count:]
                break
        return tokens, finish

    def cache_applied(self, req: Request, was_running: bool, stale: bool, had_placeholders: bool) -> None:
        """Prefix caching: the blocks an applied output completes are cached at once (not only at
        the request's next allocation), for a request that was running. 0.33.0: in any
        scheduler with placeholders or drafts, up to C less the tokens still in flight, never for
        a stale output; 0.32.0: only the AsyncScheduler, up to C - P (`release`)."""
        if not was_running:
            return
        if self.release.apply_caches_in_flight:
            if not stale and (had_placeholders or self.k > 0):
                self.kv.cache_blocks(req, req.num_computed_tokens - req.num_in_flight_tokens)
        elif self.is_async:
            self.kv.cache_blocks(req, req.num_computed_tokens - req.num_output_placeholders)

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
    """vLLM's `AsyncScheduler`: two batches in flight, -1 placeholders for drafts."""

    is_async = True

    def update_after_schedule(self, out: SchedulerOutput) -> None:
        super().update_after_schedule(out)
        # One shared read-only placeholder list of this step's draft width, as vLLM does.
        placeholders = [-1] * out.num_spec_tokens_to_schedule
        requests, spec = self.requests, out.scheduled_spec_decode_tokens
        for rid in out.num_scheduled_tokens:
            req = requests[rid]
            if req.is_prefill_chunk:
                continue
            req.num_output_placeholders += 1 + len(spec.get(rid, ()))
            req.spec_token_ids = placeholders

    def append_output(self, req: Request, tokens: list[int], stale: bool) -> tuple[list[int], str]:
        returned = list(tokens) if self.release.placeholders_resolve_returned else None
        tokens, finish = super().append_output(req, tokens, stale)
        self.account_placeholders(req, tokens if returned is None else returned, stale)
        return tokens, finish

    def account_placeholders(self, req: Request, tokens: list[int], stale: bool) -> None:
        """The output's `tokens` are no longer placeholders: P -= len(tokens): the appended ones
        (0.32.0), or every returned one, those cut after a stop included, and only while P > 0
        (0.33.0). Not for a stale output: the preemption zeroed P, and this output never had a
        share in it. P below 0 is vLLM's assert, an engine crash."""
        if stale or (self.release.placeholders_resolve_returned and req.num_output_placeholders <= 0):
            return
        req.num_output_placeholders -= len(tokens)
        if req.num_output_placeholders < 0:  # vLLM asserts here and EngineCore dies
            raise EngineCrash(
                f"scheduler assert: request {req.request_id!r} num_output_placeholders "
                f"{req.num_output_placeholders} < 0",
                kind="scheduler-assert",
            )
