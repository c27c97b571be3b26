"""Variants of SGLang 0.5.23's scheduler that each break one of the checker's G codes.

Loaded by `--impl tests.replay.check.sglang_variants:NAME`, as a user's would be: each is a
subclass of SGLang's Scheduler or of its batch result processor overriding one method
(docs/implementations.md, "SGLang's scheduler"). Importable only where sglang 0.5.23 is installed
(`.venv-sglang`): the module prepares SGLang first, as a user's module must.

    RetractionKeepsCommitted    G1: a retracted request keeps its kv_committed_len (it holds no KV)
    BonusClaimedAtApply         G2: a verify commits the bonus token too, whose KV no forward wrote yet
    RetractionDropsLastOutput   G4: a retraction drops the request's last output token (its
                                streaming client then gets it twice: G9, G8)
    SeqLensNotResolved          G6: a verify batch runs with the scheduler's own seq_lens, not the
                                FutureMap's (overlap: one round behind)
    CommitPastAllocated         G7 (and G1): a running request commits one slot past what it holds;
                                SGLang's own kv-page check asserts
    LeakAtFinish                G7: each finish takes a KV slot from the allocator and never gives
                                it back; SGLang's busy-time pool accounting asserts
    RetractionMarksOutputSent   G9: a retracted request's stream marks its re-prefill's token as
                                sent without sending it
    OverridesTheWorkers         refused in one line: it overrides a constructor the driver owns

G3 and G5 are broken by the built-in variants (`sglang-stale-commit`) and by upstream itself
(G5: #24590's shape; `sglang-finish-trim` fixes it).
"""

from __future__ import annotations

from typing import Any

from specreplay.replay.families.sglang import setup as sglang_setup

sglang_setup.prepare()  # a module that imports SGLang's scheduler prepares it first (the CPU patches)

from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.scheduler_components.batch_result_processor import (  # noqa: E402
    SchedulerBatchResultProcessor,
)


class RetractionKeepsCommitted(Scheduler):
    """A retraction that frees the request's KV but keeps its committed count (reset_for_retract
    zeroes it): committed > allocated = 0 until its next extend overwrites it."""

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> None:
        if is_retracted:
            req.kv.kv_committed_len = len(req.origin_input_ids) + len(req.output_ids) - 1
        super()._add_request_to_queue(req, is_retracted)


class BonusClaimedAtApply(SchedulerBatchResultProcessor):
    """Spec v2 commits the bonus position with the accepted run (the pre-claim #28754 removed,
    without its refund): committed = seqlen, one position past the KV the verify wrote."""

    def _resolve_spec_v2_tokens(self, result: Any, batch: Any) -> list[list[int]]:
        tokens = super()._resolve_spec_v2_tokens(result, batch)
        for req in batch.reqs:
            if not (req.is_retracted or req.finished()) and req.kv.kv_committed_len < req.kv.kv_allocated_len:
                req.kv.kv_committed_len += 1
        return tokens


class RetractionDropsLastOutput(Scheduler):
    """A retraction that drops the request's last output token: its next life re-prefills the
    prompt and all outputs but one, and samples that one again."""

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> None:
        if is_retracted and req.output_ids:
            req.output_ids.pop()
        super()._add_request_to_queue(req, is_retracted)


class RetractionMarksOutputSent(Scheduler):
    """A retracted request's stream marks the first tokens its next life generates as sent
    without sending them: its (streaming) client never receives the token the re-prefill
    samples. Through `get_output_streamer_class` (SGLang's seam for the streamer)."""

    def get_output_streamer_class(self) -> type:
        base = super().get_output_streamer_class()
        pending = self.marks_pending = set()

        class MarksSent(base):  # type: ignore[misc, valid-type]
            __slots__ = ()

            def stream_output(self, reqs: Any, *a: Any, **kw: Any) -> Any:
                for r in reqs:
                    if r.rid in pending and not r.is_retracted and len(r.output_ids) > r.send_token_offset:
                        r.send_token_offset = len(r.output_ids)
                        pending.discard(r.rid)
                return super().stream_output(reqs, *a, **kw)

        return MarksSent

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> None:
        if is_retracted:
            self.marks_pending.add(req.rid)
        super()._add_request_to_queue(req, is_retracted)


class SeqLensNotResolved(Scheduler):
    """The FutureMap hands a verify batch nothing: it runs with the seq_lens the scheduler built
    it with, which under overlap lag the round in flight."""

    def init_overlap(self) -> None:
        super().init_overlap()
        future_map = self.future_map

        def resolve_seq_lens_cpu(batch: Any, stream_ordered: bool = False) -> None:
            batch.seq_lens_cpu = batch.seq_lens.cpu()
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

        future_map.resolve_seq_lens_cpu = resolve_seq_lens_cpu


class CommitPastAllocated(Scheduler):
    """After each result, the first running request commits one slot more than it holds."""

    def process_batch_result(self, batch: Any, result: Any) -> None:
        super().process_batch_result(batch, result)
        for req in batch.reqs:
            if req.kv.holds_kv and not req.finished():
                req.kv.kv_committed_len = req.kv.kv_allocated_len + 1
                return


class LeakAtFinish(SchedulerBatchResultProcessor):
    """Each finish takes one KV slot from the allocator and keeps it nowhere."""

    def _prepare_kv_cache_release(self, req: Any) -> None:
        super()._prepare_kv_cache_release(req)
        self.token_to_kv_pool_allocator.alloc(1)


class OverridesTheWorkers(Scheduler):
    """Refused, not run: it overrides a worker constructor the driver owns (the run would
    silently build the reference worker instead)."""

    def init_tp_model_worker(self) -> None:
        super().init_tp_model_worker()
