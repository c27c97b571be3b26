"""The reference SGLang worker (replay/families/sglang/worker.py) on its own, without SGLang: what it
emits and writes for an extend, a decode and an EAGLE v2 verify round, from the oracle's tokens.
(Under SGLang's real scheduler: tests/replay/engines/test_sglang_scheduler.py, in SGLang's environment.)"""

from __future__ import annotations

import pytest

from specreplay.replay.families.sglang.worker import DECODE, EXTEND, VERIFY, Row, SglangReferenceWorker, token_rows
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.oracle import Oracle


def worker(note: str, k: int = 3, slots: int = 64) -> tuple[SglangReferenceWorker, Oracle]:
    oracle = Oracle(workload_from_notation(note))
    return SglangReferenceWorker(oracle, slots, k), oracle


def test_an_extend_writes_its_chunk_and_samples_only_at_the_fill():
    w, oracle = worker("a:p6,t4 | k3")
    prompt = oracle.prompt("a")
    head, tail = w.extend([Row("a", 6, 0, tuple(prompt[:4]), (1, 2, 3, 4), fill_len=6)])[0], None
    assert head.kind == EXTEND and head.written == prompt[:4] and not head.samples and head.kept == 4
    assert head.emitted == [oracle.token_at("a", 4)]  # the model's token after position 3: a prompt token
    assert head.next_draft is None  # nothing sampled, nothing to draft after
    (tail,) = w.extend([Row("a", 6, 4, tuple(prompt[4:]), (5, 6), fill_len=6)])
    assert tail.samples and tail.emitted == [oracle.token_at("a", 6)]  # the first output
    assert tail.next_draft == oracle.drafts("a", 7, 3)[0]  # drafts follow the bonus at position 6
    tokens, writers = w.read_kv([1, 2, 3, 4, 5, 6, 7])
    assert tokens == prompt + [-1] and writers == [w.handle("a")] * 6 + [-1]


def test_a_decode_writes_its_input_and_emits_the_next_token():
    w, oracle = worker("a:p3,t4 | k0", k=0)
    seq = oracle.expected("a")
    (row,) = w.decode([Row("a", 3, 3, (seq[3],), (9,))])
    assert row.kind == DECODE and row.emitted == [seq[4]] and row.kept == 1 and row.next_draft is None
    assert w.read_kv([9]) == ([seq[3]], [w.handle("a")])


@pytest.mark.parametrize(
    "acceptance, accepted",
    [("all", 3), ("none", 0)],
)
def test_a_verify_round_accepts_the_leading_drafts_that_match(acceptance, accepted):
    w, oracle = worker(f"a:p3,t12,{acceptance} | k3")
    seq = oracle.expected("a")
    drafts = oracle.drafts("a", 5, 3)
    (row,) = w.verify([Row("a", 3, 4, (seq[4],), (10, 11, 12, 13), relayed_draft=drafts[0])])
    assert row.kind == VERIFY and row.drafts == drafts and row.accepted == accepted
    assert row.emitted == seq[5 : 5 + accepted + 1]  # the accepted drafts, then the correction
    assert row.kept == accepted + 1  # the bonus and the accepted drafts
    assert row.next_draft == oracle.drafts("a", 5 + accepted + 1, 3)[0]
    assert w.read_kv([10, 11, 12, 13])[0] == [seq[4], *drafts]  # all k + 1 written, rejected ones too


def test_the_relayed_first_draft_is_the_one_verified():
    """A wrong first draft relayed by the scheduler is what the round verifies: it rejects it."""
    w, oracle = worker("a:p3,t12,all | k3")
    seq = oracle.expected("a")
    (row,) = w.verify([Row("a", 3, 4, (seq[4],), (10, 11, 12, 13), relayed_draft=seq[5] + 1)])
    assert row.drafts[0] == seq[5] + 1 and row.accepted == 0 and row.emitted == [seq[5]]


def test_negative_inputs_are_counted_and_rows_pad_to_the_width():
    w, oracle = worker("a:p3,t4 b:p3,t4 | k0", k=0)
    a, b = w.decode([Row("a", 3, 3, (-1,), (5,)), Row("b", 3, 3, (7,), (6,))])
    assert (a.negative_inputs, b.negative_inputs) == (1, 0)
    assert w.last_forward == [a, b]
    a.emitted = [7, 8]
    assert token_rows([a, b], 4) == [7, 8, 0, 0, oracle.token_at("b", 4), 0, 0, 0]


@pytest.mark.gpu
def test_the_worker_on_cuda_writes_and_reads_what_it_does_on_the_cpu():
    oracle = Oracle(workload_from_notation("a:p3,t12,alternate | k3"))
    seq = oracle.expected("a")
    row = Row("a", 3, 4, (seq[4],), (10, 11, 12, 13), relayed_draft=oracle.drafts("a", 5, 3)[0])
    done = {}
    for device in ("cpu", "cuda"):
        w = SglangReferenceWorker(oracle, 64, 3, device)
        (result,) = w.verify([row])
        done[device] = (result.emitted, result.accepted, w.read_kv([10, 11, 12, 13, 14]))
    assert done["cuda"] == done["cpu"]
