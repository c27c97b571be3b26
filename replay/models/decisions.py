"""Scheduling rules that more than one part of specreplay must apply the same way.

Where it sits: workloads -> **models** -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The reference scheduler decides with these functions; the scheduler
observer (observers/) uses the same functions to say why a scheduler, the real one included, skipped
a request. One definition, no drift.
"""

from __future__ import annotations


def reaches_max_tokens_in_flight(
    num_computed_tokens: int, num_output_placeholders: int, num_prompt_tokens: int, max_tokens: int
) -> bool:
    """vLLM's max-tokens skip (scheduler.py, the running-queue visit): the step in flight emits
    at least one token; if that reaches max_tokens, the request never needs another step.

    Worked example, prompt 5, max_tokens 3, k = 0: after two applied outputs C = 7 and one
    step in flight P = 1: 7 + 2 - 1 = 8 >= 5 + 3, so the request is skipped; its last token is
    on its way."""
    return num_output_placeholders > 0 and (
        num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens + max_tokens
    )
