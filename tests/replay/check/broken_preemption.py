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
"""

from __future__ import annotations

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
