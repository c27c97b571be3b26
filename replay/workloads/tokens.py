"""Token arithmetic: the tiny target model's next-token rule and the seeded drafter, in plain integers.

Where it sits: **workloads** -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. The oracle derives every request's true sequence from these functions;
`models.target_model` computes the same rule on torch tensors for the runner.

The model's next token depends only on (request, position, input token):

    next(r, p, t) = (31 * t + 17 * p + h(r)) mod V

so a request's true token sequence is fixed by its prompt whatever the scheduling, and a wrong
input token (a -1 clamped to 0, a stale draft) yields a wrong output that the checker sees.
The drafter proposes, for position q, the true token when the acceptance rule says "accept" at
(r, q) and the true token + 1 otherwise; the rule depends on (seed, r, q) only, never on timing.
"""

from __future__ import annotations

import zlib

from specreplay.replay.workloads.workload import RequestSpec

MUL_TOKEN = 31
MUL_POS = 17
_MASK31 = (1 << 31) - 1


def request_hash(seed: int, request_id: str) -> int:
    return zlib.crc32(f"{seed}/{request_id}".encode()) & _MASK31


def prompt_tokens(seed: int, request_id: str, length: int, vocab: int) -> list[int]:
    h = request_hash(seed, request_id)
    return [(h * 7 + i * 13 + 5) % vocab for i in range(length)]


def next_token(h: int, position: int, token: int, vocab: int) -> int:
    """The target model's greedy token at position + 1, given `token` at `position`."""
    return (MUL_TOKEN * token + MUL_POS * position + h) % vocab


def expected_tokens(seed: int, spec: RequestSpec, vocab: int, extra: int) -> list[int]:
    """Prompt followed by the true outputs: `prompt_len + max_tokens + extra` tokens."""
    h = request_hash(seed, spec.request_id)
    seq = prompt_tokens(seed, spec.request_id, spec.prompt_len, vocab)
    total = spec.prompt_len + spec.max_tokens + extra
    while len(seq) < total:
        seq.append(next_token(h, len(seq) - 1, seq[-1], vocab))
    return seq


def draft_is_correct(kind: str, p: float, seed: int, request_id: str, position: int) -> bool:
    """Does the drafter propose the true token for `position` of this request, under the
    acceptance rule (kind, p) of the workload?"""
    if kind == "all":
        return True
    if kind == "none":
        return False
    if kind == "alternate":
        return position % 2 == 0
    draw = zlib.crc32(f"accept/{seed}/{request_id}/{position}".encode()) & 0xFFFFFF
    return draw < p * 0x1000000
