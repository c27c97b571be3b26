"""Model Runner V2's per-request state: request slots, device-side counts and their CPU mirror.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, worker side. The reference Model Runner V2 (families/vllm/mrv2/runner.py) keeps
its requests as vLLM 0.32.0's `RequestState` does (vllm/v1/worker/gpu/states.py), under vLLM's
names, so the one MRV2 observer (families/vllm/mrv2/observer.py) reads the real runner and this one:

  req_id_to_index / index_to_req_id   a request holds a slot from its arrival until it finishes or
                                      is preempted; slots are taken from the end of `free_indices`
                                      and a freed one goes back at the end (so it is the next taken)
  num_computed_tokens.gpu             the device count: the runner's own truth, advanced only by
                                      post_update (query_len - num_rejected)
  num_computed_tokens_np              the CPU mirror: the scheduler's value, written each step
  num_computed_prefill_tokens         min(mirror, prefill_len): decides whether a batch has prefill
  prefill_len.np / prompt_len.np      tokens the runner prefills (a resumed request: all its tokens)
                                      and the user's prompt
  all_token_ids.gpu, total_len.gpu    the tokens so far per slot, and how many
  last_sampled_tokens                 the last sampled token per slot (the next decode input)
  draft_tokens [max_reqs, k]          the drafts proposed after the slot's last step

`max_seq_len` and the prefill lookahead tokens are left out: they serve pipeline parallelism and
lookahead drafters (EAGLE), which the reference does not model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class DeviceArray:
    """vLLM's StagedWriteTensor, reduced to its device tensor (`.gpu`); writes apply at once."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.gpu = tensor


class HostArray:
    """vLLM's UvaBackedTensor: host values (`.np`) the device reads (`.gpu`, a copy made when read)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.np = np.zeros(size, dtype=np.int32)
        self.device = device

    @property
    def gpu(self) -> torch.Tensor:
        return torch.from_numpy(self.np.astype(np.int64)).to(self.device)


@dataclass
class SlotRequest:
    """The host side of one request life in a slot: what the KV model and the oracle need."""

    req_id: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    kv_handle: int = -1  # which request life its KV writes are marked with (models/paged_kv.py)


class RequestStates:
    """`req_states` of Model Runner V2, on the runner's device."""

    def __init__(self, max_num_reqs: int, max_len: int, num_speculative_steps: int, device: torch.device) -> None:
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.req_id_to_index: dict[str, int] = {}
        self.index_to_req_id: dict[int, str] = {}
        self.free_indices = list(range(max_num_reqs))
        self.all_token_ids = DeviceArray(torch.zeros((max_num_reqs, max_len), dtype=torch.int64, device=device))
        self.prompt_len = HostArray(max_num_reqs, device)
        self.prefill_len = HostArray(max_num_reqs, device)
        self.total_len = DeviceArray(torch.zeros(max_num_reqs, dtype=torch.int64, device=device))
        self.num_computed_prefill_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens = DeviceArray(torch.zeros(max_num_reqs, dtype=torch.int64, device=device))
        self.num_computed_tokens_np = np.zeros(max_num_reqs, dtype=np.int32)
        self.last_sampled_tokens = torch.zeros((max_num_reqs, 1), dtype=torch.int64, device=device)
        self.draft_tokens = torch.zeros((max_num_reqs, num_speculative_steps), dtype=torch.int64, device=device)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(
        self, req_id: str, prompt_len: int, all_token_ids: list[int], num_computed_tokens: int, zero_drafts: bool
    ) -> int:
        """A new life in the slot at the end of the free list; returns the slot."""
        if not self.free_indices:
            raise AssertionError("No free indices")  # vLLM's assert: more requests than max_num_seqs
        slot = self.free_indices.pop()
        self.req_id_to_index[req_id] = slot
        self.index_to_req_id[slot] = req_id
        prefill_len = len(all_token_ids)
        self.prompt_len.np[slot] = prompt_len
        self.prefill_len.np[slot] = prefill_len
        self.total_len.gpu[slot] = prefill_len
        width = self.all_token_ids.gpu.shape[1]
        kept = all_token_ids[:width]
        if kept:
            self.all_token_ids.gpu[slot, : len(kept)] = torch.tensor(kept, dtype=torch.int64, device=self.device)
        self.num_computed_prefill_tokens[slot] = num_computed_tokens
        self.num_computed_tokens_np[slot] = num_computed_tokens
        self.num_computed_tokens.gpu[slot] = num_computed_tokens
        if zero_drafts:
            self.draft_tokens[slot].zero_()
        return slot

    def remove_request(self, req_id: str) -> int | None:
        """Free the request's slot (it goes to the end of the free list); None if it held none."""
        slot = self.req_id_to_index.pop(req_id, None)
        if slot is None:
            return None
        self.index_to_req_id.pop(slot, None)
        self.free_indices.append(slot)
        return slot
