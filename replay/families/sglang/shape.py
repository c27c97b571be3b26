"""What SGLang's scheduler takes of a drawn workload: explore's candidates for `--engine sglang-scheduler`.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. Explore draws its workloads across vLLM's settings and control events
(workloads/generators.py); SGLang's scheduler, as `--engine sglang-scheduler` drives it, takes
arrivals and aborts only and refuses the rest in one line (families/sglang/setup.py
`refuse_workload`). Refused candidates would spend the search on errors, so the engine's entry
(engines/registry.py `Engine.shape`) names `taken_by_sglang`, which keeps what SGLang takes and
drops what it has no counterpart for, from the same draw (a seed still names one workload):

- control events: the aborts and a streaming session's chunks stay; pauses, cache resets and
  resubmissions go; without the radix cache (SGLang's streaming sessions run on it) a streaming
  session becomes a plain request and its chunks go;
- a conversation's turn that arrives `after_finish` gets a fixed arrival instead (that many
  steps after the turn before it arrives): its prompt, and what it shares, stay;
- `num_lookahead_tokens` and `long_prefill_token_threshold` (vLLM's) become 0;
- the context and the KV pool grow to what SGLang's per-request limit asks of the longest request
  (a streaming session's last turn, whose prompt holds every turn before it)
  (it caps max_new_tokens to `min(context, KV slots) - 1 - prompt - 1` and refuses a prompt within
  5 of that: sglang_setup.py), so no request is capped; the pool still holds one request's worth
  and a few slots, so several requests together still run out and SGLang retracts.

tests/replay/workflows/test_explore_sglang_shape.py holds every shaped draw to `refuse_workload`.
"""

from __future__ import annotations

import dataclasses

from specreplay.replay.workloads.workload import RequestSpec, Workload

#: Room SGLang asks beyond a request: one token past prompt + max_tokens, and its request limit
#: is the pool or context less one (`refuse_workload`).
SGLANG_SPARE = 2
#: A prompt must be this many tokens below the request limit.
SGLANG_PROMPT_MARGIN = 7


def taken_by_sglang(workload: Workload) -> Workload:
    """`workload` less what SGLang's scheduler has no counterpart for (module docstring)."""
    sessions = workload.config.enable_prefix_caching
    kept = ("abort", "stream_append") if sessions else ("abort",)
    events = tuple(e for e in workload.events if e.kind in kept)
    requests = tuple(
        r if sessions or not r.streaming else dataclasses.replace(r, streaming=False) for r in workload.requests
    )
    requests = _fixed_arrivals(requests)
    shaped = dataclasses.replace(workload, requests=requests, events=events)
    last = {r.request_id: last_turn(shaped, r) for r in requests}
    need = max(
        max(prompt + max_tokens + SGLANG_SPARE for prompt, max_tokens in last.values()),
        max(prompt + SGLANG_PROMPT_MARGIN for prompt, _ in last.values()),
    )
    config = workload.config
    blocks = max(config.num_blocks, -(-need // config.block_size))
    config = dataclasses.replace(
        config,
        num_lookahead_tokens=0,
        long_prefill_token_threshold=0,
        max_model_len=max(config.max_model_len, need),
        num_blocks=blocks,
    )
    return dataclasses.replace(workload, requests=requests, events=events, config=config)


def last_turn(workload: Workload, spec: RequestSpec) -> tuple[int, int]:
    """The whole prompt and max_tokens of a request's last turn on SGLang: a streaming session's
    turn prompt holds every turn before it, prompts and all outputs (families/sglang/sessions.py);
    any other request has one turn, its prompt with a prefix or a conversation included."""
    if not spec.streaming:
        return workload.prompt_len_of(spec.request_id), spec.max_tokens
    turns = workload.turns(spec)
    return sum(tokens + max_tokens for tokens, max_tokens in turns[:-1]) + turns[-1][0], turns[-1][1]


def _fixed_arrivals(requests: tuple[RequestSpec, ...]) -> tuple[RequestSpec, ...]:
    """Each `after_finish` turn arrives that many steps after the turn it follows arrives."""
    arrival: dict[str, int] = {}
    out = []
    for r in requests:  # a followed request is listed first
        if r.after_finish is not None and r.follows is not None:
            r = dataclasses.replace(r, arrival_step=arrival[r.follows] + r.after_finish, after_finish=None)
        arrival[r.request_id] = r.arrival_step
        out.append(r)
    return tuple(out)


__all__ = ["last_turn", "taken_by_sglang"]
