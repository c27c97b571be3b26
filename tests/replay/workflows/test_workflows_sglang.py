"""explore, shrink --emit-pytest, the gate and compare on SGLang's scheduler (replay/workflows/*).

The tests marked `sglang` run SGLang's real scheduler (`scripts/sglang.sh test`); the others need no
SGLang and run in the main environment too: what explore draws for SGLang (families/sglang/shape.py,
held to the engine's own refusal), which implementations compare lists, and where the SGLang goldens
sit. A shrink needs a finding that fires on demand: `crashing_worker` makes the reference SGLang
worker raise when it would write request b's position 9, which the checker reports as
E1-engine-crash (the worker is the implementation's code, engines/crash.py), and lifting it is the fix.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.families.sglang import setup as sglang_setup
from specreplay.replay.families.sglang.worker import SglangReferenceWorker
from specreplay.replay.impls.registry import registry
from specreplay.replay.workflows.explore import PROFILES, candidate_workload
from specreplay.replay.workflows.gate import GateOptions, collect, corpus_dir, run_gate
from specreplay.replay.workflows.record import DEFAULT_COMPARE, compare_defaults
from specreplay.replay.workloads.generators import explore_workload
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces.io import read_trace, write_trace

sglang = pytest.mark.sglang
ENGINE = "sglang-scheduler"
GOLDENS = {"abort-stop", "reentry", "reentry-sync", "retract", "retract-sync"}


def load_test_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ====================================================================== explore
def test_every_draw_shaped_for_sglang_is_one_it_takes():
    """The shape keeps what SGLang takes and nothing it refuses, for draws of every profile: a
    streaming session stays one (its chunks with it) where the radix cache is on."""
    kinds, turns, sessions = set(), 0, 0
    for seed in range(120):
        profiles = (PROFILES[seed % len(PROFILES)], PROFILES[(seed * 7 + 3) % len(PROFILES)])
        drawn = explore_workload(seed, profiles)
        shaped = candidate_workload(seed, profiles, engine=ENGINE)
        sglang_setup.refuse_workload(shaped)  # raises InputError for anything SGLang cannot take
        assert shaped == candidate_workload(seed, profiles, engine=ENGINE)  # a seed still names one workload
        # Arrivals, lengths and aborts as drawn; the aborts among the events kept, the rest gone. A
        # conversation's turn sent after_finish gets a fixed step: that many after its turn before.
        arrival = {r.request_id: r.arrival_step for r in shaped.requests}
        assert [
            (
                r.request_id,
                arrival[r.follows] + r.after_finish if r.after_finish and r.follows else r.arrival_step,
                r.prompt_len,
                r.max_tokens,
                r.abort_step,
                r.prefix,
                r.follows,
            )
            for r in drawn.requests
        ] == [
            (r.request_id, r.arrival_step, r.prompt_len, r.max_tokens, r.abort_step, r.prefix, r.follows)
            for r in shaped.requests
        ]
        assert not any(r.after_finish for r in shaped.requests)
        turns += any(r.after_finish for r in drawn.requests)
        apc = drawn.config.enable_prefix_caching
        assert shaped.events == tuple(
            e for e in drawn.events if e.kind == "abort" or (apc and e.kind == "stream_append")
        )
        assert [r.streaming for r in shaped.requests] == [r.streaming and apc for r in drawn.requests]
        sessions += any(r.streaming for r in shaped.requests)
        assert shaped.config.num_spec_tokens == drawn.config.num_spec_tokens
        assert shaped.config.async_scheduling == drawn.config.async_scheduling
        kinds |= {e.kind for e in drawn.events}
    assert {"pause", "abort", "stream_append"} <= kinds  # the draws had what the shape drops
    assert turns  # and turns sent after_finish, which it fixes
    assert sessions  # and streaming sessions, which it keeps


def test_the_vllm_engines_draw_as_before():
    for seed in range(20):
        assert candidate_workload(seed, ("events", "kv-pressure")) == candidate_workload(
            seed, ("events", "kv-pressure"), engine="reference"
        )


@sglang
def test_explore_on_sglang_runs_every_draw(tmp_path):
    out = tmp_path / "found"
    result = CliRunner().invoke(main, ["explore", "--engine", ENGINE, "--budget", "10", "--seed", "3", "-o", str(out)])
    assert result.exit_code in (0, 1), result.output  # 1: findings (a report), never 2: a draw SGLang refused
    summary = json.loads((out / "explore.json").read_text())
    assert (summary["engine"], summary["workloads"], summary["implementation_errors"]) == (ENGINE, 10, 0)
    assert summary["settings"].get("lookahead=0") == 10
    assert "vLLM" not in result.output  # SGLang's scheduler is no vLLM release
    for code, finding in summary["findings"].items():  # each saved trace is SGLang's
        assert read_trace(out / finding["trace"]).impl.engine == ENGINE, code


# ====================================================================== shrink --emit-pytest
def crashing_done(original):
    def _done(self, results):
        if any(r.rid == "b" and r.first_position <= 9 < r.first_position + len(r.written) for r in results):
            raise RuntimeError("the worker fell over at b's position 9")
        return original(self, results)

    return _done


@pytest.fixture
def crashing_worker(monkeypatch):
    """The reference SGLang worker raises when it would write b's position 9 (module docstring)."""
    monkeypatch.setattr(SglangReferenceWorker, "_done", crashing_done(SglangReferenceWorker._done))
    return monkeypatch


@sglang
@pytest.mark.parametrize("oracle", ["recorded", "synthetic"])
def test_shrink_emits_a_test_that_reruns_on_sglang(tmp_path, crashing_worker, oracle):
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    text = "a:p4,t6 c:p2,t4@2 b:p3,t10 | budget 8 seqs 3 k3 async"
    recording = write_trace(
        run_workload(workload_from_notation(text), resolve("upstream", allow_import=False), engine=ENGINE),
        tmp_path / "rec.parquet",
    )
    minimal, test_file = tmp_path / "min.parquet", tmp_path / "test_min.py"
    args = ["shrink", str(recording), "-o", str(minimal), "--emit-pytest", str(test_file), "--oracle", oracle]
    args += ["--code", "E1-engine-crash", "--max-runs", "12"]  # enough to drop a and c: the rest is shrink's own
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    shrunk = read_trace(minimal)
    assert [r["id"] for r in shrunk.workload.requests] == ["b"]
    assert shrunk.impl.engine == ENGINE and shrunk.outcome.status == "crashed"
    source = test_file.read_text()
    assert "ENGINE = 'sglang-scheduler'" in source and "Run it where SGLang is installed" in source
    assert ("TRACE = Path(__file__).parent / 'min.parquet'" in source) == (oracle == "recorded")
    test = next(v for k, v in vars(load_test_module(test_file)).items() if k.startswith("test_"))
    with pytest.raises(AssertionError, match="E1-engine-crash at step"):
        test()  # the worker still falls over
    crashing_worker.undo()
    test()  # fixed: it runs through


# ====================================================================== the gate
def test_the_sglang_goldens_sit_apart_from_the_main_corpus():
    main_corpus = {p.resolve() for p in collect([corpus_dir()])}  # what `specreplay gate` gates by default
    ours = collect([corpus_dir(ENGINE)])
    assert {p.stem for p in ours} == GOLDENS and not main_corpus & {p.resolve() for p in ours}
    assert all(read_trace(p).impl.engine != ENGINE for p in main_corpus)
    assert corpus_dir("vllm-scheduler") == corpus_dir()  # no corpus of its own: the shipped one
    modes = set()
    for path in ours:
        golden = read_trace(path)
        assert golden.impl.engine == ENGINE and golden.outcome.status == "completed"
        config = golden.config
        modes.add((config.async_scheduling, config.num_spec_tokens > 0))
        rows = golden.table.to_pylist()
        if path.stem.startswith("retract"):
            assert any(r["sched_preempted"] for r in rows)
        if path.stem == "abort-stop":
            assert {"abort"} <= {r["sched_event"] for r in rows} and "stop" in {r["apply_finish_reason"] for r in rows}
    assert modes == {(True, True), (True, False), (False, True), (False, False)}  # overlap x spec


@pytest.mark.skipif(sglang_setup.installed_sglang_version() is not None, reason="the main environment's view")
def test_without_sglang_an_sglang_golden_is_an_error_that_says_how_to_install_it():
    (result,) = run_gate([corpus_dir(ENGINE) / "reentry.parquet"], GateOptions())
    assert result.result == "error" and "scripts/sglang.sh install" in result.message


@sglang
def test_the_sglang_goldens_pass_and_a_changed_row_is_caught(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["gate", "--engine", ENGINE, "--format", "json"])
    assert result.exit_code == 0, result.output
    results = json.loads(result.output)["results"]
    rerun = [f"golden recorded on the {ENGINE} engine, rerun on its recorded outcomes on {ENGINE}"]
    assert sorted((Path(r["path"]).stem, r["result"], r["notes"]) for r in results) == sorted(
        (name, "pass", rerun) for name in GOLDENS
    )
    # A golden whose scheduler view says otherwise than SGLang now does: changed, where it parts.
    golden = read_trace(corpus_dir(ENGINE) / "retract.parquet")
    table = golden.table
    at = next(i for i, r in enumerate(table.column("sched_kv_allocated_len").to_pylist()) if r)
    lengths = table.column("sched_kv_allocated_len").to_pylist()
    lengths[at] += 1
    column = table.schema.get_field_index("sched_kv_allocated_len")
    field = table.schema.field(column)
    changed = dataclasses.replace(golden, table=table.set_column(column, field, pa.array(lengths, field.type)))
    goldens = tmp_path / "goldens"
    goldens.mkdir()
    write_trace(changed, goldens / "retract.parquet")
    result = runner.invoke(main, ["gate", str(goldens), "--format", "json"])
    (got,) = json.loads(result.output)["results"]
    step, rid = table.column("step")[at].as_py(), table.column("request_id")[at].as_py()
    assert result.exit_code == 1 and got["result"] == "changed"
    assert f"from step {step}, request {rid}, sched_kv_allocated_len" in got["message"]
    # --update keeps a recording; --oracle synthetic re-records it on SGLang, as the golden was made.
    result = runner.invoke(main, ["gate", str(goldens), "--update"])
    assert result.exit_code == 2 and "refused" in result.output
    shutil.copy(corpus_dir(ENGINE) / "reentry.parquet", goldens / "reentry.parquet")
    result = runner.invoke(main, ["gate", str(goldens), "--update", "--oracle", "synthetic"])
    assert result.exit_code == 0 and "same" in result.output and "updated" in result.output, result.output


@sglang
def test_each_scheduler_picks_its_port_afresh_whatever_seeded_the_last(monkeypatch):
    """SGLang draws its gloo port from Python's global random, which every Scheduler seeds with its
    workload's seed: without a fresh draw, the runs after a seed-0 run would pick the same port in
    every process (gate --jobs 2 on the goldens, two test runs at once) and collide."""
    import random

    from sglang.srt.server_args import PortArgs

    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve

    draws, init_new = [], PortArgs.init_new

    def drawing(*args, **kwargs):
        draws.append(random.random())  # the global state SGLang's port pick starts from
        return init_new(*args, **kwargs)

    monkeypatch.setattr(PortArgs, "init_new", staticmethod(drawing))
    w = workload_from_notation("a:p3,t2 | k0 sync")
    for _ in range(3):
        assert run_workload(w, resolve("upstream", allow_import=False), engine=ENGINE).outcome.status == "completed"
    assert len(draws) == 3 and draws[1] != draws[2]  # both after a seed-0 Scheduler


# ====================================================================== compare
def test_compare_lists_what_has_an_sglang_form():
    w = build_scenario("reentry", 0)
    names, left_out = compare_defaults(ENGINE, None, w)
    assert "upstream" in names and set(names) | dict(left_out).keys() == set(registry())
    for name in ("pr30796", "pr30796-copy", "sched-clear", "noclamp", "life-guard"):  # vLLM's variants
        assert dict(left_out).get(name) == f"no form for --engine {ENGINE}"
    assert compare_defaults("reference", None, w) == (list(DEFAULT_COMPARE), [])


@sglang
def test_compare_on_sglang_records_each_side_by_side(tmp_path):
    args = ["compare", "--engine", ENGINE, "--scenario", "reentry-sync", "-o", str(tmp_path), "--format", "json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    ran = [r["impl"] for r in doc["results"]]
    assert ran[0] == "upstream" and set(ran) | set(doc["left_out"]) == set(registry())
    for row in doc["results"]:
        assert read_trace(Path(row["trace"])).impl.engine == ENGINE and row["outcome"] == "completed"
