"""`specreplay show`: a terminal timeline of both views, one lane per request and side.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> **cli**, for people. `replay/timeline.py` computes the cells; this module
folds them to the terminal width and draws them with rich (colours are a bonus: every state has its
own letter, so the picture reads the same with NO_COLOR). `--svg` saves it.
"""

from __future__ import annotations

from pathlib import Path

import click

from specreplay.cli.common import CONTEXT, console, handle_errors, trace_argument
from specreplay.replay.views.timeline import FIELDS  # plain data, no torch: --help stays fast
from specreplay.traces.errors import InputError
from specreplay.traces.families import traits

STYLES = {
    "ok": "green",
    "new": "cyan",
    "reentry": "bold yellow",
    "skip": "magenta",
    "bad": "bold red",
    "warn": "yellow",
    "dim": "dim",
    "": "",
}


def parse_steps(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, sep, last = text.partition(":")
    try:
        lo = int(first) if first else 1
        hi = int(last) if last else 1 << 62
    except ValueError:
        raise InputError(f"--steps {text!r}: expected A:B, like 4:9 (either side may be left out)") from None
    if not sep or lo < 1 or hi < lo:
        raise InputError(f"--steps {text!r}: expected A:B with 1 <= A <= B, like 4:9")
    return lo, hi


@click.command(context_settings=CONTEXT)
@trace_argument
@click.option(
    "--request", "requests", multiple=True, help="Request id to show (repeatable; default: those with findings)."
)
@click.option(
    "--steps",
    "steps_text",
    default=None,
    help="Steps A:B to show (default: all, or a window around the first finding on a long trace).",
)
@click.option(
    "--field",
    "field_name",
    type=click.Choice(sorted(FIELDS)),
    default=None,
    help="Also show this counter on both sides.",
)
@click.option("--svg", "svg_file", type=click.Path(path_type=Path), default=None, help="Save the picture as SVG too.")
@handle_errors
def show(trace_path, requests, steps_text, field_name, svg_file) -> None:
    """A timeline of the scheduler and the worker, step by step: per request a scheduler lane,
    a worker lane and the findings where they fire. A Model Runner V2 trace adds the slot each
    request holds and the step its verified drafts were proposed at.

    \b
    Example:
      specreplay show reentry.parquet --request 10
      specreplay show reentry.parquet --request 10 --steps 1:8 --field num_computed_tokens --svg reentry.svg
    """
    from specreplay.replay.check.checker import check_batches, columns_needed
    from specreplay.replay.views.timeline import build_timeline, default_steps
    from specreplay.traces.io import open_trace

    steps = parse_steps(steps_text)
    trace = open_trace(trace_path)
    findings = check_batches(trace, trace.batches(columns=columns_needed(trace)))
    window = steps or default_steps(trace.num_steps, findings)
    timeline = build_timeline(trace, findings, list(requests) or None, window, field_name)
    if requests and not timeline.lanes:
        raise InputError(
            f"{trace_path}: no request {', '.join(requests)} in steps "
            f"{window[0] if window else 1}:{window[1] if window else trace.num_steps}"
        )
    out = console()
    note = (
        ""
        if steps or window is None
        else f" (steps {window[0]}:{window[1]} of {trace.num_steps}; --steps picks others)"
    )
    runner = traits(timeline.runner_family).shown_as
    title = f"{trace_path}: {trace.workload.name or '?'} via {trace.impl_name}{runner}, {len(findings)} findings{note}"
    shown = len({lane.request_id for lane in timeline.lanes})
    if not requests and shown < timeline.requests_in_range:
        title += f"; {shown} of {timeline.requests_in_range} requests (--request picks others)"
    out.print(title)
    render(out, timeline)
    if svg_file is not None:
        _save_svg(svg_file, title, timeline, out.width, trace_path.name)
        click.echo(f"wrote {svg_file}")


def _save_svg(svg_file: Path, title: str, timeline, width: int, name: str) -> None:
    """The same picture drawn again on a recording console in colour (whatever the terminal), saved as SVG."""
    import io

    from rich.console import Console

    picture = Console(
        file=io.StringIO(),
        record=True,
        width=width,
        force_terminal=True,
        color_system="truecolor",
        highlight=False,
        markup=False,
    )
    picture.print(title)
    render(picture, timeline)
    try:
        picture.save_svg(str(svg_file), title=f"specreplay show {name}")
    except OSError as exc:
        raise InputError(f"{svg_file}: cannot write ({exc.strerror or exc})") from None


def render(out, timeline) -> None:
    from rich.text import Text

    from specreplay.replay.views.timeline import CELL, legend

    if not timeline.lanes:
        out.print("nothing to show (no rows in this range)")
        return
    labels = [f"{lane.request_id} {lane.side}" for lane in timeline.lanes]
    label_width = min(max(len(label) for label in labels), 24)
    per_block = max(1, (out.width - label_width - 1) // (CELL + 1))
    steps = list(range(timeline.first_step, timeline.last_step + 1))
    for start in range(0, len(steps), per_block):
        block = steps[start : start + per_block]
        header = Text(" " * label_width)
        for step in block:
            header.append(f"{step:>{CELL + 1}}", style="bold")
        out.print(header, no_wrap=True, crop=True)
        previous = None
        for lane, label in zip(timeline.lanes, labels):
            if previous is not None and lane.request_id != previous:
                out.print(Text(" " * label_width + "-" * (CELL + 1) * len(block), style="dim"), no_wrap=True, crop=True)
            previous = lane.request_id
            line = Text(f"{label[:label_width]:<{label_width}}")
            for step in block:
                cell = lane.cells.get(step)
                text = "" if cell is None else cell.text
                line.append(f"{text:>{CELL + 1}}", style=STYLES.get(cell.style, "") if cell else "")
            out.print(line, no_wrap=True, crop=True)
        out.print()
    out.print(
        Text(
            "legend: "
            + "; ".join(f"{glyph} {meaning}" for glyph, meaning in legend(timeline.runner_family))
            + "; findings lane: the code where it fires (* more than one); C P n k out T KV: the "
            "counter asked for with --field",
            style="dim",
        )
    )


@click.command(context_settings=CONTEXT)
@trace_argument
@click.option(
    "--perfetto",
    "out_file",
    type=click.Path(path_type=Path),
    required=True,
    help="Chrome/Perfetto trace-event JSON to write (open it in ui.perfetto.dev).",
)
@click.option("--steps", "steps_text", default=None, help="Steps A:B to export (default: from step 1).")
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="At most this many steps per file, so the viewer stays fast.",
)
@click.option(
    "--max-rows",
    type=click.IntRange(min=1),
    default=20_000,
    show_default=True,
    help="At most this many request-steps per file (about 700 bytes each).",
)
@handle_errors
def export(trace_path, out_file, steps_text, max_steps, max_rows) -> None:
    """Export a trace for the Perfetto UI: per request a scheduler track and a worker track,
    flow arrows from scheduling to apply, counters, and findings as markers.

    \b
    Example:
      specreplay export reentry.parquet --perfetto reentry.json
    """
    import json

    from specreplay.replay.check.checker import check_batches, columns_needed
    from specreplay.replay.views.perfetto import export_events
    from specreplay.traces.io import open_trace

    steps = parse_steps(steps_text)
    trace = open_trace(trace_path)
    findings = check_batches(trace, trace.batches(columns=columns_needed(trace)))
    doc = export_events(trace, findings, steps, max_steps, max_rows)
    try:
        out_file.write_text(json.dumps(doc, separators=(",", ":")))
    except OSError as exc:
        raise InputError(f"{out_file}: cannot write ({exc.strerror or exc})") from None
    other = doc["otherData"]
    shown_last = min(other["last_step"], trace.num_steps)
    more = "" if shown_last >= trace.num_steps else f" of {trace.num_steps} (--steps for the rest)"
    click.echo(
        f"wrote {out_file}: steps {other['first_step']}..{shown_last}{more}, {len(doc['traceEvents'])} events; "
        "open it in https://ui.perfetto.dev"
    )
