"""The KV ground truth of an SGLang run: what each request's KV really holds, read back through its row.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. The SGLang observer (families/sglang/observer.py) calls it after every
forward of the reference SGLang worker (families/sglang/worker.py), whose KV buffer marks every slot
with the token written there and the request life that wrote it. A request's position p lives at
slot `req_to_token[req_pool_idx, p]`, the row SGLang's scheduler keeps for it (the worker reads
the same row), so the truth follows which leading positions of each request hold its expected
tokens, written by it, and reads them back through the row after each forward:

    truth_num_computed_tokens   valid leading positions before the forward
    truth_kv_after              valid leading positions after it
    truth_kv_ok                 no gap, no wrong token written, no valid position overwritten or
                                remapped to a slot holding something else (sticky for the request)
    truth_kv_foreign_positions  valid positions whose slot another request wrote last, and
    truth_kv_foreign_writer     which request (K2)
    truth_kv_unowned_blocks     slots of the request's row [0, valid) the KV allocator holds as free
    truth_kv_block_owner        '' when there are any (freed: nobody holds them)
    truth_kv_unowned_writes     slots this forward wrote for the request that the allocator holds as free

(page size 1: a block is a slot.) A forward row writes positions `first ..` (the chunk, the decoded
token, or a verify round's bonus and k drafts) and keeps the leading `kept` of them valid (a verify
round: the bonus and the accepted drafts; the rejected drafts' slots are written, not valid). A
write that starts past the valid prefix leaves a gap; a wrong token ends the valid prefix where it
landed. A prefix the radix cache gave the request (its first extend starts past 0) is read back
and counts as valid when it holds the request's tokens, whoever wrote them (another request life
computed them: shared, not foreign); so does every position the radix cache owns for the request
(`cache_protected_len`), whose slot a checkpoint may swap for the tree's copy of the same token.
A retraction frees the request's KV: nothing stays valid, and its re-prefill starts again at 0.
A finished request leaves the truth when its KV is released. A streaming session's turn that
finishes keeps its KV in the session (families/sglang/sessions.py): the next turn, under the same
id, starts from it, every valid position read back against the new turn's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class KvView(Protocol):
    """What the truth reads of the engine: the scheduler's rows and the allocator's free slots
    (families/sglang/loop.py), and the reference worker's KV buffer."""

    def row_slots(self, req_pool_idx: int, length: int) -> list[int]: ...
    def free(self, slots: list[int]) -> list[bool]: ...
    def read_kv(self, slots: list[int]) -> tuple[list[int], list[int]]: ...
    def handle(self, rid: str) -> int: ...
    def writer(self, handle: int) -> str: ...


@dataclass
class Known:
    """One request's KV as the truth follows it."""

    valid: int = 0
    ok: bool = True
    shared: int = 0  # leading positions the radix cache gave it (another life wrote them)
    slots: list[int] = field(default_factory=list)  # its row's slots [0, valid) as last read back


class SglangTruth:
    def __init__(self, oracle: Any, kv: KvView) -> None:
        self.oracle = oracle
        self.kv = kv
        self.known: dict[str, Known] = {}

    def retracted(self, rid: str) -> None:
        """The scheduler freed the request's KV: nothing of it stays valid (its ok flag stays)."""
        found = self.known.get(rid)
        if found is not None:
            found.valid, found.shared, found.slots = 0, 0, []

    def released(self, rid: str) -> None:
        self.known.pop(rid, None)

    def kept(self, rid: str, length: int) -> None:
        """A streaming session kept the request's KV record (its turn ended, or it was retracted)
        holding `length` positions (its kv_committed_len: what the next turn, or the request's
        resumption, starts from): nothing past them stays valid (SGLang freed their slots)."""
        found = self.known.get(rid)
        if found is not None and found.valid > length:
            found.valid, found.slots = length, found.slots[:length]

    def reread(self, rid: str) -> None:
        """The request goes on from the KV record its streaming session kept: its valid positions
        are read back in full at its next forward, against its tokens then (a new turn's: the turn
        before's beyond what the new turn keeps are not the new turn's)."""
        found = self.known.get(rid)
        if found is not None:
            found.slots = []

    def forward(self, rows: list[tuple[Any, Any]], live: list[Any]) -> dict[str, dict[str, Any]]:
        """After a forward: `rows` are (Req, RowResult) of the batch, `live` every request with a
        row this iteration. Returns the truth columns per request id it knows."""
        before = {rid: k.valid for rid, k in self.known.items()}
        written: dict[int, str] = {}  # slot -> the request this forward wrote it for
        for req, result in rows:
            known = self.known.setdefault(req.rid, Known())
            before.setdefault(req.rid, 0)
            for slot in result.slots:
                written[slot] = req.rid
            self._wrote(req, known, result)
        foreign = self._read_back(live, written)
        knowns = [(req, known) for req in live if (known := self.known.get(req.rid)) is not None]
        in_batch = {req.rid: result.slots for req, result in rows}
        # One question to the allocator: which of these slots does it hold as free?
        asked = [slot for req, known in knowns for slot in (*known.slots, *in_batch.get(req.rid, ()))]
        free = iter(self.kv.free(asked))
        columns: dict[str, dict[str, Any]] = {}
        for req, known in knowns:
            unowned = sum(next(free) for _ in known.slots)
            unowned_writes = sum(next(free) for _ in in_batch.get(req.rid, ()))
            others, writer = foreign.get(req.rid, (0, None))
            columns[req.rid] = {
                "truth_num_computed_tokens": before[req.rid] if req.rid in in_batch else known.valid,
                "truth_kv_after": known.valid,
                "truth_kv_ok": known.ok,
                "truth_kv_foreign_positions": others,
                "truth_kv_foreign_writer": writer,
                "truth_kv_unowned_blocks": unowned,
                "truth_kv_block_owner": "" if unowned else None,
                "truth_kv_unowned_writes": unowned_writes,
            }
        return columns

    def _wrote(self, req: Any, known: Known, result: Any) -> None:
        """A row's writes: the valid prefix grows by the kept positions that hold the expected
        tokens from where it ended, or ends at a gap or a wrong token."""
        rid, start = req.rid, result.first_position
        if start > known.valid and known.valid == 0 and req.kv.cache_protected_len >= start:
            self._take_prefix(req, known, start)
        expected_at, prompt_len = self.oracle.token_at, len(req.origin_input_ids)
        kept = min(result.kept, len(result.written))
        good = 0
        while good < kept and result.written[good] == expected_at(rid, start + good, prompt_len):
            good += 1
        if start > known.valid:
            known.ok = False  # positions valid..start-1 were never written
        elif good < kept:
            known.ok = False
            known.valid = start + good
        else:
            known.valid = max(known.valid, start + kept)
        known.slots = known.slots[: known.valid]

    def _take_prefix(self, req: Any, known: Known, length: int) -> None:
        """The radix cache's prefix: its leading positions that hold the request's tokens."""
        slots = self.kv.row_slots(req.kv.req_pool_idx, length)
        tokens, _ = self.kv.read_kv(slots)
        good, prompt_len = 0, len(req.origin_input_ids)
        while good < length and tokens[good] == self.oracle.token_at(req.rid, good, prompt_len):
            good += 1
        if good < length:
            known.ok = False
        known.valid = known.shared = good
        known.slots = slots[:good]

    def _read_back(self, live: list[Any], written: dict[int, str]) -> dict[str, tuple[int, str | None]]:
        """Read back each request's valid positions whose slot is new or changed in its row, or
        that another request wrote this forward: each must hold its expected token, written by
        it (or, in the radix cache's prefix, by anyone). The first that does not ends the valid
        prefix. Returns, per request, the positions read that another request wrote (K2) and the
        first such writer."""
        foreign: dict[str, tuple[int, str | None]] = {}
        for req in live:
            known = self.known.get(req.rid)
            if known is None or known.valid <= 0 or req.kv.req_pool_idx is None:
                continue
            slots = self.kv.row_slots(req.kv.req_pool_idx, known.valid)
            old = known.slots
            kept = min(len(old), len(slots))
            # The row's slots as last read back (one C-level compare in the usual case), then the
            # positions that became valid since, then the slots another request wrote this forward.
            suspect = set(range(kept, len(slots)))
            if slots[:kept] != old[:kept]:
                suspect.update(p for p in range(kept) if slots[p] != old[p])
            others = {slot for slot, rid in written.items() if rid != req.rid}
            if others and not others.isdisjoint(slots):
                suspect.update(p for p, slot in enumerate(slots) if slot in others)
            known.slots = slots
            # The radix cache owns [0, cache_protected_len) (SGLang's ReqKvInfo): a checkpoint
            # of this request's own KV that found the same tokens in the tree remaps its row to the
            # tree's slots and frees its copies, so those positions may hold another life's writes.
            known.shared = max(known.shared, min(req.kv.cache_protected_len, known.valid))
            if not suspect:
                continue
            at = sorted(suspect)
            tokens, writers = self.kv.read_kv([slots[p] for p in at])
            handle, prompt_len = self.kv.handle(req.rid), len(req.origin_input_ids)
            bad = None
            strangers = [w for p, w in zip(at, writers) if w != handle and w >= 0 and p >= known.shared]
            for p, token, writer in zip(at, tokens, writers):
                mine = writer == handle or p < known.shared
                if not mine or token != self.oracle.token_at(req.rid, p, prompt_len):
                    bad = p
                    break
            if strangers:
                foreign[req.rid] = (len(strangers), self.kv.writer(strangers[0]))
            if bad is not None:
                known.valid, known.ok, known.slots = bad, False, slots[:bad]
        return foreign


__all__ = ["KvView", "SglangTruth"]
