"""X11 and vLLM's ngram_gpu drafter: the draft slots it trims because it proposed no valid draft
for them are its normal work, not booked work lost, so no warning; any other cut still is one.

vLLM 0.32.0 (ngram_proposer_gpu.py:472-513, from GPUModelRunner._update_states) cuts each request
it ran the step before down to 1 + the leading valid drafts it proposed for it, in the worker's
copy of the SchedulerOutput. On a live trace nearly every decode row shows it (step 2 of the
re-entry run: booked 4 tokens with 3 slots, ran 1). A trace without ground truth is a live vLLM
engine's to the checker; `without_ground_truth` makes one from a reference trace, so the rule is
tested here without vllm too."""

from __future__ import annotations

import random

import pytest

from specreplay.replay.check.checker import check_trace
from tests.replay.check import rowwise_checker
from tests.replay.check.test_checker import mutate
from tests.replay.check.truthless import without_ground_truth

X11 = "X11-executed-other-work"
# In the reference's re-entry trace, step 4: request 2 was run at step 3 (3 drafts cached, 4
# tokens booked with 3 slots); request 10 re-enters after a budget skip (nothing cached).
CACHED, REENTRY = (4, "2"), (4, "10")


def edit(trace, at: tuple[int, str], **values):
    """`trace` with row (step, request) given `values` (column -> value)."""
    for column, value in values.items():
        trace = mutate(trace, column, *at, value)
    return trace


def x11(trace) -> list:
    """The X11 findings; the row-by-row checker finds the same, evidence included."""
    findings = check_trace(trace)
    assert findings == rowwise_checker.check_trace(trace)
    return [f for f in findings if f.code == X11]


def trimmed(trace, at=CACHED, slots: int = 0, drafts=None):
    """Row `at` cut as ngram_gpu cuts it: `slots` of the 3 draft slots kept, the others off the tokens."""
    kept = [285, 190, 334][:slots] if drafts is None else drafts
    return edit(trace, at, worker_num_scheduled_tokens=1 + slots, worker_num_draft_slots=slots, worker_draft_ids=kept)


@pytest.fixture(scope="module")
def bare(reentry_traces):
    """The reference upstream trace as a live engine records it: no ground truth."""
    return without_ground_truth(reentry_traces["upstream"])


@pytest.mark.parametrize("slots", [0, 1, 2])
def test_the_drafters_trim_is_not_a_warning(bare, slots):
    assert x11(trimmed(bare, slots=slots)) == []


@pytest.mark.parametrize("slots", [0, 2])
def test_the_reference_runner_never_trims_so_the_same_cut_is_a_warning(reentry_traces, slots):
    (found,) = x11(trimmed(reentry_traces["upstream"], slots=slots))
    assert (found.step, found.request_id, found.expected, found.actual) == (4, "2", 4, 1 + slots)
    assert found.facts() == {
        "sched_num_draft_slots": 3,
        "worker_num_draft_slots": slots,
        "worker_cached_drafts": 3,
        "reason": "runner_never_trims",
    }


@pytest.mark.parametrize(
    "at, values, reason",
    [
        # A request the worker did not run the step before is never trimmed: pr30796's cut.
        (
            REENTRY,
            {"worker_num_scheduled_tokens": 1, "worker_num_draft_slots": 0, "worker_draft_ids": []},
            "no_cached_drafts",
        ),
        # Booked work lost beyond the drafts: 2 slots kept but only 2 tokens run (the token to verify them lost).
        (
            CACHED,
            {"worker_num_scheduled_tokens": 2, "worker_num_draft_slots": 2, "worker_draft_ids": [285, 190]},
            "not_only_draft_slots",
        ),
        # Every slot kept and a token lost.
        (CACHED, {"worker_num_scheduled_tokens": 3}, "not_only_draft_slots"),
        # More than booked.
        (
            CACHED,
            {"worker_num_scheduled_tokens": 5, "worker_num_draft_slots": 4, "worker_draft_ids": [1, 2, 3, 4]},
            "not_only_draft_slots",
        ),
        # The trim keeps only the leading valid drafts: a -1 kept means slots went some other way.
        (
            CACHED,
            {"worker_num_scheduled_tokens": 3, "worker_num_draft_slots": 2, "worker_draft_ids": [285, -1]},
            "drafts_fed",
        ),
        (
            CACHED,
            {"worker_num_scheduled_tokens": 3, "worker_num_draft_slots": 2, "worker_draft_ids": [285]},
            "drafts_fed",
        ),
        # The trim edits the worker's copy: the scheduler reading the cut back is not it (and X10).
        (
            CACHED,
            {
                "worker_num_scheduled_tokens": 1,
                "worker_num_draft_slots": 0,
                "worker_draft_ids": [],
                "apply_num_scheduled_tokens": 1,
                "apply_num_draft_slots": 0,
            },
            "scheduler_output_edited",
        ),
    ],
    ids=[
        "reentry",
        "lost-token",
        "lost-token-all-slots",
        "more-than-booked",
        "kept-placeholder",
        "fed-fewer",
        "edited-copy",
    ],
)
def test_work_lost_beyond_the_trim_is_a_warning(bare, at, values, reason):
    (found,) = x11(edit(bare, at, **values))
    assert (found.step, found.request_id, found.severity) == (at[0], at[1], "warning")
    assert found.facts()["reason"] == reason


def test_pr30796_drops_slots_on_reentry_which_no_drafter_trim_explains(reentry_traces):
    for trace in (reentry_traces["pr30796"], without_ground_truth(reentry_traces["pr30796"])):
        (found,) = x11(trace)
        assert (found.step, found.request_id, found.facts()["reason"]) == (4, "10", "no_cached_drafts")


def test_both_checkers_agree_on_random_cuts(reentry_traces):
    """Random cuts of random rows, trim-shaped or not, with and without ground truth."""
    rng = random.Random(20261130)
    outcomes = set()
    for _ in range(150):
        trace = reentry_traces[rng.choice(("upstream", "pr30796", "sched-clear"))]
        trace = without_ground_truth(trace) if rng.random() < 0.8 else trace
        steps, rids = trace.table["step"].to_pylist(), trace.table["request_id"].to_pylist()
        booked = trace.table["sched_num_draft_slots"].to_pylist()
        ran = trace.table["worker_num_scheduled_tokens"].to_pylist()
        row = rng.choice([i for i, n in enumerate(ran) if n is not None])
        slots = rng.randint(0, booked[row])
        drafts = [rng.choice((7, 7, 7, -1)) for _ in range(slots + rng.choice((0, 0, 0, -1, 1)) if slots else 0)]
        cut = edit(
            trace,
            (steps[row], rids[row]),
            worker_num_scheduled_tokens=ran[row] - booked[row] + slots + rng.choice((0, 0, 0, -1, 1)),
            worker_num_draft_slots=slots,
            worker_draft_ids=drafts,
        )
        outcomes.add(bool(x11(cut)))
    assert outcomes == {True, False}


@pytest.mark.vllm
def test_a_live_engine_trace_has_trimmed_rows_and_no_x11(live_ngram_reentry_trace):
    df = live_ngram_reentry_trace.table.to_pandas()
    cut = df[df.worker_num_scheduled_tokens < df.sched_num_scheduled_tokens]
    assert len(cut) >= 10, "the live run should show ngram_gpu's trim"  # 42 rows when measured
    assert (
        cut.sched_num_scheduled_tokens - cut.worker_num_scheduled_tokens
        == cut.sched_num_draft_slots - cut.worker_num_draft_slots
    ).all()
    assert x11(live_ngram_reentry_trace) == []


@pytest.mark.vllm
def test_a_live_row_that_lost_more_than_the_trim_is_a_warning(live_ngram_reentry_trace):
    df = live_ngram_reentry_trace.table.to_pandas()
    cut = df[df.worker_num_scheduled_tokens < df.sched_num_scheduled_tokens].iloc[0]
    at = (int(cut.step), cut.request_id)
    # The trimmed row ran one token fewer than it kept draft slots for.
    lost = edit(live_ngram_reentry_trace, at, worker_num_scheduled_tokens=int(cut.worker_num_scheduled_tokens) - 1)
    (found,) = x11(lost)
    assert (found.step, found.request_id, found.facts()["reason"]) == (*at, "not_only_draft_slots")
    # A re-entering request's slots dropped, as pr30796 drops them: no drafter trims those.
    reentry = df[(df.sched_kind == "reentering") & (df.sched_num_draft_slots > 0)].iloc[0]
    at = (int(reentry.step), reentry.request_id)
    dropped = edit(
        live_ngram_reentry_trace,
        at,
        worker_num_scheduled_tokens=int(reentry.sched_num_scheduled_tokens - reentry.sched_num_draft_slots),
        worker_num_draft_slots=0,
        worker_draft_ids=[],
    )
    (found,) = x11(dropped)
    assert (found.step, found.request_id, found.facts()["reason"]) == (*at, "no_cached_drafts")
