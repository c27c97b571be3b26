"""The reference Model Runner V2 (families/vllm/mrv2/runner.py) on synthetic workloads, read through the
MRV2 observer that records the real runner (families/vllm/mrv2/observer.py) and the KV ground truth.

What MRV2 does that V1 does not, each asserted on the rows: slots taken from the end of the free
list and reused last-freed-first; a request the budget skips keeps its slot, device count and
drafts and verifies them when it comes back; a preempted request comes back as a new life with
all its tokens as prefill; post_update's arithmetic; the n-gram speculator's padding; and the
checker, which finds nothing on the scenario set (as on V1's reference). No vLLM needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.oracle import Oracle
from specreplay.replay.workloads.scenarios import SCENARIOS, build_scenario, reentry
from specreplay.replay.workloads.workload import RequestSpec, Workload

UPSTREAM = resolve("upstream", allow_import=False)


def run_v2(workload, oracle=None, impl=UPSTREAM):
    return run_workload(workload, impl, runner="v2", oracle=oracle)


def rows_of(trace, rid=None):
    rows = trace.table.to_pylist()
    return [r for r in rows if rid is None or r["request_id"] == rid]


def ran(rows):
    return [r for r in rows if r["worker_slot"] is not None]


def preempting() -> Workload:
    """Five requests that do not fit in five blocks of 32: preemption, in async mode, k = 3."""
    base = reentry()
    config = dataclasses.replace(
        base.config, max_num_batched_tokens=64, max_num_seqs=8, block_size=32, num_blocks=6, max_model_len=96
    )
    requests = [RequestSpec(str(i), 1 + (i > 2), 20, 30) for i in range(4)] + [RequestSpec("4", 3, 12, 20)]
    return dataclasses.replace(base, name="preempting", config=config, requests=requests, acceptance="random:0.6")


@pytest.fixture(scope="module")
def seed_trace():
    return run_v2(reentry())


@pytest.fixture(scope="module")
def preempt_trace():
    return run_v2(preempting())


def test_a_v2_trace_names_its_runner_and_has_a_live_mrv2_traces_worker_columns(seed_trace):
    assert seed_trace.impl.runner_family == "v2"
    assert seed_trace.impl.runner.endswith("ModelRunnerV2")
    live = Path(__file__).parents[1] / "views" / "data" / "reentry-mrv2.parquet"
    from specreplay.traces.io import read_trace

    real = read_trace(live)

    def filled(t):
        return {
            c for c in t.table.column_names if c.startswith("worker_") and t.table.column(c).null_count < t.num_rows
        }

    assert filled(seed_trace) == filled(real)


def test_slots_come_from_the_end_of_the_free_list_and_a_freed_slot_is_taken_next(seed_trace):
    first = {r["request_id"]: r["worker_slot"] for r in ran(rows_of(seed_trace)) if r["step"] == 1}
    # 11 requests arrive at step 1, in order: request i takes slot max_num_seqs - 1 - i.
    assert first == {str(i): 15 - i for i in range(11)}
    trace = run_v2(
        dataclasses.replace(
            reentry(), requests=[RequestSpec("a", 1, 3, 2), RequestSpec("b", 1, 3, 40), RequestSpec("c", 6, 3, 4)]
        )
    )
    slots = {r["request_id"]: r["worker_slot"] for r in ran(rows_of(trace))}
    assert slots["a"] == 15 and slots["b"] == 14 and slots["c"] == 15  # a finished: c takes its slot
    took = next(r for r in rows_of(trace, "c") if r["worker_slot_prev_owner"] is not None)
    assert took["worker_slot_prev_owner"] == "a"


def test_a_skipped_request_keeps_its_slot_and_verifies_the_drafts_of_its_last_step(seed_trace):
    """The seed's re-entry on MRV2 (the reference page, section 4): request 10 in slot 5, skipped
    at steps 2 and 3 with device count 3, verifies at step 4 the drafts its step 1 proposed."""
    rows = {r["step"]: r for r in rows_of(seed_trace, "10")}
    assert rows[1]["worker_slot"] == 5 and rows[1]["worker_device_computed_after"] == 3
    assert rows[2]["worker_slot"] is None and rows[3]["worker_slot"] is None  # not in the batch
    back = rows[4]
    assert back["worker_slot"] == 5 and back["worker_device_computed_before"] == 3
    assert back["worker_draft_proposed_step"] == 1 and back["worker_draft_proposed_for"] == "10"
    assert back["worker_draft_base"] == 3 and back["worker_first_position"] == 3
    assert back["worker_num_emitted"] == 4 and back["worker_num_rejected"] == 0  # acceptance all


def test_post_update_advances_the_device_count_by_query_len_minus_rejected(preempt_trace, seed_trace):
    checked = 0
    for trace in (seed_trace, preempt_trace):
        for r in ran(rows_of(trace)):
            assert r["worker_device_computed_after"] == (
                r["worker_device_computed_before"] + r["worker_query_len"] - r["worker_num_rejected"]
            ), r
            if r["worker_num_emitted"]:
                assert r["worker_num_rejected"] == r["worker_num_draft_slots"] - (r["worker_num_emitted"] - 1)
                assert len(r["worker_sampled_ids"]) == r["worker_num_emitted"]
            else:  # a chunked prefill row samples and rejects nothing
                assert r["worker_num_rejected"] == 0
                assert r["worker_device_computed_before"] + r["worker_query_len"] < r["worker_prefill_len"]
            checked += 1
    assert checked > 100


def test_a_preempted_request_comes_back_as_a_new_life_with_all_its_tokens_as_prefill(preempt_trace):
    rows = rows_of(preempt_trace)
    freed = [r for r in rows if r["worker_freed_preempted"]]
    assert freed, "the workload preempts"
    for f in freed:
        back = next(
            r
            for r in rows
            if r["request_id"] == f["request_id"] and r["step"] > f["step"] and r["worker_slot"] is not None
        )
        assert back["worker_new_life"]
        assert back["worker_prefill_len"] > back["sched_num_prompt_tokens"]  # outputs of the first life
        # It starts from what the prefix cache still holds of its own blocks (0 when nothing).
        assert (
            back["worker_device_computed_before"]
            == back["sched_num_cached_tokens"]
            == back["sched_num_computed_tokens"]
        )
    assert any(r["sched_num_cached_tokens"] for r in rows), "no request found cached blocks: the workload shows no hit"
    assert preempt_trace.outcome.status == "completed"
    assert not [f for f in check_trace(preempt_trace) if f.severity == "error"]


class PartialDrafter(Oracle):
    """The synthetic model with an n-gram-like drafter that finds only the first draft: the
    runner pads the rest of each slot with the last sampled token, as vLLM's n-gram speculator."""

    drafter = "ngram_gpu"

    def drafts(self, rid, first_position, k, prompt_len=None):
        return super().drafts(rid, first_position, k, prompt_len)[:1]


def test_an_ngram_slot_without_a_proposal_is_padded_with_the_last_sampled_token():
    workload = reentry()
    trace = run_v2(workload, oracle=PartialDrafter(workload))
    padded = 0
    last: dict[str, int] = {}
    for r in sorted(ran(rows_of(trace)), key=lambda r: r["step"]):
        drafts = r["worker_draft_ids"]
        if len(drafts) == 3 and r["request_id"] in last:
            assert drafts[1:] == [last[r["request_id"]]] * 2, r
            padded += 1
        if r["worker_num_emitted"]:
            last[r["request_id"]] = r["worker_sampled_ids"][-1]
    assert padded > 20
    assert not [f for f in check_trace(trace) if f.severity == "error"]


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "random"])
def test_the_checker_finds_on_v2_what_it_finds_on_v1_on_the_scenario_set(name):
    """No false positives: each scenario's errors on the v2 reference are those on V1's
    reference (the known failures the scenarios exist for), never more."""
    workload = build_scenario(name)
    v1 = {f.code for f in check_trace(run_workload(workload, UPSTREAM)) if f.severity == "error"}
    v2 = {f.code for f in check_trace(run_v2(workload)) if f.severity == "error"}
    assert v2 <= v1, (name, v2 - v1)


@pytest.mark.parametrize("seed", range(8))
def test_random_workloads_on_v2_check_clean_where_v1_does(seed):
    workload = build_scenario("random", seed)
    v1 = {f.code for f in check_trace(run_workload(workload, UPSTREAM)) if f.severity == "error"}
    v2 = {f.code for f in check_trace(run_v2(workload)) if f.severity == "error"}
    assert v2 <= v1, (seed, v2 - v1)


def test_both_releases_run_the_same_runner_state():
    for version in ("0.32.0", "0.33.0"):
        trace = run_v2(reentry().at_version(version))
        assert trace.outcome.status == "completed" and trace.impl.runner_family == "v2"


def test_a_v1_runner_variant_is_refused_on_v2_in_one_line(tmp_path):
    result = CliRunner().invoke(
        main,
        ["record", "--scenario", "reentry", "--impl", "pr30796", "--runner", "v2", "-o", str(tmp_path / "x.parquet")],
    )
    assert result.exit_code == 2, result.output
    assert "pass --runner v1" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.parquet").exists()


def test_compare_on_the_reference_mrv2_leaves_out_the_v1_runner_variants(tmp_path):
    result = CliRunner().invoke(
        main, ["compare", "--scenario", "reentry", "--runner", "v2", "-o", str(tmp_path)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "left out: pr30796 (its reference runner form is for --runner v1)" in result.output
    shown = CliRunner().invoke(
        main, ["show", str(tmp_path / "reentry-upstream.parquet"), "--request", "10", "--steps", "1:5"]
    )
    # MRV2's lanes, as a live MRV2 trace shows them: request 10 keeps slot 5 through its skips.
    assert "on Model Runner V2" in shown.output and "(5)" in shown.output and "@1" in shown.output, shown.output
