"""Determinism: the same workload, implementation and seed give identical trace contents on repeat,
in other processes (whatever the hash seed), with --jobs, with or without the crash journal.
(--device cuda against --device cpu: tests/replay/models/test_gpu.py, on a machine with a GPU.)"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor

from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces.io import read_trace

CASES = [
    ("random", seed, impl)
    for seed in (2, 11, 38)
    for impl in ("upstream", "pr30796", "sched-clear")
    # random-2 books no draft slots: pr30796 does not apply to it (nothing would run in its place)
    if resolve(impl, allow_import=False).why_not(build_scenario("random", seed).config) is None
] + [
    ("reentry", 0, "pr30796-copy"),
    ("reentry-sync", 0, "upstream"),
]


def record(case):
    scenario, seed, impl = case
    return run_workload(build_scenario(scenario, seed), resolve(impl, allow_import=False))


def test_repeat_in_one_process():
    for case in CASES:
        assert record(case).content_equals(record(case)), case


def test_worker_processes_record_what_this_process_records():
    with ProcessPoolExecutor(2) as pool:
        theirs = list(pool.map(record, CASES))
    for case, trace in zip(CASES, theirs):
        assert trace.content_equals(record(case)), case


def test_jobs_1_and_2_gate_the_corpus_identically():
    """Every golden passes in worker processes too: a replay there is row for row the golden."""
    runner = CliRunner()
    one = runner.invoke(main, ["gate", "--format", "json", "--jobs", "1"])
    two = runner.invoke(main, ["gate", "--format", "json", "--jobs", "2"])
    assert one.exit_code == two.exit_code == 0 and one.output == two.output
    assert {r["result"] for r in json.loads(two.output)["results"]} == {"pass"}


def test_the_journal_does_not_change_the_trace(tmp_path):
    for case in CASES[:4]:
        scenario, seed, impl = case
        path = tmp_path / f"{scenario}{seed}{impl}.parquet"
        result = CliRunner().invoke(
            main,
            [
                "record",
                "--scenario",
                scenario,
                "--seed",
                str(seed),
                "--impl",
                impl,
                "--flush-every",
                "1",
                "-o",
                str(path),
            ],
        )
        assert result.exit_code == 0, result.output
        assert read_trace(path).content_equals(record(case)), case
