"""Coverage: a trace without ground truth (a live vLLM engine's) names the codes the checker could
not run, derived from its null ground-truth columns; a trace with ground truth names none."""

from __future__ import annotations

import pytest

from specreplay.replay.check.catalogue import BY_CODE, CATALOGUE
from specreplay.replay.check.checker import NEEDED, Checker, check_report, check_trace, unchecked_codes
from specreplay.replay.check.coverage import GROUND_TRUTH, TRUTH_INPUTS
from tests.replay.check.truthless import NEED_TRUTH, without_ground_truth


def codes(trace) -> set[str]:
    return {f.code for f in check_trace(trace)}


def test_the_ground_truth_columns_are_the_ones_the_schema_says_hold_truth():
    assert set(GROUND_TRUTH) == {
        "apply_token_mismatches",
        "truth_num_computed_tokens",
        "truth_kv_after",
        "truth_kv_ok",
        "truth_kv_foreign_positions",
        "truth_kv_foreign_writer",
        "truth_kv_unowned_blocks",
        "truth_kv_block_owner",
        "truth_kv_unowned_writes",
        "truth_unfilled_draft_slots",
        "truth_cache_hit_valid",
        "truth_cache_hit_writer",
    }
    # What a vLLM trace with no ground truth leaves unchecked, in catalogue order (SGLang's G codes
    # are not about it: test_sglang_traces.py holds an SGLang trace's list).
    assert [row.code for row in CATALOGUE if row.code in TRUTH_INPUTS and "v1" in row.runners] == NEED_TRUTH


def test_a_trace_with_ground_truth_leaves_nothing_unchecked(reentry_traces):
    for trace in reentry_traces.values():
        assert unchecked_codes(trace) == []
        assert check_report(trace, trace.batches(NEEDED)).unchecked == []


def test_without_ground_truth_exactly_the_codes_that_compare_with_it_are_unchecked(reentry_traces):
    for trace in reentry_traces.values():
        bare = without_ground_truth(trace)
        assert unchecked_codes(bare) == NEED_TRUTH
        for rows in (1, 7, 1 << 20):  # streamed in batches: the same answer
            report = check_report(bare, bare.table.select(list(NEEDED)).to_batches(max_chunksize=rows))
            assert report.unchecked == NEED_TRUTH and report.findings == check_trace(bare)
        # The declaration matches the rules: what goes with the truth is findings of those codes only.
        assert codes(bare) <= codes(trace) and codes(trace) - codes(bare) <= set(NEED_TRUTH)
    # pr30796 breaks the first four (its blocks are its own): with ground truth each fires, without it none can.
    assert codes(reentry_traces["pr30796"]) - codes(without_ground_truth(reentry_traces["pr30796"])) == set(
        NEED_TRUTH[:4]
    )


def test_each_code_is_unchecked_only_when_its_own_columns_are_null(reentry_traces):
    trace = reentry_traces["pr30796"]
    assert unchecked_codes(without_ground_truth(trace, ("apply_token_mismatches",))) == ["T1-wrong-token"]
    assert unchecked_codes(without_ground_truth(trace, ("truth_kv_ok",))) == ["K1-kv-content"]
    assert unchecked_codes(without_ground_truth(trace, ("truth_num_computed_tokens",))) == [
        "S3-scheduler-computed-tokens",
        "X2-worker-kv-position",
    ]
    # Ground truth in some rows: checked where it is.
    assert unchecked_codes(without_ground_truth(trace, keep_rows=trace.num_rows // 2)) == []


@pytest.mark.parametrize(
    "chosen, expected",
    [
        (("T1-wrong-token", "X2-sched-worker-computed"), ["T1-wrong-token"]),
        (("X2-sched-worker-computed", "S5-draft-provenance"), []),
        (("K1-kv-content", "S3-scheduler-computed-tokens"), ["S3-scheduler-computed-tokens", "K1-kv-content"]),
    ],
)
def test_a_checker_of_some_codes_names_only_its_own_unchecked(reentry_traces, chosen, expected):
    bare = without_ground_truth(reentry_traces["upstream"])
    checker = Checker(bare.config, bare.outcome, invariants=[BY_CODE[code] for code in chosen])
    for batch in bare.batches(NEEDED):
        checker.feed(batch)
    checker.findings()
    assert checker.unchecked() == expected


@pytest.mark.vllm
def test_a_forced_live_engine_trace_has_token_ground_truth_and_none_for_the_kv_cache(live_reentry_trace):
    trace = live_reentry_trace
    assert trace.impl.engine == "vllm"
    kv = [code for code in NEED_TRUTH if code != "T1-wrong-token"]
    assert unchecked_codes(trace) == kv
    assert check_report(trace, trace.batches(NEEDED)).unchecked == kv
    assert not codes(trace) & set(NEED_TRUTH)  # T1 ran: the engine sampled the oracle's tokens


def test_a_model_runner_v2_trace_lists_the_v1_runner_codes_as_not_checked(reentry_traces):
    import dataclasses

    from specreplay.cli.render import unchecked_note

    trace = reentry_traces["pr30796"]
    v1_runner = [row.code for row in CATALOGUE if "v2" not in row.runners and "v1" in row.runners]
    assert v1_runner == [
        "X2-sched-worker-computed",
        "X2-worker-position-mismatch",
        "X3-output-length",
        "S5-draft-provenance",
        "X5-placeholder-drafts",
        "X12-padding-verified",
    ]
    mrv2 = {row.code for row in CATALOGUE if row.runners == ("v2",)}
    assert {code.split("-")[0] for code in mrv2} == {"M1", "M2", "M3", "M4", "M5", "M6"}
    # the same rows under an MRV2 header: the V1 runner codes do not run and are listed, with ground truth or not
    as_v2 = dataclasses.replace(trace, impl=dataclasses.replace(trace.impl, runner_family="v2"))
    assert codes(trace) & set(v1_runner) and not codes(as_v2) & set(v1_runner)
    assert unchecked_codes(as_v2) == v1_runner
    assert check_report(as_v2, as_v2.batches(NEEDED)).unchecked == v1_runner
    bare = without_ground_truth(as_v2)
    assert unchecked_codes(bare) == [row.code for row in CATALOGUE if row.code in NEED_TRUTH or row.code in v1_runner]
    # X12 reads the V1 drafter's truth: on an MRV2 trace it is the runner's, listed once.
    assert unchecked_note(unchecked_codes(bare)) == (
        f"no ground truth: {', '.join(c for c in NEED_TRUTH if c not in v1_runner)} not checked; "
        f"V1 runner state, not Model Runner V2's: {', '.join(v1_runner)} not checked"
    )
    # a V1 trace runs the V1 codes and does not list MRV2's: they are not about its runner
    assert unchecked_codes(trace) == [] and not codes(trace) & mrv2


def test_a_forced_live_trace_checks_its_tokens_and_names_the_kv_codes_it_cannot(reentry_traces):
    """A forced live trace (families/vllm/forced_logits.py) has the oracle's token ground truth but none
    for the KV cache: T1 runs, the KV codes are listed, and the note and each code's reason say which."""
    from specreplay.cli.render import unchecked_note
    from specreplay.replay.check.coverage import KV_TRUTH, why

    trace = reentry_traces["pr30796"]
    kv_only = without_ground_truth(trace, tuple(c for c in GROUND_TRUTH if c != "apply_token_mismatches"))
    kv_codes = [code for code in NEED_TRUTH if code != "T1-wrong-token"]
    assert [code for code in KV_TRUTH if "v1" in BY_CODE[code].runners] == kv_codes  # (and SGLang's G2, G5)
    assert unchecked_codes(kv_only) == kv_codes
    assert unchecked_note(unchecked_codes(kv_only)) == (
        f"no KV ground truth (tokens checked against the oracle, T1): {', '.join(kv_codes)} not checked"
    )
    # Without token truth either (an unforced live trace) the note is the old one, T1 included.
    assert unchecked_note(unchecked_codes(without_ground_truth(trace))).startswith("no ground truth: ")
    assert why("K1-kv-content") == "the trace holds no ground truth for the KV cache (a live engine's is not read)"
    assert why("T1-wrong-token") == "the trace holds no ground truth"
