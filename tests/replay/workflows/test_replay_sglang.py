"""A replay of an SGLang recording on its recorded outcomes (families/sglang/outcomes.py, workflows/replaying.py).

The tests marked `sglang` run SGLang's real scheduler (`scripts/sglang.sh test`). To show that the
outcomes come from the rows and not from the workload's seeded model, the recordings here are made
on another model (`OtherModel`: other output tokens, drafts right on other positions) while their
metadata keep the workload: a replay on the seeded model then differs from the recording, and one
on the recorded outcomes must come back row for row. The tests below the line need no SGLang: they
read the SGLang goldens shipped in replay/corpus/sglang-scheduler/ and run in the main environment.
"""

from __future__ import annotations

import dataclasses
import functools

import pyarrow as pa
import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.sglang.outcomes import SglangRecordedOracle
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workflows.gate import corpus_dir
from specreplay.replay.workflows.replaying import default_oracle, plan_replay, trace_workload
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.oracle import Oracle
from specreplay.traces.errors import InputError
from specreplay.traces.io import read_trace, write_trace

sglang = pytest.mark.sglang
UPSTREAM = resolve("upstream", allow_import=False)
SGLANG_CORPUS = corpus_dir("sglang-scheduler")
#: A length finish, random acceptance, a stop token on the 3rd output, a 20-token prompt prefilled
#: in two chunks, an abort while running and one while waiting.
WORKLOAD = (
    "a:p4,t9 b:p3,t5,random:0.5 c:p3,t8,stop3@2 d:p20,t4@3 e:p3,t12 f:p2,t4@3"
    " | budget 16 seqs 8 | abort(e)@4 abort(f)@3"
)
MODES = [("async", 0), ("sync", 0), ("async", 3), ("sync", 3)]


class OtherModel(Oracle):
    """Not the workload's seeded model: the same prompts, other outputs, drafts right at other positions."""

    def token_at(self, rid, position, prompt_len=None):
        token = super().token_at(rid, position, prompt_len)
        return token if position < self.specs[rid].prompt_len else (token * 5 + 3) % self.vocab

    def drafts(self, rid, first_position, k, prompt_len=None):
        truth = [self.token_at(rid, q) for q in range(first_position, first_position + k)]
        return [t if q % 3 else (t + 1) % self.vocab for q, t in enumerate(truth, start=first_position)]


def workload(mode: str, k: int):
    settings = f" budget 16 seqs 8 k{k} {mode} "
    return workload_from_notation(WORKLOAD.replace(" budget 16 seqs 8 ", settings))


@functools.cache
def other_model_recording(mode: str, k: int):
    from specreplay.replay.families.sglang.loop import run_sglang

    w = workload(mode, k)
    return run_sglang(w, UPSTREAM, oracle=OtherModel(w))


def replayed(trace, oracle: str | None = None):
    plan = plan_replay(trace, "recording", oracle=oracle)
    return run_workload(plan.workload, UPSTREAM, engine=plan.engine, oracle=plan.oracle, runner=plan.runner)


# ====================================================================== on SGLang's scheduler
@sglang
@pytest.mark.parametrize("mode, k", MODES, ids=[f"{m}-k{k}" for m, k in MODES])
def test_a_recording_replays_step_exact_on_its_recorded_outcomes(mode, k):
    recording = other_model_recording(mode, k)
    assert recording.outcome.status == "completed"
    assert {r["sched_event"] for r in recording.table.to_pylist()} >= {"abort"}
    assert default_oracle(recording) == "recorded"
    again = replayed(recording)
    assert again.impl.engine == "sglang-scheduler" and again.impl.outcomes.filled == {"tokens": 0, "drafts": 0}
    diff = diff_traces(recording, again)
    assert diff.same and diff.rows_compared == recording.num_rows and not diff.only_a and not diff.only_b, diff.first
    assert again.outcome.engine_output_tokens == recording.outcome.engine_output_tokens
    # The seeded model is another model: the outcomes came from the rows.
    assert not diff_traces(recording, replayed(recording, oracle="synthetic")).same


@sglang
def test_the_stop_token_and_the_accept_lengths_come_back_from_the_rows():
    recording = other_model_recording("async", 3)
    w = trace_workload(recording, "recording")
    oracle = plan_replay(recording, "recording").oracle
    assert isinstance(oracle, SglangRecordedOracle)
    # c stopped on its 3rd output of the other model, not of the seeded one.
    assert oracle.stop_token("c") == OtherModel(w).stop_token("c") != Oracle(w).stop_token("c")
    verified = [r for r in recording.table.to_pylist() if r["worker_num_draft_slots"]]
    assert {r["worker_num_accepted"] for r in verified} >= {0, 1}  # rounds of both kinds were replayed


class RepeatingModel(Oracle):
    """Every output the same token: a request with stop_at = 3 stops on its first output."""

    def token_at(self, rid, position, prompt_len=None):
        prompt = self.specs[rid].prompt_len
        return super().token_at(rid, min(position, prompt), prompt_len)


@sglang
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_stop_before_the_stop_at_output_replays_on_the_token_its_client_got_last(mode):
    """c's stop token (its 3rd output) is already its 1st: the recording never reached the 3rd
    position, so only what the client received says which token stopped it."""
    from specreplay.replay.families.sglang.loop import run_sglang

    w = workload_from_notation(f"c:p3,t8,stop3 a:p4,t6 | k0 {mode}")
    recording = run_sglang(w, UPSTREAM, oracle=RepeatingModel(w))
    assert recording.outcome.engine_output_tokens["c"] == 1
    oracle = plan_replay(recording, "recording").oracle
    assert oracle.stop_token("c") == RepeatingModel(w).stop_token("c")
    diff = diff_traces(recording, replayed(recording))
    assert diff.same, diff.first


@sglang
def test_replay_and_diff_on_the_command_line(tmp_path):
    recording = write_trace(other_model_recording("async", 3), tmp_path / "rec.parquet")
    runner = CliRunner()
    again = tmp_path / "again.parquet"
    result = runner.invoke(main, ["replay", str(recording), "-o", str(again)])
    assert result.exit_code == 0, result.output
    assert "on the recorded outcomes of" in result.output and "(sglang-scheduler engine)" in result.output
    assert "filled by rule: 0 tokens, 0 drafts" in result.output
    result = runner.invoke(main, ["diff", str(recording), str(again)])
    assert result.exit_code == 0 and "no difference" in result.output, result.output


@sglang
def test_a_vllm_golden_runs_its_workload_on_sglang_with_the_synthetic_oracle(tmp_path):
    out = tmp_path / "on-sglang.parquet"
    args = ["replay", str(corpus_dir() / "reentry.parquet"), "--engine", "sglang-scheduler", "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    trace = read_trace(out)
    assert (trace.impl.engine, trace.impl.runner_family, trace.impl.outcomes) == ("sglang-scheduler", "sglang", None)
    assert trace.workload.to_dict() == read_trace(corpus_dir() / "reentry.parquet").workload.to_dict()


# ====================================================================== without SGLang
def golden(name: str):
    return read_trace(SGLANG_CORPUS / f"{name}.parquet")


@pytest.mark.parametrize(
    "args, says",
    [
        (
            [str(corpus_dir() / "reentry.parquet"), "--engine", "sglang-scheduler", "--oracle", "recorded"],
            "--engine sglang-scheduler runs SGLang's scheduler and worker, and this is a vLLM recording",
        ),
        (
            [str(SGLANG_CORPUS / "reentry.parquet"), "--engine", "reference"],
            "--engine reference runs vLLM's scheduler and worker, and this is an SGLang recording",
        ),
        (
            [str(SGLANG_CORPUS / "reentry.parquet"), "--engine", "vllm"],
            "--engine vllm: a live engine makes its own outcomes; replay a recording's through sglang-scheduler",
        ),
    ],
    ids=["vllm-on-sglang", "sglang-on-reference", "sglang-on-live"],
)
def test_outcomes_never_drive_the_other_engine_family(tmp_path, args, says):
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(main, ["replay", *args, "-o", str(out)])
    assert result.exit_code == 2 and says in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_an_sglang_trace_plans_its_replay_on_sglang_on_its_outcomes():
    trace = golden("reentry")
    plan = plan_replay(trace, "golden")
    assert (plan.engine, plan.runner) == ("sglang-scheduler", "sglang")
    assert isinstance(plan.oracle, SglangRecordedOracle) and plan.oracle.drains_at_end
    # Synthetic on the other family: its workload, with that engine's own worker (no --runner sglang there).
    assert plan_replay(trace, "golden", engine="reference", oracle="synthetic").runner is None
    assert plan_replay(read_trace(corpus_dir() / "reentry.parquet"), "g", engine="sglang-scheduler").runner is None


def test_where_the_recording_is_silent_the_workloads_drafter_proposes():
    trace = golden("reentry")
    w = trace_workload(trace, "golden")
    oracle = plan_replay(trace, "golden").oracle
    seeded = Oracle(w)
    rows = [r for r in trace.table.to_pylist() if r["worker_num_draft_slots"]]
    verified = {(r["request_id"], r["worker_first_position"] + 1) for r in rows}
    assert verified  # recorded proposals are the rows' own
    for rid, first in sorted(verified):
        row = next(r for r in rows if (r["request_id"], r["worker_first_position"] + 1) == (rid, first))
        assert oracle.drafts(rid, first, 3) == row["worker_draft_ids"]
    # A position no row verified: the workload's acceptance over the recorded (here: seeded) tokens.
    rid = "10"
    spec = next(s for s in w.requests if s.request_id == rid)
    far = spec.prompt_len + spec.max_tokens + 2 * w.config.num_spec_tokens + 5  # past any round it ran
    assert (rid, far) not in verified
    assert oracle.drafts(rid, far, 3) == seeded.drafts(rid, far, 3)
    assert [oracle.token_at(rid, q) for q in range(far + 3)] == [seeded.token_at(rid, q) for q in range(far + 3)]


def test_a_row_whose_accept_length_its_drafts_do_not_give_is_refused():
    trace = golden("reentry")
    table = trace.table
    accepted = table.column("worker_num_accepted").to_pylist()
    at = next(i for i, (a, d) in enumerate(zip(accepted, table.column("worker_draft_ids").to_pylist())) if d and a)
    accepted[at] -= 1
    column = table.schema.get_field_index("worker_num_accepted")
    field = table.schema.field(column)
    broken = dataclasses.replace(trace, table=table.set_column(column, field, pa.array(accepted, field.type)))
    step, rid = table.column("step")[at].as_py(), table.column("request_id")[at].as_py()
    with pytest.raises(
        InputError, match=f"recorded outcomes inconsistent at step {step}, request '{rid}': accept length"
    ):
        plan_replay(broken, "golden")


def test_the_stop_token_of_a_stop_finish_is_the_last_output_its_client_received():
    trace = golden("abort-stop")
    w = trace_workload(trace, "golden")
    oracle = plan_replay(trace, "golden").oracle
    assert "c" in oracle.stopped and oracle.received["c"] == 3
    assert oracle.stop_token("c") == Oracle(w).stop_token("c")


def test_an_engine_never_runs_the_other_familys_recorded_oracle():
    """The same rule below the command line: run_workload refuses it before anything is built."""
    sglang_trace, vllm_trace = golden("reentry-sync"), read_trace(corpus_dir() / "reentry-sync.parquet")
    sglang_plan = plan_replay(sglang_trace, "golden")
    vllm_plan = plan_replay(vllm_trace, "golden", oracle="recorded")
    with pytest.raises(
        InputError, match="--engine reference runs vLLM's scheduler and worker, and this is an SGLang recording"
    ):
        run_workload(sglang_plan.workload, UPSTREAM, engine="reference", oracle=sglang_plan.oracle)
    with pytest.raises(
        InputError, match="--engine sglang-scheduler runs SGLang's scheduler and worker, and this is a vLLM recording"
    ):
        run_workload(vllm_plan.workload, UPSTREAM, engine="sglang-scheduler", oracle=vllm_plan.oracle)
