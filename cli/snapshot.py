"""`specreplay snapshot`: ask the flight recorders of a running vLLM to write their window out.

Where it sits: cli over families/vllm/flight.py. A vLLM started with `SPECREPLAY_RECORD=DIR` and
`SPECREPLAY_WINDOW=STEPS` keeps each process's last steps in memory; this command names a dump,
sends SIGUSR1 to every process recording into DIR, waits until each has written its parts under
`DIR/<dump>/`, and prints how to merge them. The engine goes on serving.
"""

from __future__ import annotations

from pathlib import Path

import click

from specreplay.cli.common import CONTEXT, handle_errors
from specreplay.traces.errors import InputError


@click.command(context_settings=CONTEXT)
@click.argument("folder", type=click.Path(path_type=Path))
@click.option(
    "--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True, help="Seconds to wait for the dump."
)
@handle_errors
def snapshot(folder, timeout) -> None:
    """Write the window of a running flight recorder (SPECREPLAY_RECORD=FOLDER with
    SPECREPLAY_WINDOW=STEPS) to FOLDER/snapshot-TIME/, while the engine keeps serving.

    \b
    Example:
      SPECREPLAY_RECORD=rec/ SPECREPLAY_WINDOW=2000 vllm serve MODEL ...
      specreplay snapshot rec/
      specreplay merge rec/snapshot-20261203T101500Z -o window.parquet
    """
    from specreplay.replay.families.vllm.flight import (
        ask_for_windows,
        dump_name,
        live_recorders,
        sweep,
        wait_for_windows,
        withdraw_request,
    )

    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder (the SPECREPLAY_RECORD folder of a running vLLM)")
    sweep(str(folder))  # markers of recorders that are gone: their pids may be someone else's now
    pids = live_recorders(str(folder))
    if not pids:
        raise InputError(
            f"{folder}: no running flight recorder records here (started with SPECREPLAY_RECORD={folder} "
            "and SPECREPLAY_WINDOW=STEPS?)"
        )
    name = dump_name("snapshot")
    dump = folder / name
    try:
        pids = ask_for_windows(str(folder), name, pids)
        done = wait_for_windows(str(dump), pids, timeout)
    finally:
        withdraw_request(str(folder), name)
    if done != set(pids):
        raise InputError(
            f"{folder}: {len(done)} of {len(pids)} recording processes wrote their window within {timeout:g} s "
            f"(waiting for pids {', '.join(str(p) for p in pids if p not in done)})"
        )
    parts = len(list(dump.glob("*.jsonl")))
    click.echo(f"snapshot: {dump} ({parts} part files from {len(pids)} processes)")
    click.echo(f"merge it: specreplay merge {dump} -o window.parquet")
