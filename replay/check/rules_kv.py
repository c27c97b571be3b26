"""The physical KV cache: blocks and the requests that write, hold and read them.

Codes: K2 (a request's valid KV positions hold another request's tokens), K3 (the block table a
request ran with points at a block the scheduler does not hold for it: freed, or another's), K4
(a step wrote into such a block), K5 (the worker kept a finished request's state or row past the
step that announced it), K6 (a prefix-cache hit served blocks whose KV is not the KV of the
tokens their hash names). K2 to K4 and K6 read the truth columns the reference runner's paged
buffer fills (observers/truth.py; null in a live engine's trace: then nothing fires), K5 the
worker's. Each KV finding names the other request: the writer of the foreign tokens, the block's
holder, the writer of the first wrong position of a hit. The message texts are in the catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from specreplay.replay.check.findings import Finding
from specreplay.replay.check.frames import Frame

if TYPE_CHECKING:
    from specreplay.replay.check.framework import Checker


def check_foreign_tokens(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """K2: no valid KV position of a request holds a token another request wrote (first per request)."""
    c = frame.c
    foreign = c["truth_kv_foreign_positions"]
    for i in chk.first_per_request("K2-kv-foreign-tokens", frame, foreign > 0):
        yield chk.finding(
            frame,
            "K2-kv-foreign-tokens",
            i,
            "kv_cache",
            0,
            int(foreign[i]),
            other_request=c["truth_kv_foreign_writer"][i],
        )


def check_block_ownership(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """K3: the worker runs a request only on blocks the scheduler holds for it; K4: a step writes
    only into such blocks (first per request each)."""
    c = frame.c
    blocks, writes, owner = c["truth_kv_unowned_blocks"], c["truth_kv_unowned_writes"], c["truth_kv_block_owner"]
    for i in chk.first_per_request("K3-kv-unowned-block", frame, blocks > 0):
        yield chk.finding(frame, "K3-kv-unowned-block", i, "block_table", 0, int(blocks[i]), other_request=owner[i])
    for i in chk.first_per_request("K4-kv-write-unowned", frame, writes > 0):
        yield chk.finding(frame, "K4-kv-write-unowned", i, "kv_cache", 0, int(writes[i]), other_request=owner[i])


def check_finished_state(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """K5: the worker drops a finished request's state and row at the step that announces it."""
    for i in chk.first_per_request("K5-finished-state-kept", frame, frame.c["worker_kept_finished"]):
        yield chk.finding(frame, "K5-finished-state-kept", i, "requests", False, True)


def check_cache_hits(frame: Frame, chk: Checker) -> Iterable[Finding]:
    """K6: every position a prefix-cache hit covers holds the KV of the request's own token there
    when its step reads it (a block is served only for the tokens its hash names)."""
    c = frame.c
    cached, valid = c["sched_num_cached_tokens"], c["truth_cache_hit_valid"]
    bad = ~c["truth_cache_hit_valid_is_null"] & ~c["sched_num_cached_tokens_is_null"] & (valid < cached)
    for i in chk.first_per_request("K6-cache-hit-content", frame, bad):
        writer = c["truth_cache_hit_writer"][i]
        yield chk.finding(
            frame,
            "K6-cache-hit-content",
            i,
            "prefix_cache",
            int(cached[i]),
            int(valid[i]),
            other_request=writer or None,
        )
