"""Limits: each request life's max_tokens, turn by turn, read from the workload a trace stores
(and which requests sent their prompt as embeddings: what an SGLang retraction keeps of them).

Where it sits: inside check, beside coverage. The rows do not carry max_tokens (no column holds
it), but every trace stores its workload in its metadata: the one specreplay ran, or, for a live
or attached vLLM recording, the summary merge.py makes of its recorded inputs, which carries a
resubmitted life's own max_tokens on its resubmit event and each streaming turn's on its
stream_append event. So the limit the scheduler ended a life at is known for every trace
specreplay writes; a rule that needs it (the wasted-step rule, rules_waste.py) does not run where
it is not known, and the checker names its code among those it could not check (coverage.py).

The shape: (request id, life) -> the max_tokens of each of its turns, in order. An ordinary life
has one turn; a streaming session (vLLM's resumable request) one more per input chunk, in the
order the engine takes them. Example: request "s" with max_tokens 6, a chunk at step 3 with
max_tokens 5, then resubmitted at step 30 with max_tokens 9: {("s", 0): (6, 5), ("s", 1): (9,)}.

Which turn a row is in is the checker's to count (framework.py): a streaming turn's prompt is
everything computed so far plus the chunk, so the prompt length grows at every new turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specreplay.traces.errors import TraceError
from specreplay.traces.header import WorkloadHeader, coerce

#: (request id, life) -> max_tokens of each turn of that life, in order.
Limits = dict[tuple[str, int], tuple[int, ...]]


def max_tokens_by_life(workload: WorkloadHeader | Mapping[str, Any] | None) -> Limits:
    """The per-turn max_tokens of every request life the workload defines; {} when it defines
    none or cannot be read (a rule that needs them then does not run). A mapping is read as the
    workload metadata would be."""
    try:
        return _limits(coerce(WorkloadHeader, workload) if workload is not None else WorkloadHeader())
    except (TypeError, ValueError, KeyError, AttributeError, TraceError):
        return {}


def _limits(workload: WorkloadHeader) -> Limits:
    first: dict[str, int] = {}
    turns: dict[tuple[str, int], list[int]] = {}
    life: dict[str, int] = {}
    for spec in workload.requests or ():
        rid = str(spec["id"])
        first[rid] = int(spec.get("max_tokens", 16))  # RequestSpec's default
        life[rid] = 0
        turns[(rid, 0)] = [first[rid]]
    # Events in the order the engine applies them: by step, in list order within a step.
    events = sorted(workload.events or (), key=lambda e: int(e["step"]))
    for event in events:
        rid = event.get("request")
        if rid is None or str(rid) not in first:
            continue
        rid = str(rid)
        limit = event.get("max_tokens")
        limit = first[rid] if limit is None else int(limit)
        if event["kind"] == "resubmit":
            life[rid] += 1
            turns[(rid, life[rid])] = [limit]
        elif event["kind"] == "stream_append":
            turns[(rid, life[rid])].append(limit)
    return {key: tuple(values) for key, values in turns.items()}


def embedded_prompts(workload: WorkloadHeader | Mapping[str, Any] | None) -> frozenset[str]:
    """The requests whose client sent the prompt as embeddings (`input_embeds`): SGLang discards
    such a request's outputs when it retracts it and generates them anew (reset_for_retract), where
    every other retraction keeps them. Empty when the workload names none or cannot be read."""
    try:
        header = coerce(WorkloadHeader, workload) if workload is not None else WorkloadHeader()
        return frozenset(str(spec["id"]) for spec in header.requests or () if spec.get("input_embeds"))
    except (TypeError, ValueError, KeyError, AttributeError, TraceError):
        return frozenset()
