"""Shrink and gate on recordings (workflows/shrink.py, workflows/gate.py, over replaying.plan_replay).

A recording shrinks on its recorded outcomes: every candidate runs on the recording's tokens and
drafts for the requests it keeps, prompts keep their length, and the minimal trace carries the
outcomes it ran on, so it replays to itself. A recording as a gate golden is rerun on its
outcomes through the implementation under test (the ground truth it lacks is not compared), and
`--update` leaves it as it is.

The live tests (`vllm`) share one `specreplay record --scenario reentry --engine vllm` run, made
in its own process (vLLM on CPU cannot build a second engine of another config in one process),
and one shrink of it. The reference recording forced to its outcomes runs everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.replay.check.tracediff import diff_traces
from specreplay.replay.workflows.gate import GateOptions, run_gate, update_goldens
from specreplay.replay.workflows.record import pick_workload, record_to, replay_to
from specreplay.replay.workflows.replaying import default_oracle
from specreplay.replay.workflows.shrink import shrink_to
from specreplay.traces.io import read_trace

X5 = "X5-placeholder-drafts"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def outputs(trace) -> dict[str, list[int]]:
    """Per request, the tokens the scheduler applied, in order: what the model said."""
    out: dict[str, list[int]] = {}
    for row in trace.table.to_pylist():
        if row["apply_outcome"] == "applied" and row["apply_sampled_token_ids"]:
            out.setdefault(row["request_id"], []).extend(row["apply_sampled_token_ids"][: row["apply_num_tokens"]])
    return out


def where(trace, code: str) -> list[tuple[int, str]]:
    return [(f.step, f.request_id) for f in check_trace(trace) if f.code == code]


def load_test_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- a live recording
@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("live") / "live.parquet"
    cmd = [
        sys.executable,
        "-m",
        "specreplay.cli",
        "record",
        "--scenario",
        "reentry",
        "--engine",
        "vllm",
        "--runner",
        "v1",
        "-o",
        path,
    ]
    # Unforced (families/vllm/forced_logits.py): the dummy model's tokens and ngram_gpu, whose in-place trim
    # of the SchedulerOutput makes pr30796's edit below a change, not an X10 error (as on a forced,
    # draft_model recording, where no drafter edits it).
    env = {**os.environ, "SPECREPLAY_LIVE_UNFORCED": "1"}
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return path


@pytest.fixture(scope="module")
def shrunk(live, tmp_path_factory):
    folder = tmp_path_factory.mktemp("shrunk")
    return shrink_to(live, folder / "min.parquet", code=X5, pytest_file=folder / "test_min.py")


@pytest.mark.vllm
def test_a_live_recording_shrinks_on_its_outcomes_and_the_finding_stays(live, shrunk):
    recording, minimal = read_trace(live), read_trace(shrunk.output)
    assert (shrunk.oracle, shrunk.engine, shrunk.impl) == ("recorded", "reference", "upstream")
    assert where(recording, X5) == [(5, "10")]  # request 10 re-enters after a budget skip
    assert shrunk.before[:2] == (11, 11)  # 11 requests, 11 steps (the last one announces the last finish)
    assert shrunk.after[0] < 11 and shrunk.after[1] < 10 and shrunk.after[2] < shrunk.before[2]
    # The finding at its shrunk place: request 10 still re-enters with 3 placeholder drafts, earlier.
    [(step, rid)] = where(minimal, X5)
    assert rid == "10" and step < 5
    row = next(r for r in minimal.table.to_pylist() if r["step"] == step and r["request_id"] == "10")
    assert row["worker_draft_ids"] == [-1, -1, -1] and row["worker_negative_inputs"] == 3
    # The recorded outcomes were kept: each request left said what it said live, up to where it stops.
    live_said, kept = outputs(recording), outputs(minimal)
    assert set(kept) < set(live_said) and len(kept) == shrunk.after[0]
    for rid, tokens in kept.items():
        assert tokens == live_said[rid][: len(tokens)], rid
    # Prompts kept their length (the recorded tokens follow them).
    asked = {r["id"]: r["prompt_len"] for r in recording.workload.requests}
    assert all(r["prompt_len"] == asked[r["id"]] for r in minimal.workload.requests)
    # The recorded inputs of the requests kept, and only theirs.
    lives = {r["id"]: r["prompt"] for r in recording.inputs.requests}
    assert {r["id"]: r["prompt"] for r in minimal.inputs.requests} == {rid: lives[rid] for rid in kept}
    # The engine its rows ran on, and the outcomes note that makes it replay as the recording it reduces.
    impl = minimal.impl
    assert (impl.engine, impl.drafter, impl.outcomes.drains_at_end) == ("reference", "ngram_gpu", False)
    assert impl.outcomes.source == str(live) and impl.outcomes.filled == {"tokens": 0, "drafts": 0}
    assert default_oracle(minimal) == "recorded"


@pytest.mark.vllm
def test_the_shrunk_recording_replays_to_itself(shrunk, tmp_path):
    replayed = replay_to(tmp_path / "again.parquet", shrunk.output)
    assert replayed.trace.impl.outcomes.filled == {"tokens": 0, "drafts": 0}
    minimal = read_trace(shrunk.output)
    diff = diff_traces(minimal, read_trace(tmp_path / "again.parquet"))
    assert diff.same and diff.rows_compared == minimal.table.num_rows, diff.first


@pytest.mark.vllm
def test_the_emitted_test_replays_the_minimal_recording(shrunk, monkeypatch):
    text = shrunk.pytest_file.read_text()
    assert "TRACE = Path(__file__).parent / 'min.parquet'" in text and "WORKLOAD" not in text
    test = next(v for k, v in vars(load_test_module(shrunk.pytest_file)).items() if k.startswith("test_"))
    monkeypatch.delenv("SPECREPLAY_IMPL", raising=False)
    with pytest.raises(AssertionError, match=f"{X5} at step 3, request '10'"):
        test()  # upstream: the bug
    monkeypatch.setenv("SPECREPLAY_IMPL", "sched-clear")
    test()  # the fix clears the placeholders


@pytest.mark.vllm
def test_a_live_golden_passes_on_upstream_and_changes_under_the_fixes(live, shrunk, tmp_path):
    goldens = tmp_path / "goldens"
    goldens.mkdir()
    shutil.copy(live, goldens / "live.parquet")
    shutil.copy(shrunk.output, goldens / "min.parquet")
    same = run_gate([goldens], GateOptions())
    assert [(Path(r.path).name, r.result) for r in same] == [("live.parquet", "pass"), ("min.parquet", "pass")]
    for r in same:
        assert {f.code for f in r.findings} == {"S5-draft-provenance", X5} and not r.changes
        assert r.unchecked == []  # the rerun on the reference has ground truth: everything was checked
        assert any("rerun on its recorded outcomes on reference" in n for n in r.notes)
    # The truth the live golden lacks is named, not counted as a difference.
    assert any(n.startswith("not compared: ") and "truth_kv_ok" in n for n in same[0].notes)
    # sched-clear books no slots for the re-entering request: its scheduling differs, X5 is gone.
    [clear, clear_min] = run_gate([goldens], GateOptions(impl="sched-clear"))
    assert clear.result == "changed" and X5 not in {f.code for f in clear.findings}
    f = clear.changes[0]
    assert (f.step, f.request_id, f.field, f.scheduler, f.worker) == (3, "10", "sched_spec_len", 3, 0)
    assert clear_min.result == "changed"
    # pr30796 drops the placeholder slots in the worker: 4 tokens run live, 1 now.
    [pr, _] = run_gate([goldens], GateOptions(impl="pr30796"))
    assert pr.result == "changed" and pr.changed_fields["worker_num_scheduled_tokens"] >= 1
    assert "worker_num_scheduled_tokens: 4 in the golden, 1 now" in pr.message
    # The command: exit 0, then 1 with the change named.
    assert run("gate", goldens).exit_code == 0
    result = run("gate", goldens, "--impl", "sched-clear", "--format", "json")
    assert result.exit_code == 1
    assert [r["result"] for r in json.loads(result.output)["results"]] == ["changed", "changed"]


@pytest.mark.vllm
def test_update_leaves_a_live_golden_as_it_is(live, tmp_path):
    golden = tmp_path / "live.parquet"
    shutil.copy(live, golden)
    before = golden.read_bytes()
    result = run("gate", "--update", golden, "--impl", "sched-clear")
    assert result.exit_code == 2
    assert result.output.startswith(f"refused {golden}: a recording of the vllm engine")
    assert "--update --oracle synthetic" in result.output and len(result.output.splitlines()) == 1
    assert golden.read_bytes() == before


# ---------------------------------------------------------------------------- a reference recording
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ref") / "reentry.parquet"
    record_to(path, pick_workload(scenario="reentry"), "upstream")
    return path


def test_a_reference_recording_shrinks_on_its_outcomes_when_asked(reference, tmp_path):
    out = tmp_path / "min.parquet"
    result = run("shrink", reference, "--oracle", "recorded", "--code", X5, "--max-runs", "80", "-o", out)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"shrunk {reference} on its recorded outcomes (reference engine) while {X5}")
    recording, minimal = read_trace(reference), read_trace(out)
    assert where(recording, X5) == [(4, "10")]
    [(step, rid)] = where(minimal, X5)
    assert rid == "10" and step <= 4
    said = outputs(recording)
    assert all(tokens == said[rid][: len(tokens)] for rid, tokens in outputs(minimal).items())
    total = sum(r["max_tokens"] for r in minimal.workload.requests)
    assert total < sum(r["max_tokens"] for r in recording.workload.requests)
    asked = {r["id"]: r["prompt_len"] for r in recording.workload.requests}
    assert all(r["prompt_len"] == asked[r["id"]] for r in minimal.workload.requests)
    impl = minimal.impl
    assert (impl.engine, impl.drafter) == ("reference", "fixed")
    assert impl.outcomes.filled["drafts"] == 0  # every draft verified was a recorded proposal
    # It ran on recorded outcomes, so it replays on them by default (its outcomes note says so),
    # and comes back to itself.
    assert default_oracle(minimal) == "recorded" and default_oracle(recording) == "synthetic"
    replay_to(tmp_path / "again.parquet", out)
    assert diff_traces(minimal, read_trace(tmp_path / "again.parquet")).same


def test_the_synthetic_shrink_of_the_same_trace_still_cuts_prompts(reference, tmp_path):
    report = shrink_to(reference, tmp_path / "min.parquet", code=X5, max_runs=80)
    assert report.oracle == "synthetic" and report.shrunk.oracle is None
    assert any("prompt_len" in label for label in report.shrunk.reductions)
    assert read_trace(tmp_path / "min.parquet").impl.outcomes is None


def test_a_reference_golden_gated_on_its_outcomes_and_update_refused(reference, tmp_path):
    golden = tmp_path / "reentry.parquet"
    shutil.copy(reference, golden)
    [same] = run_gate([golden], GateOptions(oracle="recorded"))
    assert same.result == "pass" and not same.changes
    assert any("rerun on its recorded outcomes" in n for n in same.notes)
    [clear] = run_gate([golden], GateOptions(impl="sched-clear", oracle="recorded"))
    f = clear.changes[0]
    assert clear.result == "changed" and (f.step, f.request_id, f.field) == (3, "10", "sched_spec_len")
    before = golden.read_bytes()
    [refused] = update_goldens([golden], GateOptions(impl="sched-clear", oracle="recorded"))
    assert refused.status == "refused" and "a recording of the reference engine" in refused.message
    assert golden.read_bytes() == before
    # Without --oracle the reference golden is an ordinary one: --update rewrites it.
    [updated] = update_goldens([golden], GateOptions(impl="sched-clear"))
    assert updated.status == "updated" and read_trace(golden).impl_name == "sched-clear"


def test_a_live_engine_with_recorded_outcomes_is_refused_in_one_line(reference, tmp_path):
    result = run(
        "shrink", reference, "--oracle", "recorded", "--engine", "vllm", "--code", X5, "-o", tmp_path / "m.parquet"
    )
    assert result.exit_code == 2 and "a live engine makes its own outcomes" in result.output
    [r] = run_gate([reference], GateOptions(oracle="recorded", engine="vllm"))
    assert r.result == "error" and "a live engine makes its own outcomes" in r.message
