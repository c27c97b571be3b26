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
