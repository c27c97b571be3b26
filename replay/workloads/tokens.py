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
A request's listed acceptance (`acceptance = [2, 0, 3]`: its i-th verification round accepts a_i
drafts) is turned into positions once (`listed_rounds`), so it stays a rule of (r, q) too.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

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


def continue_tokens(h: int, seq: list[int], length: int, vocab: int, offset: int = 0) -> list[int]:
    """`seq` (a prompt, or a prompt and outputs) extended in place by the target model's
    greedy tokens to `length` tokens; `offset`: the position of seq[0] (a prompt's tail)."""
    while len(seq) < length:
        seq.append(next_token(h, offset + len(seq) - 1, seq[-1], vocab))
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


def listed_rounds(rounds: Sequence[int]) -> bytes:
    """Listed verification rounds as draft correctness by position, from the first round's first
    draft: round i accepts a_i drafts, so its drafts are right at a_i positions and wrong at the
    next (the one rejected; with a_i = k that position is the round's bonus token, never a draft
    of it), and round i + 1 drafts from the position after. For a correct engine verifying k
    drafts a round, round i's first draft is at prompt_len + 1 + sum_{j<i} (a_j + 1):

        acceptance [2, 0, 3], prompt 10, k = 3:  round 1 drafts 11..13, accepts 11, 12 (13 wrong);
        round 2 drafts 14..16, accepts none (14 wrong); round 3 drafts 15..17, accepts all three.
    """
    return b"".join(b"\x01" * a + b"\x00" for a in rounds)


@dataclass(frozen=True)
class DraftRule:
    """One request's drafter: is its proposal for a position the true token? The listed rounds
    (`listed`, from position `first`) decide the positions they cover, the rule (kind, p) the
    others; a function of (seed, request, position) only, as `draft_is_correct`."""

    kind: str
    p: float
    first: int = 0  # the position of the first listed round's first draft
    listed: bytes = b""  # listed_rounds(...): 1 where the draft at first + i is right

    def correct(self, seed: int, request_id: str, position: int) -> bool:
        i = position - self.first
        if 0 <= i < len(self.listed):
            return bool(self.listed[i])
        return draft_is_correct(self.kind, self.p, seed, request_id, position)
