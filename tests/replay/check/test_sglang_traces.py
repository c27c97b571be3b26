"""The checker on SGLang traces, in the main environment: the committed SGLang recordings
(tests/replay/check/sglang_traces.py, recorded in SGLang's environment and held to the engine
there by test_sglang_codes.py).

What each G code finds on them, evidence included; the row-by-row statement finds the same on
them and on hundreds of mutations of them; and coverage: an SGLang trace runs SGLang's codes
and the codes both engines share, never lists vLLM's as not checked, and a vLLM trace does not
list SGLang's.
"""

from __future__ import annotations

import functools
import random

import pytest

from specreplay.replay.check.catalogue import ALL, BY_CODE, CATALOGUE, SGLANG
from specreplay.replay.check.checker import check_report, check_trace, columns_needed, unchecked_codes
from specreplay.replay.check.coverage import TRUTH_INPUTS
from specreplay.traces.io import read_trace
from specreplay.traces.validate import RowValidator
from tests.replay.check import rowwise_checker
from tests.replay.check.sglang_traces import TRACES, UPSTREAM_ERRORS, path
from tests.replay.check.test_checker_equivalence import mutated, same_findings
from tests.replay.check.truthless import without_ground_truth

G_CODES = [row.code for row in CATALOGUE if row.runners == SGLANG]


@functools.cache
def trace(name: str):
    return read_trace(path(name))


def findings(name: str, code: str) -> list:
    return [f for f in check_trace(trace(name)) if f.code == code]


@pytest.mark.parametrize("name", sorted(TRACES))
def test_each_trace_has_exactly_its_g_codes_and_the_rowwise_statement_agrees(name):
    t = trace(name)
    assert t.impl.runner_family == "sglang" and t.impl.engine == "sglang-scheduler"
    found = {f.code for f in check_trace(t)}
    assert {c for c in found if c.startswith("G")} == TRACES[name][2], name
    if TRACES[name][1] == "upstream" and name not in UPSTREAM_ERRORS:
        assert all(BY_CODE[c].severity == "warning" for c in found)  # upstream: no error
    same_findings(t)


def test_the_g_codes_are_sglang_s_and_the_shared_codes_every_engine_s():
    assert G_CODES == [
        "G1-committed-past-allocated",
        "G2-committed-past-written",
        "G3-stale-result-applied",
        "G4-retracted-next-life",
        "G5-overcommit-at-finish",
        "G6-future-map-order",
        "G7-sglang-own-check",
        "G8-delivered-past-max-tokens",
        "G9-client-tokens",
        "G10-turn-past-computed",
    ]
    assert [r.code for r in CATALOGUE if r.runners == ALL] == [
        "X1-batch-membership",
        "S8-token-lost",
        "T1-wrong-token",
        "K1-kv-content",
        "K2-kv-foreign-tokens",
        "K3-kv-unowned-block",
        "K4-kv-write-unowned",
        "E1-engine-crash",
        "E2-run-incomplete",
    ]
    assert BY_CODE["G5-overcommit-at-finish"].severity == "warning"
    assert all(BY_CODE[c].severity == "error" for c in G_CODES if c != "G5-overcommit-at-finish")


# ====================================================================== each code's evidence
def test_g1_a_retracted_request_whose_late_result_committed_its_accept_length():
    """sglang-stale-commit (#23456): request 3's verify of step 6 comes back at step 7, after the
    scheduling of step 7 retracted it (committed 0, no KV), and commits 4."""
    first = findings("stale-commit", "G1-committed-past-allocated")[0]
    assert (first.step, first.request_id, first.expected, first.actual) == (7, "3", 0, 4)
    assert first.facts() == {"result_step": 6, "retracted": True}
    live = findings("commit-past-allocated", "G1-committed-past-allocated")
    assert [(f.step, f.request_id, f.expected, f.actual) for f in live] == [(1, "a", 4, 5)]


def test_g2_the_bonus_committed_before_any_forward_wrote_it():
    """BonusClaimedAtApply, no overlap: each verify commits seqlen, one past the KV it wrote."""
    found = findings("bonus-claimed", "G2-committed-past-written")
    assert {f.request_id for f in found} == set("abcde")
    a = next(f for f in found if f.request_id == "a")
    assert (a.step, a.expected, a.actual) == (5, 8, 9) and a.facts() == {"result_step": 5, "truth_step": 5}


def test_g3_late_verify_results_of_finished_and_retracted_requests():
    found = findings("stale-commit", "G3-stale-result-applied")
    retracted = [f for f in found if f.facts()["reason"] == "retracted"]
    finished = [f for f in found if f.facts()["reason"] == "finished"]
    assert retracted and finished
    f = next(f for f in finished if f.request_id == "0")
    assert (f.step, f.expected, f.actual) == (8, "ignored", "applied")
    assert f.facts()["kv_before"] == (24, 0) and f.facts()["kv_after"] == (28, 0) and f.facts()["apply_step"] == 9
    assert "moved kv_committed_len 24 -> 28" in f.message


def test_g4_a_retraction_that_drops_an_output():
    (f,) = findings("drops-last-output", "G4-retracted-next-life")
    assert (f.step, f.request_id, f.expected, f.actual) == (20, "2", 17, 16)
    assert f.facts() == {"reason": "dropped", "retracted_at": 20, "outputs_kept": 17}


def test_g5_upstream_overlap_releases_one_position_more_at_a_stop_and_an_abort():
    """#24590's shape on SGLang 0.5.23: c's stop and e's abort under overlap; the fix has none."""
    found = findings("upstream-overlap-nospec", "G5-overcommit-at-finish")
    assert [(f.request_id, f.facts()["finish"], f.expected, f.actual) for f in found] == [
        ("e", "aborted", 4, 5),
        ("c", "stop", 5, 6),
    ]
    # Dated where the damage is: the step that scheduled the wasted forward, under overlap the
    # step after the one whose result finished the request (issue 45, item 4); that row is the
    # one that holds the forward (scheduled tokens, its KV truth).
    rows = trace("upstream-overlap-nospec").table.to_pylist()
    for f in found:
        facts = f.facts()
        assert f.step == facts["result_step"] + 1 and facts["apply_step"] == f.step, facts
        (row,) = [r for r in rows if r["step"] == f.step and r["request_id"] == f.request_id]
        assert row["sched_num_scheduled_tokens"] > 0 and row["truth_num_computed_tokens"] == f.expected
    assert findings("finish-trim", "G5-overcommit-at-finish") == []

    # The fix gives back exactly the position the overlap's extra decode booked, for c and e alone.
    def owned(name: str) -> dict[str, int]:
        rows = trace(name).table.select(["request_id", "apply_owned_kv_len"]).to_pylist()
        return {r["request_id"]: r["apply_owned_kv_len"] for r in rows if r["apply_owned_kv_len"] is not None}

    upstream, fixed = owned("upstream-overlap-nospec"), owned("finish-trim")
    assert {rid: upstream[rid] - fixed[rid] for rid in upstream} == {"a": 0, "b": 0, "c": 1, "d": 0, "e": 1}


def test_g6_verify_rounds_run_at_the_scheduler_s_stale_seq_lens():
    found = findings("seq-lens-not-resolved", "G6-future-map-order")
    assert {f.request_id for f in found} == set("abcde")
    a = next(f for f in found if f.request_id == "a")
    assert (a.step, a.expected, a.actual) == (6, 8, 4)
    assert a.facts() == {"published_step": 5, "sched_seq_len": 4, "verify": True}


def test_g7_names_the_sglang_check_that_failed_instead_of_a_bare_crash():
    (f,) = findings("commit-past-allocated", "G7-sglang-own-check")
    assert trace("commit-past-allocated").outcome.status == "crashed"
    assert f.actual == "0 <= kv_committed_len <= kv_allocated_len <= row width for every request holding KV"
    assert f.facts()["check_source"] == "managers/scheduler_components/invariant_checker.py:359"
    assert "AssertionError: assert 0 <= kv.kv_committed_len" in f.message
    assert not findings("commit-past-allocated", "E1-engine-crash")  # G7 instead, not beside it


def test_g8_an_abort_in_the_round_that_crossed_max_tokens_delivers_the_whole_round():
    (f,) = findings("abort-past-max", "G8-delivered-past-max-tokens")
    assert (f.request_id, f.expected, f.actual) == ("b", 12, 13)
    assert trace("abort-past-max").outcome.engine_output_tokens == {"b": 13}


def test_g9_a_retraction_that_marks_the_output_sent_keeps_it_from_the_client():
    # Request 2 is retracted with 17 tokens streamed; its re-prefill samples the 18th, which the
    # stream marks sent without sending: its client has 19 tokens, the 18th missing, so its token
    # 17 is the worker's 19th (198), where the worker sampled 462.
    (f,) = findings("marks-output-sent", "G9-client-tokens")
    received = trace("marks-output-sent").outcome.engine_output_ids
    assert (f.request_id, f.expected, f.actual) == ("2", 462, received["2"][17]) and len(received["2"]) == 19
    assert f.facts() == {"output_index": 17, "client_tokens": 19}
    # Every other request's client got, in order, what the worker sampled; upstream's clients all do.
    assert all(len(ids) == 20 for rid, ids in received.items() if rid != "2")
    for name in ("upstream-retract-nospec", "upstream-retract-spec", "upstream-overlap-spec"):
        assert trace(name).outcome.engine_output_ids and not findings(name, "G9-client-tokens")


# ====================================================================== coverage
def test_g10_a_turn_that_starts_past_the_kv_its_session_computed():
    """Turn 2 of session s prefills from position 12; the forwards of turn 1 wrote KV up to 11 (its
    last round's correction token has none): G10 from the worker's inputs, with or without the KV
    truth (which adds K1). The session beside a plain request in upstream-session: nothing."""
    (f,) = findings("session-overclaim", "G10-turn-past-computed")
    assert (f.step, f.request_id, f.expected, f.actual) == (20, "s", 11, 12)
    assert f.facts()["frontier_step"] == 8 and f.facts()["turn_step"] == 20
    assert {g.code for g in check_trace(without_ground_truth(trace("session-overclaim")))} == {f.code}
    assert check_trace(trace("upstream-session")) == []


def test_an_sglang_trace_lists_no_vllm_code_and_a_vllm_trace_no_sglang_code(reentry_traces):
    vllm_only = {row.code for row in CATALOGUE if "sglang" not in row.runners}
    for name in TRACES:
        t = trace(name)
        report = check_report(t, t.batches(columns_needed(t)))
        assert report.unchecked == [] and unchecked_codes(t) == []
        assert not {f.code for f in report.findings} & vllm_only
    # Without ground truth: exactly the truth codes of SGLang and of both engines, not vLLM's.
    bare = without_ground_truth(trace("upstream-overlap-spec"))
    expected = [row.code for row in CATALOGUE if row.code in TRUTH_INPUTS and "sglang" in row.runners]
    assert expected == [
        "T1-wrong-token",
        "K1-kv-content",
        "K2-kv-foreign-tokens",
        "K3-kv-unowned-block",
        "K4-kv-write-unowned",
        "G2-committed-past-written",
        "G5-overcommit-at-finish",
    ]
    assert unchecked_codes(bare) == expected == check_report(bare, bare.batches(columns_needed(bare))).unchecked
    for t in reentry_traces.values():  # vLLM traces: the G codes neither run nor are listed
        assert not set(unchecked_codes(without_ground_truth(t))) & set(G_CODES)
        assert not {f.code for f in check_trace(t)} & set(G_CODES)


# ====================================================================== the row-by-row statement
def test_same_findings_on_mutated_sglang_traces():
    rng = random.Random(20261206)
    names = sorted(TRACES)
    fired: set[str] = set()
    for case in range(300):
        t = mutated(trace(rng.choice(names)), rng, edits=rng.randint(1, 6))
        RowValidator(f"case {case}").check(t.table)
        expected = rowwise_checker.check_trace(t)
        fired |= {f.code for f in expected}
        assert check_trace(t, batch_rows=rng.choice((1, 3, 17, 1 << 20))) == expected, f"case {case}"
    assert set(G_CODES) - {"G7-sglang-own-check"} <= fired, sorted(fired)  # G7 is the outcome's, not a row's
