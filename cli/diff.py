"""`specreplay diff`: one trace against its own views and ground truth, or two traces against each other.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> **cli**. Calls `replay.check.checker.check_report` or
`replay.check.tracediff.diff_batches` on the opened traces, renders findings (and the codes a trace
without ground truth left unchecked), and sets the exit code from `--fail-on`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specreplay.cli.common import (
    CONTEXT,
    EXIT_FINDINGS,
    EXIT_OK,
    console,
    fail_on_option,
    format_option,
    handle_errors,
    print_table,
)
from specreplay.traces.errors import InputError

STORY_STEPS = 8  # steps of the first finding's request shown, up to the finding


@click.command(context_settings=CONTEXT)
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@format_option
@fail_on_option
@click.option("--story/--no-story", default=True, show_default=True, help="Show the first finding's request story.")
@handle_errors
def diff(traces, fmt, fail_on, story) -> None:
    """One trace: scheduler view against worker view and ground truth.
    Two traces: the first step, request and field where they part.

    Exit 0: nothing at or above --fail-on; 1: findings, or a trace with no recorded step
    (verdict empty: nothing was checked); 2: bad input. Traces are read a batch
    of rows at a time, so memory stays bounded however long the trace.

    \b
    Example:
      specreplay diff pr30796.parquet
      specreplay diff upstream.parquet sched-clear.parquet --format json
    """
    from specreplay.traces.io import open_trace

    if len(traces) > 2:
        raise InputError(f"diff takes one or two traces, got {len(traces)}")
    # Opened, not loaded: the rows stream by row group, so memory stays bounded on long traces.
    loaded = [open_trace(p) for p in traces]
    if len(loaded) == 1:
        sys.exit(_check_one(loaded[0], str(traces[0]), fmt, fail_on, story))
    sys.exit(_compare_two(loaded, [str(t) for t in traces], fmt, fail_on))


def _check_one(trace, path: str, fmt: str, fail_on: str, story: bool) -> int:
    """One trace against its own views and ground truth; returns the exit code."""
    from specreplay.cli.render import code_counts, findings_json, findings_lines, unchecked_note
    from specreplay.replay.check.checker import check_report, columns_needed
    from specreplay.replay.check.findings import EMPTY, EMPTY_NOTE, fails, verdict

    report = check_report(trace, trace.batches(columns=columns_needed(trace), read_ahead=True))
    findings = report.findings
    # A recovered recording (outcome partial) is never a plain ok: it holds steps up to where the
    # recording stopped, and nothing after them was recorded or checked.
    word = verdict(findings, trace.num_steps)  # no recorded step: `empty`, never ok
    upto = trace.outcome.step if trace.outcome.status == "partial" else None
    if upto is not None and word not in ("diverged", EMPTY):
        word = "partial"
    if fmt == "json":
        extra = {"trace": path, "impl": trace.impl_name, "unchecked": report.unchecked}
        click.echo(findings_json(findings, extra | ({"up_to_step": upto} if upto is not None else {}), word))
    else:
        from specreplay.cli.render import trace_header

        out = console()
        out.print(trace_header(trace, path))
        # A trace without ground truth (a live engine's) says what it could not check.
        note = f" ({unchecked_note(report.unchecked, trace.impl.runner_family)})" if report.unchecked else ""
        if upto is not None:
            note = f" ({'' if word == 'partial' else 'partial, '}up to step {upto}){note}"
        stopped = f"; the recording stopped after step {upto}: nothing after it was checked" if upto else ""
        if word == EMPTY:
            out.print(f"verdict: {word} - {EMPTY_NOTE}", soft_wrap=True)
        elif not findings and not report.unchecked:
            out.print(
                f"verdict: {word}{note} - the scheduler view, the worker view and the KV cache agree at every step"
                + stopped,
                soft_wrap=True,
            )
        elif not findings:
            out.print(
                f"verdict: {word}{note} - the scheduler view and the worker view agree at every step; "
                "the KV cache and the tokens were not checked" + stopped,
                soft_wrap=True,
            )
        else:
            first = next((f for f in findings if f.severity == "error"), findings[0])
            out.print(
                f"verdict: {word}{note} - {len(findings)} findings ({code_counts(findings)})" + stopped,
                soft_wrap=True,
            )
            out.print(
                f"first divergence: step {first.step}, request {first.request_id!r}{first.life_note}, "
                f"{first.field}: {first.message}"
            )
            for line in findings_lines(findings, path):
                out.print(line, soft_wrap=True)
            if story and first.request_id is not None:
                _story(out, trace, first)
    empty = word == EMPTY and fail_on != "never"
    return EXIT_FINDINGS if empty or fails(findings, fail_on) else EXIT_OK


def _story(out, trace, first) -> None:
    """The first finding's request over the steps up to it."""
    from specreplay.cli.render import story_columns, story_table
    from specreplay.traces.families import family_of

    family = family_of(trace.impl)
    columns = tuple(dict.fromkeys(("request_id",) + tuple(name for name, _ in story_columns(family))))
    rows = trace.rows_of(first.request_id, first.step - STORY_STEPS, first.step, columns)
    print_table(out, story_table(rows, first.request_id, first.step, family))


def _compare_two(loaded, paths: list[str], fmt: str, fail_on: str) -> int:
    """The first step, request and field where two traces part; returns the exit code."""
    from specreplay.cli.render import findings_json, findings_lines, trace_header
    from specreplay.replay.check.tracediff import diff_batches

    result = diff_batches(loaded[0], loaded[1], loaded[0].batches(read_ahead=True), loaded[1].batches(read_ahead=True))
    if fmt == "json":
        click.echo(
            findings_json(
                result.findings,
                {
                    "a": paths[0],
                    "b": paths[1],
                    "differing_rows_per_field": dict(result.fields),
                    "rows_only_in_a": result.only_a,
                    "rows_only_in_b": result.only_b,
                    "not_compared": {
                        "schema": result.left_out,
                        **{f"no_truth_in_{side.lower()}": cols for side, cols in result.no_truth.items()},
                    },
                    # Differing rows per column a window's replay cannot reproduce: not a difference.
                    "not_reproduced_by_a_window": result.not_reproduced,
                },
                verdict_text="same" if result.same else "differ",
            )
        )
    else:
        out = console()
        out.print(trace_header(loaded[0], "A " + paths[0]))
        out.print(trace_header(loaded[1], "B " + paths[1]))
        if result.same:
            out.print(f"verdict: same - {result.rows_compared} rows compared, no difference")
            if result.not_reproduced:
                out.print(_not_reproduced(result), soft_wrap=True)
        else:
            f = result.first
            out.print(
                f"verdict: differ - first at step {f.step}, request {f.request_id!r}, field {f.field}: "
                f"{f.scheduler!r} in A, {f.worker!r} in B"
            )
            out.print("first difference per field (scheduler = A, worker = B):")
            for line in findings_lines(result.findings):
                out.print(line, soft_wrap=True)
            summary = ", ".join(f"{name} x{n}" for name, n in result.fields.most_common())
            out.print(f"differing rows per field: {summary}")
            if result.not_reproduced:
                out.print(_not_reproduced(result), soft_wrap=True)
        for side, columns in result.no_truth.items():
            out.print(
                f"not compared: {', '.join(columns)} (no ground truth in {side}: a live engine's recording has none)"
            )
        for side, columns in result.other_runner.items():
            out.print(f"not compared: {', '.join(columns)} (only {side}'s runner records them)")
        if result.left_out:
            out.print(f"not compared: {', '.join(result.left_out)} (not in the older trace's schema)")
    return EXIT_FINDINGS if (not result.same and fail_on != "never") else EXIT_OK


def _not_reproduced(result) -> str:
    """The window's columns that differ and that no window reproduces (docs/recording.md)."""
    counts = ", ".join(f"{name} x{n}" for name, n in result.not_reproduced.items())
    return (
        f"not reproduced by a window, not a difference: {counts} (on Model Runner V2 the slot a request takes "
        "follows the slot allocator's history from before the window, which a replay starts without: "
        "docs/recording.md)"
    )
