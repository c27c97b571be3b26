"""merge on real part files damaged after they were written: a line damaged inside a part is refused
in one line naming the file and the line (a process that dies writing leaves only its last line
cut, which stays a crash), `--salvage` keeps what precedes the damage and says so, and a part
whose header line is cut, damaged or missing is named, never counted as a run or a missing core.

The parts are `tests/traces/data/snapshot-window/`, a real `specreplay snapshot` of a served V1
vLLM (tests/traces/test_window.py), copied and damaged here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main

SNAPSHOT = Path(__file__).parents[2] / "traces" / "data" / "snapshot-window"


def copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The snapshot's parts in a folder of their own: (folder, the core's part, the runner's)."""
    folder = tmp_path / "rec"
    shutil.copytree(SNAPSHOT, folder)
    return folder, next(folder.glob("core-*.jsonl")), next(folder.glob("runner-*.jsonl"))


def overwrite(path: Path, line: int, data: bytes, at: int = 30) -> int:
    """`data` written over line `line` (1-based) of `path` from byte `at` of it; the file's lines."""
    lines = path.read_bytes().split(b"\n")
    raw = lines[line - 1]
    lines[line - 1] = raw[:at] + data + raw[at + len(data) :]
    path.write_bytes(b"\n".join(lines))
    return len(path.read_bytes().splitlines())


def merge(folder: Path, out: Path, *args: str):
    return CliRunner().invoke(main, ["merge", str(folder), "-o", str(out), *args])


def test_nul_bytes_inside_a_part_are_refused_in_one_line_naming_the_file_and_the_line(tmp_path):
    folder, core, _ = copy(tmp_path)
    lines = overwrite(core, 40, b"\0" * 40)
    out = tmp_path / "run.parquet"
    result = merge(folder, out)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"error: {core}: line 40 of {lines} is damaged (40 NUL byte(s))")
    assert "--salvage" in result.output
    assert not out.exists()  # nothing merged: no trace to draw false findings from


def test_salvage_keeps_what_precedes_the_damage_and_says_so(tmp_path):
    from specreplay.replay.check.checker import NEEDED, check_report
    from specreplay.traces.io import read_trace

    folder, core, _ = copy(tmp_path)
    lines = overwrite(core, 40, b"\0" * 40)
    out = tmp_path / "run.parquet"
    result = merge(folder, out, "--salvage")
    assert result.exit_code == 0, result.output
    dropped = [line for line in result.output.splitlines() if line.startswith("dropped:")]
    assert dropped[0] == (
        f"dropped: {core.name}: line 40 of {lines} is damaged (40 NUL byte(s)): --salvage kept the 39 line(s) "
        f"before it and dropped the {lines - 39} from it on"
    ), result.output
    trace = read_trace(out)
    assert trace.outcome.status == "partial" and "--salvage" in trace.outcome.message
    assert 0 < trace.num_steps < 21  # the snapshot's 21 steps, cut where the core's part was damaged
    # As if the engine core had died at that line: no false finding about vLLM.
    report = check_report(trace, trace.table.select(list(NEEDED)).to_batches())
    assert not [f for f in report.findings if f.severity == "error"], [str(f) for f in report.findings[:3]]


def test_a_damaged_runner_part_salvaged_loses_the_worker_view_from_the_damage_on(tmp_path):
    folder, _, runner = copy(tmp_path)
    lines = overwrite(runner, 15, b"#", at=0)  # not NUL: any line that is not a whole JSON object
    assert merge(folder, tmp_path / "refused.parquet").output.startswith(f"error: {runner}: line 15 of {lines} is")
    result = merge(folder, tmp_path / "run.parquet", "--salvage")
    assert result.exit_code == 0, result.output
    assert f"dropped: {runner.name}: line 15 of {lines} is damaged (not JSON" in result.output
    # The steps whose worker rows were after the damage: cut, and the merge says why it may be.
    assert "but its worker rows never arrived (the run stopped inside it, or --salvage dropped them)" in result.output


@pytest.mark.parametrize("last", [b'{"e":"rows","names":["step"', b"\0" * 40 + b"\n"])
def test_a_damaged_last_line_is_still_a_line_cut_mid_write(tmp_path, last):
    """A process killed inside a write leaves its last line cut and writes nothing more: that
    stays a crash, merged as before (whatever the cut line holds, NUL bytes included)."""
    folder, core, _ = copy(tmp_path)
    with core.open("ab") as fh:
        fh.write(last)
    result = merge(folder, tmp_path / "run.parquet")
    assert result.exit_code == 0, result.output
    assert f"dropped: {core.name}: 1 line(s) cut mid-write (the process died writing them)" in result.output


#: What can be left of the engine core's first line, the header naming the run: (the part's new
#: content, from its old header line and the lines after it; what merge says of it).
HEADER_CASES = {
    "empty": (lambda header, rest: b"", "empty (0 bytes): its process died before it wrote its header line"),
    "cut": (lambda header, rest: header[:100], "its only line, the header that names the run, is cut (100 bytes)"),
    "damaged": (lambda header, rest: header[:100] + b"\n" + rest, "line 1 of 77 is damaged"),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_a_cut_or_empty_core_header_names_the_file(tmp_path, case):
    folder, core, _ = copy(tmp_path)
    make, said = HEADER_CASES[case]
    header, rest = core.read_bytes().split(b"\n", 1)
    core.write_bytes(make(header, rest))
    result = merge(folder, tmp_path / "run.parquet")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and str(core) in result.output and said in result.output, result.output
    assert "runs" not in result.output and "data-parallel" not in result.output


def test_a_runner_part_with_only_its_header_cut_is_named_and_the_rest_merged(tmp_path):
    folder, _, runner = copy(tmp_path)
    runner.write_bytes(runner.read_bytes()[:100])  # the worker process died writing its first line
    result = merge(folder, tmp_path / "run.parquet")
    assert result.exit_code == 0, result.output
    assert (
        f"dropped: {runner.name}: its only line, the header that names the run, is cut (100 bytes): its process "
        "died writing it; not joined to the run"
    ) in result.output
    assert "parts of 2 runs" not in result.output


def test_a_file_that_is_no_part_is_named(tmp_path):
    folder, _, _ = copy(tmp_path)
    (folder / "notes.jsonl").write_text('{"e": "rows", "names": [], "rows": []}\n')
    result = merge(folder, tmp_path / "run.parquet")
    assert result.exit_code == 2 and str(folder / "notes.jsonl") in result.output
    assert "line 1 is not a part header naming its run (found a 'rows' line)" in result.output
