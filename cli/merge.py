"""`specreplay merge`: the part files of an attached vLLM run into one trace.

Where it sits: cli over the merge workflow (replay/workflows/merge.py). A vLLM process started
with `SPECREPLAY_RECORD=DIR` (families/vllm/attached.py) leaves one part file per process in DIR; this
command joins them, says what it dropped and why, and prints the one-line check `record` prints.
"""

from __future__ import annotations

from pathlib import Path

import click

from specreplay.cli.common import CONTEXT, handle_errors
from specreplay.traces.header import Inputs


@click.command(context_settings=CONTEXT)
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Trace file to write (.parquet).")
@click.option("--run", "run_id", default=None, help="The run to merge, when FOLDER holds parts of several.")
@click.option(
    "--salvage",
    is_flag=True,
    help="A part file damaged inside (not cut at its end): keep what precedes the damage (the trace is partial) "
    "instead of refusing it.",
)
@handle_errors
def merge(folder, output, run_id, salvage) -> None:
    """Merge what a vLLM process started with SPECREPLAY_RECORD=FOLDER wrote (one part file per
    process: engine core, workers) into one trace.

    A last line cut mid-write is a process that died writing it: dropped, and said. A line
    damaged inside a file, with more after it, is not: the file is refused (exit 2), unless
    --salvage.

    \b
    Example:
      SPECREPLAY_RECORD=rec/ python -m vllm.entrypoints.openai.api_server --model M ...
      specreplay merge rec/ -o run.parquet
      specreplay diff run.parquet
    """
    from specreplay.replay.workflows.merge import merge_to
    from specreplay.traces.errors import ObserverError

    merged = merge_to(folder, output, run_id, salvage)
    report(merged)
    if merged.failures:  # the engine went on; specreplay's recorder did not: its bug, exit 3
        raise ObserverError(f"{merged.failures[0]} (the trace holds what was recorded before it)")


def report(merged) -> None:
    """What was merged, what was dropped and why, and `record`'s one-line check."""
    from specreplay.cli.record import _summary
    from specreplay.replay.workflows.record import Recorded

    trace = merged.trace
    inputs = trace.inputs if trace.inputs is not None else Inputs()
    requests = len({r["id"] for r in inputs.requests or []})
    click.echo(
        f"merged run {merged.run}: {merged.parts} part files, {requests} requests, {len(inputs.aborts or [])} aborts"
    )
    if trace.impl.window:
        click.echo(f"window: {trace.impl.window}")
    for line in merged.dropped:
        click.echo(f"dropped: {line}")
    _summary(Recorded(merged.path, trace))
