"""A snapshot of an idle engine: whole, never cut as a crash; and what a window cannot reproduce.

`data/idle-snapshot-v1/` and `data/idle-snapshot-v2/` are real `specreplay snapshot` dumps of an
in-process vLLM 0.32.0 (async, ngram_gpu, k = 3) on V1 and on Model Runner V2 (Triton's
interpreter), taken 5 s after the engine went idle, with SPECREPLAY_WINDOW=10
(tests/replay/engines/idle_snapshot_llm.py; made by tests/traces/make_idle_snapshot.py). A first
wave of four requests left the engine idle; the window holds the second, one request of 10 tokens
(`last`), and ends as an idle engine ends: recorded step 16 schedules nothing (the async scheduler
leaves `last` unscheduled, its placeholders at max_tokens), step 17 only announces its finish.
On both runners the worker writes no row for step 16 (a step with nothing to schedule has no
sample_tokens) and its `worker_kept_finished` for step 17. `client.json` is what the client
received.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.traces.window import NOT_REPRODUCED_BY_A_WINDOW, step_of

DATA = Path(__file__).parent / "data"
RUNNERS = ("v1", "v2")


def dump(runner: str) -> Path:
    return DATA / f"idle-snapshot-{runner}"


def applied_tokens(trace, rid: str) -> list[int]:
    rows = sorted((r for r in trace.table.to_pylist() if r["request_id"] == rid), key=lambda r: r["step"])
    return [
        t
        for r in rows
        if r["apply_outcome"] == "applied"
        for t in r["apply_sampled_token_ids"][: r["apply_num_tokens"]]
    ]


@pytest.mark.parametrize("runner", RUNNERS)
def test_an_idle_snapshot_is_whole_and_replays_to_the_end(tmp_path, runner):
    from specreplay.replay.check.tracediff import diff_traces
    from specreplay.replay.workflows.merge import merge_to
    from specreplay.replay.workflows.record import replay_to

    merged = merge_to(dump(runner), tmp_path / "window.parquet")
    trace = merged.trace
    assert trace.impl.runner_family == runner
    assert trace.impl.window.startswith("steps 9..17 of the recorded engine (dumped on snapshot)")
    # Nothing dropped: the step that scheduled nothing and the announcement are the run's end.
    assert merged.dropped == [] and trace.outcome.status == "completed" and trace.num_steps == 9
    by_step = {r["step"]: r for r in trace.table.to_pylist()}
    assert (by_step[8]["sched_skip"], by_step[8]["step_total_scheduled_tokens"]) == ("max_tokens", 0)
    assert by_step[9]["sched_status"] == "finished" and by_step[9]["worker_kept_finished"] is False
    received = json.loads((dump(runner) / "client.json").read_text())["received"]["last"]
    assert len(received) == 10 and applied_tokens(trace, "last") == received
    # Its replay runs to the same end: no E2-run-incomplete for a request its client got whole.
    replayed = replay_to(tmp_path / "replay.parquet", tmp_path / "window.parquet", "upstream", engine="reference")
    assert replayed.trace.outcome.status == "completed" and replayed.trace.num_steps == 9
    diff = diff_traces(trace, replayed.trace)
    assert not diff.findings, [str(f) for f in diff.findings[:3]]
    # On MRV2 the slot `last` took was w0-0's, a request from before the window: not reproduced.
    assert diff.not_reproduced == ({"worker_slot_prev_owner": 1} if runner == "v2" else {})


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_missing_announcement_is_cut_and_the_step_that_scheduled_nothing_kept(tmp_path, runner):
    """The dump taken before the worker ran the announcing step (its line taken out): that step
    is cut, said as what it was; the step before it, which scheduled nothing, stays."""
    from specreplay.replay.workflows.merge import merge_folder

    shutil.copytree(dump(runner), tmp_path / "dump")
    part = next((tmp_path / "dump").glob("runner-*.jsonl"))
    part.write_text("".join(line for line in part.read_text().splitlines(True) if step_of(json.loads(line)) != 17))
    merged = merge_folder(tmp_path / "dump")
    assert merged.trace.num_steps == 8 and merged.trace.outcome.status == "partial"
    assert merged.dropped == [
        "step(s) 9: step 9 scheduled nothing and announced the finish of 'last', but the worker's row of that "
        "never arrived (the dump came before the worker ran the step)"
    ]


def test_a_window_replay_marks_the_slot_columns_not_reproduced_never_an_error(tmp_path):
    """`diff WINDOW REPLAY` on Model Runner V2: worker_slot_prev_owner differs (w0-0 recorded, none in
    a replay from a fresh slot allocator), reported apart, exit 0. The same difference between two
    traces that are no window is a D1 finding, exit 1."""
    from dataclasses import replace

    from specreplay.traces.io import read_trace, write_trace

    window, replay = tmp_path / "window.parquet", tmp_path / "replay.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["merge", str(dump("v2")), "-o", str(window)]).exit_code == 0
    assert runner.invoke(main, ["replay", str(window), "-o", str(replay)]).exit_code == 0
    result = runner.invoke(main, ["diff", str(window), str(replay)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "verdict: same" in result.output
    assert "not reproduced by a window, not a difference: worker_slot_prev_owner x1" in result.output
    as_json = runner.invoke(main, ["diff", str(window), str(replay), "--format", "json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["not_reproduced_by_a_window"] == {
        "worker_slot_prev_owner": 1
    }
    whole = read_trace(window)
    write_trace(replace(whole, impl=replace(whole.impl, window=None)), tmp_path / "not-a-window.parquet")
    result = runner.invoke(main, ["diff", str(tmp_path / "not-a-window.parquet"), str(replay)])
    assert result.exit_code == 1 and "D1-trace-differs" in result.output and "worker_slot_prev_owner" in result.output


def test_the_docs_list_what_a_window_does_not_reproduce_as_the_code_does():
    text = (Path(__file__).parents[2] / "docs" / "recording.md").read_text()
    said = re.search(r"which slot each request takes \(([^)]*)\)", text.replace("\n", " "))
    assert said is not None
    assert tuple(re.findall(r"`([a-z_]+)`", said.group(1))) == NOT_REPRODUCED_BY_A_WINDOW
