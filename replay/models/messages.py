"""The typed messages between the reference scheduler and the reference runner.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. Mirrors vLLM's `SchedulerOutput` (vllm/v1/core/sched/output.py) and
`ModelRunnerOutput` (vllm/v1/outputs.py), reduced to the fields that carry per-request state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int  # tokens computed before this step (prefix hits; 0 here)
    # Model Runner V2 only (the scheduler serves it: `use_v2_model_runner`): every token the
    # runner prefills, the outputs of a preempted request's earlier life included; None for V1.
    prefill_token_ids: list[int] | None = None


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)  # running scheduled, then resumed
    resumed_req_ids: set[str] = field(default_factory=set)  # back from PREEMPTED: replace blocks
    new_block_ids: list[list[int]] = field(default_factory=list)  # blocks allocated this step
    num_computed_tokens: list[int] = field(default_factory=list)  # scheduler C before this step
    num_output_tokens: list[int] = field(default_factory=list)  # applied outputs + placeholders
    # Full token list for every request not scheduled at the previous step (re-entering or
    # resumed): the worker rebuilds its output_token_ids from it.
    all_token_ids: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class SchedulerOutput:
    step: int
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # draft slots included
    total_num_scheduled_tokens: int = 0
    # Only requests with at least one draft slot; -1 placeholders under async scheduling.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    finished_req_ids: set[str] = field(default_factory=set)  # finished since the last schedule()
    preempted_req_ids: set[str] = field(default_factory=set)
    num_spec_tokens_to_schedule: int = 0  # draft width the drafter produces after this step
    # No scheduled request can use the drafts proposed after this step (vLLM 0.33.0 on, a
    # lookahead drafter under MRV2): the runner proposes none (width 0).
    skip_drafts: bool = False

    def private_copy(self) -> SchedulerOutput:
        """What a multiprocess executor hands the worker: a deserialised copy."""
        return copy.deepcopy(self)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str] = field(default_factory=list)
    req_id_to_index: dict[str, int] = field(default_factory=dict)
    # Per row: accepted drafts then the bonus/recovered token (1 + a); [] for discarded rows.
    sampled_token_ids: list[list[int]] = field(default_factory=list)


class EngineCrash(RuntimeError):
    """Something the real engine would die on (an assert, a device-side assert). The engine loop
    records it as the run's outcome (`crashed`, with the step and this message) and stops; the
    checker reports it."""

    kind = "engine-crash"

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind
