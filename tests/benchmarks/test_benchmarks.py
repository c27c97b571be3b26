"""The benchmark suite runs and reports its figures (sizes tiny; no timing is asserted here)."""

from __future__ import annotations

from benchmarks.run import decode_workload, main, reference_run
from benchmarks.table import rows


def test_startup_figure_and_table(capsys):
    out = main(["--quick", "--repeat", "1", "--only", "startup"])
    assert out["startup"]["diff_imports_torch"] is False and out["startup"]["help_s"] > 0
    assert [r[0] for r in rows(out)] == ["start-up"]
    assert "start-up" in capsys.readouterr().out


def test_decode_workload_keeps_every_request_running_every_step():
    w = decode_workload(8, 20)
    assert reference_run(w) == 8 * 20  # each request scheduled once per step until max_tokens


def test_missed_targets_are_marked():
    out = {
        "machine": {"quick": True, "cpus": 2, "repeat": 1},
        "live_recording_overhead": {"off_s": 1.0, "on_s": 1.5, "overhead": 0.5},
    }
    assert rows(out)[0][3] == "MISSED"


def test_the_attached_figure_has_a_row_per_runner():
    """A row per runner and size; the target holds the engine's thread and the writer's together."""
    figure = {
        "requests": 64,
        "recorder_us_per_request_step": 40.0,
        "scheduler_us_per_request_step": 20.0,
        "writer_thread_us_per_request_step": 1.0,
        "ratio": 2.0,
        "writer_ratio": 0.05,
    }
    out = {
        "machine": {"quick": True, "cpus": 2, "repeat": 1},
        "attached_recorder_overhead": [figure, figure | {"requests": 256, "ratio": 0.04}],
        "attached_recorder_overhead_mrv2": [figure | {"ratio": 0.04, "writer_ratio": 0.07}],
    }
    labels = {r[0]: r[3] for r in rows(out)}
    assert labels["attached recorder CPU vs the scheduler's own, 64 requests"] == "MISSED"
    assert labels["attached recorder CPU vs the scheduler's own, 256 requests"] == "met"
    assert labels["attached recorder CPU vs the scheduler's own (Model Runner V2), 64 requests"] == "MISSED"
