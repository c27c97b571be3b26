"""An exception raised inside the implementation under test is the engine's death (E1), as in vLLM.

The variants live in tests/replay/engines/raising_impls.py and are loaded as a user's would be,
`--impl tests.replay.engines.raising_impls:NAME`. What stays otherwise: bad usage is exit 2 in
one line; a failure of specreplay's own (an observer, the loop) is exit 3, never a finding; a
trace recovered from a journal never checks as a plain ok.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.replay.check.checker import check_trace
from specreplay.replay.engines.run import run_workload
from specreplay.replay.impls.registry import resolve
from specreplay.replay.workloads.workload import load_workload
from specreplay.traces.io import read_trace
from specreplay.traces.journal import journal_path
from tests.replay.engines import raising_impls
from tests.replay.engines.raising_impls import CRASH_STEP

MODULE = "tests.replay.engines.raising_impls"
SOURCE = Path(raising_impls.__file__)
WORKLOAD = {
    "requests": [
        {"id": "a", "prompt_len": 8, "max_tokens": 24},
        {"id": "b", "prompt_len": 12, "max_tokens": 24},
        {"id": "c", "prompt_len": 5, "max_tokens": 24, "arrival_step": 3},
    ],
    "seed": 1,
}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def line_of(marker: str) -> int:
    """The line of raising_impls.py that holds `marker` (the variant's raising line)."""
    return next(n for n, text in enumerate(SOURCE.read_text().splitlines(), 1) if marker in text)


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(WORKLOAD))
    return path


def record_crash(tmp_path, workload, impl, *engine):
    out = tmp_path / "crash.parquet"
    result = run("record", "--workload", workload, "--impl", f"{MODULE}:{impl}", *engine, "-o", out)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and result.output.strip().count("\n") == 0
    assert not journal_path(out).exists()  # a crash is a finished run: its trace is written
    return result.output, read_trace(out)


def assert_e1_at(trace, step: int, exception: str, where: str) -> None:
    """The one error is E1 at `step`, naming the exception and the variant's line."""
    errors = [f for f in check_trace(trace) if f.severity == "error"]
    assert [(f.code, f.step) for f in errors] == [("E1-engine-crash", step)], errors
    e1 = errors[0]
    assert e1.actual == exception and e1.facts()["where"] == where
    assert f"the engine dies at step {step}: {exception}" in e1.message and where in e1.message


def test_a_runner_hook_raising_keyerror_kills_the_engine_at_that_step(tmp_path, workload):
    output, trace = record_crash(tmp_path, workload, "ForgetfulRunner")
    where = f"{SOURCE.relative_to(Path.cwd())}:{line_of('# KeyError at CRASH_STEP')}"
    assert f"outcome crashed at step {CRASH_STEP}: KeyError: 'a', raised in the runner" in output
    assert trace.outcome.to_dict() == {
        "status": "crashed",
        "step": CRASH_STEP,
        "kind": "engine-crash",
        "exception": "KeyError",
        "where": where,
        "side": "runner",
        "message": f"KeyError: 'a', raised in the runner by ForgetfulRunner.update_cached_request at {where}",
        "request": "a",  # the key the dropped entry was looked up by: a request the engine holds
    }
    assert_e1_at(trace, CRASH_STEP, "KeyError", where)
    assert [f.request_id for f in check_trace(trace) if f.code == "E1-engine-crash"] == ["a"]
    # The steps up to it are the steps any run has: the settled ones equal upstream's row for row
    # (with async scheduling the outputs of the last two steps were still in flight).
    steps = trace.table["step"].to_pylist()
    assert max(steps) == CRASH_STEP
    full = run_workload(load_workload(workload), resolve("upstream", allow_import=False)).table
    settled = sum(1 for s in full["step"].to_pylist() if s <= CRASH_STEP - 2)
    assert trace.table.slice(0, settled).to_pylist() == full.slice(0, settled).to_pylist()


def test_a_failed_assert_in_a_scheduler_hook_kills_the_engine_at_that_step(tmp_path, workload):
    output, trace = record_crash(tmp_path, workload, "AssertingScheduler")
    where = f"{SOURCE.relative_to(Path.cwd())}:{line_of('assert self.step < CRASH_STEP')}"
    outcome = trace.outcome
    assert (outcome.status, outcome.step, outcome.kind) == ("crashed", CRASH_STEP, "scheduler-assert")
    assert (outcome.exception, outcome.where, outcome.side) == ("AssertionError", where, "scheduler")
    # A bare assert is named by its own text, as vLLM's are.
    assert "AssertionError: assert self.step < CRASH_STEP, raised in the scheduler" in outcome.message
    assert f"outcome crashed at step {CRASH_STEP}: AssertionError" in output
    assert_e1_at(trace, CRASH_STEP, "AssertionError", where)
    assert max(trace.table["step"].to_pylist()) == CRASH_STEP - 1  # schedule() of the step never returned
    assert outcome.request is None  # an assert on the step count names no request: none is guessed


def test_replay_through_a_raising_implementation_is_a_crash_too(tmp_path, workload):
    clean = tmp_path / "clean.parquet"
    assert run("record", "--workload", workload, "-o", clean).exit_code == 0
    out = tmp_path / "again.parquet"
    result = run("replay", clean, "--impl", f"{MODULE}:ForgetfulRunner", "-o", out)
    assert result.exit_code == 1 and f"outcome crashed at step {CRASH_STEP}: KeyError" in result.output
    assert read_trace(out).outcome.exception == "KeyError"


@pytest.mark.parametrize(
    "impl, text",
    [
        (f"{MODULE}:Nope", f"module '{MODULE}' has no attribute 'Nope'"),
        ("no_such_module_here:Impl", "cannot import 'no_such_module_here'"),
        (f"{MODULE}:not_an_implementation", "is a function; expected an Implementation"),
        (
            f"{MODULE}:BrokenAtStart",
            f"implementation {MODULE}:BrokenAtStart failed to start: RuntimeError: no config for the plugin, "
            f"raised in the scheduler by BrokenAtStart.__init__ at {SOURCE.relative_to(Path.cwd())}:"
            f"{line_of('no config for the plugin')}",
        ),
    ],
)
def test_bad_usage_stays_exit_2_in_one_line(tmp_path, workload, impl, text):
    out = tmp_path / "x.parquet"
    result = run("record", "--workload", workload, "--impl", impl, "-o", out)
    assert result.exit_code == 2, result.output
    assert text in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0
    assert not out.exists() and not journal_path(out).exists()


def test_specreplays_own_failures_are_never_the_engines(tmp_path, workload, monkeypatch):
    """With a user's implementation running: an observer's exception, or one of the loop's own
    code, is specreplay's (exit 3, one line, no trace), even when the implementation catches the
    observer's and raises another."""
    from specreplay.replay.engines.loop import EngineLoop
    from specreplay.replay.families.vllm.v1.observer import WorkerObserver

    def observer_bug(self, runner, so):
        raise ValueError("observer bug")

    def loop_bug(self):
        raise IndexError("loop bug")

    for impl, target, name, bug, says in [
        ("ForgetfulRunner", WorkerObserver, "on_states", observer_bug, "specreplay's worker observer failed"),
        ("SwallowingRunner", WorkerObserver, "on_states", observer_bug, "SwallowingRunner"),
        ("AssertingScheduler", EngineLoop, "apply_aborts", loop_bug, "IndexError: loop bug"),
    ]:
        with monkeypatch.context() as patch:
            patch.setattr(target, name, bug)
            out = tmp_path / f"{impl}.parquet"
            result = run("record", "--workload", workload, "--impl", f"{MODULE}:{impl}", "-o", out)
        assert result.exit_code == 3, (impl, result.output)
        assert "internal error" in result.output and says in result.output
        assert result.output.strip().count("\n") == 0 and not out.exists()
        assert "E1-engine-crash" not in result.output and "crashed" not in result.output
        journal_path(out).unlink(missing_ok=True)


def test_a_recovered_partial_trace_checks_as_partial_never_ok(tmp_path, workload):
    """A recording stopped by Ctrl-C at step 9 leaves a journal; recovered, its verdict says
    partial and up to which step, in text and JSON."""
    from specreplay.replay.workflows.record import record_to

    class Interrupted:
        def __init__(self, label):
            pass

        def __enter__(self):
            def update(done, total):
                if done == 9:
                    raise KeyboardInterrupt

            return update

        def __exit__(self, *exc):
            return False

    out = tmp_path / "run.parquet"
    with pytest.raises(KeyboardInterrupt):
        record_to(out, load_workload(workload), "upstream", progress=Interrupted, flush_every=1)
    recovered = tmp_path / "recovered.parquet"
    result = run("recover", journal_path(out), "-o", recovered)
    assert result.exit_code == 0, result.output
    last = read_trace(recovered).outcome.step
    assert 0 < last <= 9
    text = run("diff", recovered)
    assert text.exit_code == 0, text.output
    verdict = next(line for line in text.output.splitlines() if line.startswith("verdict:"))
    assert verdict.startswith(f"verdict: partial (up to step {last}) - ")
    assert f"the recording stopped after step {last}" in verdict and "verdict: ok" not in text.output
    doc = json.loads(run("diff", recovered, "--format", "json").output)
    assert (doc["verdict"], doc["up_to_step"]) == ("partial", last)


@pytest.mark.vllm
def test_on_the_real_scheduler_a_variants_exception_is_a_crash_too(tmp_path, workload):
    """--engine vllm-scheduler: the reference runner's KeyError, and the real-scheduler variant's
    KeyError and failed assert (vLLM's own asserts were crashes already: they name the variant's
    line when the variant's code raised them)."""
    _, runner = record_crash(tmp_path, workload, "ForgetfulRunner", "--engine", "vllm-scheduler")
    assert (runner.outcome.step, runner.outcome.exception) == (CRASH_STEP, "KeyError")
    (tmp_path / "crash.parquet").unlink()
    _, real = record_crash(tmp_path, workload, "FORGETFUL_REAL", "--engine", "vllm-scheduler")
    where = f"{SOURCE.relative_to(Path.cwd())}:{line_of('the bug: a lookup')}"
    assert (real.outcome.step, real.outcome.exception, real.outcome.where) == (CRASH_STEP, "KeyError", where)
    assert_e1_at(real, CRASH_STEP, "KeyError", where)
    (tmp_path / "crash.parquet").unlink()
    _, asserting = record_crash(tmp_path, workload, "ASSERTING", "--engine", "vllm-scheduler")
    assert (asserting.outcome.step, asserting.outcome.kind) == (CRASH_STEP, "scheduler-assert")
    assert asserting.outcome.where == f"{SOURCE.relative_to(Path.cwd())}:{line_of('assert self.steps_seen')}"
