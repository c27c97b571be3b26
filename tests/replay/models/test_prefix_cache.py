"""The reference scheduler's prefix cache (models/kv.py): hashes, hits, the free queue's order,
evictions, resets, and the scheduler's admission with a hit, step by step."""

from __future__ import annotations

import pytest

from specreplay.replay.models.kv import BlockLedger, BlockPool, block_hashes_of
from specreplay.replay.models.messages import ModelRunnerOutput
from specreplay.replay.models.request import Request
from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler
from specreplay.replay.workloads.config import EngineConfig

BS = 4


def req(rid: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(rid, list(tokens), max_tokens=8, cache_salt=salt)


def pool(num_blocks: int = 9, caching: bool = True, **kw) -> BlockPool:
    return BlockPool(num_blocks, BS, max_model_len=64, enable_caching=caching, **kw)


def admit(p: BlockPool, r: Request) -> tuple[list[int], int]:
    """A waiting request's admission: look the cache up, allocate its whole prompt, cache it."""
    hit, computed = p.get_computed_blocks(r)
    assert p.allocate_slots(r.request_id, 0, r.num_tokens - computed, new_computed_blocks=hit, request=r) is not None
    return hit, computed


def test_hashes_chain_over_the_whole_prefix_and_the_salt():
    a, b = req("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]), req("b", [1, 2, 3, 4, 5, 6, 7, 8])
    assert len(block_hashes_of(a, BS)) == 2  # full blocks only
    assert block_hashes_of(a, BS) == block_hashes_of(b, BS)
    c = req("c", [0, 2, 3, 4, 5, 6, 7, 8])  # same second block, another first one
    assert block_hashes_of(c, BS)[1] != block_hashes_of(a, BS)[1]
    salted = req("d", [1, 2, 3, 4, 5, 6, 7, 8], salt="tenant-1")
    assert block_hashes_of(salted, BS)[0] != block_hashes_of(a, BS)[0]
    ahead = req("e", [1, 2, 3, 4, 5])  # 0.33's lookahead hash waits for the token after the block
    assert len(block_hashes_of(ahead, BS, lookahead=1)) == 1
    assert block_hashes_of(req("f", [1, 2, 3, 4]), BS, lookahead=1) == []


def test_a_hit_is_whole_blocks_of_the_longest_cached_prefix_but_never_the_last_token():
    p = pool()
    a = req("a", list(range(10)))  # 2 full blocks and 2 tokens
    assert admit(p, a) == ([], 0)
    assert p.num_cached_blocks() == 2
    b = req("b", list(range(8)) + [99, 98])
    hit, computed = p.get_computed_blocks(b)
    assert (hit, computed) == (p.block_ids("a")[:2], 8)
    same = req("c", list(range(8)))  # all 8 cached: the last token is recomputed for its logits
    assert p.get_computed_blocks(same)[1] == 4
    other = req("d", [5] + list(range(1, 10)))
    assert p.get_computed_blocks(other) == ([], 0)


def test_an_eagle_style_drafter_drops_the_last_hit_block():
    p = pool(drop_last_hit_block=True)
    admit(p, req("a", list(range(10))))
    assert p.get_computed_blocks(req("b", list(range(9))))[1] == 4
    assert not pool(drop_last_hit_block=True, hash_lookahead=1).drop_last_hit_block  # 0.33: lookahead hashes instead


def test_shared_blocks_are_counted_and_freed_once_no_one_holds_them():
    p = pool()
    admit(p, req("a", list(range(10))))
    free_before = len(p.free)
    hit, _ = admit(p, req("b", list(range(8)) + [50, 51, 52]))
    assert all(p.ref_cnt[block] == 2 for block in hit)
    assert len(p.free) == free_before - 1  # only b's own third block was taken
    p.release("a")
    assert all(p.ref_cnt[block] == 1 for block in hit) and all(block not in p.free for block in hit)
    p.release("b")
    assert p.num_used_blocks() == 0


def test_freed_blocks_go_uncached_to_the_head_and_cached_to_the_tail_in_lru_order():
    p = pool(num_blocks=9)
    admit(p, req("a", list(range(10))))  # blocks 1, 2 cached, 3 not
    assert p.block_ids("a") == [1, 2, 3]
    p.release("a")  # freed tail first: 3 to the head; then 2, 1 to the tail
    assert list(p.free) == [3, 4, 5, 6, 7, 8, 2, 1]
    off = pool(num_blocks=9, caching=False)
    admit(off, req("a", list(range(10))))
    off.release("a")  # without caching every freed block goes to the head, tail first
    assert list(off.free) == [3, 2, 1, 4, 5, 6, 7, 8]


def test_a_hit_on_a_free_cached_block_takes_it_out_of_the_queue_and_reuse_evicts():
    p = pool(num_blocks=5)  # 4 usable blocks
    admit(p, req("a", list(range(8))))  # blocks 1, 2: block 2 holds tokens 4..7
    p.release("a")
    assert list(p.free) == [3, 4, 2, 1]
    hit, _ = admit(p, req("b", list(range(4)) + [70, 71, 72]))  # hits block 1, takes 3
    assert hit == [1] and 1 not in p.free and p.evictions == 0
    assert list(p.free) == [4, 2]
    admit(p, req("c", [40 + i for i in range(8)]))  # needs 2: 4, then the cached 2 (evicted)
    assert p.block_ids("c") == [4, 2] and p.evictions == 1
    assert p.get_computed_blocks(req("d", list(range(8)) + [9]))[1] == 4  # block 2's hash is gone


def test_the_full_sequence_fit_counts_hit_blocks_as_held_and_a_free_hit_as_taken():
    p = pool(num_blocks=4)  # 3 usable
    admit(p, req("a", list(range(8))))
    p.release("a")  # both cached, both free
    long = req("b", list(range(8)) + [1, 1, 1, 1])  # 12 tokens: 3 blocks, 2 of them hits
    hit, _ = p.get_computed_blocks(long)
    assert p.num_blocks_to_allocate("b", 12, hit) == 3  # 1 new + 2 free hits taken from the queue
    assert p.fits("b", 12, hit) and not p.fits("b", 13, hit)


def test_a_reset_forgets_every_hash_only_when_no_request_holds_a_block():
    p = pool()
    admit(p, req("a", list(range(8))))
    assert not p.reset_prefix_cache()
    p.release("a")
    assert p.reset_prefix_cache() and p.num_cached_blocks() == 0
    assert p.get_computed_blocks(req("b", list(range(9)))) == ([], 0)


def test_the_ledger_shares_hit_blocks_and_takes_any_other_block_from_its_holder():
    ledger = BlockLedger(block_size=BS)
    ledger.give("a", [1, 2, 3])
    ledger.give("b", [1, 2, 4], shared=2)
    assert ledger.holds("a", 1) and ledger.holds("b", 1) and ledger.owner[1] == "a"
    ledger.give("c", [3])  # not a hit: a double allocation takes it from a
    assert not ledger.holds("a", 3) and ledger.owner[3] == "c"
    ledger.release("a")
    assert ledger.holders[1] == ["b"]


def test_a_shared_prompt_is_admitted_from_its_cached_prefix_and_computes_the_rest():
    config = EngineConfig(max_num_batched_tokens=64, num_spec_tokens=0, block_size=BS, num_blocks=32)
    sched = Scheduler(config)
    sched.add_request(req("a", list(range(10))))
    s1 = sched.schedule()
    assert s1.scheduled_new_reqs[0].num_computed_tokens == 0
    sched.update_from_output(s1, ModelRunnerOutput(["a"], {"a": 0}, [[3]]))
    sched.add_request(req("b", list(range(8)) + [60, 61, 62]))
    s2 = sched.schedule()
    (new_b,) = s2.scheduled_new_reqs
    assert new_b.num_computed_tokens == 8 and s2.num_scheduled_tokens["b"] == 3
    assert new_b.block_ids[:2] == sched.kv.block_ids("a")[:2]
    assert sched.requests["b"].num_computed_tokens == 11


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_an_applied_output_caches_the_blocks_it_completes(version):
    """vLLM's apply caches at once (0.32: the AsyncScheduler, up to C - P; 0.33: up to C less
    the tokens in flight): a request resumed right after finds the decoded block cached."""
    config = EngineConfig(max_num_batched_tokens=64, num_spec_tokens=0, block_size=BS, num_blocks=32)
    config = EngineConfig(**{**config.to_dict(), "vllm_version": version})
    sched = AsyncScheduler(config)
    r = sched.add_request(req("a", list(range(3))))
    s1 = sched.schedule()
    s2 = sched.schedule()  # decodes position 3 while s1's output is in flight
    sched.update_from_output(s1, ModelRunnerOutput(["a"], {"a": 0}, [[9]]))  # T 4: one full block
    assert r.num_tokens == 4 and sched.kv.num_cached_blocks() == 0  # C - P = 4 - 1 = 3 < 4
    s3 = sched.schedule()
    sched.update_from_output(s2, ModelRunnerOutput(["a"], {"a": 0}, [[8]]))  # T 5, C - P = 4
    assert sched.kv.num_cached_blocks() == 1
    assert s3.num_scheduled_tokens["a"] == 1
