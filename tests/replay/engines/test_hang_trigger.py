"""The hang trigger (families/vllm/hang.py) on a real vLLM that stops making progress: a
scheduler variant blocks inside a step, raising nothing (tests/replay/engines/stall_variant.py).
With `SPECREPLAY_HANG`, the recorder writes every process's window with where each process is,
and leaves the engine as it was: released, the run finishes every request as it would have.
The dump merges, and `info` says it was a hang. Marked `vllm`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.families.vllm.attached import RECORD_ENV
from specreplay.replay.families.vllm.hang import HANG_ENV
from specreplay.traces.window import WINDOW_ENV
from tests.replay.engines.stall_variant import RELEASE_ENV

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[3]
REQUESTS, MAX_TOKENS, HANG_S = 4, 24, 3.0


def test_a_stalled_engine_writes_its_windows_and_is_left_as_it_was(tmp_path):
    folder, release = tmp_path / "rec", tmp_path / "release"
    env = {
        **os.environ,
        RECORD_ENV: str(folder),
        WINDOW_ENV: "200",
        HANG_ENV: str(HANG_S),
        RELEASE_ENV: str(release),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "tests.replay.engines.stall_run", str(REQUESTS), str(MAX_TOKENS)]
    run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        dump = wait_for_hang_dump(folder, run, timeout=300)
        assert run.poll() is None  # the dump left the engine where it was: still inside its step
        time.sleep(HANG_S * 2)  # the same stall goes on: one dump per stall
        assert len(list(folder.glob("hang-*"))) == 1
        release.touch()
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-3000:]
    # Released, the engine went on as it would have: every request ran to its max_tokens.
    result = next(line for line in out.splitlines() if line.startswith("RESULT "))
    assert sorted(json.loads(result.split(" ", 1)[1]).values()) == [MAX_TOKENS] * REQUESTS
    assert "flight recorder (hang)" in err

    core = next(p for p in dump.glob("core-*.jsonl"))
    events = [json.loads(line) for line in core.read_text().splitlines()]
    window = next(e for e in events if e["e"] == "window")
    hang = next(e for e in events if e["e"] == "hang")
    progress = [e for e in events if e["e"] == "progress"]
    assert window["reason"] == "hang" and window["dropped_steps"] == 0
    assert hang["seconds"] >= HANG_S and hang["requests"] == REQUESTS
    # The core is inside the iteration that stalled, longer than the limit, and says which.
    (core_progress,) = progress
    assert core_progress["role"] == "core" and core_progress["inside_s"] >= HANG_S
    steps = [e["step"] for e in events if e["e"] == "step"]
    assert core_progress["step"] == max(steps) and core_progress["began"] == core_progress["returned"] + 1
    # Every recording process of the run wrote its window into the same dump.
    roles = sorted(p.name.split("-", 1)[0] for p in dump.glob("*.jsonl"))
    assert roles == ["core", "runner"], roles

    out_path = tmp_path / "hang.parquet"
    merged = CliRunner().invoke(main, ["merge", str(dump), "-o", str(out_path)])
    assert merged.exit_code == 0, merged.output
    info = CliRunner().invoke(main, ["info", str(out_path)])
    assert info.exit_code == 0, info.output
    said = " ".join(info.output.split())  # as one line, however the terminal wrapped it
    assert "dumped on hang: no engine step returned for" in said, said
    assert "inside the iteration after step" in said and "(it never returned)" in said, said
    assert "the ring overwrote nothing" in said, said


def wait_for_hang_dump(folder: Path, run: subprocess.Popen, timeout: float) -> Path:
    """The hang dump once both processes' windows are in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[1][-3000:]
        for dump in folder.glob("hang-*"):
            if dump.is_dir() and len(list(dump.glob("*.jsonl"))) >= 2:
                return dump
        time.sleep(0.2)
    raise AssertionError(f"no hang dump in {timeout} s: {sorted(p.name for p in folder.iterdir())}")
