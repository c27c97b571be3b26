"""The built-in variants of SGLang's scheduler: each differs from SGLang 0.5.23 in one overridden hook.

Where it sits: workloads -> models -> **impls** -> observers -> engines -> traces -> check ->
workflows -> views -> cli. Registered in `specreplay.replay.impls.registry` (they run on
`--engine sglang-scheduler` only). Each is an SGLang form (families/sglang/forms.py): the subclass of
SGLang's batch result processor it overrides one method of is defined when the engine asks for
it, because SGLang can be imported only in its own environment, after the engine's set-up
(families/sglang/setup.py `prepare`); importing this module imports nothing of SGLang.

- `StaleVerifyCommits` re-introduces #23456 (SGLang before 2026-04-22): a spec-v2 verify result
  that comes back, under overlap, after its request finished or was retracted still commits its
  accept length and counts a verify round. The checker's G3 (and G1 for a retracted request,
  whose committed count then exceeds the none it holds) finds it.
- `TrimInFlightAtFinish` fixes the over-commit at finish of #24590 (non-spec overlap, stop or abort
  finishes; the direction of #24745): the position a decode launched before the finishing result
  was applied booked is given back at the release, so the radix cache keeps what it keeps
  without overlap. The checker's G5 finds the upstream behaviour, and nothing on this one.
- `StreamHoldsBehindSent` fixes what a streaming client of a retracted `input_embeds` request
  receives (#39645's class): SGLang discards such a request's outputs and generates them anew, and
  0.5.23's output streamer then moves the request's send cursor back to the new, shorter output, so
  the client gets the new generation's first tokens after the old ones (32 or 33 tokens for 20).
  Here the stream holds until the new generation passes what was sent, and goes on from there: the
  client gets each position once (the same tokens under greedy sampling; under random sampling
  the two generations' halves, #39645's splice, which no cursor can undo once they were sent).
  The open PRs #39738 / #39949 reset the cursor to 0 instead, which a client that already
  received tokens gets twice as well. The checker's G9 (and G8) find 0.5.23; nothing here.
- `ReservesCurrentSteps` re-introduces the code before #36897 (SGLang before 2026-08-28, the
  adaptive speculation it fixed): a decode batch's KV is reserved for the draft width in force
  when the batch is scheduled, where 0.5.23 reserves for the widest its adaptive policy may
  switch to. The policy picks the steps again when the batch's forward starts (by batch size): a
  switch to more steps there verifies past what was reserved, into other requests' KV. The
  checker's K2 (and K1) find it; nothing on 0.5.23.
- `SessionCommitsComputed` fixes the streaming session's over-claim (0.5.23): a finished turn
  hands its session `min(prompt + finished outputs, kv_allocated_len)` as committed, on the
  assumption that a verify in flight writes the last output's KV (#22897 / #22651's overlap
  round). 0.5.23's overlap loop skips that round (`enable_skip_finishing_decode`: the request
  finishes by length in the result in flight), and the sync loop never runs it, so a turn that
  ended on a verify's correction token hands on a position whose KV holds a rejected draft
  (speculation over-allocates, so the clamp does not catch it), and the next turn prefills after
  it. Here the session keeps what the turn's forwards computed (the request's own committed count,
  which counts only KV that was written), at most the finished length. The checker's G10 (and K1)
  find 0.5.23; nothing here.
"""

from __future__ import annotations

import functools
from typing import Any

from specreplay.replay.families.sglang.forms import ProcessorSubclass, SchedulerSubclass


def _processor_base() -> type:
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    return SchedulerBatchResultProcessor


@functools.cache
def stale_verify_commits() -> type:
    """The #23456 processor (module docstring), defined once per process."""

    class StaleVerifyCommits(_processor_base()):  # type: ignore[misc]
        """SGLang before #23456: `_resolve_spec_v2_tokens` commits every row's accepted run,
        the rows of requests already finished or retracted included."""

        def _resolve_spec_v2_tokens(self, result: Any, batch: Any) -> list[list[int]]:
            stale = [i for i, req in enumerate(batch.reqs) if req.is_retracted or req.finished()]
            tokens = super()._resolve_spec_v2_tokens(result, batch)
            for i in stale:  # what 0.5.23 skips (batch_result_processor.py:819-822)
                req = batch.reqs[i]
                req.kv.kv_committed_len += len(tokens[i])
                req.spec_verify_ct += 1
            return tokens

    StaleVerifyCommits.__module__, StaleVerifyCommits.__qualname__ = __name__, "StaleVerifyCommits"
    return StaleVerifyCommits


@functools.cache
def trim_in_flight_at_finish() -> type:
    """The fix of the over-commit at finish (module docstring), defined once per process."""

    class TrimInFlightAtFinish(_processor_base()):  # type: ignore[misc]
        """Once a result has finished a request, before its KV is released: when a decode in
        flight booked its next position (overlap, no speculation: kv_committed_len =
        kv_allocated_len = seqlen, where an applied result leaves seqlen - 1), free that
        position's slot and count it neither committed nor allocated, so the release inserts
        seqlen - 1 positions. The hook: SGLang 0.5.23 has no method of its own between a finish
        and its release; `_maybe_collect_routed_experts` is the one per-request method both
        finish paths call there (batch_result_processor.py:381 for a prefill's result, :1450 for
        a decode's), for every finished request."""

        def _maybe_collect_routed_experts(self, req: Any) -> None:
            super()._maybe_collect_routed_experts(req)
            kv = req.kv
            seqlen = len(req.origin_input_ids) + len(req.output_ids)
            booked = kv.kv_committed_len == kv.kv_allocated_len == seqlen > kv.cache_protected_len
            if self.enable_overlap and req.finished() and kv.holds_kv and booked:
                self.tree_cache.free_kv_row(kv, [(seqlen - 1, seqlen)])
                kv.kv_committed_len -= 1
                kv.kv_allocated_len -= 1

    TrimInFlightAtFinish.__module__, TrimInFlightAtFinish.__qualname__ = __name__, "TrimInFlightAtFinish"
    return TrimInFlightAtFinish


class StaleVerifyCommits:
    """The SGLang form of `stale_verify_commits` (what the registry holds)."""

    def __call__(self, base: type) -> type:
        return ProcessorSubclass(stale_verify_commits())(base)

    @staticmethod
    def why_not(config: Any) -> str | None:
        """A result comes back after its request finished or was retracted only under overlap,
        and the commit it changes is spec v2's."""
        if config.num_spec_tokens and config.async_scheduling:
            return None
        return (
            "StaleVerifyCommits changes what a verify result processed after its request finished commits, which "
            "happens only with EAGLE v2 under overlap; pass a workload with num_spec_tokens > 0 and async scheduling"
        )


class TrimInFlightAtFinish:
    """The SGLang form of `trim_in_flight_at_finish` (what the registry holds)."""

    def __call__(self, base: type) -> type:
        return ProcessorSubclass(trim_in_flight_at_finish())(base)

    @staticmethod
    def why_not(config: Any) -> str | None:
        """Only a non-spec decode commits at scheduling, and only under overlap is one in flight
        when a result finishes its request."""
        if not config.num_spec_tokens and config.async_scheduling:
            return None
        return (
            "TrimInFlightAtFinish gives back the position a decode in flight booked at a finish, which happens only "
            "without speculation under overlap; pass a workload with num_spec_tokens = 0 and async scheduling"
        )


def _scheduler_base() -> type:
    from sglang.srt.managers.scheduler import Scheduler

    return Scheduler


@functools.cache
def stream_holds_behind_sent() -> type:
    """The stream that never goes back (module docstring), defined once per process."""

    class StreamHoldsBehindSent(_scheduler_base()):  # type: ignore[misc]
        """The hook: `get_output_streamer_class`, SGLang's own seam for the streamer: a subclass
        whose `stream_output` leaves out every unfinished request whose output is shorter than
        what its client was sent (an input_embeds request retracted and generating anew). 0.5.23
        streams it anyway: the send takes `output_ids[send_token_offset:]`, nothing, and sets
        `send_token_offset` to the shorter length, so the new generation's tokens up to the old
        length go out a second time."""

        def get_output_streamer_class(self) -> type:
            base = super().get_output_streamer_class()

            class HeldStreamer(base):  # type: ignore[misc, valid-type]
                __slots__ = ()

                def stream_output(self, reqs: Any, *a: Any, **kw: Any) -> Any:
                    ahead = [r for r in reqs if r.finished() or len(r.output_ids) >= r.send_token_offset]
                    return super().stream_output(ahead if len(ahead) < len(reqs) else reqs, *a, **kw)

            return HeldStreamer

    StreamHoldsBehindSent.__module__, StreamHoldsBehindSent.__qualname__ = __name__, "StreamHoldsBehindSent"
    return StreamHoldsBehindSent


@functools.cache
def reserves_current_steps() -> type:
    """The code before #36897 (module docstring), defined once per process."""

    class ReservesCurrentSteps(_scheduler_base()):  # type: ignore[misc]
        """The hook: `update_running_batch`, which prepares the decode batch and reserves its KV
        (eagle_prepare_for_decode, allocation_sizing.get_alloc_len_per_decode). Around it the
        published launch-time capacity (the spec bag's max_speculative_num_draft_tokens, which
        #36897 added) is taken away, so the reservation reads the active width alone, as before."""

        def update_running_batch(self, batch: Any) -> Any:
            from sglang.srt.runtime_context import get_context

            spec = get_context().config_bag("spec")
            captured = spec.max_speculative_num_draft_tokens
            spec._set("max_speculative_num_draft_tokens", None)
            try:
                return super().update_running_batch(batch)
            finally:
                spec._set("max_speculative_num_draft_tokens", captured)

    ReservesCurrentSteps.__module__, ReservesCurrentSteps.__qualname__ = __name__, "ReservesCurrentSteps"
    return ReservesCurrentSteps


@functools.cache
def session_commits_computed() -> type:
    """The fix of the streaming session's over-claim (module docstring), defined once per process."""

    class SessionCommitsComputed(_scheduler_base()):  # type: ignore[misc]
        """The hook: `init_running_status`, the first of the constructor's steps after the tree
        cache is built (scheduler.py:653). It wraps the cache's streaming-session entry that
        keeps a finished turn's KV record (`StreamingSession.try_cache_finished_req`, on the
        instance): after 0.5.23's own keep, the record's committed length is cut to what the
        request had committed when it finished (the KV its forwards wrote)."""

        def init_running_status(self) -> None:
            super().init_running_status()
            session = getattr(self.tree_cache, "session", None)
            if session is None:
                return  # no radix cache, no streaming session
            keep = session.try_cache_finished_req

            def try_cache_finished_req(req: Any) -> bool:
                written = req.kv.kv_committed_len
                kept = keep(req)
                slot = session.slots.get(req.session.session_id) if kept and req.session is not None else None
                if slot is not None:
                    slot.kv.kv_committed_len = min(slot.kv.kv_committed_len, written)
                return kept

            session.try_cache_finished_req = try_cache_finished_req

    SessionCommitsComputed.__module__, SessionCommitsComputed.__qualname__ = __name__, "SessionCommitsComputed"
    return SessionCommitsComputed


class ReservesCurrentSteps:
    """The SGLang form of `reserves_current_steps` (what the registry holds)."""

    def __call__(self, base: type) -> type:
        return SchedulerSubclass(reserves_current_steps())(base)

    @staticmethod
    def why_not(config: Any) -> str | None:
        if config.adaptive_speculation:
            return None
        return (
            "ReservesCurrentSteps changes how a decode batch's KV is reserved while adaptive speculation switches "
            "draft widths; pass a workload with adaptive_speculation = true"
        )


class StreamHoldsBehindSent:
    """The SGLang form of `stream_holds_behind_sent` (what the registry holds)."""

    def __call__(self, base: type) -> type:
        return SchedulerSubclass(stream_holds_behind_sent())(base)

    @staticmethod
    def why_not(config: Any) -> str | None:
        return None  # any workload: it changes nothing where no output falls behind what was sent


class SessionCommitsComputed:
    """The SGLang form of `session_commits_computed` (what the registry holds)."""

    def __call__(self, base: type) -> type:
        return SchedulerSubclass(session_commits_computed())(base)

    @staticmethod
    def why_not(config: Any) -> str | None:
        if config.enable_prefix_caching:
            return None
        return (
            "SessionCommitsComputed changes what a streaming session keeps, and streaming sessions run on the "
            "radix cache; pass a workload with enable_prefix_caching = true"
        )


__all__ = [
    "ReservesCurrentSteps",
    "SessionCommitsComputed",
    "StreamHoldsBehindSent",
    "StaleVerifyCommits",
    "TrimInFlightAtFinish",
    "reserves_current_steps",
    "session_commits_computed",
    "stale_verify_commits",
    "stream_holds_behind_sent",
    "trim_in_flight_at_finish",
]
