"""The `specreplay` command group and its commands.

Where it sits: cli, over the whole record -> traces -> replay -> diff path. Each command parses,
calls one library function, and renders; torch is imported only by commands that run a runner.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specreplay.cli.common import (EXIT_FINDINGS, EXIT_OK, check_device, console, device_option, executor_option,
                        fail_on_option, format_option, handle_errors, progress)
from specreplay.traces.errors import InputError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="specreplay")
def main() -> None:
    """Record, replay and diff the scheduler and worker views of vLLM async scheduling with
    speculative decoding, and name the first step where they part.

    \b
    Example:
      specreplay record --scenario reentry --impl upstream -o reentry.parquet
      specreplay diff reentry.parquet
    """


def _run(workload, impl_name: str, executor: str | None, device: str, output: Path, allow_import: bool):
    from specreplay.replay.engine import run_workload
    from specreplay.replay.impls import resolve
    from specreplay.traces.io import write_trace

    impl = resolve(impl_name, allow_import=allow_import, executor=executor)
    check_device(device)
    if output.exists() and output.is_dir():
        raise InputError(f"{output}: is a directory; -o takes a file path like out.parquet")
    with progress(f"{workload.name} via {impl.name}") as update:
        trace = run_workload(workload, impl, device=device, progress=update)
    write_trace(trace, output)
    return trace


def _summary(trace, output: Path) -> None:
    from specreplay.cli.render import code_counts
    from specreplay.replay.checker import check_trace
    from specreplay.replay.findings import verdict

    findings = check_trace(trace)
    line = (f"wrote {output}: {trace.num_steps} steps, {trace.table.num_rows} rows, outcome "
            f"{trace.outcome.get('status')}; check: {verdict(findings)}")
    if findings:
        line += f" ({code_counts(findings)}); see `specreplay diff {output}`"
    click.echo(line)


@main.command(context_settings=CONTEXT)
@click.option("--scenario", help="A built-in scenario (see `specreplay scenarios`).")
@click.option("--workload", "workload_file", type=click.Path(path_type=Path), help="A workload file (TOML or JSON).")
@click.option("--impl", "impl_name", default="upstream", show_default=True,
              help="Implementation: a name from `specreplay impls`, or module:attr.")
@executor_option
@device_option
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the scenario's workload.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Trace file to write (.parquet).")
@handle_errors
def record(scenario, workload_file, impl_name, executor, device, seed, output) -> None:
    """Run a workload through an implementation and record both views to a Parquet trace.

    \b
    Example:
      specreplay record --scenario reentry --impl pr30796 -o pr30796.parquet
    """
    from specreplay.replay.scenarios import build_scenario
    from specreplay.replay.workload import load_workload

    if (scenario is None) == (workload_file is None):
        raise InputError("give exactly one of --scenario NAME or --workload FILE")
    workload = build_scenario(scenario, seed) if scenario else load_workload(workload_file)
    trace = _run(workload, impl_name, executor, device, output, allow_import=True)
    _summary(trace, output)


@main.command(context_settings=CONTEXT)
@click.argument("trace_path", type=click.Path(path_type=Path))
@click.option("--impl", "impl_name", default=None, help="Implementation to replay through (default: the trace's own).")
@executor_option
@device_option
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Trace file to write.")
@handle_errors
def replay(trace_path, impl_name, executor, device, output) -> None:
    """Replay a recorded trace's workload and outcomes through another implementation.

    \b
    Example:
      specreplay replay reentry.parquet --impl sched-clear -o fixed.parquet
    """
    from specreplay.replay.workload import Workload
    from specreplay.traces.io import read_trace

    source = read_trace(trace_path)
    workload = Workload.from_dict(source.workload, f"{trace_path}: workload metadata")
    name = impl_name or source.impl_name
    trace = _run(workload, name, executor, device, output, allow_import=impl_name is not None)
    _summary(trace, output)


@main.command(context_settings=CONTEXT)
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@format_option
@fail_on_option
@click.option("--story/--no-story", default=True, show_default=True, help="Show the first finding's request story.")
@handle_errors
def diff(traces, fmt, fail_on, story) -> None:
    """One trace: scheduler view against worker view and ground truth.
    Two traces: the first step, request and field where they part.

    Exit 0: nothing at or above --fail-on; 1: findings; 2: bad input.

    \b
    Example:
      specreplay diff pr30796.parquet
      specreplay diff upstream.parquet sched-clear.parquet --format json
    """
    from specreplay.cli.render import code_counts, findings_json, findings_lines, story_table, trace_header
    from specreplay.replay.findings import fails, verdict
    from specreplay.traces.io import read_trace

    if len(traces) > 2:
        raise InputError(f"diff takes one or two traces, got {len(traces)}")
    loaded = [read_trace(p) for p in traces]
    out = console()
    if len(loaded) == 1:
        from specreplay.replay.checker import check_trace

        trace = loaded[0]
        findings = check_trace(trace)
        if fmt == "json":
            click.echo(findings_json(findings, {"trace": str(traces[0]), "impl": trace.impl_name}))
        else:
            out.print(trace_header(trace, str(traces[0])))
            if not findings:
                out.print("verdict: ok - the scheduler view, the worker view and the KV cache agree at every step")
            else:
                first = next((f for f in findings if f.severity == "error"), findings[0])
                out.print(f"verdict: {verdict(findings)} - {len(findings)} findings ({code_counts(findings)})")
                out.print(f"first divergence: step {first.step}, request {first.request_id!r}, {first.field}: "
                          f"{first.message}")
                for line in findings_lines(findings):
                    out.print(line, soft_wrap=True)
                if story and first.request_id is not None:
                    out.print(story_table(trace, first.request_id, first.step))
        sys.exit(EXIT_FINDINGS if fails(findings, fail_on) else EXIT_OK)
    from specreplay.replay.tracediff import diff_traces

    result = diff_traces(*loaded)
    if fmt == "json":
        click.echo(findings_json(result.findings, {"a": str(traces[0]), "b": str(traces[1]),
                                                   "differing_rows_per_field": dict(result.fields),
                                                   "rows_only_in_a": result.only_a, "rows_only_in_b": result.only_b},
                                 verdict_text="same" if result.same else "differ"))
    else:
        out.print(trace_header(loaded[0], "A " + str(traces[0])))
        out.print(trace_header(loaded[1], "B " + str(traces[1])))
        if result.same:
            out.print(f"verdict: same - {result.rows_compared} rows compared, no difference")
        else:
            f = result.first
            out.print(f"verdict: differ - first at step {f.step}, request {f.request_id!r}, field {f.field}: "
                      f"{f.scheduler!r} in A, {f.worker!r} in B")
            out.print("first difference per field (scheduler = A, worker = B):")
            for line in findings_lines(result.findings):
                out.print(line, soft_wrap=True)
            summary = ", ".join(f"{name} x{n}" for name, n in result.fields.most_common())
            out.print(f"differing rows per field: {summary}")
    sys.exit(EXIT_FINDINGS if (not result.same and fail_on != "never") else EXIT_OK)


@main.command(context_settings=CONTEXT)
@click.argument("trace_path", type=click.Path(path_type=Path))
@format_option
@handle_errors
def info(trace_path, fmt) -> None:
    """What a trace holds: workload, config, implementation, outcome, size.

    \b
    Example:
      specreplay info reentry.parquet
    """
    import json

    from specreplay.cli.render import trace_header
    from specreplay.traces.io import read_trace

    trace = read_trace(trace_path)
    doc = {"path": str(trace_path), "schema_version": trace.schema_version, "specreplay_version": trace.version,
           "impl": trace.impl, "config": trace.config, "outcome": trace.outcome, "seed": trace.seed,
           "device": trace.device, "steps": trace.num_steps, "rows": trace.table.num_rows,
           "requests": len(trace.workload.get("requests", [])), "bytes": trace_path.stat().st_size,
           "volatile": trace.volatile}
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    out = console()
    out.print(trace_header(trace, str(trace_path)))
    for key in ("schema_version", "specreplay_version", "impl", "config", "outcome", "seed", "device",
                "requests", "bytes", "volatile"):
        out.print(f"  {key}: {doc[key]}")


@main.command(context_settings=CONTEXT)
def scenarios() -> None:
    """List the built-in scenarios.

    \b
    Example:
      specreplay record --scenario random --seed 7 -o random7.parquet
    """
    from specreplay.replay.scenarios import SCENARIOS

    for s in SCENARIOS.values():
        click.echo(f"{s.name:14} {s.summary}")


@main.command(context_settings=CONTEXT)
def impls() -> None:
    """List the registered implementations (also: any module:attr of your own).

    \b
    Example:
      specreplay record --scenario reentry --impl mypkg.fix:MyScheduler -o mine.parquet
    """
    from specreplay.replay.impls import registry

    for impl in registry().values():
        click.echo(f"{impl.name:14} [{impl.executor}] {impl.description}")


@main.command(context_settings=CONTEXT)
def codes() -> None:
    """List the checker's finding codes with severity and statement.

    \b
    Example:
      specreplay codes
    """
    from specreplay.replay.checker import all_codes

    for code, severity, statement, source in all_codes():
        click.echo(f"{code:30} {severity:8} {statement} [{source}]")


@main.command(context_settings=CONTEXT)
def schema() -> None:
    """Print the trace schema as a markdown table.

    \b
    Example:
      specreplay schema > docs/schema.md
    """
    from specreplay.traces import schema as trace_schema

    click.echo(f"Trace schema v{trace_schema.SCHEMA_VERSION}\n")
    click.echo(trace_schema.markdown_table())
