"""Crash-safe recording: a recording killed at random moments (SIGKILL), or stopped by an exception,
leaves a journal whose every flushed step is there, whole and equal to a run that finished.

The journal is traces/journal.py's; these tests hold it end to end, through `record` and `recover`."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.traces.errors import TraceError
from specreplay.traces.io import read_trace
from specreplay.traces.journal import journal_path, recover

# 12 kills spread over the run still land early, late and mid-step (each stop a whole-step
# prefix), at CI's time budget; SPECREPLAY_KILLS=200 for a longer soak.
KILLS = int(os.environ.get("SPECREPLAY_KILLS", "12"))


def long_workload():
    """Several seconds of recording: 64 decoding requests for 1,500 steps, two batches in flight."""
    from benchmarks.run import decode_workload

    return decode_workload(64, 1500)


def decoded(table):
    """Values, not encodings: a prefix of a trace has fewer enum values in its dictionaries."""
    import pyarrow as pa

    return pa.table(
        {
            name: (col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col)
            for name, col in zip(table.column_names, table.columns)
        }
    )


def assert_prefix_of(recovered, full) -> int:
    """The recovered rows are exactly the full run's rows of steps 1..last: whole steps, same values."""
    last = recovered.outcome.step
    steps = full.table["step"].to_pylist()
    whole = sum(1 for s in steps if s <= last)
    assert recovered.outcome.status == "partial"
    assert recovered.num_rows == whole, (recovered.num_rows, whole)
    assert decoded(recovered.table).equals(decoded(full.table.slice(0, whole)))
    assert recovered.workload == full.workload and recovered.config == full.config
    return last


def _record_command(spec, out) -> list[str]:
    return [
        sys.executable,
        "-m",
        "specreplay.cli",
        "record",
        "--workload",
        str(spec),
        "-o",
        str(out),
        "--flush-every",
        "4",
    ]


def _recording_seconds(spec, out) -> float:
    """Seconds from a subprocess recording's journal appearing to the process ending."""
    proc = subprocess.Popen(_record_command(spec, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = journal_path(out)
    deadline = time.monotonic() + 120
    while not journal.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    assert proc.wait(timeout=600) == 0
    return time.monotonic() - started


def test_a_recording_killed_at_random_moments_keeps_every_flushed_step(tmp_path):
    workload = long_workload()
    spec = tmp_path / "long.json"
    spec.write_text(json.dumps(workload.to_dict()))
    full = run_workload(workload, resolve("upstream", allow_import=False))
    # Kill moments spread over the whole run, however fast this machine records and however
    # loaded it is: the length of the run is measured on a subprocess recording like the ones
    # killed below, two at a time as they run (timing the in-process run instead made every kill
    # land in the first half when other tests loaded the machine).
    with ThreadPoolExecutor(2) as pool:
        duration = min(pool.map(lambda i: _recording_seconds(spec, tmp_path / f"timed{i}.parquet"), range(2)))
    rng = random.Random(6)
    delays = [rng.uniform(0.0, duration) for _ in range(KILLS)]

    def kill_one(i: int):
        out = tmp_path / f"kill{i}.parquet"
        journal = journal_path(out)
        proc = subprocess.Popen(
            _record_command(spec, out),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not journal.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the recording has started once its journal exists
        time.sleep(delays[i])
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return out, journal

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(kill_one, range(KILLS)))
    stops = []
    for out, journal in results:
        if out.exists():  # finished before the kill: the journal is gone, the trace whole
            assert not journal.exists() and read_trace(out).table.equals(full.table)
            stops.append(full.num_steps)
            continue
        assert journal.exists()  # written before the first step, so a kill always leaves it
        try:
            stops.append(assert_prefix_of(recover(journal), full))
        except TraceError as exc:  # killed before the first flush: nothing claimed, nothing lost
            assert "holds no complete step" in str(exc)
            stops.append(0)
    # The kills landed all over the run, not all at its start or its end.
    assert len(set(stops)) >= KILLS // 2 and min(stops) < full.num_steps // 4 < full.num_steps // 2 < max(stops)


def test_an_exception_leaves_a_crashed_trace_or_a_recoverable_journal(tmp_path, monkeypatch):
    """The implementation's exception is the engine's death: a trace, outcome crashed. One of
    specreplay's own (exit 3) leaves the journal, and every step recorded before it recovers."""
    (tmp_path / "crashy.py").write_text(
        "from specreplay.replay.models.scheduler import AsyncScheduler\n"
        "class CrashAt30(AsyncScheduler):\n"
        "    def schedule(self):\n"
        "        if self.step + 1 == 30:\n"
        "            raise RuntimeError('bug at step 30')\n"
        "        return super().schedule()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from benchmarks.run import decode_workload

    workload = decode_workload(8, 60)
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps(workload.to_dict()))
    out = tmp_path / "crash.parquet"
    result = CliRunner().invoke(main, ["record", "--workload", str(spec), "--impl", "crashy:CrashAt30", "-o", str(out)])
    assert result.exit_code == 1 and "outcome crashed at step 30: RuntimeError: bug at step 30" in result.output
    assert not journal_path(out).exists()
    full = run_workload(workload, resolve("upstream", allow_import=False))
    settled = sum(1 for s in full.table["step"].to_pylist() if s <= 27)  # outputs of 28, 29 still in flight
    assert decoded(read_trace(out).table.slice(0, settled)).equals(decoded(full.table.slice(0, settled)))
    # A bug of specreplay's own loop at the same step: exit 3, the journal keeps what was recorded.
    from specreplay.replay.engines.loop import EngineLoop

    schedule_and_execute = EngineLoop.schedule_and_execute

    def loop_bug(self):
        if self.step_no + 1 == 30:
            raise RuntimeError("specreplay bug at step 30")
        return schedule_and_execute(self)

    monkeypatch.setattr(EngineLoop, "schedule_and_execute", loop_bug)
    out = tmp_path / "bug.parquet"
    result = CliRunner().invoke(main, ["record", "--workload", str(spec), "-o", str(out)])
    assert result.exit_code == 3 and "specreplay bug at step 30" in result.output and not out.exists()
    recovered = recover(journal_path(out))
    assert recovered.outcome.step == 29  # every step recorded before the exception, flushed on it
    assert decoded(recovered.table.slice(0, settled)).equals(decoded(full.table.slice(0, settled)))
    # recover writes an ordinary trace that every command reads; it never overwrites one
    fixed = tmp_path / "fixed.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["recover", str(journal_path(out)), "-o", str(fixed)]).exit_code == 0
    info = json.loads(runner.invoke(main, ["info", str(fixed), "--format", "json"]).output)
    assert info["outcome"]["status"] == "partial" and info["outcome"]["step"] == 29
    again = runner.invoke(main, ["recover", str(journal_path(out)), "-o", str(fixed)])
    assert again.exit_code == 2 and "exists" in again.output
    direct = runner.invoke(main, ["diff", str(journal_path(out))])
    assert direct.exit_code == 2 and "specreplay recover" in direct.output


def test_a_finished_recording_leaves_no_journal(tmp_path):
    out = tmp_path / "ok.parquet"
    assert CliRunner().invoke(main, ["record", "--scenario", "reentry", "-o", str(out)]).exit_code == 0
    assert out.exists() and not journal_path(out).exists()


@pytest.mark.parametrize("junk", [b"", b"hello", b"\xff\xff\xff\xff\x10\x00\x00\x00garbage"])
def test_recover_refuses_what_is_not_a_journal(tmp_path, junk):
    bad = tmp_path / "bad.parquet.partial"
    bad.write_bytes(junk)
    result = CliRunner().invoke(main, ["recover", str(bad)])
    assert result.exit_code == 2 and result.output.count("\n") == 1


def test_a_step_cut_short_by_an_exception_is_left_out_of_the_journal(tmp_path):
    """The run stops on an error inside step 6 (an input error: an exception of the runner's own
    would be the engine's death, a crashed trace): the journal ends with step 5, both views
    whole, so the recovered trace has no false finding where the step was cut."""
    from specreplay.replay.check.checker import check_trace

    out = tmp_path / "cut.parquet"
    impl = "tests.replay.engines.raising_impls:RefusingRunner"  # an InputError inside step 6
    result = CliRunner().invoke(main, ["record", "--scenario", "reentry", "--impl", impl, "-o", str(out)])
    assert result.exit_code == 2 and "the runner refuses step 6" in result.output
    recovered = recover(journal_path(out))
    assert recovered.outcome.step == 5
    assert not [f for f in check_trace(recovered) if f.code == "X1-batch-membership"]
    # and a new recording to the same path refuses to drop the journal
    again = CliRunner().invoke(main, ["record", "--scenario", "reentry", "-o", str(out)])
    assert again.exit_code == 2 and "recover it first" in again.output and journal_path(out).exists()


def test_an_unwritable_output_is_bad_input_not_a_bug(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(main, ["record", "--scenario", "reentry", "-o", str(blocker / "t.parquet")])
    assert result.exit_code == 2 and result.output.startswith("error: ") and result.output.count("\n") == 1
