"""Scheduler variants that preempt without need: the bug shape S10 is for, and its stalled form.

Test support, loaded as a user's plugin would be: `--impl tests.replay.check.broken_preemption:NAME`
(from the repository root). Each overrides one hook of the reference AsyncScheduler
(replay/models/scheduler.py), `allocate_or_preempt`:

    PreemptsUnderWatermark  before allocating for a running request, preempts every request
                            behind it while fewer blocks than a watermark are free, whether the
                            allocation would fail or not: the cascade preempts requests for zero
                            blocks, and they prefill again (the run still finishes) -> S10
    PreemptsEveryone        preempts the whole running queue, the request being scheduled
                            included, at every allocation: each comes back, prefills again and
                            gains a token (its stale output is still delivered); the run
                            finishes, slowly -> S10
    PreemptsEveryoneDropping  the same in drop mode: the stale outputs are dropped, no token is
                            ever kept and the run never finishes -> E2
    DefersFreesInFlight     preempts as vLLM does, but parks a victim's blocks until the step in
                            flight that writes them returns (vLLM #45357's fence) with no check
                            that the victim can free anything now (#49674, before PR #49675): the
                            allocation fails again and the next victim goes -> S11

`defers_frees_on(real_cls)` is DefersFreesInFlight on vLLM's own scheduler: its deferral fence
switched on (as a KV-consumer connector with async scheduling does) and the victim check of PR
#49675 taken out, the code of #49674.
"""

from __future__ import annotations

from specreplay.replay.models.request import Status
from specreplay.replay.models.scheduler import AsyncScheduler

#: PreemptsUnderWatermark's watermark: free blocks below this start the cascade.
WATERMARK = 8


class PreemptsUnderWatermark(AsyncScheduler):
    """Preempts the requests behind the one it schedules while fewer than WATERMARK blocks are free."""

    def allocate_or_preempt(self, req, n, plan):
        # A pressure check on the pool instead of on the allocation: it never asks whether the
        # request fits in the blocks it holds or the free ones.
        while len(self.kv.free) < WATERMARK and self.running[-1] is not req:
            victim = self.running.pop()
            self.preempt_request(victim)
            plan.preempted.append(victim)
        return super().allocate_or_preempt(req, n, plan)


class PreemptsEveryone(AsyncScheduler):
    """Preempts the whole running queue at every allocation, the request it schedules included."""

    def allocate_or_preempt(self, req, n, plan):
        while self.running:
            victim = self.running.pop()
            self.preempt_request(victim)
            plan.preempted.append(victim)
        return False


class PreemptsEveryoneDropping(AsyncScheduler):
    """PreemptsEveryone in drop mode: the outputs in flight at each preemption are dropped."""

    def allocate_or_preempt(self, req, n, plan):
        while self.running:
            victim = self.running.pop()
            self.preempt_request(victim, drop_stale_output=True)
            plan.preempted.append(victim)
        return False


class DefersFreesInFlight(AsyncScheduler):
    """Parks a preempted request's blocks while a step in flight still writes them, and preempts
    such a victim anyway."""

    def __init__(self, config):
        super().__init__(config)
        self.parked: list[list[int]] = []  # blocks whose free waits for the step in flight

    def free_blocks(self, req):
        if req.status is Status.RUNNING and req.num_in_flight_tokens:  # a preemption, its step in flight
            self.parked.append(self.kv.pop_blocks_for_free(req.request_id))
        else:
            super().free_blocks(req)

    def update_from_output(self, out, model_output):
        result = super().update_from_output(out, model_output)
        # The step in flight at the preemptions has returned: its writes are done (async depth 1).
        parked, self.parked = self.parked, []
        for blocks in parked:
            self.kv.free_blocks(reversed(blocks))
        return result


def defers_frees_on(real_cls: type) -> type:
    """DefersFreesInFlight's form on vLLM's (Async)Scheduler `real_cls`."""

    class DefersFreesInFlightReal(real_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.defer_block_free = True  # as a KV-consumer connector with async scheduling sets it

        def _request_blocks_can_be_freed(self, request):
            return True  # PR #49675's check before a victim, taken out

        def _free_request_blocks(self, request):
            # vLLM's own deferral, with the fence test the check above no longer shares.
            if request.last_sched_seq <= self.processed_step_seq:
                self.kv_cache_manager.free(request)
                return
            blocks = self.kv_cache_manager.pop_blocks_for_free(request)
            if blocks:
                self.deferred_frees.append((self.sched_step_seq, blocks))

    return DefersFreesInFlightReal
