"""merge's whole-step rule on hand-made rows: which trailing steps a stopped run loses."""

from specreplay.replay.workflows.merge import whole_steps


def row(step, rid, scheduled, worker):
    return {
        "step": step,
        "request_id": rid,
        "sched_num_scheduled_tokens": scheduled,
        "worker_num_scheduled_tokens": worker,
    }


def test_a_whole_last_step_and_its_announcement_are_kept():
    rows = [row(1, "a", 4, 4), row(2, "a", 4, 4), row(3, "a", 0, None)]
    assert whole_steps(rows) == (rows, [])


def test_a_step_cut_by_the_stop_goes_with_the_announcement_stepped_after_it():
    # Ctrl-C while the worker runs step 2; the core already stepped 3 to announce an abort.
    # (Before: the empty step 3 ended the scan and step 2 stayed, half recorded.)
    rows = [row(1, "a", 4, 4), row(2, "a", 4, None), row(2, "b", 1, 1), row(3, "a", 0, None)]
    kept, cut = whole_steps(rows)
    assert kept == rows[:1] and cut == [2, 3]


def test_the_scan_stops_at_the_last_whole_step():
    rows = [row(1, "a", 4, None), row(2, "a", 4, 4), row(3, "a", 0, None), row(4, "a", 4, None), row(5, "a", 4, None)]
    kept, cut = whole_steps(rows)
    assert kept == rows[:3] and cut == [4, 5]  # step 1's missing worker row is a finding, not a cut
