"""`specreplay explore`: find divergences automatically.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> **cli**, automated. Calls `replay.workflows.explore.explore_to`, which writes
one trace per distinct finding code and a JSON summary; this module draws the progress bar and the
summary table and sets the exit code. `specreplay shrink` (cli/shrink.py) cuts one of them down.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from specreplay.cli.common import (
    CONTEXT,
    EXIT_FINDINGS,
    EXIT_OK,
    console,
    engine_option,
    fail_on_option,
    handle_errors,
    impl_option,
    jobs_option,
    print_table,
    runner_option,
    vllm_version_option,
)
from specreplay.replay.engines.registry import DEFAULT_ENGINE
from specreplay.traces.errors import InputError
from specreplay.traces.families import EngineLine


@click.command(context_settings=CONTEXT)
@impl_option
@engine_option
@vllm_version_option
@click.option(
    "--budget", type=click.IntRange(min=1), default=None, help="Workloads to try (default 200 unless --time)."
)
@click.option(
    "--time",
    "seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop after this many seconds (at a generation's end).",
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the search.")
@jobs_option
@click.option(
    "--ray",
    "ray_address",
    default=None,
    help="Run candidates on a Ray cluster at this address ('local': a one-machine cluster).",
)
@fail_on_option
@runner_option
@click.option(
    "-o",
    "--output-dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Folder for one trace per distinct finding code and explore.json.",
)
@handle_errors
def explore(
    impl_name, engine, vllm_version, budget, seconds, seed, jobs, ray_address, fail_on, runner, output_dir
) -> None:
    """Search seeded workloads and perturbations for findings; save a trace of every distinct
    finding code in OUTPUT_DIR (its smallest reproduction) with the seed that reproduces it.

    Exit 0: no finding at or above --fail-on; 1: findings (an exception the implementation
    raises is the finding E1-engine-crash); 2: bad input, or workloads that could not start
    (listed in explore.json).

    \b
    Example:
      specreplay explore --impl pr30796 --budget 100 -o found/
      specreplay shrink found/X10-scheduler-output-mutated.parquet -o min.parquet --emit-pytest test_min.py
      specreplay explore --engine sglang-scheduler --budget 100 -o found-sglang/
    """
    from specreplay.replay.families.vllm.setup import default_vllm_version
    from specreplay.replay.workflows.explore import explore_to

    with _progress(budget) as update:
        report = explore_to(
            output_dir,
            impl_name,
            engine=engine or DEFAULT_ENGINE,
            seed=seed,
            budget=budget,
            seconds=seconds,
            jobs=jobs,
            ray_address=ray_address,
            progress=update,
            vllm_version=vllm_version or default_vllm_version(),
            runner=runner,
        )
    _report(report)
    error = report.implementation_error()
    if error:  # like `record` with an implementation that raises: the implementation cannot run
        raise InputError(error)
    sys.exit(EXIT_FINDINGS if report.fails(fail_on) else EXIT_OK)


def _report(report) -> None:
    from rich.table import Table

    summary, output_dir = report.summary, report.output_dir
    out = console()
    cov = ", ".join(f"{k} {v}" for k, v in summary["coverage"].items()) or "none"
    from specreplay.replay.engines.registry import engine as engine_entry

    # The vLLM release the models follow; SGLang's scheduler is its own release (the trace header's `models`).
    release = (
        f"vLLM {summary.get('vllm_version') or 'default'}, "
        if engine_entry(summary["engine"]).line is EngineLine.VLLM
        else ""
    )
    out.print(
        f"explored {summary['workloads']} workloads through {summary['impl']} ({summary['engine']} engine, "
        f"{release}seed {summary['seed']}) in {summary['seconds']} s"
    )
    out.print(f"situations reached (workloads): {cov}")
    drawn = _settings_line(summary.get("settings", {}))
    if drawn:
        out.print(f"engine settings drawn (workloads): {drawn}")
    if not summary["findings"]:
        out.print("no finding")
        return
    table = Table(title=f"findings by code (traces in {output_dir})", title_justify="left")
    for column in ("code", "severity", "workloads", "smallest: seed", "at", "trace"):
        table.add_column(column, overflow="fold")
    for code, f in summary["findings"].items():
        table.add_row(
            code,
            f["severity"],
            str(f["workloads"]),
            str(f["seed"]),
            f"step {f['step']}" + (f" request {f['request_id']}" if f["request_id"] is not None else ""),
            f["trace"],
        )
    print_table(out, table)
    worst = report.most_hit()  # the divergence to shrink first
    out.print(
        f"next: specreplay shrink {output_dir / summary['findings'][worst]['trace']} --code {worst} "
        "-o min.parquet --emit-pytest test_min.py"
    )


def _settings_line(settings: dict[str, int]) -> str:
    """`{"async": 30, "k=0": 2, "k=3": 9}` -> `async 30; k 0: 2, 3: 9` (explore.json's order)."""
    groups: dict[str, list[str]] = {}
    for name, count in settings.items():
        key, _, value = name.partition("=")
        groups.setdefault(key, []).append(f"{value}: {count}" if value else str(count))
    return "; ".join(f"{key} {', '.join(values)}" for key, values in groups.items())


@contextmanager
def _progress(budget: int | None) -> Iterator[Callable | None]:
    """A bar of workloads run and the codes found so far on a terminal (stderr), nothing when piped."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("exploring"),
        BarColumn(),
        TextColumn("{task.completed} workloads"),
        TextColumn("{task.fields[found]}"),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("explore", total=budget, found="")

        def update(done, result):
            codes = sorted({c for r in result.results for c in r.findings})
            bar.update(task, completed=done, found=f"codes: {', '.join(codes) or '-'}")

        yield update
