"""The worker's persistent batch: rows, their token buffers and the previous step's row map.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, worker side. Modelled on vLLM 0.32.0's `InputBatch`
(vllm/v1/worker/gpu_input_batch.py): `add_request` fills the lowest free row, `remove_request`
leaves a hole and drops the id from `prev_req_id_to_index`, `condense` moves the highest live row
into the lowest hole until the rows are dense.

The token buffer is vLLM's `token_ids_cpu`: one fixed row per batch index that writes overwrite and
nothing clears. Past a row's known tokens and draft slots it holds what earlier writes left there
(the `-1` placeholders of earlier steps' bookkeeping and draft slots, an earlier request's tokens),
and 0 where nothing was ever written; a request that takes the row over, or a row condensed into a
hole, overwrites only its own tokens. So a gather past the known tokens reads what vLLM's would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CachedRequestState:
    """The worker's per-request state (vLLM's `CachedRequestState`), kept until finished."""

    req_id: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)  # -1 placeholders under async
    prev_num_draft_len: int = 0  # draft slots scheduled for it in the last step it ran
    kv_handle: int = -1  # which request life its KV writes are marked with (the runner's kv_writers)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    def __init__(self) -> None:
        self.req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        # Per batch index: prompt + outputs + spec region, then whatever earlier writes left. Kept
        # when the row is emptied or popped (vLLM's rows are a preallocated array).
        self.token_ids: list[list[int]] = []
        self.num_tokens_no_spec: list[int] = []
        self.num_computed_tokens_cpu: list[int] = []
        self.spec_token_ids: list[list[int]] = []
        self.block_table: list[list[int]] = []
        # {req_id: row in the previous step} for the previous step's non-discarded rows.
        self.prev_req_id_to_index: dict[str, int] = {}

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, st: CachedRequestState) -> int:
        row = next((i for i, rid in enumerate(self.req_ids) if rid is None), len(self.req_ids))
        tokens = st.prompt_token_ids + st.output_token_ids
        while len(self.token_ids) <= row:
            self.token_ids.append([])
        write_row(self.token_ids[row], 0, tokens)
        values: tuple[Any, ...] = (st.req_id, len(tokens), st.num_computed_tokens, [], list(st.block_ids))
        if row == len(self.req_ids):
            for column, value in zip(self._columns(), values):
                column.append(value)
        else:
            for column, value in zip(self._columns(), values):
                column[row] = value
        self.req_id_to_index[st.req_id] = row
        return row

    def remove_request(self, req_id: str) -> int | None:
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = None
        self.spec_token_ids[row] = []
        self.prev_req_id_to_index.pop(req_id, None)
        return row

    def condense(self) -> None:
        """Move the highest live row into the lowest hole until no hole remains."""
        while self.req_ids and self.req_ids[-1] is None:
            self._pop_row()
        hole = 0
        while True:
            hole = next((i for i in range(hole, len(self.req_ids)) if self.req_ids[i] is None), None)
            if hole is None:
                return
            last = len(self.req_ids) - 1
            active = self.num_tokens_no_spec[last] + len(self.spec_token_ids[last])
            write_row(self.token_ids[hole], 0, self.token_ids[last][:active])
            for column in self._columns():
                column[hole] = column[last]
            self.req_id_to_index[self.req_ids[hole]] = hole
            self._pop_row()
            while self.req_ids and self.req_ids[-1] is None:
                self._pop_row()

    def _columns(self) -> tuple[list, ...]:
        return (
            self.req_ids,
            self.num_tokens_no_spec,
            self.num_computed_tokens_cpu,
            self.spec_token_ids,
            self.block_table,
        )

    def _pop_row(self) -> None:
        for column in self._columns():
            column.pop()

    def write_spec_ids(self, row: int, spec: list[int]) -> None:
        """Draft slots go into the token buffer right after the known tokens (vLLM's
        update_req_spec_token_ids): under async these are the scheduler's -1 placeholders."""
        write_row(self.token_ids[row], self.num_tokens_no_spec[row], spec)
        self.spec_token_ids[row] = list(spec)

    def append_tokens(self, row: int, tokens: list[int]) -> None:
        """The step's sampled tokens after the row's known tokens (vLLM's bookkeeping: one -1 per
        row under async), over what the draft slots left there."""
        end = self.num_tokens_no_spec[row]
        write_row(self.token_ids[row], end, tokens)
        self.num_tokens_no_spec[row] = end + len(tokens)


def write_row(buffer: list[int], start: int, values: list[int]) -> None:
    """Write `values` into a token row at `start`, as a numpy row slice assignment: what lies past
    them stays; a gap before them (never written) holds 0, as vLLM's zero-initialised array."""
    if len(buffer) < start:
        buffer.extend([0] * (start - len(buffer)))
    buffer[start : start + len(values)] = values
