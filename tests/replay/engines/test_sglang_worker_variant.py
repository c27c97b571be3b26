"""A user's subclass of the reference SGLang worker (`specreplay.replay.api.SglangReferenceWorker`)
through `--impl module:Class`: loaded as a worker variant, held to the hook table, refused on
vLLM's engines; on SGLang's real scheduler (marked `sglang`: its own environment) it runs in
place of the reference worker, the header names it, and what it breaks is found."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.api import SglangReferenceWorker
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.hook_api import HookSignatureError
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.traces.io import read_trace
from tests.replay.engines.sglang_workers import AcceptsOneDraftTooMany

VARIANT = "tests.replay.engines.sglang_workers:AcceptsOneDraftTooMany"
#: Two requests verifying with k = 3 under overlap, one accepting at random: rounds with a mismatch.
WORKLOAD = "a:p4,t9,random:0.5 b:p3,t8,random:0.5 | k3 async budget 16 seqs 8"


def test_a_worker_subclass_loads_as_a_worker_variant():
    impl = resolve(VARIANT, allow_import=True)
    assert impl.sglang_worker is AcceptsOneDraftTooMany and impl.user_code
    assert impl.scheduler is impl.runner is impl.sglang_scheduler is None
    assert resolve("upstream", allow_import=False).sglang_worker_class() is SglangReferenceWorker


def test_a_worker_hook_with_the_wrong_parameters_is_refused_in_one_line():
    with pytest.raises(HookSignatureError, match=r"VerifyWithoutRows\.verify.*verify\(rows\)"):
        resolve("tests.replay.engines.sglang_workers:VerifyWithoutRows", allow_import=True)
    result = CliRunner().invoke(
        main, ["record", "--impl", "tests.replay.engines.sglang_workers:VerifyWithoutRows", "-o", "x.parquet"]
    )
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1


def test_a_worker_variant_has_no_form_on_vllms_engines(tmp_path):
    result = CliRunner().invoke(
        main, ["record", "--scenario", "reentry", "--impl", VARIANT, "-o", str(tmp_path / "x.parquet")]
    )
    assert result.exit_code == 2
    assert "changes the reference SGLang worker; it has no form for --engine reference" in result.output
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.sglang
def test_the_worker_variant_runs_under_sglangs_scheduler_and_is_found(tmp_path):
    workload = workload_from_notation(WORKLOAD)
    upstream = run_workload(workload, resolve("upstream", allow_import=False), engine="sglang-scheduler")
    assert upstream.outcome.status == "completed" and check_trace(upstream) == []
    assert upstream.impl.runner.endswith("SglangReferenceWorker")
    out, spec = tmp_path / "variant.parquet", tmp_path / "workload.json"
    spec.write_text(json.dumps(workload.to_dict()))
    args = ["record", "--engine", "sglang-scheduler", "--workload", str(spec), "--impl", VARIANT, "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (0, 1), result.output
    trace = read_trace(out)
    assert trace.impl.runner == "tests.replay.engines.sglang_workers.AcceptsOneDraftTooMany"
    found = Counter(f.code for f in check_trace(trace))
    assert found["T1-wrong-token"] > 0, found
    # The gate reruns the golden with the worker that made it: the same rows (not "changed"), and
    # the same findings, so it fails as a gate on a broken worker should.
    gated = CliRunner().invoke(main, ["gate", str(out), "--impl", VARIANT, "--format", "json"])
    (got,) = json.loads(gated.output)["results"]
    assert gated.exit_code == 1 and got["result"] == "fail", got
