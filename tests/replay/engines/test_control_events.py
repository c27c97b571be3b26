"""Control events: pause / resume, cache resets, aborts in flight, same-id resubmission and
streaming input, on the reference models; the invariants that watch request lives (L1-L3, E2),
each with a trace that breaks it and one that keeps it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import Implementation, resolve
from specreplay.replay.models.scheduler import AsyncScheduler
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.replay.workloads.workload import Workload


def run(name: str, impl="upstream"):
    implementation = impl if isinstance(impl, Implementation) else resolve(impl, allow_import=False)
    trace = run_workload(build_scenario(name), implementation)
    return trace, check_trace(trace), trace.table.to_pandas()


def errors(findings) -> set[str]:
    return {f.code for f in findings if f.severity == "error"}


# ---------------------------------------------------------------------- the scenarios on upstream
def test_pause_clear_drops_exactly_the_outputs_in_flight_at_the_reset():
    trace, findings, df = run("pause-clear")
    assert trace.outcome.status == "completed" and not errors(findings)
    assert df.step_event.str.contains("pause").any() and df.step_event.str.contains("resume").any()
    # The pause: no schedule() at steps 6-8; step 5's output drains (applied), then the clear
    # preempts everyone, who resume at step 9 with a full re-prefill.
    assert set(df.step) & {6, 7, 8} == set()
    at9 = df[df.step == 9]
    assert (at9.sched_event == "reset_preempt").all() and set(at9.sched_kind) == {"resumed", "unscheduled"}
    assert (at9.sched_kind == "resumed").sum() == 5  # the budget of 64 takes five re-prefills; one waits
    assert (df[df.step == 5].apply_outcome == "applied").all()
    # The reset at step 14 lands with step 13 in flight: exactly step 13's outputs are dropped,
    # and the stale counter holds its scheduled tokens (1 + 3 draft slots), not one per step.
    dropped = df[df.apply_outcome == "dropped"]
    assert set(dropped.step) == {13} and len(dropped) == 6 and (dropped.apply_step == 14).all()
    at14 = df[df.step == 14]
    assert (at14.sched_num_stale_output_tokens == 4).all() and (at14.sched_num_output_placeholders == 0).all()


def test_abort_inflight_ignores_the_aborted_outputs_only():
    trace, findings, df = run("abort-inflight")
    assert trace.outcome.status == "completed" and not errors(findings)
    ignored = df[df.apply_outcome == "ignored"]
    # Request 1 aborted after step 5's schedule: steps 4 and 5 were in flight. Request 2 aborted
    # before step 7's: step 6 was. (Other ignored outputs: requests finishing with one in flight.)
    assert {(4, "1"), (5, "1"), (6, "2")} <= set(zip(ignored.step, ignored.request_id))
    assert df[(df.request_id == "1") & (df.step == 5)].apply_finish_reason.item() == "aborted"
    assert df[(df.request_id == "2") & (df.step == 7)].sched_event.item() == "abort"
    assert (df[df.request_id == "6"].sched_kind == "new").any()  # the late request ran
    assert set(df.apply_outcome.dropna()) <= {"applied", "ignored"}


def test_streaming_append_turns_keep_the_kv_and_drop_the_ended_turns_step():
    trace, findings, df = run("streaming-append")
    assert trace.outcome.status == "completed" and not errors(findings)
    s = df[df.request_id == "s"]
    # Turn prompts: 6; then 6 + (6 - 1) kept outputs + 4 appended = 15; then 15 + (5 - 1) + 3 = 22.
    assert sorted(set(s.sched_num_prompt_tokens)) == [6, 15, 22]
    turns = s[s.sched_event == "stream_turn"]
    assert list(turns.step) == [6, 10]
    new_turns = s[(s.sched_kind == "new")]
    assert list(new_turns.sched_num_computed_tokens) == [0, 11, 19]  # the KV kept: all but the last token
    assert list(s[s.apply_outcome == "dropped"].step) == [5, 9]  # in flight when each turn ended
    assert (s.truth_kv_ok.dropna()).all() and (s.apply_token_mismatches.dropna() == 0).all()
    # Its last turn ends by length at step 22's output; step 23, in flight, is ignored; step 24
    # only announces the session finished (vLLM's engine core steps to announce it).
    assert s.apply_finish_reason.iloc[-3] == "length" and s.sched_status.iloc[-2] == "running"
    assert s.sched_status.iloc[-1] == "finished" and s.sched_finished_announced.iloc[-1]


def test_resubmission_with_a_step_in_flight_is_vllms_bug_and_life_guard_fixes_it():
    trace, findings, df = run("resubmit")
    assert trace.outcome.status == "crashed" and trace.outcome.step == 12
    assert "num_output_placeholders" in trace.outcome.message and errors(findings) == {"E1-engine-crash"}
    assert (df[df.request_id == "1"].sched_life == 1).any()  # the clean second life ran first
    guarded, guarded_findings, gdf = run("resubmit", "life-guard")
    assert guarded.outcome.status == "completed" and not errors(guarded_findings)
    old = gdf[(gdf.request_id == "0") & (gdf.step == 11)]
    assert old.sched_life.item() == 0 and old.apply_outcome.item() == "ignored"
    second = gdf[(gdf.request_id == "0") & (gdf.sched_life == 1)]
    assert second.sched_kind.iloc[0] == "new" and second.sched_event.iloc[0] == "resubmit"
    assert (second.apply_token_mismatches.dropna() == 0).all()


def test_streaming_preempt_is_vllms_lost_session():
    trace, findings, df = run("streaming-preempt")
    # Step 10 schedules nothing: it announces request 5, finished by step 8's output.
    assert trace.outcome.to_dict() == {"status": "completed", "step": 10, "unfinished": ["6"]}
    assert errors(findings) == {"E2-run-incomplete"}
    s = df[df.request_id == "6"]
    assert s.sched_preempted.iloc[-2]  # preempted at step 9; at 10, in no queue, it only waits
    assert s.sched_status.iloc[-1] == "waiting" and s.sched_num_tokens.iloc[-1] < s.sched_num_prompt_tokens.iloc[-1]
    # Its stale output, delivered after the preemption, ended the turn.
    assert s[s.apply_outcome == "stale_delivered"].apply_finish_reason.tolist() == ["length"]


def test_aborting_the_session_vllm_lost_finishes_it():
    import dataclasses

    from specreplay.replay.workloads.workload import Event

    base = build_scenario("streaming-preempt")
    w = dataclasses.replace(base, events=base.events + (Event(30, "abort", request="6"),))
    trace = run_workload(w, resolve("upstream", allow_import=False))
    assert trace.outcome.to_dict() == {"status": "completed"}  # the idle engine waits for the abort, which ends it
    assert not errors(check_trace(trace))


# ---------------------------------------------------------------------- each invariant: broken and kept
class NoPlaceholderAssert(AsyncScheduler):
    """No assert on a negative placeholder count: the old life's output lands on the new one."""

    def append_output(self, req, tokens, stale):
        tokens, finish = super(AsyncScheduler, self).append_output(req, tokens, stale)
        if not stale:
            req.num_output_placeholders -= len(tokens)
        return tokens, finish


class StaleAsFresh(NoPlaceholderAssert):
    """Forgets the stale share at a preemption: outputs in flight across it move the counters
    (without the placeholder assert, which would stop the run first)."""

    def preempt_request(self, req, drop_stale_output=False):
        super().preempt_request(req, drop_stale_output)
        req.num_stale_output_tokens = 0


class StaleInSteps(AsyncScheduler):
    """Counts the stale share as one per output in flight (frames), drains it in tokens."""

    def preempt_request(self, req, drop_stale_output=False):
        super().preempt_request(req, drop_stale_output)
        req.num_stale_output_tokens = 1 if req.num_in_flight_tokens else 0


def _impl(cls) -> Implementation:
    return Implementation(cls.__name__, cls.__doc__, scheduler=cls)


@pytest.mark.parametrize(
    "code, broken, kept",
    [
        ("L1-output-life", ("resubmit", _impl(NoPlaceholderAssert)), ("resubmit", "life-guard")),
        ("L2-stale-output", ("pause-clear", _impl(StaleAsFresh)), ("pause-clear", "upstream")),
        ("L3-in-flight-tokens", ("pause-clear", _impl(StaleInSteps)), ("pause-clear", "upstream")),
        ("E2-run-incomplete", ("streaming-preempt", "upstream"), ("streaming-append", "upstream")),
    ],
)
def test_each_life_invariant_has_a_trace_that_breaks_it_and_one_that_keeps_it(code, broken, kept):
    _, bad, _ = run(*broken)
    _, good, _ = run(*kept)
    assert code in {f.code for f in bad}
    assert code not in {f.code for f in good} and not errors(good)


def test_l1_names_both_lives():
    _, findings, _ = run("resubmit", _impl(NoPlaceholderAssert))
    life = next(f for f in findings if f.code == "L1-output-life")
    assert (life.step, life.request_id, life.scheduler, life.worker) == (11, "0", 0, 1)
    assert "life 0" in life.message and "life 1" in life.message


def test_l3_says_the_unit():
    _, findings, _ = run("pause-clear", _impl(StaleInSteps))
    f = next(f for f in findings if f.code == "L3-in-flight-tokens")
    assert f.field == "num_stale_output_tokens" and (f.scheduler, f.worker) == (1, 4)
    assert "scheduled tokens" in f.message


# ---------------------------------------------------------------------- workload files
BAD_EVENTS = [
    ('{"kind": "nap", "step": 3}', "kind must be one of"),
    ('{"kind": "pause", "step": 3}', "no later resume"),
    ('{"kind": "resume", "step": 3, "when": "after"}', "only an abort can land after"),
    ('{"kind": "abort", "step": 3, "request": "zz"}', "must name a request"),
    ('{"kind": "resubmit", "step": 1, "request": "a"}', "a resubmit of 'a' must come after its arrival step 1"),
    ('{"kind": "stream_append", "step": 3, "request": "a", "tokens": 2}', "not a streaming request"),
    ('{"kind": "reset_prefix_cache", "step": 3, "reset_running": "yes"}', "reset_running must be true or false"),
    ('{"kind": "abort", "step": 3, "request": "a", "mode": "keep"}', "abort takes no 'mode'"),
    ('{"kind": "abort", "step": 3, "request": ["a"]}', "must name a request"),
]


@pytest.mark.parametrize("event, message", BAD_EVENTS)
def test_a_bad_event_is_one_line_and_exit_2(tmp_path, event, message):
    path = tmp_path / "w.json"
    path.write_text('{"requests": [{"id": "a", "prompt_len": 4, "max_tokens": 8}], "events": [' + event + "]}")
    result = CliRunner().invoke(main, ["record", "--workload", str(path), "-o", str(tmp_path / "t.parquet")])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "t.parquet").exists()


def test_a_workload_file_with_events_records_and_replays(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text("""
[config]
max_num_batched_tokens = 32
[[requests]]
id = "a"
prompt_len = 4
max_tokens = 12
[[requests]]
id = "s"
prompt_len = 3
max_tokens = 4
streaming = true
[[events]]
step = 4
kind = "reset_prefix_cache"
reset_running = true
[[events]]
step = 5
kind = "stream_append"
request = "s"
tokens = 2
[[events]]
step = 6
kind = "pause"
mode = "wait"
clear_cache = false
[[events]]
step = 8
kind = "resume"
""")
    out = tmp_path / "t.parquet"
    recorded = CliRunner().invoke(main, ["record", "--workload", str(path), "-o", str(out)])
    assert recorded.exit_code == 0 and "check: ok" in recorded.output, recorded.output
    again = CliRunner().invoke(main, ["replay", str(out), "-o", str(tmp_path / "again.parquet")])
    assert again.exit_code == 0, again.output
    same = CliRunner().invoke(main, ["diff", str(out), str(tmp_path / "again.parquet")])
    assert same.exit_code == 0 and "verdict: same" in same.output


def test_shrink_keeps_the_events_the_finding_needs():
    from specreplay.replay.workflows.shrink import shrink

    result = shrink(build_scenario("resubmit"), resolve("upstream", allow_import=False), "E1-engine-crash")
    w = result.workload
    assert [r.request_id for r in w.requests] == ["0"]
    # The abort goes too: request 0 finishing on its own with a step in flight is enough, and
    # the resubmission right after still gets that step's output. A duplicate-id assert (a
    # resubmission while it is live) would be another crash, and is not taken.
    assert [(e.kind, e.request) for e in w.events] == [("resubmit", "0")]
    assert "num_output_placeholders" in result.trace.outcome.message
    assert w.config.max_num_seqs == 1 and len(result.reductions) > 10


def test_a_reset_preempted_life_aborted_and_resubmitted_is_not_marked_preempted():
    """A cache reset preempts request 0, then it is aborted and resubmitted before the same
    schedule(): the output lists 0 as preempted (the reset did it), but the new life's row must
    not say this schedule() preempted it, or S2 sees a preemption with nothing in flight."""
    w = Workload.from_dict(
        {
            "config": {
                "max_num_batched_tokens": 2,
                "max_num_seqs": 1,
                "num_spec_tokens": 0,
                "block_size": 4,
                "num_blocks": 5,
            },
            "requests": [
                {"id": "0", "prompt_len": 1, "max_tokens": 1},
                {"id": "1", "prompt_len": 1, "max_tokens": 1, "arrival_step": 3},
            ],
            "events": [
                {"step": 2, "kind": "reset_prefix_cache", "reset_running": True},
                {"step": 2, "kind": "abort", "request": "0"},
                {"step": 2, "kind": "resubmit", "request": "0"},
            ],
        }
    )
    trace = run_workload(w, resolve("life-guard", allow_import=False))
    rows = trace.table.to_pandas()
    new_life = rows[(rows.step == 2) & (rows.request_id == "0")]
    assert list(new_life.sched_life) == [1] and list(new_life.sched_event) == ["resubmit"]
    assert not new_life.sched_preempted.any()
    assert not errors(check_trace(trace))
