"""`specreplay shrink`: cut a failing trace's workload down to a minimal reproduction.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> **cli**, then back to record. Calls `replay.workflows.shrink.shrink_to`, which
writes the minimal trace and, on request, a pytest module; this module says what it cut.
"""

from __future__ import annotations

from pathlib import Path

import click

from specreplay.cli.common import (
    CONTEXT,
    engine_option,
    handle_errors,
    oracle_option,
    runner_option,
    trace_argument,
    trace_impl_option,
    vllm_version_option,
)


@click.command(context_settings=CONTEXT)
@trace_argument
@click.option(
    "--code",
    default=None,
    help="Finding code to keep firing (default: the trace's first error, else its first finding).",
)
@trace_impl_option
@engine_option
@vllm_version_option
@oracle_option("every candidate runs, for the requests it still has,")
@click.option(
    "--max-runs", type=click.IntRange(min=1), default=3000, show_default=True, help="Stop after this many replays."
)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Minimal trace to write.")
@click.option(
    "--emit-pytest",
    "pytest_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write a self-contained pytest module that fails while the code fires.",
)
@runner_option
@handle_errors
def shrink(trace_path, code, impl_name, engine, vllm_version, oracle, max_runs, output, pytest_file, runner) -> None:
    """Cut a failing trace's workload down while the same finding code still fires: fewer
    requests, steps and tokens, simpler config and acceptance. Deterministic.

    A live or attached vLLM recording shrinks on its recorded outcomes (prompts keep their
    length); the minimal trace carries them, so it replays to itself and gates as a recording.

    \b
    Example:
      specreplay shrink found/X10-scheduler-output-mutated.parquet -o min.parquet --emit-pytest test_min.py
      SPECREPLAY_IMPL=sched-clear pytest test_min.py
      specreplay shrink live.parquet --code X5-placeholder-drafts -o min.parquet
    """
    from specreplay.replay.workflows.shrink import shrink_to

    report = shrink_to(
        trace_path,
        output,
        code=code,
        impl=impl_name,
        engine=engine,
        oracle=oracle,
        max_runs=max_runs,
        pytest_file=pytest_file,
        vllm_version=vllm_version,
        runner=runner,
    )
    before, after, shrunk = report.before, report.after, report.shrunk
    on = f" on its recorded outcomes ({report.engine} engine)" if report.oracle == "recorded" else ""
    click.echo(
        f"shrunk {trace_path}{on} while {shrunk.code} fires on {report.impl}: {before[0]} requests, {before[1]} "
        f"steps, {before[2]} tokens -> {after[0]} requests, {after[1]} steps, {after[2]} tokens "
        f"({shrunk.runs} replays, {len(shrunk.reductions)} reductions kept)"
    )
    click.echo(f"wrote {output}; see `specreplay diff {output}`")
    if pytest_file is not None:
        click.echo(f"wrote {pytest_file}: fails while {shrunk.code} fires (SPECREPLAY_IMPL picks the implementation)")
        if report.oracle == "recorded":
            click.echo(f"  it replays {output} on its recorded outcomes: keep the two together")
