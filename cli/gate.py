"""`specreplay gate`: the CI regression gate over a corpus of golden traces.

Where it sits: cli over the whole path, for many traces at once. Calls
`replay.workflows.gate.run_gate` (or `update_goldens` with --update) and renders with
`cli/gate_reports.py`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from specreplay.cli.common import (
    CONTEXT,
    EXIT_FINDINGS,
    EXIT_INPUT,
    EXIT_OK,
    console,
    device_option,
    engine_option,
    executor_option,
    fail_on_option,
    format_option,
    handle_errors,
    jobs_option,
    oracle_option,
    print_table,
    runner_option,
    trace_impl_option,
    vllm_version_option,
)
from specreplay.traces.errors import InputError


@click.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@trace_impl_option
@engine_option
@runner_option
@vllm_version_option
@executor_option
@device_option
@fail_on_option
@oracle_option("each golden reruns")
@click.option("--allow-changed", is_flag=True, help="Behaviour that differs from the golden does not fail the gate.")
@click.option(
    "--update",
    is_flag=True,
    help="Rewrite the goldens from the implementation under test. A recording golden (rerun on its recorded "
    "outcomes) is refused, left as it is (exit 2): add --oracle synthetic to re-record it on its own engine.",
)
@click.option("--junit", "junit_file", type=click.Path(path_type=Path), help="Write JUnit XML here.")
@click.option("--github", is_flag=True, help="Print GitHub workflow annotations; write $GITHUB_STEP_SUMMARY if set.")
@format_option
@jobs_option
@handle_errors
def gate(
    paths,
    impl_name,
    engine,
    runner,
    vllm_version,
    executor,
    device,
    fail_on,
    oracle,
    allow_changed,
    update,
    junit_file,
    github,
    fmt,
    jobs,
) -> None:
    """Replay golden traces (files or folders; default: the shipped corpus, or SGLang's with
    --engine sglang-scheduler) through an implementation, check every invariant, and compare
    with the golden.

    Per trace: pass; fail (findings at or above --fail-on); changed (differs from the golden, no
    failing finding); error (unreadable golden, unknown implementation); n/a (the implementation
    does not apply to the golden's workload, e.g. an AsyncScheduler subclass on a synchronous
    golden: nothing ran, and nothing runs in its place; the reason is shown). Exit 0 when all
    that applied pass, 1 on any fail or changed (changed allowed with --allow-changed) or when no
    golden applied at all, 2 on any error or bad usage, 3 when a rerun ran other classes than
    asked (a specreplay bug).

    A recording of a live or attached vLLM (with its outcomes) as a golden is rerun on its
    recorded outcomes through the implementation under test on the reference engine; the ground
    truth it lacks is not compared. --update leaves such a golden as it is and says so (exit 2):
    a rerun is not the engine's run. --update --oracle synthetic re-records it on its own engine.
    An SGLang golden reruns on its recorded outcomes on SGLang's scheduler (its own environment).

    Each golden reruns as the vLLM release it was recorded as; --vllm-version reruns every golden
    as that release, and the report notes each golden recorded as another.

    \b
    Example:
      specreplay gate --impl sched-clear --allow-changed --junit gate.xml
      specreplay gate goldens/ --impl mypkg.sched:Fixed --jobs 2
      specreplay gate live.parquet --impl sched-clear
      specreplay gate --engine sglang-scheduler
    """
    from specreplay.replay.workflows.gate import GateOptions, corpus_dir, run_gate, update_goldens

    options = GateOptions(
        impl=impl_name,
        executor=executor,
        fail_on=fail_on,
        device=device,
        engine=engine,
        oracle=oracle,
        vllm_version=vllm_version,
        runner=runner,
    )
    targets = list(paths) or [corpus_dir(engine)]
    if update:
        _print_updates(update_goldens(targets, options))
        return
    results = run_gate(targets, options, jobs=jobs)
    _report(results, fmt, junit_file, github)
    if any(r.result == "error" for r in results):
        sys.exit(EXIT_INPUT)
    if all(r.result == "n/a" for r in results):  # a gate that ran nothing says nothing
        click.echo(f"error: no golden applies to {results[0].impl}: nothing ran (see the n/a reasons)", err=True)
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_FINDINGS if any(r.failed(allow_changed) for r in results) else EXIT_OK)


def _report(results, fmt: str, junit_file: Path | None, github: bool) -> None:
    from specreplay.cli import gate_reports

    _ci_reports(results, junit_file, github)
    if fmt == "json":
        click.echo(gate_reports.gate_json(results))
        return
    _table(results)


def _ci_reports(results, junit_file: Path | None, github: bool) -> None:
    """JUnit XML to a file; GitHub annotations to stdout and the step summary to its file."""
    from specreplay.cli import gate_reports

    if junit_file is not None:
        try:
            junit_file.write_text(gate_reports.junit_xml(results))
        except OSError as exc:
            raise InputError(f"--junit {junit_file}: cannot write ({exc.strerror or exc})") from None
    if github:
        for line in gate_reports.github_annotations(results):
            click.echo(line)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(gate_reports.markdown_summary(results))


def _table(results) -> None:
    from rich.table import Table

    from specreplay.cli import gate_reports
    from specreplay.cli.render import unchecked_note

    table = Table(title=f"specreplay gate: {gate_reports.summary_line(results)}", title_justify="left")
    for column in ("trace", "impl", "result", "findings", "first finding / why"):
        table.add_column(column, overflow="fold")
    for r in results:
        first = r.first
        why = (
            r.message
            if r.result in ("error", "changed", "n/a") or first is None
            else f"step {first.step} req {first.request_id} {first.code}"
        )
        notes = r.notes + ([unchecked_note(r.unchecked)] if r.unchecked else [])
        if notes:
            why += "  [" + "; ".join(notes) + "]"
        errors = sum(f.severity == "error" for f in r.findings)
        warnings = len(r.findings) - errors
        found = "-" if r.result == "n/a" else f"{errors} err, {warnings} warn"
        table.add_row(Path(r.path).name, r.impl, r.result, found, why)
    print_table(console(), table)


def _print_updates(updates) -> None:
    for u in updates:
        if u.status == "n/a":
            click.echo(f"n/a     {u.path}: left as it is: {u.message}")
        elif u.status in ("error", "refused"):
            click.echo(f"{u.status:<7} {u.path}: {u.message}")
        elif u.status == "unchanged":
            click.echo(f"same    {u.path}")
        else:
            what = u.message or (
                f"first change at step {u.first.step}, request {u.first.request_id}, {u.first.field}; "
                + ", ".join(f"{k} x{v}" for k, v in sorted(u.changed_fields.items()))
            )
            click.echo(f"updated {u.path}: {what}")
    if any(u.status in ("error", "refused") for u in updates):
        sys.exit(EXIT_INPUT)
