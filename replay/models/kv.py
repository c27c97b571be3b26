"""KV block accounting on the scheduler side: vLLM's KVCacheManager and BlockPool for one group.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, scheduler side. `allocate_slots` failing is what drives preemption; the
block ids reach the worker in `SchedulerOutput` and decide where its KV writes land. Modelled on
vLLM 0.32.0's `KVCacheManager` with one full-attention group (`UnitaryKVCacheCoordinator`,
`FullAttentionManager`, `BlockPool`, `FreeKVCacheBlockQueue`), prefix caching included:

- Block 0 is the null block; the free queue starts as 1..N-1 and allocation pops its head.
- A request's blocks are freed tail first (reversed): a block that holds a hash (cached) goes to
  the queue's tail, to be evicted last, in LRU order; any other block to its head, to be reused
  first (vLLM's `free_blocks`: `append_n` and `prepend_n`).
- With prefix caching, every full block of known tokens a request computes (or has scheduled in
  flight) is cached under a hash chained over the whole prefix (`cache_blocks`, capped at the
  request's known tokens, never its drafts); a new or resumed request looks its hashes up
  (`get_computed_blocks`: the longest run of cached blocks from the start, at most num_tokens - 1
  tokens so that the last token is recomputed for its logits, one block less for an EAGLE-style
  drafter) and shares the blocks it hits (reference counts; a hit on a free cached block takes it
  out of the queue). A free cached block handed out again loses its hash: an eviction.

Hashes are computed lazily from the request's tokens (`block_hashes_of`), with vLLM's chain of
(parent hash, the block's tokens, extra keys: the cache salt on the first block), so their equality
is vLLM's; their values are Python's and never leave the process.

`BlockLedger` is the same ownership as the scheduler's outputs state it (for the KV ground truth).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any


class FreeBlockQueue:
    """vLLM's FreeKVCacheBlockQueue: the free blocks in eviction order (head first), with O(1)
    removal from the middle (a hit on a free cached block)."""

    def __init__(self, block_ids: Iterable[int]) -> None:
        self._order: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self):
        return iter(self._order)

    def __contains__(self, block: int) -> bool:
        return block in self._order

    def popleft_n(self, n: int) -> list[int]:
        order = self._order
        return [order.popitem(last=False)[0] for _ in range(n)]

    def popleft(self) -> int:
        return self._order.popitem(last=False)[0]

    def remove(self, block: int) -> None:
        del self._order[block]

    def append_n(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            self._order[block] = None

    def prepend_n(self, blocks: Sequence[int]) -> None:
        """`blocks`, in their order, ahead of every block already queued."""
        order = self._order
        for block in reversed(blocks):
            order[block] = None
            order.move_to_end(block, last=False)


class BlockPool:
    """The scheduler's KV cache: free blocks, each request's blocks, and (with prefix caching)
    the cached blocks by hash. The name is specreplay's; the methods and their order of effects
    are vLLM's KVCacheManager's and BlockPool's."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_caching: bool = False,
        drop_last_hit_block: bool = False,
        hash_lookahead: int = 0,
    ) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # vLLM's use_eagle_block_drop: an EAGLE-style drafter needs the last hit block recomputed.
        self.drop_last_hit_block = drop_last_hit_block and not hash_lookahead
        # vLLM 0.33's num_hash_lookahead_tokens: each hash also covers this many tokens after its
        # block (the drafter's KV at the block's last position reads them), instead of the drop.
        self.hash_lookahead = hash_lookahead
        self.free = FreeBlockQueue(range(1, num_blocks))  # block 0: vLLM's null block
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # hash -> the blocks cached under it, oldest first (a hit takes the first): vLLM does not
        # de-duplicate blocks that fill up with the same tokens.
        self.cached: dict[int, dict[int, None]] = {}
        self.blocks: dict[str, list[int]] = {}  # request -> its blocks (req_to_blocks)
        self.num_cached_block: dict[str, int] = {}  # request -> its leading blocks already cached
        self.evictions = 0  # cached blocks handed out again (their hash dropped), ever

    # ---------------------------------------------------------------- vLLM's surface
    @property
    def block_pool(self) -> BlockPool:
        """vLLM's `kv_cache_manager.block_pool` (one object here): what an observer reads."""
        return self

    @property
    def kv_cache_manager(self) -> BlockPool:
        return self

    # ---------------------------------------------------------------- lookups
    def get_computed_blocks(self, req: Any) -> tuple[list[int], int]:
        """vLLM's get_computed_blocks: the cached blocks a waiting request starts from and how
        many tokens they hold. At most num_tokens - 1 tokens (the last token is recomputed for
        its logits), whole blocks, from the first block on; an EAGLE-style drafter drops the
        last one. Without prefix caching: none."""
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        hit: list[int] = []
        for block_hash in block_hashes_of(req, bs, self.hash_lookahead)[: (req.num_tokens - 1) // bs]:
            blocks = self.cached.get(block_hash)
            if not blocks:
                break
            hit.append(next(iter(blocks)))
        if self.drop_last_hit_block and hit:
            hit.pop()
        return hit, len(hit) * bs

    def num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[int] = ()) -> int:
        """vLLM's get_num_blocks_to_allocate: blocks `num_tokens` in all need beyond those held
        and hit; a hit on a free cached block counts too (it leaves the free queue)."""
        required = -(-num_tokens // self.block_size)
        held = len(self.blocks.get(request_id, ()))
        if request_id in self.num_cached_block:  # running: no new hits
            return max(required - held, 0)
        evictable = sum(1 for b in new_computed_blocks if self.ref_cnt[b] == 0)
        return max(required - held - len(new_computed_blocks), 0) + evictable

    def fits(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[int] = ()) -> bool:
        """Would `num_tokens` in all fit? (vLLM's scheduler_reserve_full_isl admission check:
        allocate_slots' full_sequence_must_fit.)"""
        full = min(num_tokens, self.max_model_len)
        return self.num_blocks_to_allocate(request_id, full, new_computed_blocks) <= len(self.free)

    # ---------------------------------------------------------------- allocation
    def allocate_slots(
        self,
        request_id: str,
        num_computed_tokens: int,
        num_new_tokens: int,
        num_lookahead_tokens: int = 0,
        new_computed_blocks: Sequence[int] = (),
        request: Any = None,
    ) -> list[int] | None:
        """Blocks for `num_new_tokens` more tokens after `num_computed_tokens` (and after the
        `new_computed_blocks` a waiting request hit), or None if the pool cannot cover them (the
        caller then preempts). The hits join the request's blocks first; then new blocks. With
        `request` (and prefix caching), its full blocks of known tokens up to the end of this
        step's range are cached. Returns the new blocks only, as vLLM does."""
        bs = self.block_size
        hit_tokens = len(new_computed_blocks) * bs
        computed = min(num_computed_tokens + hit_tokens, self.max_model_len)
        need_tokens = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if self.num_blocks_to_allocate(request_id, need_tokens, new_computed_blocks) > len(self.free):
            return None
        owned = self.blocks.setdefault(request_id, [])
        if new_computed_blocks and request_id not in self.num_cached_block:
            self.touch(new_computed_blocks)
            owned.extend(new_computed_blocks)
            self.num_cached_block[request_id] = len(owned)
        need = -(-need_tokens // bs) - len(owned)
        new = self.get_new_blocks(need) if need > 0 else []
        owned.extend(new)
        if request is not None:
            self.cache_blocks(request, min(computed + num_new_tokens, request.num_tokens))
        return new

    def get_new_blocks(self, n: int) -> list[int]:
        """`n` blocks from the head of the free queue; a cached one loses its hash (evicted)."""
        blocks = self.free.popleft_n(n)
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            self.ref_cnt[block] += 1
        return blocks

    def _maybe_evict_cached_block(self, block: int) -> bool:
        """vLLM's: drop `block`'s hash from the cache (it is being handed out again). True if it
        had one."""
        block_hash = self.block_hash[block]
        if block_hash is None:
            return False
        holders = self.cached.get(block_hash)
        if holders is not None:
            holders.pop(block, None)
            if not holders:
                del self.cached[block_hash]
        self.block_hash[block] = None
        self.evictions += 1
        return True

    def touch(self, blocks: Sequence[int]) -> None:
        """A hit on `blocks`: one more reference each; a free one leaves the free queue."""
        for block in blocks:
            if self.ref_cnt[block] == 0:
                self.free.remove(block)
            self.ref_cnt[block] += 1

    def cache_blocks(self, req: Any, num_tokens: int) -> None:
        """vLLM's cache_full_blocks: cache `req`'s full blocks within its first `num_tokens`
        tokens that are not cached yet, each under its hash (a block already cached under the
        same hash by another request is not merged: vLLM keeps block tables append-only)."""
        if not self.enable_caching:
            return
        rid = req.request_id
        done = self.num_cached_block.get(rid, 0)
        hashes = block_hashes_of(req, self.block_size, self.hash_lookahead)
        # Only blocks whose hash exists (0.33: a lookahead hash waits for the token after its block).
        full = min(num_tokens // self.block_size, len(hashes))
        if done >= full:
            return
        owned = self.blocks.get(rid, [])
        for i, block in enumerate(owned[done:full], done):  # vLLM slices the request's blocks
            block_hash = hashes[i]
            if self.block_hash[block] == block_hash:
                continue
            assert self.block_hash[block] is None, "a full block is cached once"
            self.block_hash[block] = block_hash
            self.cached.setdefault(block_hash, {})[block] = None
        self.num_cached_block[rid] = full

    # ---------------------------------------------------------------- freeing
    def release(self, request_id: str) -> None:
        """vLLM's KVCacheManager.free: the request's blocks, tail first, one reference less
        each; those no one references any more return to the free queue: a cached block to
        its tail (evicted last, LRU), any other to its head (reused first)."""
        self.free_blocks(reversed(self.pop_blocks_for_free(request_id)))

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """vLLM's: the request's blocks in allocation order, its bookkeeping dropped, the blocks
        not yet returned (the caller frees them, tail first; a deferred free frees them later)."""
        self.num_cached_block.pop(request_id, None)
        return self.blocks.pop(request_id, [])

    def free_blocks(self, ordered: Iterable[int]) -> None:
        evict_first: list[int] = []
        evict_last: list[int] = []
        for block in ordered:
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                cached = self.enable_caching and self.block_hash[block] is not None
                (evict_last if cached else evict_first).append(block)
        self.free.prepend_n(evict_first)
        self.free.append_n(evict_last)

    def reset_prefix_cache(self) -> bool:
        """vLLM's: forget every hash, only if no request holds a block; returns whether it did."""
        if self.num_used_blocks():
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        return True

    # ---------------------------------------------------------------- reading
    def get_num_free_blocks(self) -> int:
        """vLLM's name: the blocks in the free queue (cached ones included)."""
        return len(self.free)

    def num_used_blocks(self) -> int:
        """Blocks some request holds (the null block not counted)."""
        return self.num_blocks - 1 - len(self.free)

    def num_cached_blocks(self) -> int:
        """Blocks that hold a hash (in use or free, to be evicted last)."""
        return sum(len(blocks) for blocks in self.cached.values())

    def block_ids(self, request_id: str) -> list[int]:
        return list(self.blocks.get(request_id, ()))


def block_hashes_of(req: Any, block_size: int, lookahead: int = 0) -> list[int]:
    """The hashes of `req`'s full blocks of known tokens (prompt and applied outputs), chained as
    vLLM's request_block_hasher chains them: (parent hash, the block's token ids, extra keys),
    the cache salt an extra key of the first block; with `lookahead` (vLLM 0.33's
    num_hash_lookahead_tokens) the tokens after the block are extra keys too, and a block's hash
    waits for them. Computed as far as the tokens reach, kept on the request (`req.block_hashes`)
    and cut back by the caller where its tokens are cut (a streaming session's next turn)."""
    hashes = req.block_hashes
    tokens = req.all_token_ids
    full = (len(tokens) - lookahead) // block_size
    if len(hashes) < full:
        parent = hashes[-1] if hashes else None
        salt = getattr(req, "cache_salt", None)
        for i in range(len(hashes), full):
            end = (i + 1) * block_size
            extra: Any = ("cache_salt", salt) if i == 0 and salt else None
            if lookahead:
                extra = (extra, *tokens[end : end + lookahead])
            parent = hash((parent, tuple(tokens[i * block_size : end]), extra))
            hashes.append(parent)
    return hashes


class BlockLedger:
    """Who holds each block, as the scheduler's outputs state it: the blocks given with each new,
    resumed or cached request in a `SchedulerOutput`, released with each id in its finished or
    preempted sets (vLLM frees a request's blocks when it finishes or is preempted and announces
    it with the next output; a block given again in that same output was freed first). The
    leading blocks a request's prefix-cache hit covers (its `num_computed_tokens` in the output,
    when it arrives) are shared with whoever holds them; any other block given is the request's
    alone, taken from whoever the ledger thought held it.

    One output is applied in the scheduler's order: the running requests' new blocks (allocated
    before anything is admitted), then the admitted requests' own new blocks, then the hits they
    share (a hit can be on a block cached in this very step, by a running request or an earlier
    admission).

    The KV ground truth (observers/truth.py) reads block ownership here: the scheduler's word, never
    the worker's block tables."""

    def __init__(self, block_size: int = 0) -> None:
        self.block_size = block_size
        self.holders: dict[int, list[str]] = {}  # block -> the requests that hold it, first first
        self.held: dict[str, list[int]] = {}

    @property
    def owner(self) -> dict[int, str]:
        """Block -> its first holder (the request that cached it, where shared)."""
        return {block: holders[0] for block, holders in self.holders.items() if holders}

    def holds(self, rid: str, block: int) -> bool:
        return rid in self.holders.get(block, ())

    def apply(self, out) -> None:
        """One SchedulerOutput, as the scheduler made it: releases first, then what it gives."""
        cached = out.scheduled_cached_reqs
        bs = self.block_size
        for rid in (*out.finished_req_ids, *out.preempted_req_ids):
            self.release(rid)
        resumed = cached.resumed_req_ids
        admitted: list[tuple[str, list[int], int]] = []  # (request, its whole list, hit blocks)
        for data in out.scheduled_new_reqs:
            # A request that holds blocks already is a streaming session's next turn: no lookup.
            shared = data.num_computed_tokens // bs if bs and not self.held.get(data.req_id) else 0
            admitted.append((data.req_id, list(data.block_ids), shared))
        for i, rid in enumerate(cached.req_ids):
            if rid in resumed:
                shared = cached.num_computed_tokens[i] // bs if bs else 0
                admitted.append((rid, list(cached.new_block_ids[i] or []), shared))
            else:
                self.give(rid, cached.new_block_ids[i] or [])
        for rid, blocks, shared in admitted:
            self.give(rid, blocks, replace=True, shared=shared, hits=False)
        for rid, blocks, shared in admitted:
            for block in blocks[:shared]:
                self._share(rid, block)

    def release(self, rid: str) -> None:
        for block in self.held.pop(rid, []):
            holders = self.holders.get(block)
            if holders is not None and rid in holders:
                holders.remove(rid)
                if not holders:
                    del self.holders[block]

    def give(self, rid: str, blocks, replace: bool = False, shared: int = 0, hits: bool = True) -> None:
        """`rid` gets `blocks` (appended to what it holds, or instead of it: `replace`); the first
        `shared` of them are prefix-cache hits it shares with their holders (registered here, or,
        without `hits`, by the caller once every new block of the step is given), and so is any
        block it held already (a streaming session's next turn lists its blocks again: the ones
        other requests hit stay theirs too). Any other block is its alone."""
        kept = set(self.held.get(rid, ())) if replace else set()
        if replace:
            self.release(rid)
        self.held.setdefault(rid, []).extend(blocks)
        for j, block in enumerate(blocks):
            if j < shared or block in kept:
                if hits or block in kept:
                    self._share(rid, block)
                continue
            holders = self.holders.setdefault(block, [])
            for old in holders:
                if old != rid and block in self.held.get(old, ()):
                    self.held[old].remove(block)  # given to another without being freed: it is theirs now
            holders[:] = [rid]

    def _share(self, rid: str, block: int) -> None:
        holders = self.holders.setdefault(block, [])
        if rid not in holders:
            holders.append(rid)
