"""The batched hot paths give what the per-row ones gave: the oracle's drafts and mismatches for
a whole batch, the recorder's bulk column fills (issue 20)."""

from __future__ import annotations

import random

import pytest

from specreplay.replay.record.recorder import Recorder
from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.workload import RequestSpec, Workload

KINDS = ("all", "none", "alternate", "random:0.3", "random:0.7")


def _oracle() -> Oracle:
    specs = tuple(RequestSpec(str(i), 1, 5 + i, 20, acceptance=a) for i, a in enumerate(KINDS))
    return Oracle(Workload(specs, EngineConfig(), name="batched"))


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


def test_fill_columns_is_fill_row_by_row():
    one, bulk = Recorder(), Recorder()
    rows = [(str(i),) + (None,) * 19 for i in range(5)]
    for rec in (one, bulk):
        rec.append_step(1, 5, "", rows)
    values = {"worker_row": [4, 3, 2], "worker_draft_ids": [[1], [], [2, 3]]}
    at = [4, 0, 2]
    for i, row in enumerate(at):
        one.fill(row, {name: column[i] for name, column in values.items()})
    bulk.fill_columns(at, values)
    assert one.cols == bulk.cols


def test_fill_column_groups_is_fill_many_row_by_row():
    """The apply columns written column by column land as the old per-row fills did, and a
    recorder that streams its fills (overrides fill_many, as the live sink's does) still gets
    one fill_many call with a dict per row, in column order."""

    class Streaming(Recorder):
        def __init__(self):
            super().__init__()
            self.calls = []

        def fill_many(self, fills):
            self.calls.append(fills)
            super().fill_many(fills)

    one, bulk, streaming = Recorder(), Recorder(), Streaming()
    rows = [(str(i),) + (None,) * 19 for i in range(5)]
    for rec in (one, bulk, streaming):
        rec.append_step(1, 5, "", rows)
    groups = [
        (
            [3, 1],
            {"apply_step": [2, 2], "apply_outcome": ["applied", "dropped"], "apply_sampled_token_ids": [(5,), ()]},
        ),
        ([4], {"apply_step": [2], "apply_outcome": ["ignored"]}),
        ([], {"apply_step": [], "apply_outcome": []}),
    ]
    fills = [
        (3, {"apply_step": 2, "apply_outcome": "applied", "apply_sampled_token_ids": (5,)}),
        (1, {"apply_step": 2, "apply_outcome": "dropped", "apply_sampled_token_ids": ()}),
        (4, {"apply_step": 2, "apply_outcome": "ignored"}),
    ]
    one.fill_many(fills)
    bulk.fill_column_groups(groups)
    streaming.fill_column_groups(groups)
    assert one.cols == bulk.cols == streaming.cols
    assert streaming.calls == [fills]
    assert [list(d) for _, d in streaming.calls[0]] == [list(d) for _, d in fills]
    assert one.table().equals(bulk.table())
