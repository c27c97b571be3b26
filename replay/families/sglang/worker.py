"""The reference SGLang worker: what SGLang's model worker computes for a batch, on torch tensors.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, worker side. SGLang 0.5.23's scheduler hands its worker a ScheduleBatch
and takes back a GenerationBatchResult; the engine's glue (families/sglang/workers.py) turns the
batch into the plain rows below and the answers into SGLang's types, so nothing here imports
SGLang. The model is the workload's oracle: the token at position p of request r is
`oracle.token_at(r, p)` (the prompt, then the outputs a correct model emits), and the drafter's
proposal for positions p.. is `oracle.drafts(r, p, k)`. A forward whose last input sits at
position p emits the token at p + 1.

- **Extend** (a prefill chunk: positions `first .. first + n - 1`): writes the chunk's tokens into
  KV and emits the token after it. A chunk that ends before the request's fill (prompt, plus the
  outputs a retracted request re-prefills) emits one too, which the scheduler drops (a real model
  emits a token there as well); it counts as nothing emitted.
- **Decode** (non-spec): writes the last output at position `seq_len - 1`, emits the next token.
- **EAGLE v2 verify** (topk 1, k draft steps, k + 1 verify tokens): the round starts at
  `L = seq_len` (SGLang spec v2 keeps `seq_lens` at the committed length, the bonus token not yet
  in KV). It writes the bonus and the k drafts at `L .. L + k`, verifies the drafts greedily
  against the oracle's tokens (accept length = leading drafts that match + 1, the bonus), emits
  the accepted drafts and the correction token, and proposes the next round's drafts after it.
  The first of them travels the way EAGLE's does, in the draft input the scheduler relays (its
  `topk_index`, through the FutureMap under overlap); the next round drafts the rest at its start
  from the seq_len it was handed, as EAGLE's draft model does.

KV is a buffer indexed by SGLang's KV slot ids (`out_cache_loc`; slot 0 is SGLang's padding slot):
every slot written holds the token id and the handle of the request life that wrote it
(`kv_tokens`, `kv_writer`; `kv_writers[handle]` is the request id), so the KV ground truth
(families/sglang/truth.py) reads a request's positions back through its `req_to_token` row.
Rejected drafts' slots are written too (SGLang's verify writes all k + 1), valid or not.

Everything is deterministic: the same batches give the same tokens, drafts and KV. `last_forward`
keeps what the last forward did, row by row, for the observers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from specreplay.replay.workloads.oracle import Oracle

#: The kinds of forward, as SGLang's ForwardMode names them (lower case).
EXTEND, DECODE, VERIFY = "extend", "decode", "target_verify"


@dataclass(frozen=True)
class Row:
    """One request's share of a forward, as the worker receives it."""

    rid: str
    prompt_len: int  # len(origin_input_ids): the oracle's prompt
    first_position: int  # extend: prefix_len; decode: seq_len - 1; verify: seq_len (the bonus)
    input_ids: tuple[int, ...]  # the tokens fed at first_position.. (verify: the bonus only; drafts are the worker's)
    slots: tuple[int, ...]  # the KV slot of each position written (verify: k + 1 of them)
    fill_len: int = 0  # extend: the length the chunk must reach to sample (prompt + outputs)
    relayed_draft: int | None = None  # verify: the first draft, as the scheduler relayed it (topk_index)


@dataclass
class RowResult:
    """What the worker did for one row."""

    rid: str
    kind: str  # EXTEND, DECODE or VERIFY
    first_position: int
    written: list[int]  # the token ids written into KV at first_position.. (the slots in order)
    slots: list[int]
    emitted: list[int]  # the tokens it hands back as sampled (verify: the accepted run)
    samples: bool  # the scheduler will take `emitted` (an extend reaching its fill, decode, verify)
    drafts: list[int] = field(default_factory=list)  # verify: the drafts it verified
    accepted: int | None = None  # verify: drafts accepted
    next_draft: int | None = None  # spec: the first draft of the next round (relayed by the scheduler)
    negative_inputs: int = 0  # input ids < 0 it was fed (a poisoned FutureMap relay)

    @property
    def kept(self) -> int:
        """Leading written positions whose KV is meant to stay valid: the chunk or the decoded
        token; on a verify round, the bonus and the accepted drafts."""
        return len(self.written) if self.accepted is None else self.accepted + 1


class SglangReferenceWorker:
    """The reference SGLang worker. `num_slots`: the KV pool's slots (SGLang's allocator hands out
    1..num_slots; the buffer holds num_slots + 1 so slot 0, its padding slot, exists); `k`: the
    EAGLE draft steps (0: no speculative decoding)."""

    def __init__(self, oracle: Oracle, num_slots: int, k: int, device: str | torch.device = "cpu") -> None:
        import torch

        self.oracle = oracle
        self.k = k
        self.device = torch.device(device)
        self.kv_tokens = torch.full((num_slots + 1,), -1, dtype=torch.int64, device=self.device)
        self.kv_writer = torch.full((num_slots + 1,), -1, dtype=torch.int64, device=self.device)
        self.kv_writers: list[str] = []  # handle -> request id
        self.handles: dict[str, int] = {}  # request id -> its handle (one life per id)
        self.last_forward: list[RowResult] = []

    # ------------------------------------------------------------------ the forwards
    def extend(self, rows: list[Row]) -> list[RowResult]:
        out = []
        for row in rows:
            end = row.first_position + len(row.input_ids)
            token = self.oracle.token_at(row.rid, end, row.prompt_len)
            samples = end >= row.fill_len
            result = RowResult(
                row.rid,
                EXTEND,
                row.first_position,
                list(row.input_ids),
                list(row.slots),
                [token],
                samples,
                negative_inputs=sum(1 for t in row.input_ids if t < 0),
            )
            if samples and self.k:
                result.next_draft = self.propose(row.rid, end + 1, row.prompt_len)
            out.append(result)
        return self._done(out)

    def decode(self, rows: list[Row]) -> list[RowResult]:
        out = []
        for row in rows:
            (token_in,) = row.input_ids
            token = self.oracle.token_at(row.rid, row.first_position + 1, row.prompt_len)
            out.append(
                RowResult(
                    row.rid,
                    DECODE,
                    row.first_position,
                    [token_in],
                    list(row.slots),
                    [token],
                    True,
                    negative_inputs=int(token_in < 0),
                )
            )
        return self._done(out)

    def verify(self, rows: list[Row]) -> list[RowResult]:
        out = []
        k = self.k
        for row in rows:
            start = row.first_position  # L: the bonus token's position
            (bonus,) = row.input_ids
            drafts = self.oracle.drafts(row.rid, start + 1, k, row.prompt_len)
            if row.relayed_draft is not None:
                drafts[0] = row.relayed_draft  # the draft model's top-1, relayed from the last round
            truth = [self.oracle.token_at(row.rid, start + j, row.prompt_len) for j in range(1, k + 2)]
            accepted = 0
            while accepted < k and drafts[accepted] == truth[accepted]:
                accepted += 1
            emitted = truth[: accepted + 1]  # the accepted drafts, then the correction token
            result = RowResult(
                row.rid,
                VERIFY,
                start,
                [bonus, *drafts],
                list(row.slots),
                emitted,
                True,
                drafts=drafts,
                accepted=accepted,
                negative_inputs=sum(1 for t in (bonus, *drafts) if t < 0),
            )
            result.next_draft = self.propose(row.rid, start + accepted + 2, row.prompt_len)
            out.append(result)
        return self._done(out)

    def propose(self, rid: str, position: int, prompt_len: int | None = None) -> int:
        """The draft model's top-1 for `position` (the first of the next round's drafts) of the
        turn whose prompt has `prompt_len` tokens (a streaming session's turns share an id)."""
        return self.oracle.drafts(rid, position, self.k, prompt_len)[0]

    def _done(self, results: list[RowResult]) -> list[RowResult]:
        """Land the KV writes of a forward, one scatter for all its rows."""
        import torch

        slots: list[int] = []
        tokens: list[int] = []
        writers: list[int] = []
        for r in results:
            handle = self.handle(r.rid)
            n = min(len(r.slots), len(r.written))
            slots += r.slots[:n]
            tokens += r.written[:n]
            writers += [handle] * n
        if slots:
            at = torch.tensor(slots, dtype=torch.int64, device=self.device)
            self.kv_tokens[at] = torch.tensor(tokens, dtype=torch.int64, device=self.device)
            self.kv_writer[at] = torch.tensor(writers, dtype=torch.int64, device=self.device)
        self.last_forward = results
        return results

    # ------------------------------------------------------------------ the KV buffer
    def handle(self, rid: str) -> int:
        """The KV writer handle of `rid` (one per id: SGLang keeps a retracted request's object)."""
        found = self.handles.get(rid)
        if found is None:
            found = self.handles[rid] = len(self.kv_writers)
            self.kv_writers.append(rid)
        return found

    def read_kv(self, slots: list[int]) -> tuple[list[int], list[int]]:
        """(token ids, writer handles) at `slots`; -1 where nothing was written."""
        import torch

        if not slots:
            return [], []
        at = torch.tensor(slots, dtype=torch.int64, device=self.device)
        return self.kv_tokens[at].tolist(), self.kv_writer[at].tolist()


def token_rows(results: list[RowResult], width: int) -> list[int]:
    """The flat next_token_ids SGLang's spec v2 result carries: `width` per row, the emitted run
    first, padded with zeros (batch_result_processor reads the first accept_len of each)."""
    flat: list[int] = []
    for r in results:
        flat += r.emitted + [0] * (width - len(r.emitted))
    return flat


__all__ = ["DECODE", "EXTEND", "VERIFY", "Row", "RowResult", "SglangReferenceWorker", "token_rows"]
