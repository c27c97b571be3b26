"""Reference GPU runner: vLLM 0.32.0's `GPUModelRunner` state handling, on real torch tensors.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, worker side. As vLLM's runner, a step is two calls: `execute_model(S_m)`
runs `_update_states` (removals, re-adds, the deferred correction of `num_computed_tokens` booked),
`_prepare_inputs` (the previous step's sampled tokens and cached drafts scattered into the input
ids, the clamp), the tiny target model and the KV write; `sample_tokens()` rejection-samples,
proposes drafts and does the bookkeeping for the next step. The runner reports on nothing: the
worker observer (families/vllm/v1/observer.py) and the KV ground truth (observers/truth.py) watch
these calls from outside, reading the state by vLLM's names (`requests`, `input_batch`,
`_draft_token_ids`, `valid_sampled_token_count`).

Hooks a variant may override (docs/implementations.md; the names a variant uses are in
`specreplay.replay.api`, the state it reads in `api.RUNNER_STATE`):
  remove_finished(out) / remove_unscheduled(out)     the removals at the top of _update_states
  add_new_request(data) -> state                     a NewRequestData becomes worker state
  update_cached_request(out, i, rid, deferred)       per cached request: correction, trim, blocks
    trim_outputs(st, row, num_output)                the output history cut to the scheduler's count
    readd_request(out, i, st) -> state               one with no row: on_reentry, outputs restored
      on_reentry(out, rid) -> bool                   a cached request with no row; True if it
                                                     edited `out`
  write_spec_ids(st, row, out)                       draft slots into the token buffer
  write_readded_spec_ids(st, row, out)               those of a row added back (re-entry, resume)
  load_kv(out)                                       KV written outside the forward (a connector)
  apply_deferred_corrections(deferred)               the correction closure (design B)
  _prepare_inputs(out, rows) -> inputs               gather, scatter, clamp
    discarded_rows(rows, seq_lens) -> list[bool]     the rows that sample nothing (partial prefill)
    scatter_prev_sampled(ids, ...)                   the previous step's sampled tokens and drafts
  write_kv(inputs) / commit_kv()                     KV writes issued / landed (paged buffer)
  rejection_sample(...) / propose_drafts(...) / bookkeeping(...)

The drafter is the oracle's (`oracle.drafter`): `fixed` proposes k drafts every step (the
seeded drafter); the n-gram drafters of a replayed vLLM recording propose 0..k. `ngram_gpu`, as
vLLM's, works on its own copy of the output's two dicts and trims the draft slots the scheduler
booked to the valid count the drafter gave the row last step (`_trim_invalid_drafts`), keeping
the booked count for the correction.

The KV cache is paged as vLLM's: a buffer of `num_blocks * block_size` slots, a position p of a
row written at slot `block_table[p // block_size] * block_size + p % block_size`, each slot
marked with the token id and the request life that wrote it (`kv_tokens`, `kv_writer`). A step's
writes are issued with its forward (`write_kv`) and land when the GPU would have finished it
(`commit_kv`): before the next forward, so under async scheduling after the scheduler has
already built the next step (and may have freed and handed out the blocks they go to); in sync
mode when the step's output is taken. The KV ground truth reads the blocks back.

Worked example of the correction (k = 3): the scheduler booked step m-1 as if all 3 drafts were
accepted, so at step m it sends C_s = K + 3. Step m-1 accepted a = 1 (valid count 2): the worker
subtracts prev_num_draft_len - a = 2 and writes from K + 1, the first position not yet in its KV.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from itertools import chain

import numpy as np
import torch

from specreplay.replay.families.vllm.v1.input_batch import CachedRequestState, InputBatch
from specreplay.replay.models.messages import EngineCrash, ModelRunnerOutput, NewRequestData, SchedulerOutput
from specreplay.replay.models.paged_kv import PagedKV
from specreplay.replay.models.releases import release_of
from specreplay.replay.models.target_model import RecordedTargetModel, TargetModel
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.oracle import Oracle


class NegativeInputIdError(EngineCrash):
    """A negative token id reached the embedding lookup: on a GPU, a device-side assert."""

    kind = "negative-input-id"


class MalformedSchedulerOutput(EngineCrash):
    """The SchedulerOutput cannot be executed (more draft slots than scheduled tokens)."""

    kind = "malformed-scheduler-output"


@dataclass
class PreparedInputs:
    rows: list[str]
    starts: list[int]  # first position per row (the GPU-side corrected num_computed_tokens)
    num_scheduled: list[int]
    num_drafts: list[int]
    cu: list[int]  # cumulative token counts: row x owns [cu[x] - n_x, cu[x])
    input_ids: torch.Tensor  # flattened, after scatter and clamp
    positions: torch.Tensor
    draft_ids: list[list[int]]  # what the rejection sampler gets as drafts (before the clamp)
    negatives: list[int]
    discarded: list[bool]  # non-final prefill chunk rows: they sample nothing
    seq_lens: list[int]  # optimistic: the CPU num_computed_tokens (before correction) + n


class GPUModelRunner(PagedKV):
    """vLLM 0.32.0 V1 runner, design B (deferred correction, optimistic output length)."""

    #: vLLM >= 0.25 clamps input ids to >= 0 before the embedding when spec decode is on.
    clamps_negative_ids = True

    @classmethod
    def why_not(cls, config: EngineConfig) -> str | None:
        """A variant of this runner (Implementation.why_not asks it) models Model Runner V1, which
        vLLM 0.34.0 removed (its scheduler serves MRV2 only): it applies to no workload of such a
        release."""
        if not release_of(config.vllm_version).serves_mrv2_only:
            return None
        return (
            f"{cls.__name__} changes Model Runner V1's state, and vLLM {config.vllm_version} has no Model Runner V1 "
            "(removed in 0.34.0); pass --vllm-version 0.33.0, or write the change on Model Runner V2"
        )

    def __init__(self, config: EngineConfig, oracle: Oracle, device: str = "cpu") -> None:
        self.config = config
        self.oracle = oracle
        self.device = torch.device(device)
        self.k = config.num_spec_tokens
        self.use_async_scheduling = config.async_scheduling
        self.model = TargetModel(config.vocab_size, self.device)
        self.drafter = oracle.drafter
        # A recorded oracle answers by table, not by the closed-form rule (families/vllm/outcomes.py).
        self.recorded_model = RecordedTargetModel(oracle, self.device) if oracle.recorded else None
        self.num_valid_draft_tokens: list[int] = []  # ngram_gpu: per row of the last proposal
        self.booked_drafts: dict[str, int] = {}  # ngram_gpu: draft slots booked before the trim
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch()
        # Results of the previous non-empty step, indexed by its rows.
        self.prev_sampled_token_ids: torch.Tensor | None = None
        self._draft_token_ids: torch.Tensor | None = None
        self.valid_sampled_token_count_cpu: list[int] = []
        self.prev_starts: list[int] = []
        self.prev_num_draft_tokens: list[int] = []
        self.sync_drafts: tuple[list[str], list[list[int]]] = ([], [])
        self.drafts_proposed: dict[str, int] = {}  # request -> real drafts the last propose gave it
        self.init_kv(config, self.device)
        self._pending: tuple[PreparedInputs, torch.Tensor] | None = None  # between the two halves

    @property
    def batch(self) -> InputBatch:
        """The persistent batch's old name, before it took vLLM's (`input_batch`): variants written
        against it keep working, with a DeprecationWarning."""
        warnings.warn(
            "GPUModelRunner.batch is deprecated: use input_batch (vLLM's name)", DeprecationWarning, stacklevel=2
        )
        return self.input_batch

    # ================================================================ execute_model
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput | None:
        """The forward half of a step. None: sample_tokens() follows (vLLM's async split); an
        empty step returns its (empty) output at once."""
        self._pending = None
        # The previous forward is done before this one runs (one CUDA stream): its KV writes land.
        self.commit_kv()
        if self.drafter == "ngram_gpu":
            # vLLM's runner copies the two dicts it trims, so the scheduler's output stays as booked.
            out = replace(
                out,
                num_scheduled_tokens=dict(out.num_scheduled_tokens),
                scheduled_spec_decode_tokens=dict(out.scheduled_spec_decode_tokens),
            )
        deferred = self._update_states(out)
        self.load_kv(out)
        if out.total_num_scheduled_tokens == 0:
            # Empty step: no forward and no sample_tokens; the previous step's drafts and sampled
            # tokens survive, but the removals above already emptied their prev-map entries.
            return ModelRunnerOutput()
        rows = [rid for rid in self.input_batch.req_ids if rid is not None]
        inputs = self._prepare_inputs(out, rows)
        targets = self.forward(inputs)
        # Design B: the CPU correction runs once the forward is launched (its positions came
        # from the device-side corrected values in _prepare_inputs).
        self.apply_deferred_corrections(deferred)
        self.write_kv(inputs)
        self._pending = (inputs, targets)
        return None

    def sample_tokens(self) -> ModelRunnerOutput:
        """The sampling half: rejection sampling, drafts for the next step, bookkeeping."""
        inputs, targets = self._pending
        self._pending = None
        emitted, accepted, discarded = self.rejection_sample(inputs, targets)
        self.propose_drafts(inputs, emitted, discarded)
        self.bookkeeping(inputs, emitted, accepted, discarded)
        if not self.use_async_scheduling:
            self.commit_kv()  # sync: the engine waits for this step before it schedules the next
        rows = inputs.rows
        return ModelRunnerOutput(
            req_ids=rows, req_id_to_index={rid: x for x, rid in enumerate(rows)}, sampled_token_ids=emitted
        )

    def _update_states(self, out: SchedulerOutput) -> list[tuple[str, int]]:
        """vLLM's _update_states: removals, new and cached requests, the batch condensed. Returns
        the deferred corrections (request, optimistic draft count) for after the forward."""
        self.edited: set[str] = set()  # requests whose draft slots on_reentry took out of `out`
        self.remove_finished(out)
        self.remove_unscheduled(out)
        to_add = [self.add_new_request(data) for data in out.scheduled_new_reqs]
        self.booked_drafts = self._trim_invalid_drafts(out) if self.drafter == "ngram_gpu" else {}
        self.prev_num_draft_tokens = [0] * len(self.prev_num_draft_tokens)
        deferred: list[tuple[str, int]] = []
        for i, rid in enumerate(out.scheduled_cached_reqs.req_ids):
            state = self.update_cached_request(out, i, rid, deferred)
            if state is not None:
                to_add.append(state)
        new_ids = {data.req_id for data in out.scheduled_new_reqs}
        for state in to_add:
            row = self.input_batch.add_request(state)
            if state.req_id in new_ids:
                self.write_spec_ids(state, row, out)
            else:
                self.write_readded_spec_ids(state, row, out)
        self.input_batch.condense()
        return deferred

    def take_draft_token_ids(self) -> tuple[list[str], list[list[int]]]:
        """Sync mode: the drafts proposed after the last step, for update_draft_token_ids."""
        drafts, self.sync_drafts = self.sync_drafts, ([], [])
        return drafts

    # ================================================================ _update_states
    def remove_finished(self, out: SchedulerOutput) -> None:
        for rid in out.finished_req_ids:
            self.requests.pop(rid, None)
            self.input_batch.remove_request(rid)

    def remove_unscheduled(self, out: SchedulerOutput) -> None:
        resumed = out.scheduled_cached_reqs.resumed_req_ids
        scheduled = set(out.num_scheduled_tokens) - resumed
        for rid in [r for r in self.input_batch.req_id_to_index if r not in scheduled]:
            self.input_batch.remove_request(rid)

    def add_new_request(self, data: NewRequestData) -> CachedRequestState:
        if data.req_id in self.requests:
            return self.update_streaming_request(data)
        state = CachedRequestState(
            data.req_id, list(data.prompt_token_ids), list(data.block_ids), data.num_computed_tokens
        )
        self.requests[data.req_id] = state
        self.kv_handle(data.req_id)  # a new life: a new mark on the KV slots it writes
        return state

    def update_streaming_request(self, data: NewRequestData) -> CachedRequestState:
        """vLLM 0.32's _update_streaming_request: a known id arriving as a new request is a
        streaming session's next turn. Its row goes (and with it the ended turn's sampled token
        and drafts in the previous-step map), its state takes the new prompt and blocks, and the
        KV it keeps is what the scheduler counts as computed."""
        rid = data.req_id
        self.input_batch.remove_request(rid)
        state = self.requests[rid]
        state.prompt_token_ids = list(data.prompt_token_ids)
        state.block_ids = list(data.block_ids)
        state.num_computed_tokens = data.num_computed_tokens
        state.output_token_ids = []
        state.prev_num_draft_len = 0
        return state

    def update_cached_request(
        self, out: SchedulerOutput, i: int, rid: str, deferred: list[tuple[str, int]]
    ) -> CachedRequestState | None:
        """One cached request: correction bookkeeping, output trim, blocks, re-add or spec write.
        Returns the state when the request must be (re-)added to the batch."""
        cached = out.scheduled_cached_reqs
        st = self.requests[rid]
        num_computed = cached.num_computed_tokens[i]
        num_output = cached.num_output_tokens[i]
        row = self.input_batch.req_id_to_index.get(rid)
        if st.prev_num_draft_len and self.use_async_scheduling:
            if row is None:
                st.prev_num_draft_len = 0  # re-entry: the scheduler's value is already exact
            else:
                optimistic = st.prev_num_draft_len
                st.output_token_ids.extend([-1] * optimistic)
                deferred.append((rid, optimistic))
                prev_row = self.input_batch.prev_req_id_to_index.get(rid)
                if prev_row is not None:
                    self.prev_num_draft_tokens[prev_row] = optimistic
        st.num_computed_tokens = num_computed
        if num_output < len(st.output_token_ids):
            self.trim_outputs(st, row, num_output)
        new_blocks = cached.new_block_ids[i]
        if rid in cached.resumed_req_ids:
            st.block_ids = list(new_blocks)  # its old blocks were freed at preemption
        else:
            st.block_ids.extend(new_blocks)
        if row is None:
            return self.readd_request(out, i, st)
        self.input_batch.num_computed_tokens_cpu[row] = num_computed
        self.input_batch.block_table[row].extend(new_blocks)
        self.write_spec_ids(st, row, out)
        return None

    def trim_outputs(self, st: CachedRequestState, row: int | None, num_output: int) -> None:
        """The worker's output history is longer than the scheduler's count (`num_output`: the
        optimistic extension by the drafts of step m-1, or outputs the scheduler cut): cut it, and
        the row's known tokens with it (`row` None: the request has no row)."""
        del st.output_token_ids[num_output:]
        if row is not None:
            self.input_batch.num_tokens_no_spec[row] = len(st.prompt_token_ids) + num_output

    def readd_request(self, out: SchedulerOutput, i: int, st: CachedRequestState) -> CachedRequestState:
        """A scheduled cached request with no row (re-entering after a step it was not scheduled
        in, or resumed), its counters and blocks already updated: `on_reentry`, then under async
        its outputs restored from the scheduler's `all_token_ids` (the worker's hold placeholders).
        Returns the state to add back to the batch (after the new requests, lowest free row)."""
        rid = st.req_id
        num_output = out.scheduled_cached_reqs.num_output_tokens[i]
        if self.on_reentry(out, rid):
            self.edited.add(rid)
        if self.use_async_scheduling and num_output > 0:
            st.output_token_ids = list(out.scheduled_cached_reqs.all_token_ids[rid][-num_output:])
        return st

    def _trim_invalid_drafts(self, out: SchedulerOutput) -> dict[str, int]:
        """vLLM's update_scheduler_for_invalid_drafts: a cached request with a row keeps only as
        many draft slots as the drafter found valid drafts for its row last step. Returns the
        booked counts, which the correction keeps using (prev_num_draft_len)."""
        booked = {rid: len(spec) for rid, spec in out.scheduled_spec_decode_tokens.items()}
        valid_counts = self.num_valid_draft_tokens
        for rid in out.scheduled_cached_reqs.req_ids:
            row = self.input_batch.req_id_to_index.get(rid)
            spec = out.scheduled_spec_decode_tokens.get(rid)
            if row is None or spec is None:
                continue
            valid = max(0, min(valid_counts[row] if row < len(valid_counts) else 0, len(spec)))
            trim = len(spec) - valid
            if trim:
                out.total_num_scheduled_tokens -= trim
                out.num_scheduled_tokens[rid] -= trim
            if valid == 0:
                out.scheduled_spec_decode_tokens.pop(rid, None)
            else:
                out.scheduled_spec_decode_tokens[rid] = spec[:valid]
        return booked

    def on_reentry(self, out: SchedulerOutput, rid: str) -> bool:
        """A scheduled cached request with no row (re-entering or resumed). Upstream: nothing."""
        return False

    def write_spec_ids(self, st: CachedRequestState, row: int, out: SchedulerOutput) -> None:
        spec = out.scheduled_spec_decode_tokens.get(st.req_id, [])
        self.input_batch.write_spec_ids(row, spec)
        # After an ngram_gpu trim the correction still counts the slots the scheduler booked.
        st.prev_num_draft_len = self.booked_drafts.get(st.req_id, len(spec))

    def write_readded_spec_ids(self, st: CachedRequestState, row: int, out: SchedulerOutput) -> None:
        """The draft slots of a row added back this step (a re-entry, a resume), once it has its
        row: `write_spec_ids`, as vLLM >= 0.14 does. vLLM 0.11-0.13 (design A0) wrote none, so the
        row's draft slots kept what earlier writes left there (input_batch.py)."""
        self.write_spec_ids(st, row, out)

    def apply_deferred_corrections(self, deferred: list[tuple[str, int]]) -> dict[str, int]:
        """Design B's closure, run after the forward is launched: subtract the drafts of step m-1
        that were rejected, using that step's valid sampled counts (1 + accepted)."""
        corrections: dict[str, int] = {}
        prev_map = self.input_batch.prev_req_id_to_index
        for rid, optimistic in deferred:
            prev_row = prev_map.get(rid)
            if prev_row is None or prev_row >= len(self.valid_sampled_token_count_cpu):
                continue
            correction = optimistic - (self.valid_sampled_token_count_cpu[prev_row] - 1)
            self.requests[rid].num_computed_tokens -= correction
            row = self.input_batch.req_id_to_index.get(rid)
            if row is not None:
                self.input_batch.num_computed_tokens_cpu[row] -= correction
            corrections[rid] = correction
        return corrections

    # ================================================================ inputs and forward
    def _prepare_inputs(self, out: SchedulerOutput, rows: list[str]) -> PreparedInputs:
        """vLLM's _prepare_inputs over the whole batch: per-row counts read once, then the
        starts, positions, scatter indexes and discard mask as array operations."""
        num_rows = len(rows)
        batch = self.input_batch
        sched, spec = out.num_scheduled_tokens, out.scheduled_spec_decode_tokens
        ns_l = [sched[rid] for rid in rows]
        ds_l = [len(spec[rid]) if rid in spec else 0 for rid in rows]
        ns, ds = np.array(ns_l, dtype=np.int64), np.array(ds_l, dtype=np.int64)
        if num_rows and (ds >= ns).any():
            x = int(np.argmax(ds >= ns))
            raise MalformedSchedulerOutput(
                f"request {rows[x]!r} has {ds_l[x]} draft slots inside {ns_l[x]} scheduled tokens at step {out.step}"
            )
        cpu_l = batch.num_computed_tokens_cpu[:num_rows]
        cpu = np.array(cpu_l, dtype=np.int64)
        cu = np.cumsum(ns)
        total = int(cu[-1]) if num_rows else 0
        begin = cu - ns
        if self.use_async_scheduling:
            prev_map = batch.prev_req_id_to_index
            prev = np.array([prev_map.get(rid, -1) for rid in rows], dtype=np.int64)
        else:
            prev = np.full(num_rows, -1, dtype=np.int64)
        starts = cpu.copy()
        pnd = np.array(self.prev_num_draft_tokens, dtype=np.int64)
        if len(pnd) and pnd.any():
            # The GPU kernel: true start of m-1 plus its valid count is the true start of m.
            known = (prev >= 0) & (prev < len(pnd))
            at = np.where(known, prev, 0)
            fix = known & (pnd[at] > 0)
            if fix.any():
                ps = np.array(self.prev_starts, dtype=np.int64)
                vc = np.array(self.valid_sampled_token_count_cpu, dtype=np.int64)
                starts[fix] = ps[at[fix]] + vc[at[fix]]
        # The gather from each row's token buffer: past the row's known tokens it reads what earlier
        # writes left at that batch index (input_batch.py), 0 past anything ever written.
        buffers = batch.token_ids
        chunks = [buffers[x][c : c + n] for x, c, n in zip(range(num_rows), cpu_l, ns_l)]
        flat = list(chain.from_iterable(chunks))
        if len(flat) != total:
            flat = list(chain.from_iterable(t + [0] * (n - len(t)) for t, n in zip(chunks, ns_l)))
        positions = np.arange(total, dtype=np.int64) + np.repeat(starts - begin, ns)
        scatter_at, scatter_src, draft_at, draft_src = [], [], [], []
        scatter_rows: list[int] = []
        draft_rows: list[int] = []
        if self.prev_sampled_token_ids is not None:
            has = prev >= 0
            scatter_at = (cu - 1 - ds)[has].tolist()
            scatter_src = prev[has].tolist()
            scatter_rows = np.flatnonzero(has).tolist()
            if self._draft_token_ids is not None:
                width = self._draft_token_ids.shape[1]
                j = np.arange(width, dtype=np.int64)
                mask = has[:, None] & (j[None, :] < np.minimum(ds, width)[:, None])
                draft_at = ((cu - ds)[:, None] + j[None, :])[mask].tolist()
                draft_src = (prev[:, None] * width + j[None, :])[mask].tolist()
                draft_rows = np.broadcast_to(np.arange(num_rows)[:, None], mask.shape)[mask].tolist()
        ids = torch.tensor(flat, dtype=torch.int64, device=self.device)
        self.scatter_prev_sampled(ids, scatter_at, scatter_src, draft_at, draft_src, rows, scatter_rows, draft_rows)
        cu_l = cu.tolist()
        draft_ids, negatives = self._clamp_inputs(out, rows, ids, cu_l, ds_l)
        pos = torch.from_numpy(positions).to(self.device)
        seq_l = (cpu + ns).tolist()
        discarded = self.discarded_rows(rows, seq_l)
        return PreparedInputs(rows, starts.tolist(), ns_l, ds_l, cu_l, ids, pos, draft_ids, negatives, discarded, seq_l)

    def load_kv(self, out: SchedulerOutput) -> None:
        """KV that reaches the cache outside the forward, after `_update_states` and before this
        step's forward (a KV connector's load of a remote prefill, a swap-in): none in vLLM's
        runner without a connector. Write it with `issue_kv_writes(rid, positions, tokens)`: it
        lands with the step's own writes (`commit_kv`), and the KV ground truth reads it as theirs."""

    def discarded_rows(self, rows: list[str], seq_lens: list[int]) -> list[bool]:
        """vLLM's discard mask, per batch row: True where the row samples nothing this step (its
        step ends before the worker's known tokens do: a partial prefill). `seq_lens[x]` is row
        x's computed count plus its scheduled tokens."""
        requests = self.requests
        return [end < requests[rid].num_tokens for rid, end in zip(rows, seq_lens)]

    def scatter_prev_sampled(
        self,
        ids: torch.Tensor,
        token_at: list[int],
        token_rows: list[int],
        draft_at: list[int],
        draft_slots: list[int],
        rows: list[str] | None = None,
        token_of: list[int] | None = None,
        draft_of: list[int] | None = None,
    ) -> None:
        """vLLM's _prepare_input_ids under async scheduling, on the device: each row that was in the
        previous step's map gets that step's last sampled token at its last non-draft input
        (`token_at[j]` <- `prev_sampled_token_ids[token_rows[j]]`) and the drafts cached for it in
        its draft slots (`draft_at[j]` <- `_draft_token_ids.reshape(-1)[draft_slots[j]]`, slot =
        previous row * width + j). A row with no previous-step row keeps what the gather put there.
        Whose entry each is: `rows[token_of[j]]` and `rows[draft_of[j]]` (this step's batch rows)."""
        if token_at:
            at = torch.tensor(token_at, dtype=torch.int64, device=self.device)
            ids[at] = self.prev_sampled_token_ids[torch.tensor(token_rows, device=self.device)]
        if draft_at:
            at = torch.tensor(draft_at, dtype=torch.int64, device=self.device)
            ids[at] = self._draft_token_ids.reshape(-1)[torch.tensor(draft_slots, device=self.device)]

    def _clamp_inputs(
        self, out: SchedulerOutput, rows: list[str], ids: torch.Tensor, cu: list[int], num_drafts: list[int]
    ) -> tuple[list[list[int]], list[int]]:
        """The drafts each row feeds the rejection sampler and its negative input ids, read
        before the clamp (vLLM gathers the spec metadata first); then the clamp, or without it
        (`clamps_negative_ids = False`) the embedding's failure."""
        num_rows = len(rows)
        width = max(num_drafts, default=0)
        if width:
            dev = self.device
            ends = torch.tensor(cu, dtype=torch.int64, device=dev)
            d = torch.tensor(num_drafts, dtype=torch.int64, device=dev)
            index = (ends - d)[:, None] + torch.arange(width, device=dev)[None, :]
            gathered = ids[index.clamp_(max=max(ids.numel() - 1, 0))].tolist()
            draft_ids = [g[:n] for g, n in zip(gathered, num_drafts)]
        else:
            draft_ids = [[] for _ in range(num_rows)]
        negative = ids < 0
        if not bool(negative.any()):
            return draft_ids, [0] * num_rows
        ends = torch.tensor(cu, dtype=torch.int64, device=ids.device)
        row_of = torch.searchsorted(ends, torch.arange(ids.numel(), device=ids.device), right=True)
        per_row = torch.zeros(num_rows, dtype=torch.int64, device=ids.device)
        negatives = per_row.index_add_(0, row_of, negative.to(torch.int64)).tolist()
        if self.clamps_negative_ids:
            ids.clamp_(min=0)
        else:
            bad = next(rows[x] for x in range(num_rows) if negatives[x])
            raise NegativeInputIdError(f"input id -1 reached the embedding for request {bad!r} at step {out.step}")
        return draft_ids, negatives

    def forward(self, inputs: PreparedInputs) -> torch.Tensor:
        """The target model's token for every input position."""
        if self.recorded_model is not None:
            turns = [(rid, len(self.requests[rid].prompt_token_ids)) for rid in inputs.rows]
            return self.recorded_model.forward(inputs.input_ids, inputs.positions, turns, inputs.num_scheduled)
        return self.model.forward(inputs.input_ids, inputs.positions, self._hashes(inputs))

    def _hashes(self, inputs: PreparedInputs) -> torch.Tensor:
        per_row = np.array([self.oracle.hash(rid) for rid in inputs.rows], dtype=np.int64)
        return torch.from_numpy(np.repeat(per_row, inputs.num_scheduled)).to(self.device)

    def kv_block_table(self, rid: str) -> list[int]:
        """The block table the worker runs `rid` with: its batch row's, else its cached state's
        (what the KV writes and the KV ground truth address, models/paged_kv.py)."""
        row = self.input_batch.req_id_to_index.get(rid)
        return self.input_batch.block_table[row] if row is not None else self.requests[rid].block_ids

    # ================================================================ sample_tokens
    def rejection_sample(
        self, inputs: PreparedInputs, targets: torch.Tensor
    ) -> tuple[list[list[int]], list[int], list[bool]]:
        """Greedy rejection sampling on the device, the whole batch at once: accept the longest
        prefix of drafts equal to the target's argmax (a negative draft is always rejected), then
        one bonus/recovered token. Rows whose step is a non-final prefill chunk emit nothing."""
        num_rows = len(inputs.rows)
        width = max(inputs.num_drafts, default=0)
        dev = self.device
        discarded = inputs.discarded
        d = torch.tensor(inputs.num_drafts, dtype=torch.int64, device=dev)
        last = torch.tensor(inputs.cu, dtype=torch.int64, device=dev) - 1
        slot_index = torch.minimum((last - d)[:, None] + torch.arange(width + 1, device=dev)[None, :], last[:, None])
        target = targets[slot_index]  # [rows, width + 1]
        if width:
            padded = [fed + [-1] * (width - len(fed)) for fed in inputs.draft_ids]
            drafts = torch.tensor(padded, dtype=torch.int64, device=dev).reshape(num_rows, width)
            valid = torch.arange(width, device=dev)[None, :] < d[:, None]
            match = (drafts == target[:, :width]) & (drafts >= 0) & valid
            accepted_t = torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)
        else:
            accepted_t = torch.zeros(num_rows, dtype=torch.int64, device=dev)
        target_host = target.tolist()  # the D2H copy of the sampled tokens
        accepted = accepted_t.tolist()
        emitted = [[] if gone else t[: a + 1] for t, a, gone in zip(target_host, accepted, discarded)]
        return emitted, accepted, discarded

    def propose_drafts(self, inputs: PreparedInputs, emitted: list[list[int]], discarded: list[bool]) -> None:
        """The drafter proposes k tokens after each row's last emitted token, from the seeded
        acceptance rule (schedule-independent). Discarded rows get zeros, and so does every row
        when the longest optimistic sequence plus k does not fit the drafter's max length
        (vLLM's `_input_fits_in_drafter`): the drafter is skipped for the whole batch. The fixed
        drafter asks the oracle for the whole batch at once (`Oracle.draft_rows`)."""
        rows = inputs.rows
        fits = max(inputs.seq_lens, default=0) + self.k <= self.config.max_model_len
        live = [x for x in range(len(rows)) if not discarded[x]] if self.k and fits else []
        # What the drafter really proposed per row (the rest of its k is padding, zeros): the
        # worker observer counts the next step's slots that no draft fills.
        self.drafts_proposed = dict.fromkeys(rows, 0)
        firsts = [
            inputs.starts[x] + inputs.num_scheduled[x] - inputs.num_drafts[x] + len(emitted[x]) for x in live
        ]  # the position after each live row's last emitted token
        prompt_lens = [len(self.requests[rows[x]].prompt_token_ids) for x in live]
        if self.drafter == "fixed":
            table = np.zeros((len(rows), self.k), dtype=np.int64)
            if live:
                table[live] = self.oracle.draft_rows([rows[x] for x in live], firsts, self.k, prompt_lens)
                self.drafts_proposed.update((rows[x], self.k) for x in live)
            if self.use_async_scheduling:
                self._draft_token_ids = torch.from_numpy(table).to(self.device)
            else:
                self.sync_drafts = (list(rows), sync_rows(table.tolist(), discarded))
            return
        proposals: list[list[int]] = [[] for _ in rows]
        for x, first, prompt_len in zip(live, firsts, prompt_lens):
            proposals[x] = self.oracle.drafts(rows[x], first, self.k, prompt_len)
            self.drafts_proposed[rows[x]] = len(proposals[x])
        if self.drafter == "ngram_gpu" and self.k and fits:
            # Skipped for the whole batch, the drafter leaves the previous counts in place, as vLLM's buffer.
            self.num_valid_draft_tokens = [len(p) for p in proposals]
        if self.use_async_scheduling:
            padded = [p + [0] * (self.k - len(p)) for p in proposals]
            self._draft_token_ids = torch.tensor(padded, dtype=torch.int64, device=self.device).reshape(
                len(rows), self.k
            )
        else:
            self.sync_drafts = (list(rows), sync_rows(proposals, discarded))

    def bookkeeping(
        self, inputs: PreparedInputs, emitted: list[list[int]], accepted: list[int], discarded: list[bool]
    ) -> None:
        """Cache this step's results for the next one and extend the output lists (one -1 per
        sampled row under async; the real tokens in sync mode)."""
        rows = inputs.rows
        # vLLM keeps the previous step's row map under async scheduling only (sync feeds the
        # sampled tokens back through the scheduler).
        self.input_batch.prev_req_id_to_index = (
            {rid: x for x, rid in enumerate(rows) if not discarded[x]} if self.use_async_scheduling else {}
        )
        self.valid_sampled_token_count_cpu = [0 if discarded[x] else len(emitted[x]) for x in range(len(rows))]
        self.prev_starts = list(inputs.starts)
        self.prev_num_draft_tokens = [0] * len(rows)
        backup = [emitted[x][-1] if emitted[x] else 0 for x in range(len(rows))]
        self.prev_sampled_token_ids = torch.tensor(backup, dtype=torch.int64, device=self.device)
        for x, rid in enumerate(rows):
            if discarded[x]:
                continue
            st = self.requests[rid]
            new = [-1] if self.use_async_scheduling else list(emitted[x])
            st.output_token_ids.extend(new)
            self.input_batch.append_tokens(x, new)


def sync_rows(proposals: list[list[int]], discarded: list[bool]) -> list[list[int]]:
    """Sync mode's drafts for update_draft_token_ids: a row for every request in the batch, as
    vLLM's take_draft_token_ids hands them (the batch's req_ids), none for a discarded one (a
    partial prefill). The scheduler then clears a prefill chunk's spec list, stale drafts of a
    streaming session's ended turn included; a request left out would keep them."""
    return [[] if gone else p for p, gone in zip(proposals, discarded)]
