"""Implementations of SGLang's scheduler: the built-ins and `--impl module:Class` on
`--engine sglang-scheduler` (families/sglang/forms.py, families/sglang/variants.py).

The tests marked `sglang` record on SGLang 0.5.23's real scheduler (its own environment,
`scripts/sglang.sh test`); the others need no SGLang and run everywhere: what the registry holds
and what each engine refuses, in one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.registry import engine
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import registry, resolve
from specreplay.replay.workloads.notation import workload_from_notation
from specreplay.traces.errors import InputError
from specreplay.traces.io import read_trace

sglang = pytest.mark.sglang
VARIANTS = "tests.replay.check.sglang_variants:"
BUILT_IN = ("sglang-stale-commit", "sglang-finish-trim", "sglang-stream-hold", "sglang-adaptive-reserve-current")


def workload_file(tmp_path, text: str):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload_from_notation(text).to_dict()))
    return path


def test_the_built_in_sglang_variants_have_an_sglang_form_only():
    for name in BUILT_IN:
        impl = registry()[name]
        assert impl.sglang_scheduler is not None and impl.vllm_parts() == []
    for name in ("upstream", "pr30796", "sched-clear", "noclamp", "life-guard"):  # vLLM's: none
        assert registry()[name].sglang_scheduler is None


@pytest.mark.parametrize(
    "text, name, applies",
    [
        ("a:p4,t6 | k3 async", "sglang-stale-commit", True),
        ("a:p4,t6 | k3 sync", "sglang-stale-commit", False),
        ("a:p4,t6 | k0 async", "sglang-stale-commit", False),
        ("a:p4,t6 | k0 async", "sglang-finish-trim", True),
        ("a:p4,t6 | k3 async", "sglang-finish-trim", False),
        ("a:p4,t6 | k0 sync", "sglang-finish-trim", False),
        ("a:p4,t6 | k3 async adaptive", "sglang-adaptive-reserve-current", True),
        ("a:p4,t6 | k3 async", "sglang-adaptive-reserve-current", False),
    ],
)
def test_each_built_in_says_where_it_changes_nothing(text, name, applies):
    reason = registry()[name].why_not(workload_from_notation(text).config)
    assert (reason is None) == applies, reason


@pytest.mark.parametrize("engine_name", ["reference", "vllm-scheduler"])
def test_an_sglang_variant_on_a_vllm_engine_is_refused_in_one_line(tmp_path, engine_name):
    with pytest.raises(
        InputError, match=f"^sglang-finish-trim changes SGLang's scheduler; it has no form for --engine {engine_name}"
    ):
        engine(engine_name).refuse(
            resolve("sglang-finish-trim", allow_import=False), workload_from_notation("a:p4,t6 | k0 async").config
        )
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        main,
        [
            "record",
            "--impl",
            "sglang-finish-trim",
            "--workload",
            str(workload_file(tmp_path, "a:p4,t6 | k0 async")),
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "has no form for --engine reference" in result.output and not out.exists()


def test_a_variant_of_vllm_s_classes_is_refused_on_sglang():
    with pytest.raises(InputError, match="^sched-clear changes vLLM's scheduler; it has no form for --engine sglang"):
        engine("sglang-scheduler").refuse(
            resolve("sched-clear", allow_import=False), workload_from_notation("a:p4,t6 | async").config
        )


# ====================================================================== on SGLang's scheduler
@sglang
def test_a_user_s_scheduler_subclass_runs_from_module_attr_and_the_header_names_it(tmp_path):
    """RetractionDropsLastOutput overrides Scheduler._add_request_to_queue: what ran is the
    variant (its G4 finding is in `record`'s check line), and the header says so."""
    out = tmp_path / "drops.parquet"
    impl = VARIANTS + "RetractionDropsLastOutput"
    wfile = workload_file(tmp_path, "0-5:p4,t20 | blocks 4 block 16 k0 async")
    result = CliRunner().invoke(
        main, ["record", "--engine", "sglang-scheduler", "--impl", impl, "--workload", str(wfile), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "G4-retracted-next-life" in result.output
    header = read_trace(out).impl
    assert header.name == impl
    assert header.scheduler == "tests.replay.check.sglang_variants.RetractionDropsLastOutput(DrivenScheduler)"


@sglang
@pytest.mark.parametrize(
    "name", [*BUILT_IN, VARIANTS + "BonusClaimedAtApply", VARIANTS + "SeqLensNotResolved", "upstream"]
)
def test_the_engine_expects_the_classes_the_header_names(name):
    """The gate holds a run's header to `expected`: the variant on the driver's scheduler (a
    processor variant too), the reference SGLang worker, the executor."""
    text = "a:p4,t6 b:p3,t5,stop2 | k0 async" if name == "sglang-finish-trim" else "a:p4,t6 b:p3,t5,stop2 | k3 async"
    if name == "sglang-adaptive-reserve-current":
        text += " adaptive"
    workload = workload_from_notation(text)
    impl = resolve(name, allow_import=True)
    trace = run_workload(workload, impl, engine="sglang-scheduler")
    expected = engine("sglang-scheduler").expected(impl, workload.config)
    assert expected == {"scheduler": trace.impl.scheduler, "runner": trace.impl.runner, "executor": trace.impl.executor}
    upstream = "specreplay.replay.families.sglang.workers.DrivenScheduler"
    variant = name.split(":")[-1] if ":" in name else {"sglang-stale-commit": "StaleVerifyCommits"}.get(name, "")
    assert trace.impl.scheduler == upstream if name == "upstream" else trace.impl.scheduler.endswith(")")
    assert variant in trace.impl.scheduler


@sglang
def test_a_variant_that_overrides_the_driver_s_worker_constructor_is_refused_in_one_line():
    with pytest.raises(InputError, match=r"^OverridesTheWorkers overrides Scheduler\.init_tp_model_worker, which"):
        resolve(VARIANTS + "OverridesTheWorkers", allow_import=True)


# ====================================================================== the page's SGLang hooks
def sglang_section() -> str:
    text = (Path(__file__).resolve().parents[3] / "docs" / "implementations.md").read_text()
    # SGLang's own classes; the reference SGLang worker's hooks after it are specreplay's (test_public_api).
    return text[text.index("## SGLang's scheduler") : text.index("### The reference SGLang worker")]


@sglang
def test_every_sglang_hook_the_page_names_is_sglang_s_with_those_parameters():
    import inspect

    from specreplay.replay.families.sglang import setup as sglang_setup

    sglang_setup.prepare()
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    owners = {"`Scheduler`": Scheduler, "`SchedulerBatchResultProcessor`": SchedulerBatchResultProcessor}
    rows = [line.split("|")[1:-1] for line in sglang_section().splitlines() if line.startswith("| `")]
    assert len(rows) >= 8
    for hook, owner, *_ in rows:
        name, params = re.match(r"\s*`(\w+)\(([^)]*)\)`", hook).groups()
        method = getattr(owners[owner.strip()], name)
        assert list(inspect.signature(method).parameters) == [p.strip() for p in params.split(",")], name


@sglang
def test_the_page_s_example_runs_from_module_attr_and_releases_one_more_at_a_length_finish(tmp_path, monkeypatch):
    # Fenced `py`: test_public_api runs the page's `python` blocks in the main environment, without SGLang.
    # The module imports sglang at its top: `--impl` (workflows/record.py resolve_impl) readies the process first.
    from specreplay.replay.workflows.record import resolve_impl

    code = sglang_section().split("```py\n", 1)[1].split("```", 1)[0]
    (tmp_path / "myfix.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = "a:p4,t6 b:p3,t9 | k0 async"
    mine = run_workload(
        workload_from_notation(text), resolve_impl("myfix:NoInflightSkip", allow_import=True), engine="sglang-scheduler"
    )
    assert mine.impl.scheduler == "myfix.NoInflightSkip(DrivenScheduler)"
    g5 = [f for f in check_trace(mine) if f.code == "G5-overcommit-at-finish"]
    assert [(f.request_id, f.facts()["finish"]) for f in g5] == [("a", "length"), ("b", "length")]
    upstream = run_workload(
        workload_from_notation(text), resolve("upstream", allow_import=False), engine="sglang-scheduler"
    )
    assert not check_trace(upstream)  # SGLang 0.5.23 skips them: no G5 at a length finish
