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
    """A row per runner and size; the target (issue 44): the engine's thread at most 3% of the
    scheduler's CPU, and the engine's thread and the writer's together at most 10%."""
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
        "attached_recorder_overhead": [figure, figure | {"requests": 256, "ratio": 0.03}],
        "attached_recorder_overhead_mrv2": [
            figure | {"ratio": 0.04, "writer_ratio": 0.01},  # the engine's thread over 3%
            figure | {"requests": 256, "ratio": 0.03, "writer_ratio": 0.08},  # over 10% together
        ],
    }
    labels = {r[0]: r[3] for r in rows(out)}
    assert labels["attached recorder CPU vs the scheduler's own, 64 requests"] == "MISSED"
    assert labels["attached recorder CPU vs the scheduler's own, 256 requests"] == "met"
    assert labels["attached recorder CPU vs the scheduler's own (Model Runner V2), 64 requests"] == "MISSED"
    assert labels["attached recorder CPU vs the scheduler's own (Model Runner V2), 256 requests"] == "MISSED"


def test_the_served_figure_is_judged_by_its_median_and_its_best_batch():
    """Recording may cost at most 3% of output tokens/s; the row misses when either the median or
    the best batch says more."""

    def mode(tokens: float, best: float) -> dict:
        return {
            "tokens_per_s": tokens,
            "cpu_s_per_token": 0.4e-3,
            "best_tokens_per_s": best,
            "best_cpu_s_per_token": 0.3e-3,
            "tokens_per_s_vs_off": tokens / 1000 - 1,
            "cpu_per_token_vs_off": 0.0,
            "best_tokens_per_s_vs_off": best / 2000 - 1,
            "best_cpu_per_token_vs_off": 0.0,
        }

    out = {
        "machine": {"quick": True, "cpus": 2, "repeat": 1},
        "served_throughput": {
            "rounds": 15,
            "prompts": 128,
            "output_len": 128,
            "modes": {"off": mode(1000, 2000), "whole": mode(990, 1980), "window": mode(1000, 1900)},
        },
    }
    labels = {r[0].split(" (")[0]: r[3] for r in rows(out)}
    assert labels["served throughput, recorder whole vs off"] == "met"  # -1% and -1%
    assert labels["served throughput, recorder window vs off"] == "MISSED"  # the best batch: -5%
