"""The oracle's batched hot paths give what the per-row ones gave: the drafts and mismatches for
a whole batch (issue 20)."""

from __future__ import annotations

import random

import pytest

from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.oracle import Oracle

KINDS = ("all", "none", "alternate", "random:0.3", "random:0.7")
#: A request of each acceptance kind, request i with a prompt of 5 + i tokens.
BATCHED = "0:p5,t20,all 1:p6,t20,none 2:p7,t20,alternate 3:p8,t20,random:0.3 4:p9,t20,random:0.7 | name batched"


def _oracle() -> Oracle:
    return Oracle(workload_from_notation(BATCHED))


def _draft_by_rule(oracle: Oracle, rid: str, q: int) -> int:
    """The drafter's rule written out per position (workloads/tokens.py)."""
    kind, p = oracle._acceptance[rid]
    true = oracle.token_at(rid, q)
    return true if tokens.draft_is_correct(kind, p, oracle.workload.seed, rid, q) else (true + 1) % oracle.vocab


@pytest.mark.parametrize("k", [1, 3, 4])
def test_draft_rows_equal_the_rule_row_by_row(k):
    oracle, rng = _oracle(), random.Random(k)
    rids = [str(rng.randrange(len(KINDS))) for _ in range(64)]
    firsts = [rng.randrange(0, 120) for _ in rids]  # past the precomputed end too: extended in bulk
    batch = oracle.draft_rows(rids, firsts, k, [None] * len(rids)).tolist()
    assert batch == [[_draft_by_rule(oracle, r, f + j) for j in range(k)] for r, f in zip(rids, firsts)]
    assert batch == [oracle.drafts(r, f, k) for r, f in zip(rids, firsts)]


def test_mismatches_count_against_the_expected_tokens():
    oracle = _oracle()
    expected = [oracle.token_at("3", 8 + 10 + j) for j in range(4)]
    assert oracle.mismatches("3", 10, expected) == 0
    assert oracle.mismatches("3", 10, [expected[0], -5, expected[2], 7 if expected[3] != 7 else 8]) == 2


# ---------------------------------------------------------------------- acceptance per round
def test_listed_rounds_become_positions_a_correct_engine_verifies():
    """acceptance [2, 0, 3], prompt 10 (a prefix of 6 and its own 4), k = 3: round 1 drafts
    11..13 and accepts 11, 12; round 2 drafts 14..16 and accepts none; round 3 drafts 15..17 and
    accepts all; from 19 on the workload's rule (none here)."""
    oracle = Oracle(workload_from_notation("a:prefix=s,p4,t30,accept=2.0.3 | k3 none prefix s=p6"))
    right = [q for q in range(11, 40) if oracle.drafts("a", q, 1)[0] == oracle.token_at("a", q)]
    assert right == [11, 12, 15, 16, 17]
    first_draft, accepted = 11, []
    for _ in range(3):  # a correct engine: the drafts from its first draft up to the first wrong one
        drafts = oracle.drafts("a", first_draft, 3)
        n = next((j for j in range(3) if drafts[j] != oracle.token_at("a", first_draft + j)), 3)
        accepted.append(n)
        first_draft += n + 1
    assert accepted == [2, 0, 3]


@pytest.mark.parametrize("k", [1, 3])
def test_draft_rows_equal_the_drafts_row_by_row_with_listed_rounds_too(k):
    oracle = Oracle(workload_from_notation(f"0:p5,t40,accept={k}.0.1 1:p7,t40,accept=0.{k} 2:p4,t40 | k{k} random:0.5"))
    rng = random.Random(k)
    rids = [str(rng.randrange(3)) for _ in range(48)]
    firsts = [rng.randrange(0, 40) for _ in rids]
    batch = oracle.draft_rows(rids, firsts, k, [None] * len(rids)).tolist()
    assert batch == [oracle.drafts(r, f, k) for r, f in zip(rids, firsts)]
