"""KV block accounting on the scheduler side: a free-block queue and per-request block lists.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, scheduler side. `allocate_slots` failing is what drives preemption; the
block ids reach the worker in `SchedulerOutput` and decide where its KV writes land. Modelled on
vLLM 0.32.0's KVCacheManager for one full-attention group without prefix caching: block 0 is the
reserved null block, allocation takes from the head of the free queue, and a freed request's blocks
go back to the tail in reverse order. `BlockLedger` is the same ownership as the scheduler's outputs
state it (for the KV ground truth).
"""

from __future__ import annotations

from collections import deque


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.free: deque[int] = deque(range(1, num_blocks))  # block 0: vLLM's null block
        self.blocks: dict[str, list[int]] = {}

    def allocate_slots(
        self, request_id: str, num_computed_tokens: int, num_new_tokens: int, num_lookahead_tokens: int = 0
    ) -> list[int] | None:
        """Blocks for `num_new_tokens` more tokens after `num_computed_tokens`, or None if the
        pool cannot cover them (the caller then preempts)."""
        owned = self.blocks.setdefault(request_id, [])
        need_tokens = min(num_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        need = -(-need_tokens // self.block_size) - len(owned)
        if need <= 0:
            return []
        if need > len(self.free):
            return None
        new = [self.free.popleft() for _ in range(need)]
        owned.extend(new)
        return new

    def fits(self, request_id: str, num_tokens: int) -> bool:
        """Would `num_tokens` in all fit? (vLLM's scheduler_reserve_full_isl admission check.)"""
        held = len(self.blocks.get(request_id, ()))
        need = -(-min(num_tokens, self.max_model_len) // self.block_size) - held
        return need <= len(self.free)

    def release(self, request_id: str) -> None:
        owned = self.blocks.pop(request_id, [])
        self.free.extend(reversed(owned))

    def num_used_blocks(self) -> int:
        """Blocks held by requests (the null block not counted)."""
        return sum(len(owned) for owned in self.blocks.values())

    def block_ids(self, request_id: str) -> list[int]:
        return list(self.blocks.get(request_id, ()))


class BlockLedger:
    """Who holds each block, as the scheduler's outputs state it: the blocks given with each new,
    resumed or cached request in a `SchedulerOutput`, released with each id in its finished or
    preempted sets (vLLM frees a request's blocks when it finishes or is preempted and announces
    it with the next output; a block given again in that same output was freed first).

    The KV ground truth (observers/truth.py) reads block ownership here: the scheduler's word, never
    the worker's block tables."""

    def __init__(self) -> None:
        self.owner: dict[int, str] = {}
        self.held: dict[str, list[int]] = {}

    def apply(self, out) -> None:
        """One SchedulerOutput, as the scheduler made it: releases first, then what it gives."""
        cached = out.scheduled_cached_reqs
        for rid in (*out.finished_req_ids, *out.preempted_req_ids):
            self.release(rid)
        for data in out.scheduled_new_reqs:
            self.give(data.req_id, data.block_ids, replace=True)  # a streaming turn: the whole list again
        for i, rid in enumerate(cached.req_ids):
            self.give(rid, cached.new_block_ids[i] or [], replace=rid in cached.resumed_req_ids)

    def release(self, rid: str) -> None:
        for block in self.held.pop(rid, []):
            if self.owner.get(block) == rid:
                del self.owner[block]

    def give(self, rid: str, blocks, replace: bool = False) -> None:
        if replace:
            self.release(rid)
        held = self.held.setdefault(rid, [])
        for block in blocks:
            old = self.owner.get(block)
            if old is not None and old != rid and block in self.held.get(old, ()):
                self.held[old].remove(block)  # given to another without being freed: it is theirs now
            self.owner[block] = rid
            held.append(block)
