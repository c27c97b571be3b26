"""Implementations under test that misuse KV blocks around a step in flight, as plugins would.

Loaded as a user's would be: `--impl tests.replay.models.kv_variants:NAME`
(tests/replay/models/test_physical_kv.py). Each keeps its own log of what it did, so a test can
say at which step and for which requests the checker must flag it.
"""

from __future__ import annotations

from specreplay.replay.families.vllm.v1.runner import GPUModelRunner
from specreplay.replay.models.scheduler import AsyncScheduler


class EarlyFreeScheduler(AsyncScheduler):
    """Frees a running request's KV blocks as soon as its step in flight would take it to
    max_tokens if every draft were accepted: an optimistic early release. The step in flight
    still writes into those blocks, the next allocation hands them to another request, and when
    drafts were rejected the request goes on through its old block table.

    `released`: (step, request id, blocks) per early release; `given`: (step, request id, blocks)
    per request the step's output gave blocks to."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.released: list[tuple[int, str, list[int]]] = []
        self.given: list[tuple[int, str, list[int]]] = []
        self._freed: set[int] = set()  # id() of the request objects already released early

    def update_after_schedule(self, out):
        self.given += [(out.step, data.req_id, list(data.block_ids)) for data in out.scheduled_new_reqs]
        cached = out.scheduled_cached_reqs
        self.given += [(out.step, rid, list(blocks)) for rid, blocks in zip(cached.req_ids, cached.new_block_ids)]
        super().update_after_schedule(out)

    def running_demand(self, req, budget, threshold):
        outputs_if_accepted = req.num_tokens - req.num_prompt_tokens + req.num_output_placeholders
        if req.num_output_placeholders and outputs_if_accepted >= req.max_tokens and id(req) not in self._freed:
            self._freed.add(id(req))
            self.released.append((self.step, req.request_id, self.kv.block_ids(req.request_id)))
            self.kv.release(req.request_id)
        return super().running_demand(req, budget, threshold)


class LingeringRunner(GPUModelRunner):
    """Drops a finished request's cached state one step after the step that announced it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lingering: set[str] = set()

    def remove_finished(self, out):
        for rid in self.lingering - set(out.num_scheduled_tokens):
            self.requests.pop(rid, None)
            self.input_batch.remove_request(rid)
        self.lingering = {rid for rid in out.finished_req_ids if rid in self.requests}
        for rid in self.lingering:
            self.input_batch.remove_request(rid)  # the row goes (the sweep would take it anyway)


class KeepsHashOnReuse(AsyncScheduler):
    """Hands a free cached block out again without dropping its hash (vLLM's eviction, skipped):
    the prefix cache still offers the block for the tokens it held, while the request it went to
    writes its own there. A later hit reads that request's KV as its own prefix (K6)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.kv._maybe_evict_cached_block = lambda block: False


class CachesAtFinish(AsyncScheduler):
    """Caches every full block of a finished request's known tokens when it frees them (a "save
    at finish" that forgets the KV of its last tokens was never computed): the block holding the
    last sampled token, whose KV no step wrote, or a rejected draft's KV where that token goes, is
    served as a hit to a request that continues the conversation (K6)."""

    def free_blocks(self, req):
        if req.status.finished and req.request_id in self.kv.blocks:
            self.kv.cache_blocks(req, req.num_tokens)
        super().free_blocks(req)
