"""Reference Model Runner V2: vLLM 0.32.0 / 0.33.0's `vllm/v1/worker/gpu/` runner, on real torch tensors.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, worker side; the reference of runner family v2 (engines/registry.py),
beside the V1 reference (families/vllm/v1/runner.py). It reports on nothing: the MRV2 observer that records
the real runner (families/vllm/mrv2/observer.py) and the KV ground truth (observers/truth.py) read it
by vLLM's names. A step is two calls, as vLLM's:

  execute_model(S_m)   finish_requests (finished and preempted ids: their slots freed, sorted),
                       add_requests (new ones, a preempted request's next life among them, with
                       all its tokens as prefill), update_requests (the CPU mirror takes the
                       scheduler's count; new blocks), then `_prepare_inputs`: the batch in
                       vLLM's order (verifying rows, then by query length), `idx_mapping` the
                       rows' slots, prefill tokens gathered from each slot's tokens at its device
                       count, positions from the device count, the slot's last sampled token and
                       its drafts written over the last 1 + d inputs of a decoding row; the
                       forward; the KV writes issued (models/paged_kv.py)
  sample_tokens()      `sample` (greedy rejection sampling: num_sampled = accepted + 1, none
                       for a chunked-prefill row; num_rejected = drafts - accepted), post_update
                       (last sampled token, tokens, device count += query_len - num_rejected),
                       then the drafter's proposal into the slot's draft row

Unlike V1 there is no persistent batch and no deferred correction: a request the budget skips
keeps its slot, its device count and the drafts proposed after its last step, and verifies those
when it is scheduled again. The scheduler's draft placeholders give only the number of drafts a
row verifies (`len(scheduled_spec_decode_tokens[r])`), never their values, and nothing in the
SchedulerOutput is edited. No input id is clamped: a negative id reaching the embedding is a
device-side assert on a GPU (NegativeInputIdError).

The drafter is the oracle's (`oracle.drafter`): `fixed` proposes k drafts for every sampled row
(`Oracle.draft_rows`); a replayed n-gram recording (ngram, ngram_gpu) proposes what the recorded
slot held, and a slot it has nothing for gets the last sampled token in every draft slot, as
vLLM's n-gram speculator pads a slot without a match (ngram/speculator.py ~147): verified, and
rejected unless the model repeats itself.

Release differences (models/releases.py, `mrv2_*` fields) are read in one place each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specreplay.replay.families.vllm.mrv2.batch import ExecuteModelState, InputBatch, SamplerOutput
from specreplay.replay.families.vllm.mrv2.states import RequestStates, SlotRequest
from specreplay.replay.families.vllm.v1.runner import MalformedSchedulerOutput, NegativeInputIdError
from specreplay.replay.models.messages import ModelRunnerOutput, SchedulerOutput
from specreplay.replay.models.paged_kv import PagedKV
from specreplay.replay.models.releases import release_of
from specreplay.replay.models.target_model import RecordedTargetModel, TargetModel
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.oracle import Oracle


class OracleSpeculator:
    """The drafter of the reference MRV2: the oracle's proposals, padded as vLLM's n-gram
    speculator pads (the slot's last sampled token)."""

    def __init__(self, runner: ModelRunnerV2) -> None:
        self.runner = runner
        self.drafter = getattr(runner.oracle, "drafter", "fixed")

    def propose(self, batch: InputBatch, num_sampled: torch.Tensor) -> torch.Tensor:
        runner = self.runner
        states, k = runner.req_states, runner.k
        index = batch.idx_mapping
        last = states.last_sampled_tokens[index, 0]
        drafts = last[:, None].repeat(1, k)  # no proposal: the last sampled token in every slot
        live = [x for x, n in enumerate(num_sampled.tolist()) if n > 0]
        if not live:
            return drafts
        # The position after each sampled row's last token: its device count, post_update done, + 1.
        after = (states.num_computed_tokens.gpu[index] + 1).tolist()
        rids = [batch.req_ids[x] for x in live]
        firsts = [after[x] for x in live]
        prompt_lens = [len(runner.requests[rid].prompt_token_ids) for rid in rids]
        if self.drafter == "fixed":
            table = runner.oracle.draft_rows(rids, firsts, k, prompt_lens)
            drafts[torch.tensor(live, device=drafts.device)] = torch.from_numpy(table).to(drafts.device)
            return drafts
        for x, rid, first, plen in zip(live, rids, firsts, prompt_lens):
            proposal = runner.oracle.drafts(rid, first, k, plen)[:k]
            if proposal:
                drafts[x, : len(proposal)] = torch.tensor(proposal, dtype=torch.int64, device=drafts.device)
        return drafts


class ModelRunnerV2(PagedKV):
    """vLLM's Model Runner V2 (vllm/v1/worker/gpu/model_runner.py GPUModelRunner), its state
    handling, for one rank, greedy sampling, no CUDA graphs."""

    def __init__(self, config: EngineConfig, oracle: Oracle, device: str = "cpu") -> None:
        self.config = config
        self.oracle = oracle
        self.device = torch.device(device)
        self.release = release_of(config.vllm_version)
        self.k = self.num_speculative_steps = config.num_spec_tokens
        self.use_async_scheduling = config.async_scheduling
        self.max_num_reqs = config.max_num_seqs
        self.decode_query_len = self.k + 1  # one sampled token per step, plus the drafts
        # Room for every token a request can reach (drafts past max_model_len included).
        self.req_states = RequestStates(self.max_num_reqs, config.max_model_len + self.k + 1, self.k, self.device)
        self.requests: dict[str, SlotRequest] = {}
        # vLLM's InputBuffers: persistent, so a position no kernel writes keeps its old value.
        size = config.max_num_batched_tokens
        self.input_ids_buffer = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.positions_buffer = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.model = TargetModel(config.vocab_size, self.device)
        self.recorded_model = RecordedTargetModel(oracle, self.device) if oracle.recorded else None
        self.speculator = OracleSpeculator(self) if self.k else None
        self.execute_model_state: ExecuteModelState | None = None
        self.valid_sampled_token_count_cpu: list[int] = []  # num_sampled per row, for the KV ground truth
        self.sync_drafts: tuple[list[str], list[list[int]]] = ([], [])
        # 0.34.0's DraftTokensHandler: the last draft width of every live request, in the order
        # each was first set (release.mrv2_drafts_of_live_requests).
        self.draft_widths: dict[str, int] = {}
        self.init_kv(config, self.device)

    # ================================================================ execute_model
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput | None:
        """The forward half. None: sample_tokens() follows; an empty step returns its output at once."""
        self.execute_model_state = None
        self.commit_kv()  # the previous forward is done before this one runs (one stream)
        self._update_states(out)
        if out.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput()
        batch = self._prepare_inputs(out)
        hidden = self.forward(batch)
        self.write_kv(batch)
        # A step whose drafts go unused proposes none (skip_drafts: width 0, every slot -1).
        width = 0 if out.skip_drafts else out.num_spec_tokens_to_schedule
        self.execute_model_state = ExecuteModelState(batch, hidden, width)
        return None

    def _update_states(self, out: SchedulerOutput) -> None:
        """finish_requests, add_requests, update_requests (model_runner.py ~1152-1260)."""
        self.finish_requests(out)
        self.add_requests(out)
        self.update_requests(out)

    def finish_requests(self, out: SchedulerOutput) -> None:
        """Finished and preempted requests alike lose their slots, freed in sorted order."""
        for rid in sorted(set(out.finished_req_ids) | set(out.preempted_req_ids)):
            self._remove_request(rid)
            self.requests.pop(rid, None)

    def _remove_request(self, rid: str) -> int | None:
        self.draft_widths.pop(rid, None)
        return self.req_states.remove_request(rid)

    def add_requests(self, out: SchedulerOutput) -> None:
        """Each new request takes a slot. A known id is a streaming session's next turn: its old
        slot is freed and it is added again (the same request life for the KV model)."""
        zero_drafts = self.k > 0 or not self.release.mrv2_zero_drafts_needs_k
        for data in out.scheduled_new_reqs:
            rid = data.req_id
            prior = self.requests.get(rid) if rid in self.req_states.req_id_to_index else None
            self._remove_request(rid)
            prefill = data.prefill_token_ids if data.prefill_token_ids is not None else data.prompt_token_ids
            self.req_states.add_request(
                rid, len(data.prompt_token_ids), list(prefill), data.num_computed_tokens, zero_drafts
            )
            handle = prior.kv_handle if prior is not None else -1
            self.requests[rid] = SlotRequest(rid, list(data.prompt_token_ids), list(data.block_ids), handle)
            self.kv_handle(rid)

    def update_requests(self, out: SchedulerOutput) -> None:
        """The scheduler's count into the CPU mirror; new blocks appended."""
        cached = out.scheduled_cached_reqs
        states = self.req_states
        for rid, num_computed, new_blocks in zip(cached.req_ids, cached.num_computed_tokens, cached.new_block_ids):
            states.num_computed_tokens_np[states.req_id_to_index[rid]] = num_computed
            if new_blocks:
                self.requests[rid].block_ids.extend(new_blocks)
        np.minimum(states.num_computed_tokens_np, states.prefill_len.np, out=states.num_computed_prefill_tokens)

    def kv_block_table(self, rid: str) -> list[int]:
        return self.requests[rid].block_ids

    # ================================================================ prepare_inputs
    def batch_order(self, out: SchedulerOutput) -> list[str]:
        """vLLM's sort_batch_req_ids: verifying rows first, then decode-length rows, then by length."""
        counts, spec, q = out.num_scheduled_tokens, out.scheduled_spec_decode_tokens, self.decode_query_len
        return sorted(counts, key=lambda r: (not spec.get(r), counts[r] != q, counts[r]))

    def _prepare_inputs(self, out: SchedulerOutput) -> InputBatch:
        states, dev = self.req_states, self.device
        req_ids = self.batch_order(out)
        num_reqs = len(req_ids)
        n_np = np.array([out.num_scheduled_tokens[r] for r in req_ids], dtype=np.int32)
        slots_np = np.array([states.req_id_to_index[r] for r in req_ids], dtype=np.intp)
        spec = out.scheduled_spec_decode_tokens
        d_np = np.array([len(spec.get(r, ())) for r in req_ids], dtype=np.int32) if spec else None
        d = d_np if d_np is not None else np.zeros(num_reqs, dtype=np.int32)
        logits_np = d + 1
        if (n_np < logits_np).any():  # vLLM asserts num_scheduled_tokens >= num_logits
            bad = req_ids[int(np.flatnonzero(n_np < logits_np)[0])]
            raise MalformedSchedulerOutput(
                f"runner assert at step {out.step}: request {bad!r} has fewer scheduled tokens than drafts + 1"
            )
        qsl_np = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(n_np, out=qsl_np[1:])
        cu_np = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(logits_np, out=cu_np[1:])
        total = int(qsl_np[-1])
        idx = torch.from_numpy(slots_np.astype(np.int64)).to(dev)
        qsl = torch.from_numpy(qsl_np.astype(np.int64)).to(dev)
        n_t = torch.from_numpy(n_np.astype(np.int64)).to(dev)
        d_t = torch.from_numpy(d.astype(np.int64)).to(dev)
        computed = states.num_computed_tokens.gpu[idx]
        prefill_len = states.prefill_len.gpu[idx]
        # Row of each token and its offset in the row: from the host counts (as vLLM's query_start_loc).
        row_of_np = np.repeat(np.arange(num_reqs, dtype=np.int64), n_np)
        row_of = torch.from_numpy(row_of_np).to(dev)
        offset = torch.from_numpy(np.arange(total, dtype=np.int64) - qsl_np[:-1].astype(np.int64)[row_of_np]).to(dev)
        positions = computed[row_of] + offset
        ids = self.input_ids_buffer[:total]
        self.positions_buffer[:total] = positions
        # prepare_prefill_inputs: only when the CPU side sees a prefilling row; each row still
        # prefilling by its device count reads its slot's tokens from that count on.
        if (states.num_computed_prefill_tokens[slots_np] < states.prefill_len.np[slots_np]).any():
            prefilling = (computed < prefill_len)[row_of]
            width = states.all_token_ids.gpu.shape[1]
            tokens = states.all_token_ids.gpu[idx[row_of], positions.clamp(0, width - 1)]
            ids[prefilling] = tokens[prefilling]
        seq_lens = computed + n_t
        # combine_sampled_and_draft_tokens: a row past its prefill gets its slot's last sampled
        # token at its first logit position (when that lies past the prefill) and its drafts after it.
        q_end = qsl[1:]
        num_logits = d_t + 1
        logits_start = q_end - num_logits
        decoding = seq_lens > prefill_len
        takes_last = decoding & (seq_lens - num_logits >= prefill_len)
        if bool(takes_last.any()):
            ids[logits_start[takes_last]] = states.last_sampled_tokens[idx[takes_last], 0]
        width = int(d.max()) if num_reqs else 0
        if width and self.k:
            j = torch.arange(width, device=dev)
            mask = decoding[:, None] & (j[None, :] < d_t[:, None])
            at = (q_end - d_t)[:, None] + j[None, :]
            src = states.draft_tokens[idx][:, :width]
            ids[at[mask]] = src[mask]
        cu = torch.from_numpy(cu_np).to(dev)
        j1 = torch.arange(self.k + 1, device=dev)
        in_row = j1[None, :] < num_logits[:, None]
        logits_indices = (logits_start[:, None] + j1[None, :])[in_row]
        host_ids = ids.tolist()
        qsl_l = qsl_np.tolist()
        draft_ids = [host_ids[qsl_l[x + 1] - int(d[x]) : qsl_l[x + 1]] for x in range(num_reqs)]
        negatives = [sum(1 for t in host_ids[qsl_l[x] : qsl_l[x + 1]] if t < 0) for x in range(num_reqs)]
        return InputBatch(
            req_ids=req_ids,
            idx_mapping=idx,
            idx_mapping_np=slots_np,
            num_scheduled_tokens=n_np,
            num_draft_tokens_per_req=d_np,
            query_start_loc=qsl,
            query_start_loc_np=qsl_np,
            seq_lens=seq_lens,
            input_ids=ids,
            positions=self.positions_buffer[:total],
            logits_indices=logits_indices,
            cu_num_logits=cu,
            starts=computed.tolist(),
            discarded=(seq_lens < prefill_len).tolist(),
            draft_ids=draft_ids,
            negatives=negatives,
        )

    def forward(self, batch: InputBatch) -> torch.Tensor:
        """The target model's token for every input position. MRV2 clamps nothing: a negative
        id reaching the embedding is a device-side assert on a GPU."""
        bad = next((x for x, n in enumerate(batch.negatives) if n), None)
        if bad is not None:
            raise NegativeInputIdError(f"input id -1 reached the embedding for request {batch.req_ids[bad]!r}")
        if self.recorded_model is not None:
            turns = [(rid, len(self.requests[rid].prompt_token_ids)) for rid in batch.req_ids]
            return self.recorded_model.forward(batch.input_ids, batch.positions, turns, batch.num_scheduled)
        per_row = np.array([self.oracle.hash(rid) for rid in batch.req_ids], dtype=np.int64)
        hashes = torch.from_numpy(np.repeat(per_row, batch.num_scheduled_tokens)).to(self.device)
        return self.model.forward(batch.input_ids, batch.positions, hashes)

    # ================================================================ sample_tokens
    def sample_tokens(self, grammar_output: Any = None) -> ModelRunnerOutput:
        state = self.execute_model_state
        self.execute_model_state = None
        batch = state.input_batch
        sampler_output, num_sampled, num_rejected = self.sample(state.hidden_states, batch)
        self.postprocess_sampled(batch, sampler_output.sampled_token_ids, num_sampled, num_rejected)
        counts = num_sampled.tolist()  # the D2H copy the scheduler's output is trimmed with
        self.valid_sampled_token_count_cpu = counts
        k, width = self.k, state.num_spec_tokens_to_schedule
        if self.speculator is not None:
            drafts = self.speculator.propose(batch, num_sampled)
            if width < k:
                drafts[:, width:] = -1
            self.req_states.draft_tokens[batch.idx_mapping] = drafts
        if k and not self.use_async_scheduling:
            # DraftTokensHandler without structured output: -1 per draft; the runner keeps the real
            # ones. From 0.34.0 it hands back every live request's last width, not the batch's only.
            if self.release.mrv2_drafts_of_live_requests:
                self.draft_widths.update(dict.fromkeys(batch.req_ids, min(width, k)))
                self.sync_drafts = (list(self.draft_widths), [[-1] * w for w in self.draft_widths.values()])
            else:
                self.sync_drafts = (list(batch.req_ids), [[-1] * min(width, k) for _ in batch.req_ids])
        if not self.use_async_scheduling:
            self.commit_kv()  # sync: the engine waits for this step before it schedules the next
        sampled = sampler_output.sampled_token_ids.tolist()
        rows = batch.req_ids
        return ModelRunnerOutput(
            req_ids=list(rows),
            req_id_to_index={rid: x for x, rid in enumerate(rows)},
            sampled_token_ids=[s[:n] for s, n in zip(sampled, counts)],
        )

    def sample(
        self, hidden_states: torch.Tensor, batch: InputBatch
    ) -> tuple[SamplerOutput, torch.Tensor, torch.Tensor]:
        """Greedy rejection sampling over each row's logits (its last 1 + d positions): accept
        the longest prefix of drafts equal to the target's token, then one more token. A chunked
        prefill row samples nothing and rejects nothing."""
        dev = self.device
        n_rows = batch.num_reqs
        d = torch.tensor(batch.num_drafts, dtype=torch.int64, device=dev)
        num_logits = d + 1
        width = self.k + 1
        cu = batch.cu_num_logits
        j = torch.arange(width, device=dev)
        valid = j[None, :] < num_logits[:, None]
        logit_at = (cu[:-1][:, None] + j[None, :]).clamp(max=max(batch.logits_indices.numel() - 1, 0))
        position = batch.logits_indices[logit_at]  # input position of each logit
        target = hidden_states[position]  # [rows, k + 1]
        if self.k:
            total = batch.input_ids.numel()
            fed = batch.input_ids[(position[:, : self.k] + 1).clamp(max=total - 1)]  # the draft after each logit
            match = (fed == target[:, : self.k]) & (fed >= 0) & (j[None, : self.k] < d[:, None])
            accepted = torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)
        else:
            accepted = torch.zeros(n_rows, dtype=torch.int64, device=dev)
        prefill_len = self.req_states.prefill_len.gpu[batch.idx_mapping]
        chunked = batch.seq_lens < prefill_len
        num_sampled = torch.where(chunked, 0, accepted + 1)
        num_rejected = torch.where(chunked, 0, num_logits - num_sampled)
        sampled = torch.where(valid & (j[None, :] <= accepted[:, None]), target, -1)
        return SamplerOutput(sampled), num_sampled, num_rejected

    def postprocess_sampled(
        self, batch: InputBatch, sampled: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor
    ) -> None:
        """post_update: the last sampled token and the tokens into each row's slot, and the
        device count advanced by query_len - num_rejected."""
        states, dev = self.req_states, self.device
        idx = batch.idx_mapping
        n_rows = batch.num_reqs
        has = num_sampled > 0
        rows = torch.arange(n_rows, device=dev)
        if bool(has.any()):
            last = sampled[rows, (num_sampled - 1).clamp(min=0)]
            states.last_sampled_tokens[idx[has], 0] = last[has]
            total = states.total_len.gpu[idx]
            j = torch.arange(sampled.shape[1], device=dev)
            write = j[None, :] < num_sampled[:, None]
            width = states.all_token_ids.gpu.shape[1]
            at = (total[:, None] + j[None, :]).clamp(max=width - 1)
            slot = idx[:, None].expand_as(at)
            states.all_token_ids.gpu[slot[write], at[write]] = sampled[write]
            states.total_len.gpu[idx] = total + num_sampled
        query_len = batch.query_start_loc[1 : n_rows + 1] - batch.query_start_loc[:n_rows]
        states.num_computed_tokens.gpu[idx] += query_len - num_rejected

    def take_draft_token_ids(self) -> tuple[list[str], list[list[int]]]:
        """Sync mode: what the scheduler gets back after a step (-1 per draft)."""
        drafts, self.sync_drafts = self.sync_drafts, ([], [])
        return drafts
