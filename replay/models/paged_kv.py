"""The paged KV buffer both reference runners write: vLLM's cache layout, each slot marked by its writer.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, worker side. A mixin of the V1 reference runner (families/vllm/v1/runner.py) and
the reference Model Runner V2 (families/vllm/mrv2/runner.py): one KV model for both, so the KV ground
truth (observers/truth.py) reads either the same way.

A buffer of `num_blocks * block_size` slots; a position p of a row is written at slot
`block_table[p // block_size] * block_size + p % block_size`, each slot marked with the token id
and the request life that wrote it (`kv_tokens`, `kv_writer`, the handle's request id in
`kv_writers`). A step's writes are issued with its forward (`write_kv`) and land when the GPU
would have finished it (`commit_kv`): before the next forward, so under async scheduling after the
scheduler has already built the next step (and may have freed and handed out the blocks they go
to); in sync mode when the step's output is taken.

What the runner gives it: `requests[rid].kv_handle` (the life's handle, -1 until first use),
`kv_block_table(rid)` (the table the worker runs `rid` with), and, per step, the prepared inputs'
`rows`, `starts`, `num_scheduled` and flat `input_ids`.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import torch

from specreplay.replay.workloads.config import EngineConfig

#: The handle `kv_last_blocks` notes a block under when a write that is not a forward's went into it.
NOT_A_FORWARD = -2


class PagedKV:
    """The KV half of a reference runner (mixed in; `init_kv` from the runner's __init__)."""

    requests: dict[str, Any]
    device: torch.device  # the runner's
    config: EngineConfig

    def init_kv(self, config: EngineConfig, device: torch.device) -> None:
        slots = config.num_blocks * config.block_size
        self.kv_tokens = torch.full((slots,), -1, dtype=torch.int64, device=device)
        self.kv_writer = torch.full((slots,), -1, dtype=torch.int64, device=device)
        self.kv_writers: list[str] = []
        # Writes issued by forwards the GPU has not finished (slots, tokens, writer handles), oldest
        # first: `commit_kv` lands them, in stream order, before the next forward.
        self.kv_in_flight: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.kv_last_blocks: dict[int, set[int]] = {}  # block -> handles the last forward wrote it with
        # Blocks written outside the forward since it (issue_kv_writes), under NOT_A_FORWARD: the
        # truth reads them back as it does blocks another request wrote.
        self.kv_loaded_blocks: dict[int, set[int]] = {}

    def kv_block_table(self, rid: str) -> list[int]:
        raise NotImplementedError

    def write_kv(self, inputs: Any) -> None:
        """Issue the KV writes of every scheduled token: its id (what the model read) into the
        slot its position maps to through the row's block table, marked with the writing request
        life. A position outside the row's blocks has no slot and is dropped (the KV ground
        truth marks it broken). The writes land when the forward is done (`commit_kv`)."""
        slots, keep, writers = self._kv_slots(inputs)
        if slots.numel():
            self.kv_in_flight.append((slots, inputs.input_ids[keep], writers))

    def issue_kv_writes(self, rid: str, positions: list[int], tokens: list[int]) -> None:
        """Issue KV writes that are not a forward's (runner.load_kv: a connector): token
        `tokens[j]` at position `positions[j]` of `rid`, through its block table, marked with its
        life; a position outside its blocks is dropped. They land at the next `commit_kv`."""
        bs, table = self.config.block_size, self.kv_block_table(rid)
        kept = [(p, t) for p, t in zip(positions, tokens) if 0 <= p // bs < len(table)]
        if not kept:
            return
        dev = self.device
        slots = torch.tensor([table[p // bs] * bs + p % bs for p, _ in kept], dtype=torch.int64, device=dev)
        values = torch.tensor([t for _, t in kept], dtype=torch.int64, device=dev)
        writers = torch.full((len(kept),), self.kv_handle(rid), dtype=torch.int64, device=dev)
        self.kv_in_flight.append((slots, values, writers))
        for p, _ in kept:
            self.kv_loaded_blocks.setdefault(table[p // bs], set()).add(NOT_A_FORWARD)

    def _kv_slots(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The KV slot of every scheduled token that has one, its index in the flat inputs and
        the handle of the request life writing it, for the whole batch at once (vLLM's slot
        mapping: the block table flattened, each position's block looked up in its row's part).
        Notes which handles wrote each block (`kv_last_blocks`)."""
        bs = self.config.block_size
        num_rows = len(inputs.rows)
        tables = [self.kv_block_table(rid) for rid in inputs.rows]
        lengths = np.array([len(t) for t in tables], dtype=np.int64)
        flat_blocks = np.fromiter(chain.from_iterable(tables), dtype=np.int64)
        counts = np.array(inputs.num_scheduled, dtype=np.int64)
        row_of = np.repeat(np.arange(num_rows), counts)
        begin = np.cumsum(counts) - counts
        pos = np.repeat(np.array(inputs.starts, dtype=np.int64) - begin, counts) + np.arange(len(row_of))
        block_index = pos // bs
        keep = np.flatnonzero((block_index >= 0) & (block_index < lengths[row_of]))
        row_kept = row_of[keep]
        blocks = flat_blocks[(np.cumsum(lengths) - lengths)[row_kept] + block_index[keep]]
        slots = blocks * bs + pos[keep] % bs
        handles = np.array([self.kv_handle(rid) for rid in inputs.rows], dtype=np.int64)
        writers = handles[row_kept]
        touched: dict[int, set[int]] = {}
        if len(keep):
            span = len(self.kv_writers) + 1
            for key in np.unique(blocks * span + writers).tolist():
                touched.setdefault(key // span, set()).add(key % span)
        for block, loaded in self.kv_loaded_blocks.items():
            touched.setdefault(block, set()).update(loaded)
        self.kv_loaded_blocks = {}
        self.kv_last_blocks = touched
        dev = self.device
        return torch.from_numpy(slots).to(dev), torch.from_numpy(keep).to(dev), torch.from_numpy(writers).to(dev)

    def kv_handle(self, rid: str) -> int:
        """The handle request `rid`'s current life marks its KV writes with (given on first use
        to a state a variant built itself)."""
        st = self.requests[rid]
        if st.kv_handle < 0:
            st.kv_handle = len(self.kv_writers)
            self.kv_writers.append(rid)
        return st.kv_handle

    def commit_kv(self) -> None:
        """The KV writes of the forwards issued so far land in the cache, oldest first: a later
        write to a slot wins, as on one CUDA stream. Called before the next forward (async: step
        m's writes land after schedule(m+1) ran, while the scheduler may have freed and reused
        their blocks) and, in sync mode, when the step's output is taken."""
        for at, tokens, writers in self.kv_in_flight:
            self.kv_tokens[at] = tokens
            self.kv_writer[at] = writers
        self.kv_in_flight = []

    def read_kv(self, slots: list[int], landed: bool = False) -> tuple[list[int], list[int]]:
        """Token ids and writer handles in `slots`: the cache as it is, or (`landed`) as it will be
        once the writes in flight land (nothing else writes in between)."""
        at = torch.tensor(slots, dtype=torch.int64, device=self.device)
        tokens, writers = self.kv_tokens[at].tolist(), self.kv_writer[at].tolist()
        if landed and self.kv_in_flight:
            later: dict[int, tuple[int, int]] = {}
            for where, new_tokens, new_writers in self.kv_in_flight:
                later.update(zip(where.tolist(), zip(new_tokens.tolist(), new_writers.tolist())))
            for i, slot in enumerate(slots):
                hit = later.get(slot)
                if hit is not None:
                    tokens[i], writers[i] = hit
        return tokens, writers
