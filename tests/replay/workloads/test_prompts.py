"""Prompts (replay/workloads/prompts.py): explicit ids, a shared prefix before a request's own
text, and a conversation's next turn (the turn before's prompt, its answer, the new text), as
the oracle hands them to every engine and builds its expected sequences on them."""

from __future__ import annotations

from specreplay.replay.workloads import tokens
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.prompts import answer
from specreplay.replay.workloads.workload import Workload


def seeded(workload: Workload, rid: str, length: int) -> list[int]:
    """A plain request's prompt: `length` tokens from the seed and its id, as always."""
    return tokens.prompt_tokens(workload.seed, rid, length, workload.config.vocab_size)


def test_a_plain_request_s_prompt_is_the_seeded_one_it_always_was():
    workload = workload_from_notation("a:p9 b:p4 | seed 5")
    assert Oracle(workload).prompt("a") == seeded(workload, "a", 9)
    assert workload.prompt_len_of("b") == 4


def test_explicit_ids_are_the_prompt_as_given():
    workload = workload_from_notation("a:prompt=7.1.4.4,t3 | vocab 64")
    assert Oracle(workload).prompt("a") == [7, 1, 4, 4]
    assert workload.requests[0].prompt_len == workload.prompt_len_of("a") == 4


def test_requests_naming_a_prefix_share_its_tokens_then_have_their_own_seeded_text():
    workload = workload_from_notation(
        "a:prefix=sys,p5 b:prefix=sys,p7 c:prefix=doc,prompt=9.9 | prefix sys=p40 prefix doc=3.2.1"
    )
    oracle = Oracle(workload)
    a, b = oracle.prompt("a"), oracle.prompt("b")
    assert a[:40] == b[:40] == workload.prompts.prefix("sys")
    assert a[40:] == seeded(workload, "a", 5) and b[40:] == seeded(workload, "b", 7)
    assert oracle.prompt("c") == [3, 2, 1, 9, 9]
    assert [workload.prompt_len_of(r) for r in "abc"] == [45, 47, 5]
    # Three full 16-token blocks are not all shared: 40 tokens fill two, the third holds 8 of them.
    assert a[:32] == b[:32] and a[:48] != b[:48]


def test_a_follow_up_s_prompt_is_the_turn_before_its_answer_and_its_new_text():
    workload = workload_from_notation("q0:p6,t5 q1:follows=q0,p3,t4 q2:follows=q1,prompt=8.8,t2")
    oracle = Oracle(workload)
    q0, q1 = oracle.expected("q0"), oracle.expected("q1")
    assert oracle.prompt("q1") == q0[:6] + q0[6:11] + seeded(workload, "q1", 3)
    assert oracle.prompt("q2") == q1[:14] + q1[14:18] + [8, 8]
    assert workload.prompt_len_of("q2") == 14 + 4 + 2
    # Each turn's own outputs still follow its own hash (the target model's rule is per request).
    assert q1[14] == tokens.next_token(oracle.hash("q1"), 13, q1[13], workload.config.vocab_size)


def test_the_answer_of_a_request_with_a_stop_token_ends_at_its_first_occurrence():
    """vLLM's stop_token_ids end the output at the first token equal to it, which can come before
    the stop_at-th output: the answer sent back is what the engine emitted, stop token included."""
    for seed in range(200):
        workload = workload_from_notation(f"q0:p3,t30,stop12 q1:follows=q0,p2 | seed {seed} vocab 8")
        oracle = Oracle(workload)
        outputs = oracle.expected("q0")[3:33]
        stop = oracle.stop_token("q0")
        if outputs.index(stop) < 11:  # an earlier occurrence than the 12th output
            break
    else:
        raise AssertionError("no seed puts the stop token early")
    got = answer(workload.requests[0], oracle.prompt("q0"), workload.seed, 8)
    assert got == outputs[: outputs.index(stop) + 1]
    assert oracle.prompt("q1") == oracle.prompt("q0") + got + seeded(workload, "q1", 2)


def test_the_oracle_s_expected_sequence_starts_with_the_whole_prompt():
    workload = workload_from_notation("a:prefix=sys,p5,t6,stop3 b:follows=a,p4,t5 | prefix sys=p20")
    oracle = Oracle(workload)
    for rid in ("a", "b"):
        prompt = oracle.prompt(rid)
        assert oracle.expected(rid)[: len(prompt)] == prompt
        assert oracle.mismatches(rid, 0, oracle.expected(rid)[len(prompt) : len(prompt) + 3]) == 0
    assert oracle.stop_token("a") == oracle.expected("a")[25 + 2]


def test_a_conversation_of_many_turns_resolves_in_a_walk():
    """Thousands of turns (each stopping at its first output): no recursion limit, no quadratic
    rebuild of every turn before; the lengths add up turn by turn."""
    turns = [{"id": "t0", "prompt_len": 2, "max_tokens": 1}] + [
        {"id": f"t{i}", "follows": f"t{i - 1}", "prompt_len": 1, "max_tokens": 1, "stop_at": 1} for i in range(1, 3000)
    ]
    workload = Workload.from_dict({"requests": turns, "config": {"max_model_len": 10_000, "num_blocks": 1000}})
    assert workload.prompt_len_of("t2999") == 2 + 2 * 2999
    prompt = Oracle(workload).prompt("t2999")
    assert len(prompt) == 6000 and prompt[:3] == Oracle(workload).prompt("t1")[:3]


def test_a_prompt_sent_as_embeddings_has_its_own_seeded_tokens_as_any_prompt():
    """An input_embeds request's embedding rows stand for tokens (the SGLang driver encodes one
    per row): its prompt, and so the KV the truth expects and the model's rule, are its seeded
    tokens, as if sent as ids; only what the engine is sent differs."""
    plain, embedded = (workload_from_notation(f"e:p5,t4{flag}") for flag in ("", ",embeds"))
    assert Oracle(embedded).prompt("e") == Oracle(plain).prompt("e") == seeded(plain, "e", 5)
    assert Oracle(embedded).expected("e") == Oracle(plain).expected("e")
    assert embedded.to_dict()["requests"][0]["input_embeds"] is True
