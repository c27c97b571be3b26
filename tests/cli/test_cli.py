"""CLI: the four variants on reentry (table and JSON), exit codes, bad-input messages."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from tests.replay.check.truthless import FORCED_NOT_CHECKED, NEED_KV_TRUTH, NEED_TRUTH, NOT_CHECKED


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    runner = CliRunner()
    paths = {}
    for impl in ("upstream", "pr30796", "pr30796-copy", "sched-clear"):
        path = root / f"{impl}.parquet"
        result = runner.invoke(main, ["record", "--scenario", "reentry", "--impl", impl, "-o", str(path)])
        assert result.exit_code == 0, result.output
        assert f"wrote {path}" in result.output
        paths[impl] = path
    return paths


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize(
    "impl, exit_code, verdict",
    [
        ("upstream", 0, "wasteful"),
        ("pr30796", 1, "diverged"),
        ("pr30796-copy", 1, "diverged"),
        ("sched-clear", 0, "ok"),
    ],
)
def test_diff_json_verdicts_and_exit_codes(recorded, impl, exit_code, verdict):
    result = run("diff", recorded[impl], "--format", "json")
    assert result.exit_code == exit_code
    doc = json.loads(result.output)
    assert doc["verdict"] == verdict
    for f in doc["findings"]:
        # The 0.1 keys and the request's life (README: diff --format json).
        assert set(f) == {"code", "severity", "step", "request_id", "field", "scheduler", "worker", "message", "life"}
    if impl == "upstream":
        assert {(f["code"], f["step"], f["request_id"]) for f in doc["findings"]} == {
            ("S5-draft-provenance", 4, "10"),
            ("X5-placeholder-drafts", 4, "10"),
        }


def test_fail_on_thresholds(recorded):
    assert run("diff", recorded["upstream"], "--fail-on", "warning").exit_code == 1
    assert run("diff", recorded["pr30796"], "--fail-on", "never").exit_code == 0


def test_table_output_names_the_first_divergence_and_tells_the_story(recorded):
    result = run("diff", recorded["pr30796"])
    assert result.exit_code == 1
    assert "verdict: diverged" in result.output
    assert "first divergence: step 4, request '10'" in result.output
    assert "REENTRY" in result.output and "budget" in result.output


def test_two_trace_diff(recorded):
    same = run("diff", recorded["upstream"], recorded["upstream"])
    assert same.exit_code == 0 and "verdict: same" in same.output
    differ = run("diff", recorded["upstream"], recorded["sched-clear"], "--format", "json")
    assert differ.exit_code == 1
    doc = json.loads(differ.output)
    assert doc["verdict"] == "differ"
    first = doc["findings"][0]
    assert (first["step"], first["request_id"], first["field"]) == (3, "10", "sched_spec_len")


def test_replay_through_another_implementation(recorded, tmp_path):
    out = tmp_path / "fixed.parquet"
    result = run("replay", recorded["upstream"], "--impl", "sched-clear", "-o", out)
    assert result.exit_code == 0 and "check: ok" in result.output
    assert run("diff", out, recorded["sched-clear"]).exit_code == 0


def test_listing_commands():
    assert "reentry" in run("scenarios").output
    listing = run("impls").output
    assert all(name in listing for name in ("upstream", "pr30796", "pr30796-copy", "sched-clear"))
    assert "S5-draft-provenance" in run("codes").output
    assert "`worker_num_computed_tokens`" in run("schema").output


def test_info(recorded):
    result = run("info", recorded["upstream"], "--format", "json")
    assert result.exit_code == 0 and json.loads(result.output)["impl"]["name"] == "upstream"


def assert_bad_input(result, text):
    assert result.exit_code == 2, result.output
    assert text in result.output
    assert "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0


def test_bad_inputs_exit_2_with_one_line(tmp_path, recorded):
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    assert_bad_input(run("diff", junk), "not a readable Parquet file")
    assert_bad_input(run("diff", tmp_path / "nope.parquet"), "no such file")
    assert_bad_input(run("info", junk), "not a readable Parquet file")
    assert_bad_input(run("replay", junk, "-o", tmp_path / "x.parquet"), "not a readable Parquet file")
    assert_bad_input(run("record", "--scenario", "nope", "-o", tmp_path / "x.parquet"), "unknown scenario")
    assert_bad_input(
        run("record", "--scenario", "reentry", "--impl", "nope", "-o", tmp_path / "x.parquet"), "unknown implementation"
    )
    assert_bad_input(
        run("record", "--scenario", "reentry", "--impl", "no_such_mod:X", "-o", tmp_path / "x.parquet"), "cannot import"
    )
    assert_bad_input(run("record", "-o", tmp_path / "x.parquet"), "exactly one of")
    bad = tmp_path / "w.toml"
    bad.write_text("requests = [ { id = 'a', prompt_len = -3 } ]")
    assert_bad_input(run("record", "--workload", bad, "-o", tmp_path / "x.parquet"), "prompt_len: must be >= 1")
    bad.write_text("this is = not toml [")
    assert_bad_input(run("record", "--workload", bad, "-o", tmp_path / "x.parquet"), "not valid TOML")
    bad_json = tmp_path / "w.json"
    bad_json.write_text(json.dumps({"requests": [{"id": "a"}], "config": {"max_num_seqs": "many"}}))
    assert_bad_input(
        run("record", "--workload", bad_json, "-o", tmp_path / "x.parquet"), "max_num_seqs must be an integer"
    )
    assert_bad_input(run("diff", recorded["upstream"], recorded["upstream"], recorded["upstream"]), "one or two traces")
    assert not (tmp_path / "x.parquet").exists()


def test_failed_record_keeps_an_existing_trace(tmp_path, recorded):
    target = tmp_path / "keep.parquet"
    target.write_bytes(recorded["upstream"].read_bytes())
    before = target.read_bytes()
    assert run("record", "--scenario", "nope", "-o", target).exit_code == 2
    assert target.read_bytes() == before


def test_workload_file_round_trip(tmp_path):
    wl = tmp_path / "mine.toml"
    wl.write_text("""
name = "mine"
seed = 3
acceptance = "random:0.5"
[config]
max_num_batched_tokens = 24
num_spec_tokens = 2
[[requests]]
id = "a"
prompt_len = 30
max_tokens = 8
[[requests]]
id = "b"
arrival_step = 2
prompt_len = 4
max_tokens = 12
abort_step = 6
""")
    out = tmp_path / "mine.parquet"
    result = run("record", "--workload", wl, "-o", out)
    assert result.exit_code == 0, result.output
    doc = json.loads(run("info", out, "--format", "json").output)
    assert doc["config"]["max_num_batched_tokens"] == 24 and doc["requests"] == 2


def test_cuda_without_gpu_is_bad_input(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_bad_input(
        run("record", "--scenario", "reentry", "--device", "cuda", "-o", tmp_path / "x.parquet"),
        "CUDA is not available",
    )


def test_same_trace_across_processes_and_hash_seeds(tmp_path):
    import os
    import subprocess
    import sys

    from specreplay.traces.io import read_trace

    paths = []
    for seed in ("1", "2"):
        path = tmp_path / f"r{seed}.parquet"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(
            [sys.executable, "-m", "specreplay.cli", "record", "--scenario", "random", "--seed", "5", "-o", str(path)],
            check=True,
            env=env,
            capture_output=True,
        )
        paths.append(path)
    assert read_trace(paths[0]).content_equals(read_trace(paths[1]))


def test_compare_reports_each_variant(tmp_path):
    result = run("compare", "--scenario", "reentry", "-o", tmp_path, "--format", "json")
    assert result.exit_code == 0, result.output
    verdicts = {r["impl"]: r["verdict"] for r in json.loads(result.output)["results"]}
    assert verdicts == {"upstream": "wasteful", "pr30796": "diverged", "pr30796-copy": "diverged", "sched-clear": "ok"}


def test_help_and_diff_do_not_import_torch(tmp_path, recorded):
    import subprocess
    import sys

    args = ["diff", str(recorded["upstream"]), "--format", "json"]
    code = (
        "import sys; from specreplay.cli.main import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False")


def test_user_implementation_errors_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "userimpls.py").write_text(
        "from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler\n"
        "class Boom(AsyncScheduler):\n"
        "    def schedule(self):\n"
        "        raise KeyError('user bug')\n"
        "class Plain(Scheduler):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "x.parquet"
    # An exception of the implementation kills the engine, as in vLLM: a trace, E1, exit 1.
    crashed = run("record", "--scenario", "reentry", "--impl", "userimpls:Boom", "-o", out)
    assert crashed.exit_code == 1 and crashed.output.strip().count("\n") == 0, crashed.output
    assert "outcome crashed at step 1: KeyError: 'user bug', raised in the scheduler by Boom.schedule" in crashed.output
    assert_bad_input(
        run("record", "--scenario", "reentry", "--impl", "userimpls:Plain", "-o", out),
        "Plain is a synchronous Scheduler and the workload uses async scheduling; subclass AsyncScheduler",
    )


def test_seed_overrides_a_workload_file_and_must_be_non_negative(tmp_path):
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"requests": [{"id": "a", "prompt_len": 4, "max_tokens": 4}], "seed": 1}))
    out = tmp_path / "w.parquet"
    assert run("record", "--workload", wl, "--seed", 77, "-o", out).exit_code == 0
    assert json.loads(run("info", out, "--format", "json").output)["seed"] == 77
    assert run("record", "--scenario", "reentry", "--seed", -5, "-o", out).exit_code == 2


def without_ground_truth(path, out):
    """The trace at `path` with its ground-truth columns null, as a live engine records it, at `out`."""
    from specreplay.traces.io import read_trace, write_trace
    from tests.replay.check.truthless import without_ground_truth as strip

    return write_trace(strip(read_trace(path)), out)


def test_a_trace_with_ground_truth_says_everything_was_checked(recorded):
    for impl in recorded:
        doc = json.loads(run("diff", recorded[impl], "--format", "json").output)
        assert doc["unchecked"] == []
    table = run("diff", recorded["sched-clear"]).output
    assert "verdict: ok - the scheduler view, the worker view and the KV cache agree at every step" in table
    assert "not checked" not in table
    assert "not checked" not in run("diff", recorded["pr30796"]).output


def test_a_trace_without_ground_truth_says_which_checks_did_not_run(recorded, tmp_path):
    ok = without_ground_truth(recorded["sched-clear"], tmp_path / "ok.parquet")
    table = run("diff", ok)
    assert table.exit_code == 0
    assert (
        f"verdict: ok ({NOT_CHECKED}) - the scheduler view and the worker view agree at every step; "
        "the KV cache and the tokens were not checked"
    ) in table.output
    assert "and the KV cache agree" not in table.output
    doc = json.loads(run("diff", ok, "--format", "json").output)
    assert doc["verdict"] == "ok" and doc["unchecked"] == NEED_TRUTH
    # With findings: the verdict still says what it could not check; the truth codes cannot fire.
    diverged = without_ground_truth(recorded["pr30796"], tmp_path / "diverged.parquet")
    table = run("diff", diverged)
    assert table.exit_code == 1 and f"verdict: diverged ({NOT_CHECKED}) - " in table.output
    doc = json.loads(run("diff", diverged, "--format", "json").output)
    assert doc["unchecked"] == NEED_TRUTH and not {f["code"] for f in doc["findings"]} & set(NEED_TRUTH)


def test_record_says_which_checks_did_not_run_without_ground_truth(tmp_path, monkeypatch):
    from specreplay.replay.engines import run as engines_run
    from tests.replay.check.truthless import without_ground_truth as strip

    record = engines_run.run_workload
    monkeypatch.setattr(engines_run, "run_workload", lambda *a, **kw: strip(record(*a, **kw)))
    ok = run("record", "--scenario", "reentry", "--impl", "sched-clear", "-o", tmp_path / "ok.parquet")
    assert ok.exit_code == 0 and f"; check: ok ({NOT_CHECKED})" in ok.output
    wasteful = run("record", "--scenario", "reentry", "-o", tmp_path / "wasteful.parquet")
    assert f"; check: wasteful (S5-draft-provenance x1, X5-placeholder-drafts x1); {NOT_CHECKED}; see" in (
        wasteful.output
    )
    monkeypatch.undo()
    assert "not checked" not in run("record", "--scenario", "reentry", "-o", tmp_path / "truth.parquet").output


@pytest.mark.vllm
def test_a_live_trace_says_which_checks_did_not_run(live_reentry_trace, tmp_path):
    from specreplay.traces.io import write_trace

    path = write_trace(live_reentry_trace, tmp_path / "live.parquet")
    table = run("diff", path)
    assert table.exit_code == 0, table.output
    # A forced live trace (the default): its tokens are checked (T1), its KV cache is not.
    assert f"verdict: ok ({FORCED_NOT_CHECKED}) - " in table.output or (
        f"verdict: wasteful ({FORCED_NOT_CHECKED}) - " in table.output
    )
    assert "the scheduler view, the worker view and the KV cache agree" not in table.output
    doc = json.loads(run("diff", path, "--format", "json").output)
    assert doc["unchecked"] == NEED_KV_TRUTH
