"""What a scheduler's messages carry, read the same way whichever vLLM release made them.

Where it sits: workloads -> models -> impls -> **observers** -> engines -> traces -> check ->
workflows -> views -> cli. The observers read vLLM's own `SchedulerOutput` and
`ModelRunnerOutput` (and specreplay's messages, which have vLLM's names). Two of their fields
went in vLLM 0.34.0, and these two functions are the one place that knows:

- `CachedRequestData.resumed_req_ids`: 0.34's scheduler sends every resumed request as a new one
  (`scheduled_new_reqs`, all its tokens in `prefill_token_ids`), so a 0.34 output resumes no
  cached request;
- `CachedRequestData.all_token_ids` (the V1 runner's re-entry list) went with them;
- `ModelRunnerOutput.req_id_to_index`: 0.34 reads the output by position in `req_ids` (vLLM's
  scheduler.py builds the same map from `req_ids`).
"""

from __future__ import annotations

import dataclasses
from typing import Any


def resumed_ids(cached: Any) -> set[str] | frozenset[str]:
    """The ids of the cached requests `cached` (a CachedRequestData) resumes: none from 0.34 on."""
    resumed = getattr(cached, "resumed_req_ids", None)
    return resumed if resumed is not None else frozenset()


def output_index(model_output: Any) -> dict[str, int]:
    """Request id -> its row in `model_output`'s per-request lists."""
    index = getattr(model_output, "req_id_to_index", None)
    if index is not None:
        return index
    return {rid: i for i, rid in enumerate(model_output.req_ids or ())}


def reentry_tokens(cached: Any) -> dict[str, Any]:
    """Request id -> all its tokens, for the cached requests the V1 runner re-adds (none from 0.34 on)."""
    tokens = getattr(cached, "all_token_ids", None)
    return tokens if tokens is not None else {}


def runner_output(cls: type, req_ids: list[str], sampled_token_ids: list[list[int]]) -> Any:
    """vLLM's `ModelRunnerOutput` (`cls`, the installed one) for rows `req_ids`, with the id ->
    row map where that release still has the field."""
    more: dict[str, Any] = {}
    if "req_id_to_index" in {f.name for f in dataclasses.fields(cls)}:
        more["req_id_to_index"] = {rid: i for i, rid in enumerate(req_ids)}
    return cls(req_ids=req_ids, sampled_token_ids=sampled_token_ids, **more)
