"""`specreplay explore` and `specreplay shrink`: find divergences automatically, then cut one down.

Where it sits: cli over record -> traces -> replay -> diff, automated (replay/explore.py,
replay/shrink.py). explore writes one trace per distinct finding code and a JSON summary;
shrink writes the minimal trace and, on request, a pytest module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specreplay.cli.common import (CONTEXT, EXIT_FINDINGS, EXIT_OK, console, engine_option, fail_on_option,
                                   handle_errors)
from specreplay.traces.errors import InputError


@click.command(context_settings=CONTEXT)
@click.option("--impl", "impl_name", default="upstream", show_default=True,
              help="Implementation to search: a name from `specreplay impls`, or module:attr.")
@engine_option
@click.option("--budget", type=click.IntRange(min=1), default=None, help="Workloads to try (default 200 unless --time).")
@click.option("--time", "seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop after this many seconds (at a generation's end).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the search.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Local worker processes.")
@click.option("--ray", "ray_address", default=None,
              help="Run candidates on a Ray cluster at this address ('local': a one-machine cluster).")
@fail_on_option
@click.option("-o", "--output-dir", type=click.Path(path_type=Path), required=True,
              help="Folder for one trace per distinct finding code and explore.json.")
@handle_errors
def explore(impl_name, engine, budget, seconds, seed, jobs, ray_address, fail_on, output_dir) -> None:
    """Search seeded workloads and perturbations for findings; save a trace of every distinct
    finding code in OUTPUT_DIR (its smallest reproduction) with the seed that reproduces it.

    Exit 0: no finding at or above --fail-on; 1: findings; 2: bad input, or workloads the
    implementation raised on (listed in explore.json).

    \b
    Example:
      specreplay explore --impl pr30796 --budget 100 -o found/
      specreplay shrink found/X10-scheduler-output-mutated.parquet -o min.parquet --emit-pytest test_min.py
    """
    from specreplay.replay.engines.loop import run_workload
    from specreplay.replay.workflows.explore import Candidate, explore as search, make_runner
    from specreplay.replay.impls.registry import resolve
    from specreplay.traces.io import write_trace

    if ray_address and jobs > 1:
        raise InputError("give --jobs or --ray, not both")
    impl = resolve(impl_name, allow_import=True)  # fail fast on an unknown name
    if output_dir.exists() and not output_dir.is_dir():
        raise InputError(f"{output_dir}: exists and is not a folder")
    engine = engine or "reference"
    runner = make_runner(jobs, ray_address)
    out = console(stderr=True)
    try:
        with _progress(out, budget) as update:
            result = search(impl_name, engine, seed, budget if budget or seconds else 200, seconds, runner, update)
    finally:
        runner.close()
    output_dir.mkdir(parents=True, exist_ok=True)
    from specreplay.replay.check.checker import all_codes

    for code, *_ in all_codes():  # traces an earlier explore left here would read as this run's
        (output_dir / f"{code}.parquet").unlink(missing_ok=True)
    summary = {"impl": impl_name, "engine": engine, "seed": seed, "workloads": len(result.results),
               "seconds": round(result.seconds, 1), "coverage": dict(sorted(result.coverage.items())), "findings": {}}
    errors = [r for r in result.results if r.error]
    summary["implementation_errors"] = len(errors)
    summary["first_errors"] = [{"seed": r.seed, "profiles": list(r.profiles), "error": r.error} for r in errors[:10]]
    for code, hits in result.by_code().items():
        first = hits[0]
        finding = first.findings[code]
        # Deterministic: running the smallest hit again here gives the trace its worker saw.
        trace = run_workload(Candidate(first.index, first.seed, first.profiles).workload(), impl, engine=engine)
        path = output_dir / f"{code}.parquet"
        write_trace(trace, path)
        summary["findings"][code] = {"severity": finding["severity"], "workloads": len(hits), "seed": first.seed,
                                     "profiles": list(first.profiles), "step": finding["step"],
                                     "request_id": finding["request_id"], "message": finding["message"],
                                     "trace": path.name}  # beside explore.json
    (output_dir / "explore.json").write_text(json.dumps(summary, indent=2) + "\n")
    _report(summary, output_dir)
    if errors:  # like `record` with an implementation that raises: the implementation cannot run
        raise InputError(f"{len(errors)} of {len(result.results)} workloads failed to run through {impl_name} "
                         f"(first, seed {errors[0].seed}: {errors[0].error})")
    severities = [f["severity"] for f in summary["findings"].values()]
    failing = fail_on != "never" and (("error" in severities) or (fail_on == "warning" and severities))
    sys.exit(EXIT_FINDINGS if failing else EXIT_OK)


def _report(summary: dict, output_dir: Path) -> None:
    from rich.table import Table

    out = console()
    cov = ", ".join(f"{k} {v}" for k, v in summary["coverage"].items()) or "none"
    out.print(f"explored {summary['workloads']} workloads through {summary['impl']} ({summary['engine']} engine, "
              f"seed {summary['seed']}) in {summary['seconds']} s")
    out.print(f"situations reached (workloads): {cov}")
    if not summary["findings"]:
        out.print("no finding")
        return
    table = Table(title=f"findings by code (traces in {output_dir})", title_justify="left")
    for column in ("code", "severity", "workloads", "smallest: seed", "at", "trace"):
        table.add_column(column, overflow="fold")
    for code, f in summary["findings"].items():
        table.add_row(code, f["severity"], str(f["workloads"]), str(f["seed"]),
                      f"step {f['step']} request {f['request_id']}", f["trace"])
    out.print(table)
    # Suggest the divergence most workloads hit, errors before warnings.
    worst = max(summary["findings"], key=lambda c: (summary["findings"][c]["severity"] == "error",
                                                     summary["findings"][c]["workloads"]))
    out.print(f"next: specreplay shrink {output_dir / summary['findings'][worst]['trace']} --code {worst} "
              "-o min.parquet --emit-pytest test_min.py")


class _progress:
    def __init__(self, out, budget):
        self.out, self.budget, self.bar = out, budget, None

    def __enter__(self):
        if not sys.stderr.isatty():
            return None
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("exploring"), BarColumn(), TextColumn("{task.completed} workloads"),
                            TextColumn("{task.fields[found]}"), TimeElapsedColumn(), console=self.out, transient=True)
        self.bar.__enter__()
        task = self.bar.add_task("explore", total=self.budget, found="")

        def update(done, result):
            codes = sorted({c for r in result.results for c in r.findings})
            self.bar.update(task, completed=done, found=f"codes: {', '.join(codes) or '-'}")

        return update

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


@click.command(context_settings=CONTEXT)
@click.argument("trace_path", type=click.Path(path_type=Path))
@click.option("--code", default=None, help="Finding code to keep firing (default: the trace's first error, "
              "else its first finding).")
@click.option("--impl", "impl_name", default=None, help="Implementation to replay through (default: the trace's own).")
@engine_option
@click.option("--max-runs", type=click.IntRange(min=1), default=3000, show_default=True,
              help="Stop after this many replays.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Minimal trace to write.")
@click.option("--emit-pytest", "pytest_file", type=click.Path(path_type=Path), default=None,
              help="Also write a self-contained pytest module that fails while the code fires.")
@handle_errors
def shrink(trace_path, code, impl_name, engine, max_runs, output, pytest_file) -> None:
    """Cut a failing trace's workload down while the same finding code still fires: fewer
    requests, steps and tokens, simpler config and acceptance. Deterministic.

    \b
    Example:
      specreplay shrink found/X10-scheduler-output-mutated.parquet -o min.parquet --emit-pytest test_min.py
      SPECREPLAY_IMPL=sched-clear pytest test_min.py
    """
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workflows.shrink import emit_pytest, shrink as reduce, size
    from specreplay.replay.workloads.workload import Workload
    from specreplay.traces.io import read_trace, write_trace

    source = read_trace(trace_path)
    workload = Workload.from_dict(source.workload, f"{trace_path}: workload metadata")
    name = impl_name or source.impl_name
    impl = resolve(name, allow_import=impl_name is not None)
    engine = engine or source.impl.get("engine", "reference")
    from specreplay.replay.check.checker import all_codes

    known = [c[0] for c in all_codes()]
    if code is not None and code not in known:
        raise InputError(f"--code {code!r} is not a finding code; see `specreplay codes`")
    if code is None:
        findings = check_trace(source)
        if not findings:
            raise InputError(f"{trace_path}: no finding to shrink toward; this trace is clean")
        code = next((f.code for f in findings if f.severity == "error"), findings[0].code)
    before = size(workload, source)
    result = reduce(workload, impl, code, engine=engine, max_runs=max_runs)
    after = size(result.workload, result.trace)
    write_trace(result.trace, output)
    click.echo(f"shrunk {trace_path} while {code} fires on {impl.name}: {before[0]} requests, {before[1]} steps, "
               f"{before[2]} tokens -> {after[0]} requests, {after[1]} steps, {after[2]} tokens "
               f"({result.runs} replays, {len(result.steps)} reductions kept)")
    click.echo(f"wrote {output}; see `specreplay diff {output}`")
    if pytest_file is not None:
        pytest_file.write_text(emit_pytest(result, str(trace_path), impl.name, engine))
        click.echo(f"wrote {pytest_file}: fails while {code} fires (SPECREPLAY_IMPL picks the implementation)")
