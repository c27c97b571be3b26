"""show: the re-entry story at a glance (golden rendering, folding, SVG); export: a Perfetto
trace-event file that passes the format's rules and stays bounded on a long trace."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main

GOLDEN = Path(__file__).parent / "golden" / "show-reentry-request-10.txt"


@pytest.fixture(scope="module")
def reentry(tmp_path_factory):
    path = tmp_path_factory.mktemp("show") / "reentry.parquet"
    assert CliRunner().invoke(main, ["record", "--scenario", "reentry", "-o", str(path)]).exit_code == 0
    return path


def show(*args, width: int = 100):
    result = CliRunner().invoke(main, ["show", *map(str, args)], env={"COLUMNS": str(width), "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_request_10_skip_drop_and_reentry_match_the_golden_rendering(reentry):
    out = show(reentry, "--request", "10").replace(str(reentry), "TRACE")
    if os.environ.get("SPECREPLAY_WRITE_GOLDEN"):  # after an intended change: rewrite, review, commit
        GOLDEN.write_text(out)
    assert out == GOLDEN.read_text()
    sched = next(line for line in out.splitlines() if line.startswith("10 sched"))
    worker = next(line for line in out.splitlines() if line.startswith("10 worker"))
    assert sched.split()[2:6] == ["N3", "b", "b", "R1+3"]  # admitted, skipped twice by the budget, re-enters
    assert worker.split()[2:6] == ["3", ".", ".", "1+3!"]  # out of the batch, back with -1 drafts


def test_long_traces_fold_to_the_terminal_width(reentry):
    out = show(reentry, "--request", "10", "--field", "num_computed_tokens", width=44)
    lines = [line for line in out.splitlines() if not line.startswith("legend")]
    assert max(len(line) for line in lines) <= 44
    assert sum(1 for line in lines if line.startswith("10 sched C")) >= 2  # folded into blocks


def test_svg_saves_the_same_picture(reentry, tmp_path):
    svg = tmp_path / "reentry.svg"
    out = show(reentry, "--request", "10", "--svg", svg)
    assert f"wrote {svg}" in out
    text = svg.read_text()
    assert text.startswith("<svg") and "R1+3" in text


def test_open_ended_steps_stop_at_the_trace_end(reentry):
    out = show(reentry, "--request", "10", "--steps", "5:")
    header = out.splitlines()[1].split()
    assert header == ["5", "6", "7", "8", "9"]


def test_show_bad_input(reentry):
    runner = CliRunner()
    for args, message in ((["--steps", "9:2"], "--steps"), (["--request", "nope"], "no request nope")):
        result = runner.invoke(main, ["show", str(reentry), *args])
        assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1


def test_diff_lines_say_how_to_show_a_finding(reentry):
    out = CliRunner().invoke(main, ["diff", str(reentry)], env={"COLUMNS": "200"}).output
    assert f"show: specreplay show {reentry} --request 10 --steps 1:8" in out


# ---------------------------------------------------------------------- Perfetto
REQUIRED = {
    "X": ("name", "ts", "dur", "pid", "tid"),
    "C": ("name", "ts", "pid", "args"),
    "i": ("name", "ts", "pid", "tid", "s"),
    "s": ("name", "ts", "pid", "tid", "id"),
    "f": ("name", "ts", "pid", "tid", "id", "bp"),
    "M": ("name", "pid", "args"),
}


def check_trace_events(doc: dict) -> None:
    """The trace-event format's rules that the Perfetto UI relies on."""
    events = doc["traceEvents"]
    assert events and doc["displayTimeUnit"] in ("ms", "ns")
    starts, ends = {}, {}
    last_ts: dict[tuple[int, int], int] = defaultdict(lambda: -1)
    for e in events:
        assert e["ph"] in REQUIRED, e
        for key in REQUIRED[e["ph"]]:
            assert key in e, (key, e)
        if e["ph"] != "M":
            assert isinstance(e["ts"], int) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] > 0 and e["ts"] >= last_ts[(e["pid"], e["tid"])]  # ordered per track
            last_ts[(e["pid"], e["tid"])] = e["ts"]
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in e["args"].values())
        if e["ph"] in "sf":
            assert isinstance(e["id"], int)  # Perfetto reads a string id as hex
        if e["ph"] == "s":
            starts[e["id"]] = e
        if e["ph"] == "f":
            ends[e["id"]] = e
    assert starts.keys() == ends.keys()  # every flow start has its end, and the reverse
    assert all(ends[i]["ts"] > starts[i]["ts"] for i in starts)
    slices = {(e["pid"], e["tid"], e["ts"] // 1000) for e in events if e["ph"] == "X"}
    assert all((e["pid"], e["tid"], e["ts"] // 1000) in slices for e in ends.values())  # flows bind to a slice


def test_perfetto_export_of_the_reentry_trace(reentry, tmp_path):
    out = tmp_path / "reentry.json"
    result = CliRunner().invoke(main, ["export", str(reentry), "--perfetto", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    check_trace_events(doc)
    names = {(e["args"]["name"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert "request 10" in names
    pid = next(e["pid"] for e in doc["traceEvents"] if e["ph"] == "M" and e["args"].get("name") == "request 10")
    sched = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["tid"] == 1]
    assert [e["name"] for e in sched[:4]] == ["new 3", "skipped: budget", "skipped: budget", "re-entering 1+3"]
    worker_steps = [
        e["args"]["step"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["tid"] == 2
    ]
    assert 2 not in worker_steps and 3 not in worker_steps  # dropped from the batch
    marks = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["pid"] == pid]
    assert {"S5-draft-provenance", "X5-placeholder-drafts"} <= {e["name"] for e in marks}
    counters = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == pid}
    assert counters == {"num_computed_tokens (scheduler)", "num_computed_tokens (worker)", "num_output_placeholders"}


def test_perfetto_export_stays_bounded_on_a_10000_step_trace(tmp_path):
    from benchmarks.run import decode_workload, tiled
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.traces.io import write_trace

    trace = run_workload(decode_workload(16, 500), resolve("upstream", allow_import=False))
    trace.table = tiled(trace, 10_000 // trace.num_steps + 1)
    path = write_trace(trace, tmp_path / "long.parquet")
    assert trace.num_steps >= 10_000
    out = tmp_path / "long.json"
    result = CliRunner().invoke(main, ["export", str(path), "--perfetto", str(out)])
    assert result.exit_code == 0, result.output
    assert "--steps for the rest" in result.output
    assert out.stat().st_size < 20 * 2**20  # the default window: at most 20,000 request-steps
    doc = json.loads(out.read_text())
    check_trace_events(doc)
    later = tmp_path / "later.json"
    assert (
        CliRunner().invoke(main, ["export", str(path), "--perfetto", str(later), "--steps", "9000:9100"]).exit_code == 0
    )
    steps = {e["args"]["step"] for e in json.loads(later.read_text())["traceEvents"] if e["ph"] == "X"}
    assert min(steps) == 9000 and max(steps) == 9100


def test_a_clean_trace_with_many_requests_shows_a_few_and_says_so(tmp_path, monkeypatch):
    from benchmarks.run import decode_workload
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.traces.io import write_trace

    path = write_trace(
        run_workload(decode_workload(64, 100), resolve("upstream", allow_import=False)), tmp_path / "d64.parquet"
    )
    monkeypatch.chdir(tmp_path)  # a short path in the header: a long one (xdist's popen-gw0/ in it) wraps the line
    out = show(path.name, width=200)
    assert "(steps 1:64 of 102; --steps picks others); 12 of 64 requests (--request picks others)" in out
    lanes = {line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["sched"]}
    assert len(lanes) == 12
