"""One step's batch on the reference Model Runner V2, under vLLM's InputBatch names.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli, worker side. What `ModelRunnerV2._prepare_inputs` (families/vllm/mrv2/runner.py)
builds and `sample_tokens` reads: the MRV2 observer (families/vllm/mrv2/observer.py) reads it as it
reads the real runner's `execute_model_state.input_batch`, the KV ground truth (observers/truth.py)
through the per-row host lists both reference runners give it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class InputBatch:
    """One step's batch, under vLLM's InputBatch names (what the MRV2 observer reads), plus the
    per-row host lists the KV ground truth reads of either reference runner (`rows`, `starts`,
    `num_scheduled`, `num_drafts`, `cu`, `discarded`, `draft_ids`, `negatives`)."""

    req_ids: list[str]
    idx_mapping: torch.Tensor  # [num_reqs] slot per batch row
    idx_mapping_np: np.ndarray
    num_scheduled_tokens: np.ndarray  # [num_reqs]
    num_draft_tokens_per_req: np.ndarray | None  # None: no drafts scheduled this step
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    query_start_loc_np: np.ndarray
    seq_lens: torch.Tensor  # device count + query length
    input_ids: torch.Tensor  # a view of the persistent input buffer
    positions: torch.Tensor
    logits_indices: torch.Tensor
    cu_num_logits: torch.Tensor
    starts: list[int]  # the device count per row (its first position)
    discarded: list[bool]  # chunked prefill rows (seq_len < prefill_len): they sample nothing
    draft_ids: list[list[int]]  # the drafts each row verifies, as fed
    negatives: list[int]  # negative input ids per row
    has_structured_output_reqs: bool = False

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def num_draft_tokens(self) -> int:
        return int(self.num_draft_tokens_per_req.sum()) if self.num_draft_tokens_per_req is not None else 0

    @property
    def rows(self) -> list[str]:
        return self.req_ids

    @property
    def num_scheduled(self) -> list[int]:
        return self.num_scheduled_tokens.tolist()

    @property
    def num_drafts(self) -> list[int]:
        d = self.num_draft_tokens_per_req
        return d.tolist() if d is not None else [0] * len(self.req_ids)

    @property
    def cu(self) -> list[int]:
        return self.query_start_loc_np[1 : len(self.req_ids) + 1].tolist()


@dataclass
class ExecuteModelState:
    """What execute_model leaves for sample_tokens (vLLM's `execute_model_state`)."""

    input_batch: InputBatch
    hidden_states: torch.Tensor  # here: the target model's token at every input position
    num_spec_tokens_to_schedule: int


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [num_reqs, k + 1], -1 past num_sampled
