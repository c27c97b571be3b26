"""The flight recorder's window (traces/window.py): bounded in memory, dumped whole, merged from the
first step an empty engine can replay it from, numbered from 1.

`data/crash-window/` is a real dump: a tiny in-process vLLM 0.32.0 (async, ngram_gpu, k = 3) with
SPECREPLAY_WINDOW=14, running tests/replay/engines/overrun_variant.py's scheduler, fed three waves
of requests, the last with one that trips the variant's assert at step 27. The window held steps
12..26; the engine went idle before step 17.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from specreplay.traces.errors import InputError
from specreplay.traces.parts import PartWriter, read_parts
from specreplay.traces.window import Window, rebase, replayable_start, step_of, window_steps

DUMP = Path(__file__).parent / "data" / "crash-window"


def real_steps() -> dict[int, list[dict]]:
    """The real dump's events by step (core and runner), the lines no step owns left out."""
    by_step: dict[int, list[dict]] = {}
    for path in sorted(DUMP.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            step = step_of(event)
            if step is not None:
                by_step.setdefault(step, []).append(event)
    return by_step


def at_step(event: dict, step: int) -> dict:
    """`event` moved to `step`, as the engine would write it there."""
    if event["e"] == "rows":
        return {**event, "rows": [[step, *row[1:]] for row in event["rows"]]}
    if event["e"] == "patch":
        return {**event, "rows": [[step, *row[1:]] for row in event["rows"]]}
    return {**event, "step": step}


def test_the_window_holds_a_bounded_number_of_steps_over_10000_steps(tmp_path):
    """The real dump's steps written over and over through a windowed part writer, 10,000 steps:
    what it holds never exceeds WINDOW + 1 steps of the largest step's bytes, stays flat from the
    time the window fills, and a dump holds exactly the last steps."""
    window, steps = 50, real_steps()
    cycle = sorted(steps)
    largest = max(sum(len(json.dumps(e, separators=(",", ":"))) + 1 for e in steps[s]) for s in cycle)
    writer = PartWriter(str(tmp_path), "core", {"e": "part", "run": "r", "role": "core"}, window=window)
    held = []
    for n in range(1, 10_001):
        for event in steps[cycle[n % len(cycle)]]:
            writer.write(at_step(event, n))
        if n % 100 == 0:
            writer.flush()
            held.append(writer.window.held_bytes())
    assert max(held) <= (window + 1) * largest + 1024
    assert max(held[10:]) - min(held[10:]) <= 2 * largest  # flat: it does not grow with the run
    assert not list(tmp_path.glob("*.jsonl"))  # nothing on disk until a dump
    path = writer.dump(str(tmp_path / "dump"), "snapshot")
    events = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert events[0]["e"] == "part" and events[1] == {**events[1], "e": "window", "last_step": 10_000, "dropped": True}
    kept = {step_of(e) for e in events} - {None}
    assert kept == set(range(10_000 - window + 1, 10_001))
    # The ring says what it overwrote: every step before the window, each step's lines and rows.
    written = [e for n in range(1, 10_001) for e in steps[cycle[n % len(cycle)]]]
    held_lines = len(events) - 2 - (len([e for e in events if step_of(e) is None]) - 2)
    assert events[1]["dropped_steps"] == 10_000 - window
    assert events[1]["dropped_lines"] == sum(1 for e in written if step_of(e) is not None) - held_lines
    rows_written = sum(len(e["rows"]) for e in written if e["e"] == "rows")
    rows_held = sum(len(e["rows"]) for e in events if e["e"] == "rows")
    assert events[1]["dropped_rows"] == rows_written - rows_held > 0
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(tmp_path / "dump").st_mode & 0o777 == 0o700
    writer.close()


def test_a_dump_starts_where_an_empty_engine_can_replay_it_and_is_numbered_from_1():
    core = next(p for p in read_parts(str(DUMP)) if p.role == "core")
    line = next(e for e in core.events if e["e"] == "window")
    assert (line["first_step"], line["last_step"], line["dropped"]) == (12, 26, True)
    start, leftovers = replayable_start(core.events, dropped=True)
    # Step 17: the third wave's first; w1-3 finished at 16 and only has its finish announced at 17.
    assert (start, leftovers) == (17, {"w1-3"})
    events = rebase(core.events, start, leftovers)
    rows = [row for e in events if e["e"] == "rows" for row in e["rows"]]
    assert min(r[0] for r in rows) == 1 and max(r[0] for r in rows) == 10
    at = next(e for e in events if e["e"] == "rows")["names"].index("request_id")
    assert {r[at] for r in rows} == {"w2-0", "w2-1", "w2-2", "w2-3", "w2-long"}
    arrivals = {e["id"]: e["step"] for e in events if e["e"] == "request"}
    assert set(arrivals.values()) == {1}  # arrived at the window's first step
    applied = [v for e in events if e["e"] == "cols" for v in e["cols"].get("apply_step", ())]
    assert applied and all(v is None or 1 <= v <= 10 for v in applied)


def test_a_window_with_no_idle_step_does_not_replay():
    core = next(p for p in read_parts(str(DUMP)) if p.role == "core")
    during = [e for e in core.events if step_of(e) is None or step_of(e) >= 18]  # the third wave, cut inside
    assert replayable_start(during, dropped=True) is None
    assert replayable_start(during, dropped=False) == (18, set())  # nothing dropped: from its first step


def test_merge_refuses_a_window_that_does_not_replay_in_one_line(tmp_path):
    from specreplay.replay.workflows.merge import merge_folder

    for path in DUMP.glob("*.jsonl"):
        lines = path.read_text().splitlines()
        kept = [ln for ln in lines if (step_of(json.loads(ln)) or 99) >= 18]
        (tmp_path / path.name).write_text("\n".join(kept) + "\n")
    with pytest.raises(InputError, match="holds no step at which the engine held no request"):
        merge_folder(tmp_path)


def test_a_crash_dump_merges_into_a_trace_that_replays_step_exact_on_the_variant(tmp_path):
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.workflows.merge import merge_to
    from specreplay.replay.workflows.record import replay_to

    shutil.copytree(DUMP, tmp_path / "dump")
    merged = merge_to(tmp_path / "dump", tmp_path / "crash.parquet")
    trace = merged.trace
    assert trace.impl.window == "steps 17..26 of the recorded engine (dumped on crash); step 1 here is step 17"
    assert trace.num_steps == 10 and trace.outcome.status == "crashed" and trace.outcome.step == 11
    assert trace.outcome.kind == "scheduler-assert"
    variant = "tests.replay.engines.overrun_variant:IMPL"
    replayed = replay_to(tmp_path / "replay.parquet", tmp_path / "crash.parquet", variant, engine="reference")
    diff = diff_traces(trace, replayed.trace)
    assert not diff.findings, [str(f) for f in diff.findings[:3]]
    upstream = replay_to(tmp_path / "upstream.parquet", tmp_path / "crash.parquet", "upstream", engine="reference")
    assert upstream.trace.outcome.status != "crashed"  # what the fix would have done: no death


def test_the_window_setting_is_a_number_of_steps(monkeypatch):
    monkeypatch.setenv("SPECREPLAY_WINDOW", "2000")
    assert window_steps() == 2000
    monkeypatch.delenv("SPECREPLAY_WINDOW")
    assert window_steps() is None
    for bad in ("0", "-3", "1e3", "64MB"):
        monkeypatch.setenv("SPECREPLAY_WINDOW", bad)
        with pytest.raises(InputError, match="a number of engine steps"):
            window_steps()


def test_a_late_line_of_an_older_step_stays_until_the_lines_before_it_go():
    window = Window(2)
    for step in (1, 2, 3):
        window.add({"e": "step", "step": step}, b"x" * 10)
    window.add({"e": "cols", "step": 2}, b"y" * 10)  # step 2's output, applied during step 3
    window.add({"e": "step", "step": 4}, b"z" * 10)
    assert [s for s, _, _ in window.lines] == [3, 2, 4]
    assert window.bytes == 30 and window.dropped
    assert (window.dropped_steps, window.dropped_lines, window.dropped_rows) == (2, 2, 0)
    window.add({"e": "rows", "rows": [[5, "a"], [5, "b"]]}, b"r" * 10)  # step 3 goes, and 2's late line
    assert (window.dropped_steps, window.dropped_lines, window.dropped_rows) == (3, 4, 0)
    window.add({"e": "step", "step": 8}, b"s" * 10)  # step 4 and step 5's two rows go
    assert (window.dropped_steps, window.dropped_lines, window.dropped_rows) == (5, 6, 2)


def test_a_snapshot_with_no_running_flight_recorder_says_so_in_one_line(tmp_path):
    from click.testing import CliRunner

    from specreplay.cli.main import main

    (tmp_path / "window-999999999.live").write_text("run")  # a recorder that is gone
    result = CliRunner().invoke(main, ["snapshot", str(tmp_path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "no running flight recorder records here" in result.output
    result = CliRunner().invoke(main, ["snapshot", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "no such folder" in result.output


def test_merge_of_the_flight_recorders_folder_names_its_dumps(tmp_path):
    from specreplay.replay.workflows.merge import merge_folder

    shutil.copytree(DUMP, tmp_path / "crash-20261203T145236Z-28991")
    with pytest.raises(InputError, match="a flight recorder's folder: merge one of its 1 dump"):
        merge_folder(tmp_path)


def test_rebase_moves_every_step_column_and_nulls_what_points_before_the_window():
    """Model Runner V2's worker view names steps too (the step whose propose wrote a slot's
    drafts, the slot's last write): renumbered with the rows, null when before the window."""
    events = [
        {"e": "rows", "names": ["step", "request_id", "sched_status"], "rows": [[10, "a", "running"]]},
        {
            "e": "cols",
            "step": 10,
            "ids": ["a"],
            "cols": {"worker_draft_proposed_step": [9], "worker_slot_last_write_step": [4], "worker_slot": [3]},
        },
        {"e": "patch", "rows": [[10, "a", {"apply_step": 11, "apply_num_tokens": 2}]]},
        {"e": "request", "id": "a", "step": 8},
        {"e": "request", "id": "old", "step": 2},
    ]
    out = rebase(events, start=9)
    assert out[0]["rows"] == [[2, "a", "running"]]
    assert out[1]["step"] == 2 and out[1]["cols"] == {
        "worker_draft_proposed_step": [1],
        "worker_slot_last_write_step": [None],
        "worker_slot": [3],
    }
    assert out[2]["rows"] == [[2, "a", {"apply_step": 3, "apply_num_tokens": 2}]]
    assert [e for e in out if e["e"] == "request"] == [{"e": "request", "id": "a", "step": 0}]


def test_record_attach_records_whole_runs_and_refuses_a_window(tmp_path, monkeypatch):
    from specreplay.replay.workflows.attach import attach_to

    monkeypatch.setenv("SPECREPLAY_WINDOW", "100")
    with pytest.raises(InputError, match="record --attach records the whole run"):
        attach_to(tmp_path / "run.parquet", ["true"])
    assert not list(tmp_path.iterdir())  # nothing ran, nothing made


SNAPSHOT = Path(__file__).parent / "data" / "snapshot-window"


def test_a_snapshot_taken_before_the_worker_finished_its_last_step_ends_before_it(tmp_path):
    """`data/snapshot-window/` is a real `specreplay snapshot` of a served V1 vLLM after its first
    wave (tests/replay/engines/test_flight_recorder.py): its last step, 21, only announces
    finished requests. With the worker's lines of it taken out (the dump came before the worker
    finished it), merge cuts it, and the trace still replays step for step."""
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.workflows.merge import merge_to
    from specreplay.replay.workflows.record import replay_to

    whole = merge_to(SNAPSHOT, tmp_path / "whole.parquet").trace
    assert whole.num_steps == 21 and whole.outcome.status != "partial"
    shutil.copytree(SNAPSHOT, tmp_path / "dump")
    runner = next((tmp_path / "dump").glob("runner-*.jsonl"))
    kept = [ln for ln in runner.read_text().splitlines() if step_of(json.loads(ln)) != 21]
    runner.write_text("\n".join(kept) + "\n")
    merged = merge_to(tmp_path / "dump", tmp_path / "cut.parquet")
    assert merged.trace.num_steps == 20 and merged.trace.outcome.status == "partial"
    assert any("step 21 was scheduled" in line or "step(s) 21" in line for line in merged.dropped), merged.dropped
    variant = "tests.replay.engines.overrun_variant:IMPL"
    for path, trace in ((tmp_path / "whole.parquet", whole), (tmp_path / "cut.parquet", merged.trace)):
        replayed = replay_to(tmp_path / f"replay-{path.stem}.parquet", path, variant, engine="reference")
        diff = diff_traces(trace, replayed.trace)
        assert not diff.findings, [str(f) for f in diff.findings[:3]]
