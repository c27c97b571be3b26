"""The KV ground truth: what each request's KV cache really holds, read back from the paged buffer.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. An observer of either reference runner (V1's, attached with the worker
observer, families/vllm/v1/observer.py; the reference MRV2's, with the MRV2 observer). The runner
keeps a paged KV buffer as vLLM's cache is laid out (models/paged_kv.py: slot = block * block_size
+ offset, through the block table the worker runs each request with, `kv_block_table`), each slot
marked with the token id written there and the request life that wrote it; a step's writes land
when the GPU would commit them (`commit_kv`). This observer follows which leading positions of each request the
worker has computed, and reads them back from the blocks after each step's writes: a position is
valid while its slot holds the request's expected token, written by that request life. It writes the
truth_* columns:

    truth_num_computed_tokens   valid leading positions before the step's write
    truth_kv_after              valid leading positions after it
    truth_kv_ok                 no gap, no overwrite with a wrong token, no write outside the blocks,
                                no valid position overwritten by another request
    truth_kv_foreign_positions  valid positions holding another request's tokens after the step,
    truth_kv_foreign_writer     and which request wrote them (K2)
    truth_kv_unowned_blocks     blocks of the table the worker ran the step with that the scheduler
    truth_kv_block_owner        does not hold for the request (freed: "", or whose they are) (K3)
    truth_kv_unowned_writes     positions the step wrote into such blocks (K4)

Block ownership is the scheduler's, as its outputs state it (`models.kv.BlockLedger`: blocks
given with each new, resumed or cached request, released with each finished or preempted id;
the blocks a prefix-cache hit covers are shared with whoever holds them), never the worker's own
tables.

A request admitted with a prefix-cache hit (its `num_computed_tokens` in the step's output) starts
from KV another request life wrote (or its own earlier life). When its step has run, the hit's
positions are read back as the step's forward reads them (its own writes and every earlier one
landed): each must hold the request's own token, whoever wrote it. How many do is
`truth_cache_hit_valid` (and who wrote the first that does not, `truth_cache_hit_writer`): a block
served for a hash that names other tokens than it holds (a rejected draft's KV, a stale block)
shows there (K6). The hit's positions are the request's valid prefix from then on, whoever wrote
them.

A streaming session's next turn keeps the positions both the old turn's valid prefix and the
scheduler's computed count cover, each read back against the new turn's expected tokens.

A write that starts past the valid prefix leaves a gap; one that starts before it rewrites
positions; a wrong token ends the valid prefix where it landed. A request the worker knows but
did not run this step gets its standing values, read back again where this step wrote into its
blocks. A live engine has no oracle and no truth.
"""

from __future__ import annotations

from typing import Any

from specreplay.replay.families.vllm.v1.observer import RowWriter, RunnerObserver
from specreplay.replay.models.kv import BlockLedger
from specreplay.replay.observers.message_shapes import resumed_ids


class KvTruth(RunnerObserver):
    def __init__(self, oracle: Any, writer: RowWriter, block_size: int) -> None:
        self.oracle = oracle
        self.writer = writer
        self.block_size = block_size
        self.ledger = BlockLedger(block_size)
        self.valid: dict[str, int] = {}  # request -> valid leading positions
        self.ok: dict[str, bool] = {}
        self.step: int | None = None
        self.before: dict[str, int] = {}
        self.inputs: Any = None
        self.released: set[str] = set()  # preempted: their blocks are gone until they resume
        self.returning: set[str] = set()  # preempted requests this step admits again as new ones
        self.tables: dict[str, list[int]] = {}  # the block table last read back, per request
        self.users: dict[int, set[str]] = {}  # block -> the requests whose table (as last read) holds it
        self.evidence: dict[str, dict[str, Any]] = {}  # this step's K2/K3/K4/K6 values per request
        # Per request, the leading positions its prefix-cache hit covered (written by whoever
        # cached them), and the requests admitted with a hit at this step (checked once it ran).
        self.shared: dict[str, int] = {}
        self.hits: dict[str, int] = {}

    def on_execute(self, runner: Any, so: Any) -> None:
        self.step = getattr(so, "_specreplay_step", None)
        self.inputs = None
        self.evidence = {}
        self.hits = {}
        self.ledger.apply(so)  # the SchedulerOutput as the scheduler made it (before any worker edit)
        new_ids = {data.req_id for data in so.scheduled_new_reqs}
        # Model Runner V2: a preempted request comes back as a new one (its KV is gone but for a
        # prefix-cache hit); a streaming session's next turn also arrives new, keeping its KV.
        self.returning = new_ids & (self.released | set(so.preempted_req_ids))
        self.released -= new_ids
        resumed = resumed_ids(so.scheduled_cached_reqs)
        self.released -= resumed
        self.released |= set(so.preempted_req_ids) - resumed

    def on_states(self, runner: Any, so: Any) -> None:
        """What _update_states did to the worker's knowledge of each request's KV."""
        for rid in so.finished_req_ids:
            self.valid.pop(rid, None)
            self.ok.pop(rid, None)
            self.shared.pop(rid, None)
            self.retable(rid, None)
        for data in so.scheduled_new_reqs:
            rid = data.req_id
            if (
                rid in self.valid and rid not in self.returning
            ):  # a streaming session's next turn keeps what it computed
                self.valid[rid] = self.reread_kept(runner, rid, min(self.valid[rid], data.num_computed_tokens))
            else:
                self.admitted(rid, data.num_computed_tokens)
        cached = so.scheduled_cached_reqs
        resumed = resumed_ids(cached)
        if resumed:
            for i, rid in enumerate(cached.req_ids):
                if rid in resumed:
                    # Its old blocks were freed at preemption: only a prefix-cache hit is there.
                    self.admitted(rid, cached.num_computed_tokens[i])
        self.before = dict(self.valid)

    def admitted(self, rid: str, hit: int) -> None:
        """`rid` (re)starts from `hit` positions of cached KV (0: none), checked once its step ran."""
        self.valid[rid] = hit
        self.ok[rid] = True
        self.shared[rid] = hit
        self.hits[rid] = hit  # 0: none, and truth_cache_hit_valid says 0 of 0

    def reread_kept(self, runner: Any, rid: str, kept: int) -> int:
        """A streaming session's next turn: how many of the `kept` leading positions hold the new
        turn's expected tokens (its prompt is the old turn's tokens but the last sampled one, then
        the chunk), read back from the blocks it now runs with. The old turn checked them against
        its own tokens, so one holding an old turn's token where the chunk now goes (a worker that
        counts the ended turn's last token as computed) ends the valid prefix there."""
        st = runner.requests.get(rid)
        if st is None or kept <= 0:
            return kept
        bs = self.block_size
        table = runner.kv_block_table(rid)
        reach = min(kept, len(table) * bs)  # a position past the table has no slot: not valid
        if reach <= 0:
            self.ok[rid] = False
            return 0
        tokens, writers = runner.read_kv([table[p // bs] * bs + p % bs for p in range(reach)], landed=True)
        expected = self.oracle.expected(rid, len(st.prompt_token_ids))
        handle, shared = st.kv_handle, self.shared.get(rid, 0)
        good = 0
        while (
            good < reach
            and good < len(expected)
            and (writers[good] == handle or good < shared)
            and tokens[good] == expected[good]
        ):
            good += 1
        if good < kept:
            self.ok[rid] = False
        return good

    def on_inputs(self, rows: list, runner: Any, so: Any, inputs: Any) -> None:
        """A position outside the request's blocks has no KV slot: the write is broken. A block of
        the table the step runs with that the scheduler does not hold for the request: K3, and
        the positions written into it: K4."""
        self.inputs = inputs
        bs = self.block_size
        ledger = self.ledger
        for x, rid in enumerate(inputs.rows):
            blocks = runner.kv_block_table(rid)
            start, n = inputs.starts[x], inputs.num_scheduled[x]
            if not (0 <= start // bs and (start + n - 1) // bs < len(blocks)):
                self.ok[rid] = False
            if blocks == ledger.held.get(rid, []):
                continue  # the table is exactly what the scheduler holds for it
            foreign = [j for j, b in enumerate(blocks) if not ledger.holds(rid, b)]
            if foreign:
                first = max(start, 0) // bs
                last = min((start + n - 1) // bs, len(blocks) - 1)
                writes = sum(min(start + n, (j + 1) * bs) - max(start, j * bs) for j in foreign if first <= j <= last)
                holders = ledger.holders.get(blocks[foreign[0]])
                self.evidence[rid] = {
                    "truth_kv_unowned_blocks": len(foreign),
                    "truth_kv_block_owner": holders[0] if holders else "",
                    "truth_kv_unowned_writes": writes,
                }

    def on_sampled(self, runner: Any, output: Any = None) -> None:
        inputs = self.inputs
        if self.hits:
            self.check_hits(runner)
        host = inputs.input_ids.tolist()  # after the clamp: what the model really read
        counts = runner.valid_sampled_token_count_cpu
        begin = 0
        for x, rid in enumerate(inputs.rows):
            n, d, start = inputs.num_scheduled[x], inputs.num_drafts[x], inputs.starts[x]
            discarded = inputs.discarded[x]
            kept = n if discarded else n - d + counts[x] - 1  # positions whose KV stays valid
            expected = self.oracle.expected(rid, len(runner.requests[rid].prompt_token_ids))
            written = host[begin : begin + kept]
            begin = inputs.cu[x]
            before = self.valid.get(rid, 0)
            good = 0
            while good < kept and start + good < len(expected) and written[good] == expected[start + good]:
                good += 1
            if start > before:
                self.ok[rid] = False  # positions before..start-1 were never written
                after = before
            elif good < kept:
                self.ok[rid] = False
                after = min(before, start + good) if start + good < before else start + good
            else:
                after = max(before, start + kept)
            self.valid[rid] = after
        self.read_back(runner)

    def check_hits(self, runner: Any) -> None:
        """The positions each prefix-cache hit of this step covered, read back as the step's
        forward read them (every write issued so far landed, this step's own included: a
        request computing the hit's blocks in the same step writes them before the attention
        reads them): each must hold the request's own token, whoever wrote it. The first that
        does not ends what the request really starts from."""
        bs = self.block_size
        plan: list[tuple[str, int]] = []
        slots: list[int] = []
        for rid, hit in self.hits.items():
            if hit <= 0:
                self.evidence.setdefault(rid, {})["truth_cache_hit_valid"] = 0
                continue
            st = runner.requests.get(rid)
            if st is None:
                continue
            table = runner.kv_block_table(rid)
            reach = min(hit, len(table) * bs)
            plan.append((rid, reach))
            slots.extend(table[p // bs] * bs + p % bs for p in range(reach))
        tokens, writers = runner.read_kv(slots, landed=True) if slots else ([], [])
        at = 0
        for rid, reach in plan:
            hit = self.hits[rid]
            expected = self.oracle.expected(rid, len(runner.requests[rid].prompt_token_ids))
            good = 0
            while good < reach and good < len(expected) and tokens[at + good] == expected[good]:
                good += 1
            found = self.evidence.setdefault(rid, {})
            found["truth_cache_hit_valid"] = good
            if good < hit:
                w = writers[at + good] if good < reach else -1
                found["truth_cache_hit_writer"] = runner.kv_writers[w] if w >= 0 else ""
                self.valid[rid] = self.before[rid] = self.shared[rid] = good
                self.ok[rid] = False
            at += reach

    def read_back(self, runner: Any) -> None:
        """Read each request's valid positions back from the blocks another request's write of
        this step went into (all of them where its block table changed): each must hold its
        expected token, written by it. The first that does not ends the valid prefix; one written
        by another request is K2. (A request's own writes were checked against its inputs.)"""
        bs = self.block_size
        wanted: dict[str, set[int]] = {}  # request -> indexes into its block table to read
        for rid, valid in self.valid.items():
            st = runner.requests.get(rid)
            if st is None or valid <= 0 or rid in self.released:
                continue
            table = runner.kv_block_table(rid)
            old = self.tables.get(rid)
            if old != table:
                # Blocks appended (a request's table grows as it runs) are read; a replaced table whole.
                kept = len(old) if old is not None and table[: len(old)] == old else 0
                self.retable(rid, table)
                wanted[rid] = set(range(kept, len(table)))
        # Blocks this step wrote with another request life than the one whose table holds them.
        for block, handles in runner.kv_last_blocks.items():
            for rid in self.users.get(block, ()):
                st = runner.requests.get(rid)
                if st is not None and handles != {st.kv_handle} and rid in self.valid and rid not in self.released:
                    wanted.setdefault(rid, set()).update(j for j, b in enumerate(self.tables[rid]) if b == block)
        plan: list[tuple[str, int, list[int]]] = []  # (request, handle, positions to read)
        slots: list[int] = []
        for rid, indexes in wanted.items():
            valid, table = self.valid[rid], self.tables[rid]
            positions = [p for j in sorted(indexes) for p in range(j * bs, min((j + 1) * bs, valid))]
            if positions:
                plan.append((rid, runner.requests[rid].kv_handle, positions))
                slots.extend(table[p // bs] * bs + p % bs for p in positions)
        if not slots:
            return
        tokens, writers = runner.read_kv(slots, landed=True)
        at = 0
        for rid, handle, positions in plan:
            expected = self.oracle.expected(rid, len(runner.requests[rid].prompt_token_ids))
            shared = self.shared.get(rid, 0)  # a prefix-cache hit's positions: anyone's writes
            bad = None
            foreign = 0
            other = None
            for i, p in enumerate(positions):
                w = writers[at + i]
                own = w == handle or p < shared
                if not own and w >= 0:
                    foreign += 1
                    other = other if other is not None else runner.kv_writers[w]
                if bad is None and (not own or p >= len(expected) or tokens[at + i] != expected[p]):
                    bad = p
            at += len(positions)
            if bad is not None:
                self.valid[rid] = min(self.valid[rid], bad)
                self.ok[rid] = False
            if foreign:
                found = self.evidence.setdefault(rid, {})
                found["truth_kv_foreign_positions"] = foreign
                found["truth_kv_foreign_writer"] = other

    def retable(self, rid: str, table: list[int] | None) -> None:
        """Note `rid`'s block table as now read (None: forget it), and who uses which block."""
        old = self.tables.pop(rid, None) or []
        keep = len(old) if table is not None and table[: len(old)] == old else 0
        for block in old[keep:]:
            users = self.users.get(block)
            if users is not None:
                users.discard(rid)
                if not users:
                    del self.users[block]
        if table is not None:
            for block in table[keep:]:
                self.users.setdefault(block, set()).add(rid)
            self.tables[rid] = list(table)

    def flush(self) -> None:
        if self.step is None:
            return
        ran = set(self.inputs.rows) if self.inputs is not None else set()
        rids = list(self.valid)
        after = list(self.valid.values())
        ok = self.ok
        columns: dict[str, list] = {
            "truth_num_computed_tokens": [
                self.before.get(rid, valid) if rid in ran else valid for rid, valid in zip(rids, after)
            ],
            "truth_kv_after": after,
            "truth_kv_ok": [ok.get(rid, True) for rid in rids],
            "truth_kv_foreign_positions": [0] * len(rids),
            "truth_kv_unowned_blocks": [0] * len(rids),
            "truth_kv_unowned_writes": [0] * len(rids),
        }
        if self.evidence:
            at = {rid: i for i, rid in enumerate(rids)}
            for rid, found in self.evidence.items():
                if rid not in at:
                    continue
                for name, value in found.items():
                    columns.setdefault(name, [None] * len(rids))[at[rid]] = value
        bulk = getattr(self.writer, "write_columns", None)
        if bulk is not None:
            bulk(self.step, rids, columns)
        else:
            names = list(columns)
            for i, rid in enumerate(rids):
                row = {name: columns[name][i] for name in names}
                found = self.evidence.get(rid, {})
                self.writer.write(self.step, rid, {n: v for n, v in row.items() if v is not None or n in found})
        self.writer.step_done(self.step)
        self.inputs = None
