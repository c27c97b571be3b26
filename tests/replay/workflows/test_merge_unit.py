"""merge on hand-made input: the whole-step rule (which trailing steps a stopped run loses), and part
folders with an unknown runner, a process that could not record, and no step at all."""

import functools

from specreplay.replay.workflows.merge import unapply_cut, whole_steps


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


def test_what_the_cut_iteration_applied_is_taken_back():
    """Async: iteration 3 schedules step 3 and applies step 2's output. Cut inside it, the trace
    ends with iteration 2: step 2's output unapplied, as a replay of two steps leaves it (a served
    MRV2 run stopped while the worker still ran the step after the last request finished)."""
    rows = [row(1, "a", 4, 4), row(2, "a", 4, 4), row(3, "a", 4, None)]
    rows[0].update(apply_step=2, apply_outcome="applied", apply_num_tokens=3)
    rows[1].update(apply_step=3, apply_outcome="applied", apply_num_tokens=3, apply_finish_reason="length")
    kept, cut = whole_steps(rows)
    assert cut == [3] and unapply_cut(kept, cut[0]) == [2]
    assert kept[0]["apply_outcome"] == "applied" and kept[0]["apply_num_tokens"] == 3
    assert kept[1]["apply_step"] is kept[1]["apply_outcome"] is kept[1]["apply_finish_reason"] is None
    assert kept[1]["sched_num_scheduled_tokens"] == 4  # what the schedule recorded stays


# ---------------------------------------------------------------------- hand-made part folders
def write_part(folder, name, *events):
    import json

    folder.mkdir(exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


@functools.cache
def reentry_run():
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workflows.record import pick_workload

    workload = pick_workload("reentry")
    return workload, run_workload(workload, resolve("upstream", allow_import=False)).table


def core_part(folder, steps):
    """An engine core's part: the scheduler rows of the reference engine's reentry run at `steps`
    (its worker columns left out: the core process writes none), its config and requests."""
    workload, table = reentry_run()
    names = [n for n in table.column_names if not n.startswith(("worker_", "truth_"))]
    rows = [[r[n] for n in names] for r in table.select(names).to_pylist() if r["step"] in steps]
    requests = [
        {
            "e": "request",
            "id": r.request_id,
            "step": r.arrival_step,
            "prompt": [1] * r.prompt_len,
            "max_tokens": r.max_tokens,
        }
        | {"streaming": False}
        for r in workload.requests
    ]
    write_part(
        folder,
        "core-1-1",
        {"e": "part", "run": "r1", "role": "core", "pid": 1, "vllm": "0.32.0", "patches": []},
        {"e": "config", "config": workload.config.to_dict(), "drafter": "ngram", "model": "m"},
        *requests,
        *([{"e": "rows", "names": names, "rows": rows}] if rows else []),
    )


def test_an_unknown_runner_keeps_the_scheduler_view_and_says_the_worker_view_was_not_recorded(tmp_path):
    from click.testing import CliRunner

    from specreplay.cli.main import main
    from specreplay.replay.engines.registry import known_runners
    from specreplay.replay.workflows.merge import merge_folder

    folder = tmp_path / "rec"
    core_part(folder, [1, 2, 3])
    write_part(
        folder,
        "runner-2-1",
        {"e": "part", "run": "r1", "role": "runner", "pid": 2, "vllm": "0.32.0", "patches": []},
        {"e": "unknown_runner", "runner": "fork.worker.ForkRunner", "known": known_runners()},
    )
    merged = merge_folder(folder)
    (line,) = merged.dropped
    assert "fork.worker.ForkRunner" in line and known_runners() in line and "not recorded" in line
    assert "never arrived" not in line
    trace = merged.trace
    assert trace.num_steps == 3 and trace.impl.runner == "fork.worker.ForkRunner"  # nothing cut
    assert trace.outcome.status == "partial" and "worker view" in trace.outcome.message
    result = CliRunner().invoke(main, ["merge", str(folder), "-o", str(tmp_path / "run.parquet")])
    dropped = [x for x in result.output.splitlines() if x.startswith("dropped:")]
    assert dropped == [f"dropped: {line}"], result.output
    # No worker view: specreplay's blind spot is not the engine's fault. No code that compares with
    # the worker view runs (X1 would find every scheduled row without its worker row), and the
    # summary says why they did not.
    from specreplay.replay.check.checker import NEEDED, check_report
    from specreplay.traces.header import UNOBSERVED_RUNNER

    assert trace.impl.runner_family == UNOBSERVED_RUNNER
    report = check_report(trace, trace.table.select(list(NEEDED)).to_batches())
    assert not [f for f in report.findings if f.code[0] in "XM"], report.findings
    assert "X1-batch-membership" in report.unchecked and "M3-draft-origin" in report.unchecked
    # The scheduler view's codes ran and found nothing; the verdict says what was not checked.
    assert "check: ok (worker view not recorded (a runner specreplay does not observe)" in result.output


def test_a_process_that_could_not_record_is_one_line(tmp_path):
    """A plugin that could not set up (MRV2 on a CPU without Triton's interpreter) leaves a
    not_recorded line; with no engine-core part the merge says that, in one line, exit 2."""
    from click.testing import CliRunner

    from specreplay.cli.main import main

    folder = tmp_path / "rec"
    message = "start the process with TRITON_INTERPRET=1"
    write_part(
        folder,
        "plugin-1-1",
        {"e": "part", "run": "r1", "role": "plugin", "pid": 1, "vllm": "0.32.0", "patches": []},
        {"e": "not_recorded", "message": message},
    )
    result = CliRunner().invoke(main, ["merge", str(folder), "-o", str(tmp_path / "run.parquet")])
    assert result.exit_code == 2 and result.output.strip() == f"error: {folder}: nothing recorded: {message}"


def test_a_trace_of_no_step_is_never_ok(tmp_path):
    """0 steps recorded: `empty` on merge (record --attach prints the same line), diff (exit 1)
    and gate (error), never ok."""
    from click.testing import CliRunner

    from specreplay.cli.main import main

    folder, out = tmp_path / "rec", tmp_path / "run.parquet"
    core_part(folder, [])
    runner = CliRunner()
    merged = runner.invoke(main, ["merge", str(folder), "-o", str(out)])
    assert merged.exit_code == 0, merged.output
    assert "0 steps, 0 rows" in merged.output and "check: empty (the trace holds no recorded step" in merged.output
    diff = runner.invoke(main, ["diff", str(out)])
    assert diff.exit_code == 1 and "verdict: empty - the trace holds no recorded step" in diff.output
    as_json = runner.invoke(main, ["diff", str(out), "--format", "json"])
    assert as_json.exit_code == 1 and '"verdict": "empty"' in as_json.output
    gate = runner.invoke(main, ["gate", str(out)])
    assert gate.exit_code != 0 and "no recorded step" in gate.output and "1 pass" not in gate.output


def test_record_attach_of_a_command_that_recorded_no_step_is_empty_and_exit_1(tmp_path):
    """`record --attach`: the command's engine wrote its config and no step (here the command
    writes that part itself, as an engine core stopped before its first step leaves it)."""
    import sys

    from click.testing import CliRunner

    from specreplay.cli.main import main

    made = tmp_path / "made"
    core_part(made, [])
    (part,) = made.glob("*.jsonl")
    copy = f"import os, shutil; shutil.copy({str(part)!r}, os.environ['SPECREPLAY_RECORD'])"
    out = tmp_path / "run.parquet"
    result = CliRunner().invoke(main, ["record", "--attach", "-o", str(out), "--", sys.executable, "-c", copy])
    assert result.exit_code == 1, result.output
    assert "exited with status 0" in result.output and "0 steps, 0 rows" in result.output
    assert "check: empty (the trace holds no recorded step: nothing was checked)" in result.output
