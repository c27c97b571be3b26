"""The built-in variants: each differs from upstream in one overridden hook.

Where it sits: workloads -> models -> **impls** -> observers -> engines -> traces -> check ->
workflows -> views -> cli. Registered in `specreplay.replay.impls.registry`; also the worked
examples for users writing their own implementation (docs/implementations.md), written against the
public API (`specreplay.replay.api`) alone. A runner variant whose hook a workload can never reach
says so in a `why_not(config)` classmethod (`Implementation.why_not`): it is then never run, and
never stood in for, on such a workload.
"""

from __future__ import annotations

# Through the public API, as a user's variant imports them (docs/implementations.md).
from specreplay.replay.api import AsyncScheduler, EngineConfig, GPUModelRunner, SchedulerOutput


def needs_draft_slots(cls: type, what: str, config: EngineConfig) -> str | None:
    """A runner variant whose change concerns draft slots only does not apply to a workload
    that books none (num_spec_tokens = 0): `what` its hook does, for the reason."""
    if config.num_spec_tokens > 0:
        return None
    return (
        f"{cls.__name__} {what}, and the workload books no draft slots (num_spec_tokens = 0); "
        "pass a workload with num_spec_tokens > 0"
    )


def drop_draft_slots(out, rid: str) -> bool:
    """PR #30796's edit: take request `rid`'s draft slots out of the SchedulerOutput `out` (its
    num_scheduled_tokens, the total and scheduled_spec_decode_tokens). True if there were any."""
    slots = out.scheduled_spec_decode_tokens.pop(rid, None)
    if not slots:
        return False
    out.num_scheduled_tokens[rid] -= len(slots)
    out.total_num_scheduled_tokens -= len(slots)
    return True


class DropReentryDraftsRunner(GPUModelRunner):
    """PR #30796: a request re-entering the batch has no cached drafts, so drop its draft slots
    from the SchedulerOutput (num_scheduled_tokens, total and scheduled_spec_decode_tokens)."""

    def on_reentry(self, out: SchedulerOutput, rid: str) -> bool:
        return drop_draft_slots(out, rid)

    @classmethod
    def why_not(cls, config: EngineConfig) -> str | None:
        """Sync or async alike a re-entering request can carry draft slots; without any, never."""
        return super().why_not(config) or needs_draft_slots(
            cls, "drops the draft slots of a request re-entering the batch", config
        )


def drop_reentry_drafts_on(real_cls: type) -> type:
    """pr30796 on vLLM's GPUModelRunner: before execute_model reads the SchedulerOutput, drop
    the draft slots of every request it knows that has no row in the batch (re-entering)."""

    class DropReentryDrafts(real_cls):  # type: ignore[misc, valid-type]
        def execute_model(self, scheduler_output, *args, **kwargs):
            rows = self.input_batch.req_id_to_index
            for rid in [
                r for r in scheduler_output.scheduled_spec_decode_tokens if r in self.requests and r not in rows
            ]:
                drop_draft_slots(scheduler_output, rid)
            return super().execute_model(scheduler_output, *args, **kwargs)

    DropReentryDrafts.__qualname__ = f"DropReentryDrafts({real_cls.__name__})"
    return DropReentryDrafts


def clear_stale_placeholders(running, out) -> None:
    """PRs #37629 / #46899's rule: a running request not scheduled in `out` keeps no all -1
    placeholder list (reference and real requests alike: vLLM's field names)."""
    for req in running:
        if (
            req.request_id not in out.num_scheduled_tokens
            and req.spec_token_ids
            and all(t == -1 for t in req.spec_token_ids)
        ):
            req.spec_token_ids = []


class ClearStalePlaceholdersScheduler(AsyncScheduler):
    """PR #37629 / #46899: after scheduling, a running request that was not scheduled keeps no
    all -1 placeholder list, so it cannot book draft slots with nothing behind them later."""

    def update_after_schedule(self, out: SchedulerOutput) -> None:
        super().update_after_schedule(out)
        clear_stale_placeholders(self.running, out)


def clear_stale_placeholders_on(real_cls: type) -> type:
    """sched-clear on the real vLLM: a subclass of its (Async)Scheduler that clears, after
    `_update_after_schedule`, the all -1 spec lists of running requests it did not schedule."""

    class ClearStalePlaceholders(real_cls):  # type: ignore[misc, valid-type]
        def _update_after_schedule(self, scheduler_output):
            super()._update_after_schedule(scheduler_output)
            clear_stale_placeholders(self.running, scheduler_output)

    ClearStalePlaceholders.__qualname__ = f"ClearStalePlaceholders({real_cls.__name__})"
    return ClearStalePlaceholders


class NoClampRunner(GPUModelRunner):
    """vLLM <= 0.22: no clamp before the embedding; a -1 placeholder draft crashes the engine."""

    clamps_negative_ids = False

    @classmethod
    def why_not(cls, config: EngineConfig) -> str | None:
        """A negative input id comes only from a -1 draft slot (an async placeholder, or the
        padding of a one-token admission to 1 + k tokens, sync too): none without draft slots."""
        return super().why_not(config) or needs_draft_slots(cls, "leaves -1 draft slots unclamped", config)


def _hide_other_lives(requests: dict, scheduled_for: dict) -> dict:
    """The live requests whose id was scheduled for another object (an earlier life): removed
    from `requests` for the duration of an update_from_output, returned to be put back."""
    return {rid: req for rid, req in requests.items() if rid in scheduled_for and scheduled_for[rid] is not req}


def _restore(requests: dict, order: list, hidden: dict) -> dict:
    """`requests` with the hidden ones back, in their original order."""
    merged = {**requests, **hidden}
    return {rid: merged[rid] for rid in order if rid in merged} | {
        rid: r for rid, r in merged.items() if rid not in order
    }


class LifeGuardScheduler(AsyncScheduler):
    """A per-life guard vLLM 0.32.0 lacks: an output goes only to the request object (the life)
    its step was scheduled for. A request resubmitted under the id of an aborted one then never
    receives the old life's output. Each object notes, in its own `plugin_state` (empty for each
    life), the steps in flight for it."""

    def update_after_schedule(self, out: SchedulerOutput) -> None:
        super().update_after_schedule(out)
        for rid in out.num_scheduled_tokens:
            self.requests[rid].plugin_state.setdefault("steps_in_flight", set()).add(out.step)

    def request_for_output(self, out, rid):
        req = super().request_for_output(out, rid)
        steps = req.plugin_state.get("steps_in_flight", set()) if req is not None else set()
        if out.step not in steps:
            return None  # scheduled for an earlier life of the id: to this output, the id is gone
        steps.discard(out.step)
        return req


def life_guard_on(real_cls: type) -> type:
    """life-guard on the real vLLM: a subclass of its (Async)Scheduler with the same guard."""

    class LifeGuard(real_cls):  # type: ignore[misc, valid-type]
        def schedule(self, *args, **kwargs):
            so = super().schedule(*args, **kwargs)
            self.__dict__.setdefault("_scheduled_for", {})[id(so)] = {
                rid: self.requests[rid] for rid in so.num_scheduled_tokens
            }
            return so

        def update_from_output(self, scheduler_output, model_runner_output):
            order = list(self.requests)
            hidden = _hide_other_lives(
                self.requests, self.__dict__.get("_scheduled_for", {}).pop(id(scheduler_output), {})
            )
            for rid in hidden:
                del self.requests[rid]
            try:
                return super().update_from_output(scheduler_output, model_runner_output)
            finally:
                if hidden:
                    self.requests = _restore(self.requests, order, hidden)

    LifeGuard.__qualname__ = f"LifeGuard({real_cls.__name__})"
    return LifeGuard
