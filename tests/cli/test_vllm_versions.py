"""--vllm-version: each command runs the release it is told, a trace keeps the one it ran as, and
each rule that differs between 0.32.0 and 0.33.0 shows in a run (models/releases.py; 0.34.0's:
tests/replay/models/test_release_0_34.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.setup import default_vllm_version, installed_vllm_version
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workflows.gate import corpus_dir
from specreplay.replay.workloads.config import MODELLED_VERSIONS
from specreplay.replay.workloads.workload import Workload
from specreplay.traces.io import open_trace

UPSTREAM = resolve("upstream", allow_import=False)


def version_of(path) -> str:
    return open_trace(path).config.vllm_version


def test_record_replay_and_shrink_keep_the_release(tmp_path):
    runner = CliRunner()
    a = tmp_path / "a.parquet"
    made = runner.invoke(main, ["record", "--scenario", "reentry", "--vllm-version", "0.33.0", "-o", str(a)])
    assert made.exit_code == 0, made.output
    assert version_of(a) == "0.33.0"
    info = runner.invoke(main, ["info", str(a)])
    assert "specreplay reference of vllm 0.33.0" in info.output
    same = tmp_path / "same.parquet"
    assert runner.invoke(main, ["replay", str(a), "-o", str(same)]).exit_code == 0
    assert version_of(same) == "0.33.0"  # a trace reruns as the release it ran as
    older = tmp_path / "older.parquet"
    assert runner.invoke(main, ["replay", str(a), "--vllm-version", "0.32.0", "-o", str(older)]).exit_code == 0
    assert version_of(older) == "0.32.0"


def test_the_default_is_the_installed_release_when_modelled():
    """Else 0.33.0: the newest release with the loop engines' default runner (V1; 0.34.0 has none)."""
    installed = installed_vllm_version()
    assert default_vllm_version() == (installed if installed in MODELLED_VERSIONS else "0.33.0")


def test_a_workload_file_names_its_release_and_a_bad_one_is_one_line(tmp_path):
    doc = {"config": {"vllm_version": "0.33.0"}, "requests": [{"id": "a", "prompt_len": 4, "max_tokens": 3}]}
    good = tmp_path / "w.json"
    good.write_text(json.dumps(doc))
    out = tmp_path / "w.parquet"
    assert CliRunner().invoke(main, ["record", "--workload", str(good), "-o", str(out)]).exit_code == 0
    assert version_of(out) == "0.33.0"
    doc["config"]["vllm_version"] = "0.31.0"
    good.write_text(json.dumps(doc))
    bad = CliRunner().invoke(main, ["record", "--workload", str(good), "-o", str(tmp_path / "x.parquet")])
    assert bad.exit_code == 2
    assert "vllm_version '0.31.0' is not modelled; modelled: 0.32.0, 0.33.0, 0.34.0" in bad.output
    flag = CliRunner().invoke(main, ["record", "--scenario", "reentry", "--vllm-version", "0.31.0", "-o", "y.parquet"])
    assert flag.exit_code == 2 and "0.31.0" in flag.output


def test_the_gate_reruns_a_golden_as_its_release_and_says_when_told_another(tmp_path):
    golden = corpus_dir() / "reentry.parquet"
    own = CliRunner().invoke(main, ["gate", str(golden), "--format", "json"])
    assert own.exit_code == 0, own.output
    assert not any("rerun as" in n for r in json.loads(own.output)["results"] for n in r["notes"])
    other = CliRunner().invoke(main, ["gate", str(golden), "--vllm-version", "0.33.0", "--format", "json"])
    notes = [n for r in json.loads(other.output)["results"] for n in r["notes"]]
    assert "golden recorded as vLLM 0.32.0, rerun as 0.33.0" in notes


def test_explore_runs_as_the_release_asked(tmp_path):
    out = tmp_path / "found"
    result = CliRunner().invoke(main, ["explore", "--budget", "4", "--vllm-version", "0.33.0", "-o", str(out)])
    assert result.exit_code in (0, 1), result.output
    assert "vLLM 0.33.0" in result.output
    assert json.loads((out / "explore.json").read_text())["vllm_version"] == "0.33.0"


# ---------------------------------------------------------------------- the rules, one by one
def _single(max_tokens: int, **config) -> Workload:
    return Workload.from_dict(
        {
            "acceptance": "all",
            "config": {"num_spec_tokens": 3, **config},
            "requests": [{"id": "a", "prompt_len": 5, "max_tokens": max_tokens}],
        }
    )


def _rows(trace, rid="a"):
    return [r for r in trace.table.to_pylist() if r["request_id"] == rid]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_a_stop_inside_accepted_drafts_takes_the_cut_tokens_off_c_in_0_33(async_scheduling):
    """max_tokens 3, all 3 drafts accepted: after the prefill's token, step 2 returns 4 tokens,
    cut to 2 by max_tokens. 0.32.0 keeps C where the schedule put it; 0.33.0 takes the 2 cut
    tokens back off (async: 13 -> 11, sync: 9 -> 7)."""
    workload = _single(3, async_scheduling=async_scheduling)
    runs = {v: run_workload(workload.at_version(v), UPSTREAM) for v in MODELLED_VERSIONS}
    final = {v: [r for r in _rows(t) if r["apply_finish_reason"] == "length"][0] for v, t in runs.items()}
    c32, c33, c34 = (final[v]["apply_num_computed_tokens"] for v in ("0.32.0", "0.33.0", "0.34.0"))
    assert final["0.32.0"]["apply_num_tokens"] == final["0.33.0"]["apply_num_tokens"] == 2
    assert c32 - c33 == 2 and c34 == c33, (c32, c33, c34)


def test_a_paused_engine_refuses_new_requests_in_0_33_only():
    doc = {
        "config": {"num_spec_tokens": 3},
        "requests": [
            {"id": "a", "prompt_len": 5, "max_tokens": 20},
            {"id": "late", "prompt_len": 5, "max_tokens": 5, "arrival_step": 5},
        ],
        "events": [{"step": 4, "kind": "pause", "mode": "wait", "clear_cache": False}, {"step": 8, "kind": "resume"}],
    }
    runs = {v: run_workload(Workload.from_dict(doc).at_version(v), UPSTREAM) for v in MODELLED_VERSIONS}
    assert _rows(runs["0.32.0"], "late") and not _rows(runs["0.33.0"], "late")
    events = {e for e in runs["0.33.0"].table.column("step_event").to_pylist() if e}
    assert any("rejected late: engine_paused" in e for e in events)
    assert runs["0.33.0"].outcome.status == "completed" and runs["0.33.0"].outcome.unfinished is None


def test_engine_vllm_on_a_wheel_without_cpu_kernels_is_one_line(monkeypatch):
    from specreplay.replay.families.vllm import setup as vllm_setup
    from specreplay.traces.errors import InputError

    monkeypatch.setattr(vllm_setup, "installed_vllm", lambda: ("vllm", "0.33.0"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(InputError, match="vllm 0.33.0's whole engine needs a GPU here"):
        vllm_setup.refuse_engine_without_kernels()


@pytest.mark.vllm
def test_the_real_scheduler_refuses_a_workload_of_another_release(tmp_path):
    installed = installed_vllm_version()
    other = next(v for v in MODELLED_VERSIONS if v != installed)
    result = CliRunner().invoke(
        main,
        ["record", "--scenario", "reentry", "--engine", "vllm-scheduler", "--vllm-version", other, "-o", "x.parquet"],
    )
    assert result.exit_code == 2
    assert f"runs the installed vllm {installed}, but the workload asks for vLLM {other}" in result.output
