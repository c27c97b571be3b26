"""What the flight recorder leaves beside its dumps (families/vllm/flight.py): a recorder's `window-PID.live`
marker goes with its process, and `snapshot.request` once its dump is written; the marker of a
recorder killed outright is removed by whoever looks next (a recorder starting, a snapshot), so a
later snapshot never signals a pid that may be someone else's by then.

The recorders are real processes running specreplay's own recorder path (a windowed part writer,
`flight_recorder_started`, the SIGUSR1 handler), without vLLM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from click.testing import CliRunner

from specreplay.cli.main import main

RECORDER = textwrap.dedent(
    """
    import os, sys, time
    from specreplay.replay.families.vllm.flight import flight_recorder_started
    from specreplay.traces.parts import PartWriter

    folder = sys.argv[1]
    writer = PartWriter(folder, "core", {"e": "part", "run": "r1", "role": "core", "pid": os.getpid()}, window=4)
    for step in range(1, 7):
        writer.write({"e": "step", "step": step})
    flight_recorder_started(folder)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(folder, f"stop-{os.getpid()}")) and time.monotonic() < deadline:
        time.sleep(0.02)
    """
)


def start_recorder(folder: Path) -> subprocess.Popen:
    env = {**os.environ, "SPECREPLAY_RUN_ID": "r1"}
    proc = subprocess.Popen([sys.executable, "-c", RECORDER, str(folder)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def dead_pid() -> int:
    """A pid whose process has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def markers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".live"))


def test_a_clean_stop_after_a_snapshot_leaves_only_the_dump(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    stale = dead_pid()
    (folder / f"window-{stale}.live").write_text("r0")  # a recorder of an earlier run, killed outright
    proc = start_recorder(folder)
    try:
        assert markers(folder) == [f"window-{proc.pid}.live"]  # the stale one went when this one started
        result = CliRunner().invoke(main, ["snapshot", str(folder)])
        assert result.exit_code == 0, result.output
        (dump,) = [p for p in folder.iterdir() if p.is_dir()]
        assert len(list(dump.glob("core-*.jsonl"))) == 1
        assert not (folder / "snapshot.request").exists()  # its dump is written: the request is withdrawn
    finally:
        (folder / f"stop-{proc.pid}").touch()
        assert proc.wait(60) == 0
    os.unlink(folder / f"stop-{proc.pid}")
    assert sorted(p.name for p in folder.iterdir()) == [dump.name]  # a clean stop: no marker left


def test_a_killed_recorders_marker_is_removed_by_the_next_snapshot(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    proc = start_recorder(folder)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (folder / "snapshot.request").write_text("snapshot-old\n")  # a request nobody withdrew
    assert markers(folder) == [f"window-{proc.pid}.live"]  # killed outright: it could not remove it
    result = CliRunner().invoke(main, ["snapshot", str(folder)])
    assert result.exit_code == 2 and "no running flight recorder records here" in result.output
    assert list(folder.iterdir()) == []


def test_a_recorder_stopping_removes_the_markers_of_recorders_gone_before_it(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    first, second = start_recorder(folder), start_recorder(folder)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert len(markers(folder)) == 2
    (folder / f"stop-{second.pid}").touch()
    assert second.wait(60) == 0
    assert markers(folder) == []
