"""`specreplay record`, `replay` and `compare`: run workloads through implementations into traces.

Where it sits: cli over **record** -> traces. Each command builds a workload (scenario, file, or a
trace's metadata), runs it with `replay.engine.run_workload`, writes the trace, and prints a
one-line check summary.
"""

from __future__ import annotations

from pathlib import Path

import click

from specreplay.cli.common import (CONTEXT, check_device, console, device_option, engine_option, executor_option,
                                   handle_errors, progress)
from specreplay.traces.errors import InputError

FLUSH_EVERY = 16  # replay.recorder.FLUSH_EVERY, without importing torch for --help

flush_option = click.option(
    "--flush-every", type=click.IntRange(min=1), default=FLUSH_EVERY, show_default=True,
    help="Steps between appends of settled rows to OUTPUT.partial while recording (and at least every "
         "0.5 s); a crash keeps them (`specreplay recover`).")


def _run(workload, impl_name: str, executor: str | None, device: str, output: Path, allow_import: bool,
         engine: str = "reference", model: str | None = None, flush_every: int = FLUSH_EVERY):
    from specreplay.replay.engines.loop import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.traces.io import write_trace
    from specreplay.traces.journal import holds_steps, journal_path

    impl = resolve(impl_name, allow_import=allow_import, executor=executor)
    check_device(device)
    if output.exists() and output.is_dir():
        raise InputError(f"{output}: is a directory; -o takes a file path like out.parquet")
    journal = journal_path(output)
    if journal.exists():
        if holds_steps(journal):  # an earlier recording to this path died: its rows are not ours to drop
            raise InputError(f"{journal}: a recording to {output} did not finish; recover it first "
                             f"(`specreplay recover {journal}`) or delete it")
        journal.unlink()  # it died before its first flush: nothing in it
    with progress(f"{workload.name} via {impl.name}") as update:
        try:
            trace = run_workload(workload, impl, device=device, progress=update, engine=engine, model=model,
                                 journal=journal, flush_every=flush_every)
        except InputError as exc:
            if journal.exists() and holds_steps(journal):
                raise InputError(f"{exc}; the steps recorded before it are in {journal} "
                                 f"(`specreplay recover {journal}`)") from None
            journal.unlink(missing_ok=True)
            raise
    write_trace(trace, output)
    journal.unlink(missing_ok=True)  # the trace is written: the journal has served its purpose
    return trace


def _workload(scenario: str | None, workload_file: Path | None, seed: int | None):
    from dataclasses import replace

    from specreplay.replay.workloads.scenarios import build_scenario
    from specreplay.replay.workloads.workload import load_workload

    if (scenario is None) == (workload_file is None):
        raise InputError("give exactly one of --scenario NAME or --workload FILE")
    if scenario:
        return build_scenario(scenario, seed or 0)
    workload = load_workload(workload_file)
    return workload if seed is None else replace(workload, seed=seed)


def _summary(trace, output: Path) -> None:
    from specreplay.cli.render import code_counts
    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.check.findings import verdict

    findings = check_trace(trace)
    line = (f"wrote {output}: {trace.num_steps} steps, {trace.num_rows} rows, outcome "
            f"{trace.outcome.get('status')}; check: {verdict(findings)}")
    if findings:
        line += f" ({code_counts(findings)}); see `specreplay diff {output}`"
    click.echo(line)


@click.command(context_settings=CONTEXT)
@click.option("--scenario", help="A built-in scenario (see `specreplay scenarios`).")
@click.option("--workload", "workload_file", type=click.Path(path_type=Path), help="A workload file (TOML or JSON).")
@click.option("--impl", "impl_name", default="upstream", show_default=True,
              help="Implementation: a name from `specreplay impls`, or module:attr.")
@engine_option
@executor_option
@device_option
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed of the workload: a scenario's (default 0), or overriding a workload file's.")
@click.option("--model", default=None, help="--engine vllm: a model with real weights (folder or hub name); "
              "default: a tiny dummy-weight model written on the fly.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Trace file to write (.parquet).")
@click.option("--max-steps", type=click.IntRange(min=1), default=None,
              help="Stop the run after this many engine steps (default: the workload's max_steps).")
@flush_option
@handle_errors
def record(scenario, workload_file, impl_name, engine, executor, device, seed, model, output, max_steps,
           flush_every) -> None:
    """Run a workload through an implementation and record both views to a Parquet trace.

    While it runs, settled rows go to OUTPUT.partial every --flush-every steps and on any error, so
    a crash or a kill keeps them: `specreplay recover OUTPUT.partial` turns them into a trace.

    \b
    Example:
      specreplay record --scenario reentry --impl pr30796 -o pr30796.parquet
    """
    from dataclasses import replace

    workload = _workload(scenario, workload_file, seed)
    if max_steps is not None:
        workload = replace(workload, max_steps=max_steps)
    trace = _run(workload, impl_name, executor, device, output, allow_import=True, engine=engine or "reference",
                 model=model, flush_every=flush_every)
    _summary(trace, output)


@click.command(context_settings=CONTEXT)
@click.argument("trace_path", type=click.Path(path_type=Path))
@click.option("--impl", "impl_name", default=None, help="Implementation to replay through (default: the trace's own).")
@engine_option
@executor_option
@device_option
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Trace file to write.")
@flush_option
@handle_errors
def replay(trace_path, impl_name, engine, executor, device, output, flush_every) -> None:
    """Replay a recorded trace's workload and outcomes through another implementation.

    \b
    Example:
      specreplay replay reentry.parquet --impl sched-clear -o fixed.parquet
    """
    from specreplay.replay.workloads.workload import Workload
    from specreplay.traces.io import open_trace

    source = open_trace(trace_path)  # the workload is in the metadata: no rows are needed
    workload = Workload.from_dict(source.workload, f"{trace_path}: workload metadata")
    name = impl_name or source.impl_name
    trace = _run(workload, name, executor, device, output, allow_import=impl_name is not None,
                 engine=engine or source.impl.get("engine", "reference"), flush_every=flush_every)
    _summary(trace, output)



@click.command(context_settings=CONTEXT)
@click.argument("journal", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Trace file to write (default: the journal's name with .recovered.parquet).")
@handle_errors
def recover(journal, output) -> None:
    """Turn the journal of a recording that did not finish (OUTPUT.partial, left by a crash or a
    kill) into a trace: every step flushed before it stopped, outcome `partial`.

    \b
    Example:
      specreplay recover run.parquet.partial -o run.parquet
    """
    from specreplay.traces.io import write_trace
    from specreplay.traces.journal import SUFFIX, recover as recover_journal

    if output is None:
        stem = journal.name[: -len(SUFFIX)] if journal.name.endswith(SUFFIX) else journal.name
        output = journal.with_name(Path(stem).stem + ".recovered.parquet")
    if output.exists():
        raise InputError(f"{output}: exists; choose another path with -o (a trace is never overwritten by recover)")
    trace = recover_journal(journal)
    write_trace(trace, output)
    click.echo(f"wrote {output}: steps 1..{trace.outcome['step']}, {trace.num_rows} rows, outcome partial "
               f"(the recording stopped after step {trace.outcome['step']})")


DEFAULT_COMPARE = ("upstream", "pr30796", "pr30796-copy", "sched-clear")


@click.command(context_settings=CONTEXT)
@click.option("--scenario", help="A built-in scenario (see `specreplay scenarios`).")
@click.option("--workload", "workload_file", type=click.Path(path_type=Path), help="A workload file (TOML or JSON).")
@click.option("--impls", "impl_names", default=",".join(DEFAULT_COMPARE), show_default=True,
              help="Comma-separated implementations to record side by side.")
@engine_option
@device_option
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed of the workload: a scenario's (default 0), or overriding a workload file's.")
@click.option("-o", "--output-dir", type=click.Path(path_type=Path), default=Path("specreplay-traces"),
              show_default=True, help="Folder for the traces, one per implementation.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@handle_errors
def compare(scenario, workload_file, impl_names, engine, device, seed, output_dir, fmt) -> None:
    """Record one workload under several implementations and show each one's verdict side by side.

    Exit 0 whatever the verdicts (it is a report); 2 on bad input. `specreplay diff TRACE` shows
    the findings of one of them in full.

    \b
    Example:
      specreplay compare --scenario reentry
      specreplay compare --scenario random --seed 7 --impls upstream,sched-clear
    """
    import json

    from rich.table import Table

    from specreplay.replay.check.checker import check_trace
    from specreplay.replay.check.findings import verdict

    workload = _workload(scenario, workload_file, seed)
    names = [n.strip() for n in impl_names.split(",") if n.strip()]
    if not names:
        raise InputError("--impls: give at least one implementation name")
    if output_dir.exists() and not output_dir.is_dir():
        raise InputError(f"{output_dir}: exists and is not a folder")
    rows = []
    for name in names:
        path = output_dir / f"{workload.name}-{name.replace(':', '_').replace('/', '_')}.parquet"
        trace = _run(workload, name, None, device, path, allow_import=True, engine=engine or "reference")
        findings = check_trace(trace)
        first = next((f for f in findings if f.severity == "error"), findings[0] if findings else None)
        rows.append({"impl": name, "executor": trace.impl.get("executor"), "verdict": verdict(findings),
                     "errors": sum(f.severity == "error" for f in findings),
                     "warnings": sum(f.severity == "warning" for f in findings),
                     "first": None if first is None else first.to_dict(), "trace": str(path),
                     "outcome": trace.outcome.get("status")})
    if fmt == "json":
        click.echo(json.dumps({"workload": workload.name, "results": rows}, indent=2, default=str))
        return
    table = Table(title=f"{workload.name}: {len(workload.requests)} requests, "
                        f"{'async' if workload.config.async_scheduling else 'sync'}, "
                        f"budget {workload.config.max_num_batched_tokens}, k={workload.config.num_spec_tokens}",
                  title_justify="left")
    for column in ("impl", "verdict", "errors", "warnings", "first finding", "trace"):
        table.add_column(column, overflow="fold")
    for row in rows:
        f = row["first"]
        first = "-" if f is None else f"step {f['step']} req {f['request_id']} {f['code']}"
        table.add_row(row["impl"], row["verdict"] + ("" if row["outcome"] == "completed" else f" ({row['outcome']})"),
                      str(row["errors"]), str(row["warnings"]), first, row["trace"])
    out = console()
    out.print(table)
    out.print("details: specreplay diff TRACE   (exit 1 when it finds errors)")
