"""The built-in variants: each differs from upstream in one overridden hook.

Where it sits: replay. Registered in `specreplay.replay.impls`; also the worked examples for
users writing their own implementation.
"""

from __future__ import annotations

from specreplay.replay.messages import SchedulerOutput
from specreplay.replay.runner import GPUModelRunner
from specreplay.replay.scheduler import AsyncScheduler


class DropReentryDraftsRunner(GPUModelRunner):
    """PR #30796: a request re-entering the batch has no cached drafts, so drop its draft slots
    from the SchedulerOutput (num_scheduled_tokens, total and scheduled_spec_decode_tokens)."""

    def on_reentry(self, out: SchedulerOutput, rid: str) -> bool:
        slots = out.scheduled_spec_decode_tokens.pop(rid, None)
        if not slots:
            return False
        out.num_scheduled_tokens[rid] -= len(slots)
        out.total_num_scheduled_tokens -= len(slots)
        return True


class ClearStalePlaceholdersScheduler(AsyncScheduler):
    """PR #37629 / #46899: after scheduling, a running request that was not scheduled keeps no
    all -1 placeholder list, so it cannot book draft slots with nothing behind them later."""

    def update_after_schedule(self, out: SchedulerOutput) -> None:
        super().update_after_schedule(out)
        for req in self.running:
            if req.request_id not in out.num_scheduled_tokens and req.spec_token_ids \
                    and all(t == -1 for t in req.spec_token_ids):
                req.spec_token_ids = []


def clear_stale_placeholders_on(real_cls: type) -> type:
    """sched-clear on the real vLLM: a subclass of its (Async)Scheduler that clears, after
    `_update_after_schedule`, the all -1 spec lists of running requests it did not schedule."""

    class ClearStalePlaceholders(real_cls):  # type: ignore[misc, valid-type]
        def _update_after_schedule(self, scheduler_output):
            super()._update_after_schedule(scheduler_output)
            for req in self.running:
                if req.request_id not in scheduler_output.num_scheduled_tokens and req.spec_token_ids \
                        and all(t == -1 for t in req.spec_token_ids):
                    req.spec_token_ids = []

    ClearStalePlaceholders.__qualname__ = f"ClearStalePlaceholders({real_cls.__name__})"
    return ClearStalePlaceholders


class NoClampRunner(GPUModelRunner):
    """vLLM <= 0.22: no clamp before the embedding; a -1 placeholder draft crashes the engine."""

    clamps_negative_ids = False
