"""Bounded memory: diff and info read a long trace one row group at a time; their peak memory does
not grow with the trace and stays far below what loading it would take. (gate streams its golden
the same way, through the same reader and diff.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.traces.io import write_trace

ROWS = 3_000_000
ROW_GROUP = 50_000


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory):
    """A clean 3M-row trace in 50k-row groups: a 64-request run tiled (steps offset, ids per tile)."""
    from benchmarks.run import decode_workload, tiled

    trace = run_workload(decode_workload(64, 500), resolve("upstream", allow_import=False))
    table = tiled(trace, ROWS // trace.num_rows + 1)
    folder = tmp_path_factory.mktemp("long")
    trace.table = table.slice(0, ROWS // 10)
    short = write_trace(trace, folder / "short.parquet", row_group_size=ROW_GROUP)
    trace.table = table
    path = write_trace(trace, folder / "long.parquet", row_group_size=ROW_GROUP)
    return path, short, table.nbytes


def peak_rss(args: list[str]) -> tuple[int, float, str]:
    """Exit code, peak resident memory in bytes and stdout of `specreplay ARGS` in a fresh process."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent through fork and exec,
    # so a child of this (large) test process would report the parent's peak.
    code = (
        "import sys\nfrom specreplay.cli.main import main\n"
        f"sys.argv = ['specreplay'] + {args!r}\n"
        "try:\n    main()\nexcept SystemExit as e:\n    status = e.code\n"
        "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
        "print('PEAK', hwm, status, file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("PEAK")][-1].split()
    return int(line[2]), int(line[1]) * 1024, proc.stdout


def test_diff_and_info_stream_a_long_trace(long_trace):
    """Ten times the rows, the same peak: memory follows the row group, not the trace."""
    path, short, table_bytes = long_trace
    from specreplay.replay.workflows.gate import corpus_dir

    small = str(corpus_dir() / "reentry.parquet")
    # What the same commands take on a 200-row trace: interpreter, pyarrow, numpy, rich.
    baseline = max(peak_rss(["diff", small, "--format", "json"])[1], peak_rss(["diff", small, small])[1])
    for command in (["diff", "{}", "--format", "json"], ["info", "{}"], ["diff", "{}", "{}", "--format", "json"]):
        status, peak, out = peak_rss([a.format(path) for a in command])
        assert status == 0, (command, out[-500:])
        peak_short = peak_rss([a.format(short) for a in command])[1]
        # Loading the long trace would take its table's bytes (380 MB here) on top of the baseline.
        assert peak - peak_short < table_bytes / 10, (command, peak / 2**20, peak_short / 2**20)
        assert peak - baseline < table_bytes / 2, (command, peak / 2**20, baseline / 2**20, table_bytes / 2**20)
    assert json.loads(peak_rss(["diff", str(path), "--format", "json"])[2])["verdict"] == "ok"
