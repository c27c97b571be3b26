"""`specreplay info`, `scenarios`, `impls`, `codes`, `schema`: what a trace holds and what the tool knows.

Where it sits: cli, beside the main path; read-only.
"""

from __future__ import annotations

import click

from specreplay.cli.common import CONTEXT, console, format_option, handle_errors, print_table, ran_line, trace_argument
from specreplay.traces.errors import InputError
from specreplay.traces.header import WorkloadHeader


@click.command(context_settings=CONTEXT)
@trace_argument
@format_option
@handle_errors
def info(trace_path, fmt) -> None:
    """What a trace holds: workload, config, implementation, outcome, size. Every row group is
    read and validated on the way (one at a time: memory stays bounded).

    \b
    Example:
      specreplay info reentry.parquet
    """
    import json

    from specreplay.cli.render import trace_header
    from specreplay.replay.workflows.cache_report import CacheCounts
    from specreplay.traces.io import open_trace

    trace = open_trace(trace_path)
    seen: set[str] = set()
    cache = CacheCounts.of_config(trace.config.to_dict() or (trace.workload.config or WorkloadHeader()).to_dict())
    for batch in trace.batches(columns=("request_id", *CacheCounts.COLUMNS)):
        seen.update(batch.column("request_id").unique().to_pylist())
        cache.add(batch)
    doc = {
        "path": str(trace_path),
        "schema_version": trace.schema_version,
        "specreplay_version": trace.version,
        "impl": trace.impl.to_dict(),
        "config": trace.config.to_dict(),
        "outcome": trace.outcome.to_dict(),
        "seed": trace.seed,
        "device": trace.device,
        "steps": trace.num_steps,
        "rows": trace.num_rows,
        "requests": len(seen),
        "bytes": trace_path.stat().st_size,
        "volatile": trace.volatile.to_dict(),
        "events": _event_counts(trace.workload),
        "prefix_cache": cache.to_dict(),
    }
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    out = console()
    out.print(trace_header(trace, str(trace_path)))
    out.print(f"  ran: {ran_line(trace.impl)}")
    if trace.impl.tokens:
        out.print(f"  tokens: {TOKEN_MODES.get(trace.impl.tokens, trace.impl.tokens)}")
    if trace.impl.window:
        out.print(f"  window: {trace.impl.window}")
    out.print(f"  prefix cache: {cache.line()}")
    for key in (
        "schema_version",
        "specreplay_version",
        "impl",
        "config",
        "outcome",
        "seed",
        "device",
        "requests",
        "events",
        "bytes",
        "volatile",
    ):
        if key != "events" or doc[key]:
            out.print(f"  {key}: {doc[key]}")


#: How an attached recording wrote its token ids (traces/pseudonym.py), as `info` says it.
TOKEN_MODES = {
    "plain": "plain (the engine's own token ids)",
    "pseudonym": "pseudonym (every token id through the run's keyed permutation of the vocabulary; "
    "the key stayed in the recording folder)",
}


def _event_counts(workload: WorkloadHeader) -> dict[str, int]:
    """The workload's control events by kind (the metadata is read as given: count what is there)."""
    events = workload.events
    counts: dict[str, int] = {}
    for event in events if isinstance(events, list) else ():
        if isinstance(event, dict):
            kind = str(event.get("kind"))
            counts[kind] = counts.get(kind, 0) + 1
    return counts


@click.command(context_settings=CONTEXT)
@click.option(
    "--matrix",
    is_flag=True,
    help="Run every vLLM and SGLang failure specreplay knows on every modelled vLLM release and runner family, "
    "and on SGLang 0.5.23's real scheduler where sglang is installed (its own environment), and say which "
    "reproduce (on the installed vLLM release's real scheduler, on the reference models for the others; "
    "each runner family on its reference runner).",
)
@click.option("--reference-only", is_flag=True, help="With --matrix: measure every release on the reference models.")
@click.option(
    "--runner",
    "runners",
    multiple=True,
    type=click.Choice(["v1", "v2", "sglang"]),
    help="With --matrix: only this runner family (repeatable; default: v1 and v2, V1 GPUModelRunner and Model "
    "Runner V2, and sglang, SGLang 0.5.23's scheduler, where sglang is installed).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "markdown", "json"]),
    default="table",
    show_default=True,
    help="With --matrix: the output format (markdown: the table in docs/vllm-releases.md).",
)
@handle_errors
def scenarios(matrix: bool, reference_only: bool, runners: tuple[str, ...], fmt: str) -> None:
    """List the built-in scenarios; with --matrix, the known failures x vLLM release x runner, and SGLang.

    \b
    Example:
      specreplay record --scenario random --seed 7 -o random7.parquet
      specreplay scenarios --matrix
    """
    if not matrix:
        if reference_only or runners or fmt != "table":
            raise InputError("--reference-only, --runner and --format go with --matrix")
        from specreplay.replay.workloads.scenarios import SCENARIOS

        width = max(len(name) for name in SCENARIOS)
        for s in SCENARIOS.values():
            click.echo(f"{s.name:{width}} {s.summary}")
        return
    from specreplay.cli.render import bug_matrix_markdown, bug_matrix_table
    from specreplay.replay.families.sglang.setup import require_sglang
    from specreplay.replay.workflows.bug_matrix import MATRIX_RUNNERS, SGLANG, bug_matrix

    vllm_runners = tuple(r for r in runners if r != SGLANG) if runners else MATRIX_RUNNERS
    if runners and SGLANG in runners:
        require_sglang()  # asked for: one line where it is not installed
    sglang = (SGLANG in runners) if runners else None  # None: where it is installed
    cells = bug_matrix(use_real=not reference_only, runners=vllm_runners, sglang=sglang)
    if fmt == "json":
        import json

        click.echo(json.dumps([c.to_dict() for c in cells], indent=2))
    elif fmt == "markdown":
        click.echo(bug_matrix_markdown(cells))
    else:
        print_table(console(), bug_matrix_table(cells))


@click.command(context_settings=CONTEXT)
def impls() -> None:
    """List the registered implementations (also: any module:attr of your own).

    \b
    Example:
      specreplay record --scenario reentry --impl mypkg.fix:MyScheduler -o mine.parquet
    """
    from specreplay.replay.impls.registry import registry

    found = registry()
    width = max(len(name) for name in found)  # the names in one column, however long
    for impl in found.values():
        click.echo(f"{impl.name:{width}} [{impl.executor}] {impl.description}")


@click.command(context_settings=CONTEXT)
def codes() -> None:
    """List the checker's finding codes with severity and statement.

    \b
    Example:
      specreplay codes
    """
    from specreplay.replay.check.checker import all_codes

    for code, severity, statement, source in all_codes():
        click.echo(f"{code:30} {severity:8} {statement} [{source}]")


@click.command(context_settings=CONTEXT)
def schema() -> None:
    """Print the trace schema as a markdown table.

    \b
    Example:
      specreplay schema > docs/schema.md
    """
    from specreplay.traces import schema as trace_schema

    click.echo(f"Trace schema v{trace_schema.SCHEMA_VERSION}\n")
    click.echo(trace_schema.RUNNERS_NOTE + "\n")
    click.echo(trace_schema.markdown_table())
