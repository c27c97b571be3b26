"""The scheduler's per-request state, modelled on vLLM 0.32.0's `vllm/v1/request.py`.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The scheduler observer reads these fields, by the names vLLM's `Request`
gives them, into the `sched_*` columns; nothing on the worker side ever sees this object. Status
names are vLLM's too.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_LENGTH_CAPPED = "length"
    FINISHED_STOPPED = "stop"
    FINISHED_ABORTED = "aborted"
    #: A streaming session between turns: it keeps its KV blocks and waits for its next input chunk.
    WAITING_FOR_STREAMING_REQ = "waiting_for_streaming_req"

    def __init__(self, value: str) -> None:
        # A plain attribute, set once per member: read for every request on every step.
        self.finished: bool = value in ("length", "stop", "aborted")


class Request:
    """Scheduler-side request. Counter names and meanings are vLLM's."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "max_tokens",
        "stop_token_id",
        "all_token_ids",
        "num_prompt_tokens",
        "num_computed_tokens",
        "num_output_placeholders",
        "spec_token_ids",
        "status",
        "is_prefill_chunk",
        "num_preemptions",
        "num_in_flight_tokens",
        "num_stale_output_tokens",
        "drop_stale_output",
        "resumable",
        "streaming_queue",
        "output_start",
        "block_hashes",
        "cache_salt",
        "_plugin_state",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        stop_token_id: int | None = None,
        resumable: bool = False,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.stop_token_id = stop_token_id  # SamplingParams.stop_token_ids: finish on this token
        self.all_token_ids: list[int] = list(prompt_token_ids)  # prompt + applied outputs only
        # Where this turn's outputs start in all_token_ids: the prompt's end, until a streaming
        # session's next turn (vLLM keeps a separate output list and clears it then).
        self.output_start = len(prompt_token_ids)
        self.num_computed_tokens = 0  # C: computed or scheduled in flight (optimistic for drafts)
        self.num_output_placeholders = 0  # P: in-flight outputs not yet applied, drafts included
        self.spec_token_ids: list[int] = []  # drafts to book next time; [-1]*k under async
        self.status = Status.WAITING
        self.is_prefill_chunk = False
        self.num_preemptions = 0
        # vLLM 0.32 stale-output tracking (B++): tokens scheduled and not yet applied, and the
        # share of them that predates the last preemption.
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.drop_stale_output = False
        # Streaming input (vLLM's resumable requests): the session's queued input chunks, a
        # StreamingUpdate or None (the end of the stream) each; None for an ordinary request.
        self.resumable = resumable
        self.streaming_queue: deque[Any] | None = None
        # Prefix caching: the hashes of its full blocks of known tokens, computed as far as they
        # are needed (models/kv.py block_hashes_of), and vLLM's cache salt (SamplingParams'
        # cache_salt: an extra key of the first block's hash, so only requests with the same salt
        # share a prefix).
        self.block_hashes: list[int] = []
        self.cache_salt = cache_salt
        self._plugin_state: dict[str, Any] | None = None  # see plugin_state; made on first use

    @property
    def plugin_state(self) -> dict[str, Any]:
        """A variant's own per-request state, as the slots leave no room for new attributes:
        empty for each new Request, that is each life of an id (a resubmission is a new
        object); kept across preemptions and a streaming session's turns (the same object).
        Nothing of specreplay reads or writes it, and it is not in the trace."""
        if self._plugin_state is None:
            self._plugin_state = {}
        return self._plugin_state

    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.output_start

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.output_start :]

    def __repr__(self) -> str:  # for debugging the tool itself
        return (
            f"Request({self.request_id!r}, {self.status.value}, C={self.num_computed_tokens}, "
            f"P={self.num_output_placeholders}, T={self.num_tokens}, spec={len(self.spec_token_ids)})"
        )
